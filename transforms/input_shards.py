"""Whether the training step's tf.data input is split among the workers.

A step that draws its batch from a tf.data iterator must read, on each
worker, that worker's share of the examples: a dataset with no shard on its
way gives every worker the same examples, which is not what one device does
with the global batch (each of N workers would read the whole dataset). The
evidence is the pipeline's data flow: every dataset the step's iterators are
made from must reach them only through a ShardDataset (`autopar.shard(ds)`,
or `ds.shard(n, i)` written by hand; autopar.shard leaves one even where the
worker count is not known yet, in the launcher). Pure: a graph in, the
unsharded sources out (transforms.compile refuses them).

Arrays fed through feed_dict or `runner.call` are not seen here: splitting
them is the program's part (docs/programs.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import tensorflow as tf

from autopar.transforms.graph_utils import library_functions, op_name_of

# Iterator reads (tf.compat.v1 get_next, and the optional form).
GET_NEXT_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})
# Datasets that keep one worker's share of their input: Dataset.shard, and
# tf.data's auto-sharding (tf.distribute), which shards by worker index too.
SHARD_TYPES = frozenset({"ShardDataset", "AutoShardDataset", "ExperimentalAutoShardDataset"})
# Iterators a MakeIterator op points at a dataset (make_initializable_iterator,
# Iterator.from_structure + make_initializer, iter(ds) inside a tf.function).
_MADE_ITERATOR_TYPES = frozenset({"IteratorV2", "Iterator", "AnonymousIterator",
                                  "AnonymousIteratorV2", "AnonymousIteratorV3"})
# Iterators whose dataset is chosen when the step runs (a fed string handle).
_FED_ITERATOR_TYPES = frozenset({"IteratorFromStringHandle", "IteratorFromStringHandleV2"})
# A tf.data dataset op's type: TensorSliceDataset, BatchDatasetV2, ...
_DATASET_TYPE = re.compile(r"Dataset(V\d+)?$")


@dataclass(frozen=True)
class UnshardedInput:
    get_next: str        # the step's iterator read
    source: str          # the dataset (or fed variant) no shard covers
    source_type: str
    where: str = ""      # "" in the graph, else the one-shot iterator whose function builds it


def unsharded_inputs(graph: tf.Graph, roots: list[str]) -> list[UnshardedInput]:
    """For every iterator read the ops `roots` depend on (by data or control
    edges), the dataset sources that reach its iterator with no shard on
    the way, in the graph's order."""
    found: list[UnshardedInput] = []
    library = None
    for get_next in _reads(graph, roots):
        iterator = _through_identities(get_next.inputs[0].op)
        if iterator.type == "OneShotIterator":
            if library is None:
                library = library_functions(graph)
            sinks = [("function", (iterator.name, iterator.get_attr("dataset_factory").name))]
        elif iterator.type in _MADE_ITERATOR_TYPES:
            sinks = [("graph", op.inputs[0].op) for op in _makers(graph, iterator)]
        elif iterator.type in _FED_ITERATOR_TYPES:
            # Any iterator of the graph may be the one fed: all must be sharded.
            sinks = [("graph", op.inputs[0].op) for op in graph.get_operations()
                     if op.type == "MakeIterator"]
            sinks += [("function", (op.name, op.get_attr("dataset_factory").name))
                      for op in graph.get_operations() if op.type == "OneShotIterator"]
            if any(kind == "function" for kind, _ in sinks) and library is None:
                library = library_functions(graph)
        else:
            sinks = []
        if not sinks:
            # An iterator whose dataset the graph does not show: nothing proves it sharded.
            found.append(UnshardedInput(get_next.name, iterator.name, iterator.type))
            continue
        for kind, sink in sinks:
            if kind == "graph":
                sources = _graph_sources(sink)
                found += [UnshardedInput(get_next.name, s.name, s.type) for s in sources]
            else:
                owner, function = sink
                found += [UnshardedInput(get_next.name, name, op_type, owner)
                          for name, op_type in _function_sources(library.get(function))]
    return list(dict.fromkeys(found))


def _reads(graph: tf.Graph, roots: list[str]) -> list[tf.Operation]:
    """The iterator reads among `roots`' ancestors, in the graph's order."""
    seen: set[str] = set()
    stack = [graph.get_operation_by_name(op_name_of(name)) for name in roots]
    reads = []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in GET_NEXT_TYPES:
            reads.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    order = {op.name: i for i, op in enumerate(graph.get_operations())}
    return sorted(reads, key=lambda op: order[op.name])


def _through_identities(op: tf.Operation) -> tf.Operation:
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op


def _makers(graph: tf.Graph, iterator: tf.Operation) -> list[tf.Operation]:
    """The MakeIterator ops that point `iterator` at a dataset."""
    return [op for op in graph.get_operations() if op.type == "MakeIterator"
            and _through_identities(op.inputs[1].op) is iterator]


def _graph_sources(sink: tf.Operation) -> list[tf.Operation]:
    """The datasets (and fed or captured variants) `sink`'s pipeline starts
    from with no shard between them and `sink`."""
    sources, seen, stack = [], set(), [sink]
    while stack:
        op = stack.pop()
        if op.name in seen or op.type in SHARD_TYPES:
            continue
        seen.add(op.name)
        if op.type == "Placeholder" and op.outputs and op.outputs[0].dtype == tf.variant:
            sources.append(op)        # a dataset fed when the step runs: not proven sharded
            continue
        upstream = [t.op for t in op.inputs]
        if _DATASET_TYPE.search(op.type) and not any(_DATASET_TYPE.search(u.type)
                                                     or u.type in SHARD_TYPES for u in upstream):
            sources.append(op)
            continue
        stack.extend(upstream)
    return sorted(sources, key=lambda op: op.name)


def _function_sources(function) -> list[tuple[str, str]]:
    """(node, type) of the unsharded sources of a dataset function (a
    OneShotIterator's factory): the same walk over its NodeDefs, from what
    it returns. A function the library does not hold proves nothing."""
    if function is None:
        return [("(its dataset function)", "unknown")]
    nodes = {n.name: n for n in function.node_def}

    def inputs(node) -> list:
        return [nodes[op_name_of(name)] for name in node.input
                if not name.startswith("^") and op_name_of(name) in nodes]
    stack = [nodes[op_name_of(value)] for value in function.ret.values()
             if op_name_of(value) in nodes]
    sources, seen = [], set()
    while stack:
        node = stack.pop()
        if node.name in seen or node.op in SHARD_TYPES:
            continue
        seen.add(node.name)
        upstream = inputs(node)
        if _DATASET_TYPE.search(node.op) and not any(_DATASET_TYPE.search(u.op)
                                                     or u.op in SHARD_TYPES for u in upstream):
            sources.append((node.name, node.op))
            continue
        stack.extend(upstream)
    return sorted(sources)
