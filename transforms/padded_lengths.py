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

A cond deciding by whether every example of the batch, or any, passes a
test (tf.reduce_all, tf.reduce_any: Keras's Hinge loss converts labels of 0
and 1 to -1 and 1 when all of the batch's are 0 or 1) is checked the same
way (transforms.example_rows' `alike`): one device decides for the global
batch, each worker for its share, and the two agree exactly when every
worker decides alike. The step fails naming the cond if they do not.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.features.base import GraphFeature, Rewiring, in_step_cond, in_step_flag
from autopar.transforms.graph_utils import INPUT_OP_TYPES, node_input_name
from autopar.transforms.keys import PADDED_LENGTHS


class PaddedLengths(GraphFeature):
    """A training step refuses inputs the workers padded to different lengths,
    and conds their shares decide apart."""
    name = "padded_lengths"
    fields = ("padded_inputs", "checked_predicates")
    keys = (PADDED_LENGTHS,)
    after = ("example_rows",)

    def find(self, facts):
        return {"padded_inputs": find_padded_inputs(
            facts.index, facts.index.of_types(INPUT_OP_TYPES),
            [loss.split(":")[0] for _, loss in facts.trained_seeds if loss]),
            "checked_predicates": dict(facts.shared["rows"].alike)}

    def rewrite(self, ctx):
        if not (ctx.analysis.padded_inputs or ctx.analysis.checked_predicates) \
                or ctx.plan.num_workers == 1:
            return None
        flag = in_step_flag(ctx.graph)
        rewire, built = rewrite_length_checks(ctx.graph, ctx.analysis.padded_inputs,
                                              ctx.backend, ctx.plan.num_workers, flag,
                                              ctx.analysis.checked_predicates)
        return Rewiring(rewire, built | {flag.op.name}, outputs={"in_step": flag.name})

    def report_fields(self, analysis, plan):
        return {"padded_inputs": sorted(analysis.padded_inputs),
                "checked_predicates": sorted(analysis.checked_predicates.values())}


def find_padded_inputs(index, input_ops, losses: list[str]) -> dict[str, list[int]]:
    """{fed or dataset tensor a training step reads: its axes past the first
    whose length the graph leaves unknown}. Only tensors a trained loss (its
    op in `losses`) is computed from: every training step reads them."""
    starts = [index.position[op] for op in losses if op in index.position]
    if not starts:
        return {}
    before = {index.names[i] for i in index.reachable(starts, edges=index.preds)}
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


def _after(op, x: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([op]):
        return tf.identity(x)
