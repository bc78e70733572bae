"""One index of a graph's ops, built once per analysis and shared by the
analysis and every graph feature (transforms.features): names, types,
positions, producers and consumers, ops by type, whether an op is in a
gradients scope. Reading an op's name or type goes through TensorFlow's C
API; on a BERT-large-sized graph (24,000 ops) each walk of the graph that
asked every op for them cost 30-70 ms, and the analysis and the features
walked it about twenty times.

Positions are the graph's creation order (graph.get_operations()), a
topological order of the data edges except for a while loop's back edges.
"""
from __future__ import annotations

import collections

import tensorflow as tf

from autopar.transforms.graph_utils import INPUT_OP_TYPES, in_gradient_scope, op_name_of


class GraphIndex:
    def __init__(self, graph: tf.Graph):
        self.graph = graph
        self.ops = graph.get_operations()
        self.names = [op.name for op in self.ops]
        self.types = [op.type for op in self.ops]
        self.position = {name: i for i, name in enumerate(self.names)}
        # in a gradients scope (the backward pass tf.gradients builds), decided
        # once per scope
        scopes: dict[str, bool] = {}
        self.in_gradient = []
        for name in self.names:
            scope = name.rpartition("/")[0]
            if scope not in scopes:
                scopes[scope] = in_gradient_scope(name)
            self.in_gradient.append(scopes[scope])
        n = len(self.ops)
        # preds[i]: the producers of op i's inputs, one per input, in order
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        self.control_succs: list[list[int]] = [[] for _ in range(n)]
        # consumers[i][k]: the ops reading output k of op i (once per read)
        self.consumers: list[dict[int, list[int]]] = [{} for _ in range(n)]
        # A graph keeps one Python Operation per op: a tensor's op is one of
        # self.ops (found by identity, cheaper than asking its name).
        by_id = {id(op): i for i, op in enumerate(self.ops)}
        for i, op in enumerate(self.ops):
            preds = self.preds[i]
            for t in op.inputs:
                p = by_id[id(t.op)]
                preds.append(p)
                self.succs[p].append(i)
                self.consumers[p].setdefault(t.value_index, []).append(i)
            # (an op's control outputs are a cheap read, its control inputs
            # an expensive one: 0.3 s on a 24,000-op graph)
            controlled = op._control_outputs
            if controlled:
                self.control_succs[i] = sorted(by_id[id(c)] for c in controlled)
        self._by_type: dict[str, list[int]] = collections.defaultdict(list)
        for i, t in enumerate(self.types):
            self._by_type[t].append(i)

    def of_types(self, types) -> list[tf.Operation]:
        """The ops of any of `types`, in graph order."""
        found = sorted(i for t in types for i in self._by_type.get(t, ()))
        return [self.ops[i] for i in found]

    def op_types(self) -> list[str]:
        """Every op type of the graph."""
        return list(self._by_type)

    def batch_local(self, stops) -> set[str]:
        """graph_utils.batch_local_ops from the index: ops whose inputs
        depend on this worker's own input batch other than through the
        tensors `stops` (names), forward from the input ops along data edges."""
        stopped = set()
        for name in stops:
            op, _, k = name.rpartition(":")
            if op in self.position:
                stopped.add((self.position[op], int(k)))
        frontier = sorted(i for t in INPUT_OP_TYPES for i in self._by_type.get(t, ()))
        seen = set(frontier)
        while frontier:
            i = frontier.pop()
            for k, readers in self.consumers[i].items():
                if (i, k) in stopped:
                    continue
                for c in readers:
                    if c not in seen:
                        seen.add(c)
                        frontier.append(c)
        return {self.names[i] for i in seen}

    def reachable(self, starts, edges=None, extra=None) -> set[int]:
        """Positions reachable from `starts` (included) along `edges` (data
        successors by default) and `extra` (more successor lists)."""
        edges = edges or self.succs
        seen = set(starts)
        frontier = list(seen)
        while frontier:
            i = frontier.pop()
            for j in edges[i]:
                if j not in seen:
                    seen.add(j)
                    frontier.append(j)
            if extra is not None:
                for j in extra[i]:
                    if j not in seen:
                        seen.add(j)
                        frontier.append(j)
        return seen

    def computing(self, names) -> set[int]:
        """Positions of the ops that the ops or tensors `names` ("op" or
        "op:0"; None and names of no op here are skipped) are computed from
        along data edges, theirs included: what a loss reads."""
        starts = {self.position.get(op_name_of(name)) for name in names if name}
        return self.reachable([i for i in starts if i is not None], edges=self.preds)

    def propagate(self, seeds: dict[int, int], forward: bool, control: bool = False) -> list[int]:
        """reach[i]: OR of the seed bits of every op with a path of one or
        more data edges (and forward control edges, with `control`) to i
        (forward) or from i (backward). A worklist in (reverse) creation
        order: each op is visited once on an acyclic graph; a loop's back
        edge re-queues only what it changes."""
        n = len(self.ops)
        edges = self.succs if forward else self.preds
        if control:
            edges = [a + b for a, b in zip(edges, self.control_succs)]
        reach = [0] * n
        order = range(n) if forward else range(n - 1, -1, -1)
        queue = collections.deque(i for i in order)
        queued = [True] * n
        while queue:
            i = queue.popleft()
            queued[i] = False
            out = reach[i] | seeds.get(i, 0)
            if not out:
                continue
            for j in edges[i]:
                new = reach[j] | out
                if new != reach[j]:
                    reach[j] = new
                    if not queued[j]:
                        queued[j] = True
                        queue.append(j)
        return reach
