"""Losses that mix the examples of a batch.

Data-parallel training gives each worker a share of the global batch. Where
the loss of one example depends only on that example, the workers' gradients
combine into one device's on the global batch (averaged or added, as the loss
reduces). Where an example's value depends on other examples of its batch,
each worker mixes only the examples of its own share: in-batch negatives (the
logits of every query against every key of the batch, `q @ k^T`), a statistic
of the batch fed back into each example (centring by the batch's mean,
`l2_normalize(x, axis=0)`, class weights counted over the batch). The
gradients are then those of N devices each training on its share, not one
device's. Batch normalisation is the case autopar recognises and can make
exact (Config(batch_norm_group), transforms/batchnorm.py); the others are
found here and reported, so the difference is never silent.

Found from data flow, in the forward computation of the losses (no gradient
op, no variable), on tensors computed from the input batch whose first
dimension is the batch's (the inputs' first dimension: unknown in a graph
built for any batch size):

- a reduction over the batch axis of such a tensor whose result is combined
  with such a tensor again (the losses' own reductions are combined with
  other scalars only; a reduction that keeps a first dimension of unknown
  size, as over a time-major tensor's axis 0, is not counted);
- a 2-D MatMul of two such tensors, either transposed (every example
  against every example: `q @ k^T`, a Gram matrix over the batch);
- a top-k (a sort) of one value per example: the batch's hardest examples.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.graph_utils import INPUT_OP_TYPES, reduces_batch_axis
from autopar.transforms.loss_counts import forward_ops

# Reductions whose input 1 lists the axes.
_REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm", "All", "Any"})
# Ops that rank the elements of their input's last axis (tf.sort and
# tf.argsort build TopKV2 too): over a vector of one value per example, a
# choice among the batch's examples (the k hardest).
_SELECTIONS = frozenset({"TopKV2", "TopK"})
# How far past a reduction its result is followed to where it meets an example.
_MAX_HOPS = 12


def find_batch_mixing(graph: tf.Graph, losses: list[str | None], batch_ops: set[str],
                      exempt: set[str]) -> list[str]:
    """The ops (sorted names) at which the losses' forward computation mixes
    the examples of a batch (module docstring). `batch_ops`: the ops computed
    from the input batch (graph_utils.batch_local_ops); `exempt`: ops handled
    elsewhere (batch-norm moments)."""
    cone = {op.name: op for loss in dict.fromkeys(x for x in losses if x)
            for op in forward_ops(graph.get_tensor_by_name(loss))}
    ops = list(cone.values())
    leading = {t.shape[0] for op in ops if op.type in INPUT_OP_TYPES
               for t in op.outputs if t.shape.rank}

    def per_example(t: tf.Tensor) -> bool:
        return (t.op.name in batch_ops and bool(t.shape.rank)
                and t.shape[0] in leading)

    def has_a_batch_dimension(t: tf.Tensor) -> bool:   # transposed or not
        return (t.op.name in batch_ops and t.shape.rank == 2
                and any(d in leading for d in t.shape))

    found = []
    for op in ops:
        if op.name in exempt:
            continue
        if op.type == "MatMul" and all(has_a_batch_dimension(x) for x in op.inputs[:2]):
            found.append(op.name)
        elif op.type in _SELECTIONS and per_example(op.inputs[0]) and op.inputs[0].shape.rank == 1:
            found.append(op.name)
        elif (op.type in _REDUCTIONS and per_example(op.inputs[0]) and reduces_batch_axis(op)
              and not (op.outputs[0].shape.rank and op.outputs[0].shape[0] is None)
              and _meets_an_example(op, cone, per_example)):
            found.append(op.name)
    return sorted(found)


def _meets_an_example(reduction: tf.Operation, cone: dict, per_example) -> bool:
    """Whether the reduction's result, within a few ops of the losses'
    forward computation, enters an op together with a per-example tensor
    that it does not itself produce."""
    mine, frontier = {reduction.name}, [reduction]
    for _ in range(_MAX_HOPS):
        following = []
        for op in frontier:
            for consumer in {c for t in op.outputs for c in t.consumers()}:
                if consumer.name not in cone or consumer.name in mine:
                    continue
                if any(per_example(x) and x.op.name not in mine for x in consumer.inputs):
                    return True
                mine.add(consumer.name)
                following.append(consumer)
        if not following:
            return False
        frontier = following
    return False


def mixing_note(ops: list[str], num_workers: int) -> str:
    """What the report and the chief's log say of `ops` (find_batch_mixing)."""
    shown = ", ".join(repr(op) for op in ops[:3]) + (f" (+{len(ops) - 3} more)"
                                                     if len(ops) > 3 else "")
    return (f"the loss mixes the examples of a batch at {shown} (in-batch negatives, a statistic "
            f"of the batch fed back into each example): each of the {num_workers} workers mixes "
            "only the examples of its own share, so the gradients are those of "
            f"{num_workers} devices each training on its share, not one device's on the global "
            "batch (batch normalisation is the case autopar makes exact: "
            "Config(batch_norm_group))")
