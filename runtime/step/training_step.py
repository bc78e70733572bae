"""Which runs are training steps, and what a training step fetches and feeds
besides the user's fetches.

A fetch that reaches a variable update is a training step. With an Analysis
the step ops are the analysis's; without one (single device, a graph autopar
cannot distribute) a step is any run that writes a trainable variable: a
hand-written update is one step, a gradient-accumulation run that only adds
into non-trainable accumulators is not, the run applying them is.

`StepFetches.extras` is the one place that says what the loop fetches with a
step for itself (the loss for progress, the losses' counts, the batch size);
`with_step` what the rewrite asks a step to run with it (barriers, server
ops)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.runtime.step.graph_queries import (initializer_ops, trainable_writer_step_ops,
                                                  upstream)
from autopar.transforms.analysis import Analysis
from autopar.transforms.features.registry import feature_fetches
from autopar.transforms.random_draws import BATCH_DRAWS_SCOPE, stateful_draw


class StepFetches:
    """`batch_size`: the input batch's leading dimension (fetched when
    nothing is fed); `with_step`: [(train groups, op)], fetched with a step
    that updates those groups (its end-of-step barriers and the server ops
    it runs without waiting for them, transforms.methods.ps.rewrite);
    `after_step`: an op run after every step (averaging batch-local state);
    `step_feeds`: fed in every training step's run (WorkerGraph.in_step);
    `lookup_barriers`: a grouped lookup (an op name) -> the barrier a run
    that is not a training step fetches with it (WorkerGraph.lookup_barriers)."""

    def __init__(self, graph: tf.Graph, analysis: Analysis | None, *, num_workers: int = 1, batch_size: tf.Tensor | None = None, with_step=(),
                 after_step: tf.Operation | None = None, step_feeds=None, lookup_barriers=None):
        self.analysis = analysis
        self.num_workers = num_workers
        self._step_ops = (analysis.step_ops if analysis is not None
                          else trainable_writer_step_ops(graph, initializer_ops(graph)))
        # The loss of each train group, fetched with the steps that update it.
        self._losses = ([graph.get_tensor_by_name(g.loss) if g.loss else None
                         for g in analysis.train_groups] if analysis is not None else [])
        # The losses' counts of the batch's values (transforms.loss_counts),
        # this worker's, fetched with every step: Runner.last_loss_counts.
        self.loss_counts = [graph.get_tensor_by_name(c)
                            for c in feature_fetches(analysis).get("loss_counts", [])]
        self._batch_size = batch_size
        self._with_step = list(with_step)
        self.after_step = after_step
        self.feeds = dict(step_feeds or {})
        self._lookup_barriers = {name: graph.get_operation_by_name(barrier)
                                 for name, barrier in (lookup_barriers or {}).items()}
        self._barriers_of: dict[tuple[str, ...], list[tf.Operation]] = {}
        # The program's per-example draws whose kernels keep a generator's
        # state, and the copies of them transforms.random_draws makes draw
        # the global batch's rows (what a run runs)
        self._stateful_draws = sorted(
            name for name in (analysis.batch_draws if analysis is not None and num_workers > 1
                              else ())
            if stateful_draw(graph.get_operation_by_name(name).type))
        self._stateful_copies = {
            op.name for op in graph.get_operations()
            if op.name.startswith(BATCH_DRAWS_SCOPE) and stateful_draw(op.type)
        } if self._stateful_draws else set()
        self._draws_of: dict[tuple[str, ...], list[str]] = {}

    def is_step(self, element) -> bool:
        op = element if isinstance(element, tf.Operation) else getattr(element, "op", None)
        return op is not None and op.name in self._step_ops

    def any_step(self, mapped) -> bool:
        return any(self.is_step(leaf) for leaf in tf.nest.flatten(mapped) if leaf is not None)

    def groups_of(self, mapped) -> set[int]:
        """The train groups the training-step leaves of `mapped` update."""
        groups: set[int] = set()
        if self.analysis is None:
            return groups
        for leaf in tf.nest.flatten(mapped):
            if leaf is None or not self.is_step(leaf):
                continue
            op = leaf if isinstance(leaf, tf.Operation) else leaf.op
            found = self.analysis.groups_of(op.name)
            if op.name not in self.analysis.trains and self.num_workers > 1 and found:
                members = self.analysis.train_groups[found[0]].variables
                if len(members) > 1:
                    raise AutoparError(
                        f"the fetch '{op.name}' updates one of the variables its train op "
                        f"updates together ({', '.join(members[:3])}"
                        f"{', ...' if len(members) > 3 else ''}): a distributed step applies a "
                        "train op's aggregated gradients as one, so fetch the train op "
                        "(e.g. what minimize() or apply_gradients() returned)")
            groups.update(found)
        return groups

    def extras(self, groups: set[int], fed: bool) -> dict:
        """What a training step fetches besides the user's fetches: the loss
        of the first train group it updates (for progress), the losses'
        counts of the batch's values and, with no feed, the input batch's
        size."""
        extra = {}
        if self.loss_counts:
            extra["counts"] = self.loss_counts
        loss = next((self._losses[g] for g in sorted(groups) if self._losses[g] is not None),
                    None)
        if loss is not None:
            extra["loss"] = loss
        if self._batch_size is not None and not fed:
            extra["batch"] = self._batch_size
        return extra

    @staticmethod
    def counts_of(got: dict) -> list[float] | None:
        """The losses' counts a step fetched (`extras`), None if it did not."""
        return [float(np.sum(c)) for c in got["counts"]] if "counts" in got else None

    def with_step(self, groups: set[int]) -> list:
        """The ops a step updating `groups` fetches with it: every one of a
        set of groups among them."""
        return [op for op_groups, op in self._with_step if set(op_groups) <= groups]

    def stateful_draws(self, fetches) -> list[str]:
        """The program's per-example draws keeping a generator's state when
        a run of `fetches` runs any (run on one worker outside a training
        step, one moves that worker's generator ahead of the others')."""
        if not self._stateful_copies:
            return []
        return self._of_run(fetches, self._draws_of, lambda seen: (
            self._stateful_draws if self._stateful_copies & seen else []))

    def lookup_barriers(self, fetches) -> list[tf.Operation]:
        """The barriers of the grouped lookups (Config.aggregation_group)
        that `fetches` run."""
        if not self._lookup_barriers:
            return []
        return self._of_run(fetches, self._barriers_of, lambda seen: [
            b for name, b in sorted(self._lookup_barriers.items()) if name in seen])

    @staticmethod
    def _of_run(fetches, cache: dict, answer):
        """answer(the names of the ops a run of `fetches` runs), kept in
        `cache` by the fetches' names."""
        ops = [op for op in (x if isinstance(x, tf.Operation) else getattr(x, "op", None)
                             for x in fetches) if op is not None]
        key = tuple(sorted(op.name for op in ops))
        if key not in cache:
            cache[key] = answer({op.name for op in upstream(ops)})
        return cache[key]
