"""Losses normalised by a count taken from the batch's values.

A loss averaged over the tokens a mask keeps, `sum(loss * mask) /
sum(mask)`, divides by a count that depends on which examples a worker
holds: one device divides the global batch's sum by the global count, and
the mean of the workers' gradients, each divided by its own count, is not
that (a worker with few kept tokens would weigh as much as one with many).
tf.compat.v1.losses with weights builds this (SUM_BY_NONZERO_WEIGHTS, their
default, divides by the number of non-zero weights; MEAN by their sum), and
so does a Keras 3 loss over a masked sequence (each kept position weighs
size / count).

Found from data flow: the denominator of a division in the loss's forward
computation that is, up to casts and added or max'ed constants, a sum over
the batch axis of a tensor computed from the input batch's values alone
(no variable, no gradient; not just its shape, which the loss reduction
already accounts for). The rewrite makes the backward pass divide by the
count's sum over the workers, divided by the number of workers when their
gradients are averaged: worker w's gradient becomes N * grad(S_w) / (sum of
counts), whose mean over workers is one device's grad(S) / count on the
global batch. Only the backward pass reads the sum: the forward pass, and
the loss a worker reports, stay its own, so a worker can still compute the
loss alone (a collective there would wait for every worker).

A count that reaches the loss otherwise than as the denominator the backward
pass reads (Keras weighs each kept position of a masked sequence by
size / count, and differentiates through those weights) is refused by name:
rescaling it would need the forward pass's collective.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.graph_utils import VARIABLE_OP_TYPES, in_gradient_scope, reduces_batch_axis

_DIVISIONS = frozenset({"RealDiv", "Div", "DivNoNan", "TrueDiv"})
# Ops between a count and the division that keep it a count of the batch.
_UNARY = frozenset({"Identity", "Cast", "Snapshot", "StopGradient"})
_WITH_A_CONSTANT = frozenset({"Maximum", "Add", "AddV2"})
# Ops whose output depends on their input's shape only.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike",
                         "VariableShape"})


def find_loss_counts(graph: tf.Graph, losses: list[str | None],
                     input_types: frozenset[str]) -> list[str]:
    """The denominators (tensor names) of the divisions in the losses'
    forward computation that are counts of the batch's values."""
    out: list[str] = []
    for loss in dict.fromkeys(x for x in losses if x):
        for op in forward_ops(graph.get_tensor_by_name(loss)):
            if op.type in _DIVISIONS and op.inputs[1].dtype.is_floating:
                den = op.inputs[1]
                if den.name in out or not _is_value_count(den, input_types):
                    continue
                if not any(in_gradient_scope(c.name) for c in den.consumers()):
                    raise UnsupportedGraphError(
                        f"the loss '{loss}' is weighted through '{op.name}' by '{den.name}', a "
                        "count of the batch's values (a mask's sum, e.g. a Keras loss over a "
                        "masked sequence): one device counts the global batch, each worker its "
                        "share, and autopar cannot rescale a count the backward pass does not "
                        "divide by directly. Average the per-position losses yourself: "
                        "tf.reduce_sum(losses * mask) / tf.reduce_sum(mask)")
                out.append(den.name)
    return out


def forward_ops(t: tf.Tensor) -> list[tf.Operation]:
    """The ops `t` is computed from, not crossing a gradient scope or a variable."""
    seen, stack, out = {t.op.name}, [t.op], []
    while stack:
        op = stack.pop()
        out.append(op)
        for x in op.inputs:
            if x.op.name in seen or in_gradient_scope(x.op.name) or x.op.type in VARIABLE_OP_TYPES:
                continue
            seen.add(x.op.name)
            stack.append(x.op)
    return out


def _is_value_count(t: tf.Tensor, input_types: frozenset[str]) -> bool:
    while True:
        op = t.op
        if op.type in _UNARY:
            t = op.inputs[0]
        elif op.type in _WITH_A_CONSTANT:
            varying = [x for x in op.inputs if tf.get_static_value(x) is None]
            if len(varying) != 1:
                return False
            t = varying[0]
        else:
            break
    if t.op.type != "Sum" or not reduces_batch_axis(t.op):
        return False
    return _from_input_values(t.op.inputs[0], input_types)


def _from_input_values(t: tf.Tensor, input_types: frozenset[str]) -> bool:
    """Whether `t` is computed from an input's values (not only its shape)
    and reads no variable."""
    seen, stack, found = {t.op.name}, [t.op], False
    while stack:
        op = stack.pop()
        if op.type in VARIABLE_OP_TYPES or in_gradient_scope(op.name):
            return False
        if op.type in input_types:
            found = True
            continue
        if op.type in _SHAPE_ONLY:
            continue
        for x in op.inputs:
            if x.op.name not in seen:
                seen.add(x.op.name)
                stack.append(x.op)
    return found


def rewrite_loss_counts(graph: tf.Graph, counts: list[str], backend, keys,
                        divisor: int) -> tuple[dict[str, str], set[str]]:
    """Build each count's sum over workers divided by `divisor` in `graph`
    (the worker's scratch copy): a division, so that equal counts give back
    each worker's own exactly. Returns (count -> replacement that the
    backward pass reads instead; the ops that keep reading the counts: those
    built here and the forward pass's)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    forward: set[str] = set()
    with tf.name_scope("autopar/loss_count/"):
        for i, name in enumerate(counts):
            count = graph.get_tensor_by_name(name)
            forward |= {c.name for c in count.consumers() if not in_gradient_scope(c.name)}
            total = backend.allreduce_sum(tf.reshape(count, [1]), keys.key(i))
            rewire[name] = tf.reshape(total / tf.cast(divisor, count.dtype), tf.shape(count)).name
    built = {op.name for op in graph.get_operations()} - before
    return rewire, built | forward
