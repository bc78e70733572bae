"""Inputs padded to a length of each worker's own.

A step that reads a batch of sequences of a length the graph leaves unknown
(a TensorSpec of [None, None], a dataset's padded_batch) reads each batch
padded to its longest example. One device pads the global batch to the
longest of all its examples; a worker fed its share padded by itself (the
dataset sharded before padded_batch) pads to the longest of its own, and a
model whose examples see their padding (a mean over every position, an RNN
stepping over the pad tokens, a loss averaged over padded positions) then
computes another value for the same example, silently.

Whether a program is blind to its padding (masks everywhere) is beyond what
the analysis can prove, but whether the workers' lengths are one device's is
known when the step runs: the global batch's length is the longest of the
workers', so the workers pad alike exactly when they pad to one device's
length. So a training step checks it: each such input's unknown lengths,
summed over the workers (one small all-reduce per input), must be N times
this worker's, or the step fails before the backward pass starts, naming
the input, and nothing is updated. Padding every worker's batch to one
length (a fixed padded length, or autopar.fit, which splits each global
batch after it is padded) passes. The check runs in training steps alone
(under the in-step flag the runner feeds): an evaluation on the chief alone
waits for no other worker.

The largest or smallest integer of the batch's values that a trained loss
is computed from (transforms.example_rows' statistics: the batch's longest
sequence, which tf.compat.v1.nn.dynamic_rnn runs its loop to when given a
sequence_length, and a program's tf.reduce_max of the lengths it computes)
is likewise each worker's own, of its share, where one device's is the
global batch's: a training step replaces it by the largest (smallest) of
the workers' (one small all-gather each), so a loop runs, and a cond
decides, as on one device. Not with micro-batches (each would take its
own).

A cond deciding by whether every example of the batch, or any, passes a
test (tf.reduce_all, tf.reduce_any: Keras's Hinge loss converts labels of 0
and 1 to -1 and 1 when all of the batch's are 0 or 1) is checked the same
way (transforms.example_rows' `alike`): one device decides for the global
batch, each worker for its share, and the two agree exactly when every
worker decides alike. The step fails naming the cond if they do not.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.features.base import GraphFeature, Rewiring, in_step_cond, in_step_flag
from autopar.transforms.graph_utils import INPUT_OP_TYPES, node_input_name
from autopar.transforms.keys import BATCH_STATISTICS, PADDED_LENGTHS


class PaddedLengths(GraphFeature):
    """A training step refuses inputs the workers padded to different lengths,
    and conds their shares decide apart, and takes the global batch's
    statistics."""
    name = "padded_lengths"
    fields = ("padded_inputs", "checked_predicates")
    keys = (PADDED_LENGTHS, BATCH_STATISTICS)
    after = ("example_rows",)

    def find(self, facts):
        return {"padded_inputs": find_padded_inputs(
            facts.index, facts.index.of_types(INPUT_OP_TYPES),
            [loss for _, loss in facts.trained_seeds]),
            "checked_predicates": dict(facts.shared["rows"].alike)}

    def check(self, analysis, plan, config):
        if analysis.batch_statistics and config.micro_batches > 1 and plan.num_workers > 1:
            raise UnsupportedGraphError(
                f"Config(micro_batches={config.micro_batches}) with statistics of the batch's "
                f"values ({', '.join(repr(t) for t in sorted(analysis.batch_statistics))}: "
                "the largest or smallest of its examples' integers): each micro-batch would "
                "take its own, where one device takes the global batch's; use micro_batches=1")

    def rewrite(self, ctx):
        analysis = ctx.analysis
        if not (analysis.padded_inputs or analysis.checked_predicates
                or analysis.batch_statistics) or ctx.plan.num_workers == 1:
            return None
        flag = in_step_flag(ctx.graph)
        rewire, built = rewrite_length_checks(ctx.graph, analysis.padded_inputs,
                                              ctx.backend, ctx.plan.num_workers, flag,
                                              analysis.checked_predicates)
        made, more = rewrite_global_statistics(ctx.graph, analysis.batch_statistics,
                                               ctx.backend, flag)
        return Rewiring({**rewire, **made}, built | more | {flag.op.name},
                        outputs={"in_step": flag.name})

    def report_fields(self, analysis, plan):
        return {"padded_inputs": sorted(analysis.padded_inputs),
                "checked_predicates": sorted(analysis.checked_predicates.values()),
                "batch_statistics": sorted(analysis.batch_statistics)}


def find_padded_inputs(index, input_ops, losses: list[str]) -> dict[str, list[int]]:
    """{fed or dataset tensor a training step reads: its axes past the first
    whose length the graph leaves unknown}. Only tensors a trained loss (in
    `losses`, tensor names) is computed from: every training step reads them."""
    before = {index.names[i] for i in index.computing(losses)}
    if not before:
        return {}
    out = {}
    for op in input_ops:
        if op.name not in before:
            continue
        for t in op.outputs:
            if t.dtype in (tf.resource, tf.variant) or t.shape.rank is None:
                continue
            unknown = [axis for axis in range(1, t.shape.rank) if t.shape[axis] is None]
            if unknown:
                out[t.name] = unknown
    return out


def rewrite_length_checks(graph: tf.Graph, padded: dict[str, list[int]], backend,
                          num_workers: int, flag: tf.Tensor,
                          predicates: dict[str, str] | None = None
                          ) -> tuple[dict[str, str], set[str]]:
    """In `graph` (the worker's scratch copy): each padded input, and each
    boolean of the whole batch a cond decides by (`predicates`: it -> the
    cond), read through a check that it is every worker's, run in training
    steps (when `flag`, the in-step flag, is fed True). Returns (tensor ->
    its checked read, which every op but the check's reads instead; the ops
    built)."""
    before = {op.name for op in graph.get_operations()}
    rewire = {}
    checks = [(name, lambda x, axes=axes: tf.gather(tf.shape(x, out_type=tf.int64), axes),
               f"autopar: the workers padded the step's input '{name}' to different lengths "
               f"(axes {axes}), where one device pads the global batch to one: pad every "
               "worker's batch to one fixed length (padded_batch's padded_shapes), or train "
               "with autopar.fit") for name, axes in sorted(padded.items())]
    checks += [(name, lambda x: x,
                f"autopar: the workers' shares of this step's batch decide '{cond}' apart "
                f"('{name}' holds on some workers, not on others), where one device decides "
                "it once for the global batch") for name, cond in sorted((predicates or {}).items())]
    with graph.as_default(), tf.name_scope("autopar/padded_lengths/"):
        for k, (name, value_of, message) in enumerate(checks):
            x = graph.get_tensor_by_name(name)
            mine = tf.cast(value_of(x), tf.float64)

            def check(mine=mine, k=k, message=message):
                total = backend.allreduce_sum(mine, PADDED_LENGTHS.key(k))
                return tf.debugging.assert_equal(total, mine * num_workers, message=message)
            checked = in_step_cond(flag, lambda check=check, x=x: _after(check(), x),
                                   lambda x=x: tf.identity(x))
            rewire[node_input_name(name)] = node_input_name(checked.name)
    built = {op.name for op in graph.get_operations()} - before
    return rewire, built


def rewrite_global_statistics(graph: tf.Graph, statistics: dict[str, str], backend,
                              flag: tf.Tensor) -> tuple[dict[str, str], set[str]]:
    """In `graph` (the worker's scratch copy): each statistic ({tensor:
    "Max" or "Min"}) read as the largest (smallest) of every worker's, in
    training steps (`flag`), gathered over the workers (float64: exact for
    the integers of lengths). Returns (tensor -> its global read; the ops
    built)."""
    before = {op.name for op in graph.get_operations()}
    rewire = {}
    with graph.as_default(), tf.name_scope("autopar/batch_statistics/"):
        for k, (name, kind) in enumerate(sorted(statistics.items())):
            x = graph.get_tensor_by_name(name)
            extreme = tf.reduce_max if kind == "Max" else tf.reduce_min

            def global_value(x=x, extreme=extreme, k=k):
                every = backend.allgather(tf.cast(x, tf.float64)[None],
                                          BATCH_STATISTICS.key(k))
                return tf.cast(extreme(every, axis=0), x.dtype)
            made = in_step_cond(flag, global_value, lambda x=x: tf.identity(x))
            rewire[node_input_name(name)] = node_input_name(made.name)
    return rewire, {op.name for op in graph.get_operations()} - before


def _after(op, x: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([op]):
        return tf.identity(x)
