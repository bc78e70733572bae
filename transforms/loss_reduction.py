"""How a loss reduces over the batch (mean, sum, neither), read from the
graph: walks back from the loss through scaling, casts and added
batch-independent terms to the first reduction of a batch-dependent tensor
(reduce_mean / reduce_sum, and what tf.compat.v1.losses builds for its
reductions). The analysis decides with it how workers' gradients combine
(Analysis.loss_reduction), and batch weights (transforms.batch_weights)
which tensor's leading dimension is a loss's batch (batch_reduced).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.graph_utils import (VARIABLE_OP_TYPES, batch_local_ops, folded_value,
                                            in_gradient_scope, reduces_batch_axis, stacked_terms,
                                            uncast)

tf1 = tf.compat.v1


def loss_reduction_of_all(graph, losses: list[str | None],
                          batch_ops: set[str], rows=None) -> tuple[str, str]:
    """loss_reduction() of every distinct loss, when they agree (`batch_ops`:
    batch_local_ops(graph, set()))."""
    found = {loss: loss_reduction(graph, loss, batch_ops, rows) for loss in dict.fromkeys(losses)}
    if len(found) > 1:
        # a loss no input reaches (a tape that differentiates a regularizer
        # alone) says nothing of the batch
        found = {loss: value for loss, value in found.items()
                 if loss is None or graph.get_tensor_by_name(loss).op.name in batch_ops} or found
    if not found:
        return loss_reduction(graph, None)
    kinds = {kind for kind, _ in found.values()}
    if len(kinds) == 1:
        return next(iter(found.values()))
    if "neither" in kinds:
        return next(value for value in found.values() if value[0] == "neither")
    if {"mean", "sum"} <= kinds:
        # one aggregation for every gradient: one loss's would be off by N
        return "neither", ("the train ops' losses reduce differently over the batch (" + "; ".join(
            f"'{loss}': {kind}" for loss, (kind, _) in found.items()) + "): one aggregation of "
            "the workers' gradients matches one device for some of them only")
    return "unknown", ("the train ops' losses reduce differently over the batch: " + "; ".join(
        f"'{loss}': {kind}" for loss, (kind, _) in found.items()))


def loss_reduction(graph, loss: str | None, batch_ops: set[str] | None = None,
                   rows=None) -> tuple[str, str]:
    """("mean" | "sum" | "neither" | "unknown", why) for how the loss reduces over the
    batch: walks back from the loss through scaling, casts and added
    batch-independent terms to the first reduction of a batch-dependent
    tensor (reduce_mean / reduce_sum, and what tf.compat.v1.losses builds for
    its reductions: SUM is a Sum; MEAN, SUM_BY_NONZERO_WEIGHTS and
    SUM_OVER_BATCH_SIZE divide that Sum by a count of the batch). `batch_ops`:
    batch_local_ops(graph, set()), when the caller has it."""
    return _loss_reduction(graph, loss, batch_ops, rows)[:2]


def batch_reduced(graph, loss: str, batch_ops: set[str], rows=None) -> str | None:
    """A tensor whose leading dimension counts the examples over which
    `loss` is a mean (in proportion: transforms.batch_weights weighs by its
    share of the workers' sum): the tensor that reduction reduces (the
    per-example losses a reduce_mean averages, the values a Keras loss sums
    before dividing by their count), or, where the examples' forms (`rows`)
    show it reduces them along another axis (a mean over axis 1 of
    transposed errors), the batch's input tensor; None when the loss is no
    mean or shows none."""
    kind, _, reduced = _loss_reduction(graph, loss, batch_ops, rows)
    if kind != "mean" or reduced is None:
        return None
    form = rows.form(reduced) if rows is not None else ("",)
    if form[0] == "rows" and form[1] != 0:
        return rows.batch_input
    return reduced.name


# Why a loss's reduction is "unknown" when the loss itself shows none: no
# loss was found, or it reads no input (every worker computes one device's
# gradient of it, and averaging keeps it).
_NO_LOSS = "no loss tensor found"
_NO_INPUT = "does not depend on any input placeholder or iterator"


def no_loss_found(why: str) -> bool:
    """Whether a loss_reduction()'s `why` says no loss tensor was found."""
    return why == _NO_LOSS


def unread(kind: str, why: str) -> bool:
    """Whether a loss_reduction() of `kind` and `why` is one the loss shows
    but the analysis cannot read (an op between the loss and the batch's
    reduction that it has no rule for): averaging would be a guess."""
    return kind == "unknown" and why != _NO_LOSS and not why.endswith(_NO_INPUT)


def _loss_reduction(graph, loss: str | None, batch_ops: set[str] | None, rows=None):
    """loss_reduction() and the tensor the reduction it found reduces."""
    if loss is None:
        return "unknown", _NO_LOSS, None
    if batch_ops is None:
        batch_ops = batch_local_ops(graph, set())
    kind, why, reduced = _reduction_of(graph.get_tensor_by_name(loss), batch_ops, 0, rows)
    if kind == "const":
        return "unknown", f"the loss '{loss}' {_NO_INPUT}", None
    return kind, why, reduced


def _reduction_of(t: tf.Tensor, batch_ops: set[str], depth: int,
                  rows=None) -> tuple[str, str, tf.Tensor | None]:
    """(kind, why, the tensor the reduction found reduces over the batch)."""
    op = t.op
    if op.name not in batch_ops:
        return "const", "", None
    if depth > 50:
        return "unknown", f"'{op.name}' is too far from a recognised batch reduction", None
    if op.type in ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "Neg", "Snapshot",
                   "CheckNumerics", "CheckNumericsV2", "EnsureShape", "Print"):
        # ops that pass their first input's value on (tf.debugging.check_numerics,
        # tf.ensure_shape, tf.compat.v1.Print)
        return _reduction_of(op.inputs[0], batch_ops, depth + 1, rows)
    terms = stacked_terms(op)
    if terms is not None:
        return _reduction_of_terms(op, terms, batch_ops, depth, rows)
    if op.type == "L2Loss":   # tf.nn.l2_loss: half the sum of squares, the batch's too
        return "sum", f"'{op.name}' (tf.nn.l2_loss) sums over the batch", op.inputs[0]
    if op.type in ("Mean", "Sum"):
        if not _reduces_the_batch(op, rows):
            return _reduction_of(op.inputs[0], batch_ops, depth + 1, rows)
        kind = "mean" if op.type == "Mean" else "sum"
        # (a Sum of a scalar, as tf.compat.v1.losses builds, passes it through)
        reduced = op.inputs[0] if op.inputs[0].shape.rank != 0 else _reduced_in(op.inputs[0])
        return kind, f"'{op.name}' is a reduce_{kind} over the batch", reduced
    if op.type in ("Mul",):
        kinds = [_reduction_of(x, batch_ops, depth + 1, rows) for x in op.inputs]
        batch = [k for k in kinds if k[0] != "const"]
        if len(batch) == 1:
            return batch[0]
        return "unknown", f"'{op.name}' multiplies two batch-dependent tensors", None
    if op.type in ("RealDiv", "Div", "DivNoNan", "TrueDiv"):
        num, why, reduced = _reduction_of(op.inputs[0], batch_ops, depth + 1, rows)
        den = op.inputs[1]
        static = _constant_value(den, batch_ops)
        if num != "sum":
            if static is not None or den.op.name not in batch_ops:
                return num, why, reduced
            return "unknown", f"'{op.name}' divides a {num} by a batch-dependent tensor", None
        if static is not None:
            shape = _summed_shape(op.inputs[0])
            if static.size != 1:
                return "unknown", (f"'{op.name}' divides a sum over the batch by the constant "
                                   f"{static!r}, not a number"), None
            if shape is not None and shape.is_fully_defined() and float(static) in (
                    float(shape.num_elements()), float(shape[0] if shape.rank else 1)):
                # a static graph's own batch: the program averages over it
                return "mean", (f"'{op.name}' divides the sum by {float(static):g}, the number "
                                "of elements or examples summed (the per-worker batch)"), reduced
            # One device runs the same program on the global batch and divides
            # its sum by the same constant: the workers' losses add up to it.
            return "sum", (f"'{op.name}' divides a sum over the batch by the constant "
                           f"{float(static):g}, which is not the per-worker batch: a scaled sum "
                           "(as tf.nn.compute_average_loss with a global_batch_size), which one "
                           "device computes on the global batch as the workers' sum"), reduced
        if den.op.name in batch_ops:
            return "mean", (f"'{op.name}' divides a sum over the batch by the batch-derived "
                            f"count '{den.name}'"), reduced
        return "unknown", f"'{op.name}' divides a sum over the batch by '{den.name}'", None
    if op.type in ("Add", "AddV2", "AddN", "Sub"):
        return _reduction_of_terms(op, list(op.inputs), batch_ops, depth, rows)
    if op.type in ("Select", "SelectV2") and op.inputs[0].shape.rank == 0:
        # tf.where(c, a, b) of one condition (a flag fed with the run; one
        # computed from the batch is refused by transforms.batch_mixing): one
        # loss or the other, each as it reduces (a constant has no gradient)
        kinds = [_reduction_of(x, batch_ops, depth + 1, rows) for x in op.inputs[1:]]
        batch = [k for k in kinds if k[0] != "const"]
        if len({k[0] for k in batch}) == 1:
            return batch[0]
        return "unknown", f"'{op.name}' selects losses reduced differently over the batch", None
    return "unknown", (f"'{op.name}' ({op.type}) does not show how the loss reduces over the "
                       "batch"), None


# Ops whose output keeps its inputs' axes (elementwise), through which an
# axis 0 stays what it was.
_AXES_KEPT = frozenset("""
Identity Cast Neg Abs Square Sqrt Rsqrt Exp Log Log1p Sigmoid Tanh Relu Softplus Pow
Add AddV2 Sub Mul MulNoNan RealDiv Div DivNoNan Maximum Minimum SquaredDifference
StopGradient""".split())


def _reduces_the_batch(op: tf.Operation, rows) -> bool:
    """Whether the reduction `op` (a Sum or Mean) reduces the batch's axis:
    where the examples' forms say which axis of its input runs over them
    (`rows`: transforms.example_rows, once the analysis has them), that
    one, and none of an input that is already a reduction over them; else
    axis 0, unless an earlier reduction took it away."""
    form = rows.form(op.inputs[0]) if rows is not None else ("",)
    if form[0] == "reduced":
        return False
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if form[0] == "rows" and axes is not None and rank is not None:
        return form[1] in {int(a) % rank for a in axes.reshape(-1)}
    return reduces_batch_axis(op) and not _batch_axis_gone(op.inputs[0])


def _batch_axis_gone(t: tf.Tensor) -> bool:
    """Whether axis 0 of `t` is no longer the batch's: `t` is computed,
    through elementwise ops on tensors of its rank, from a reduction over
    axis 0 that dropped it (tf.reduce_sum(tf.reduce_mean(x, axis=0)): the
    per-class means over the batch, summed over the classes)."""
    rank = t.shape.rank
    if rank is None:
        return False
    stack, seen = [t], set()
    while stack:
        x = stack.pop()
        if x.name in seen or x.shape.rank != rank:
            continue
        seen.add(x.name)
        op = x.op
        if (op.type in ("Mean", "Sum") and op.inputs[0].shape.rank == rank + 1
                and reduces_batch_axis(op)):
            return True
        if op.type in _AXES_KEPT:
            stack.extend(op.inputs)
    return False


def _reduction_of_terms(op: tf.Operation, terms: list[tf.Tensor], batch_ops: set[str],
                        depth: int, rows=None) -> tuple[str, str, tf.Tensor | None]:
    """How a loss that `op` adds up from `terms` reduces over the batch."""
    # A constant term (Python's sum() of Keras's per-output losses starts
    # at 0) has no gradient: only the terms a gradient flows through count.
    kinds = [_reduction_of(x, batch_ops, depth + 1, rows) for x in terms
             if x.op.name in batch_ops or _constant_value(x, batch_ops) is None]
    batch = [k for k in kinds if k[0] != "const"]
    names = {k[0] for k in batch}
    if names == {"mean"}:
        return batch[0][0], batch[0][1] + " (other terms are averaged alike)", batch[0][2]
    if names == {"sum"} and len(batch) == len(kinds):
        return batch[0]
    if names == {"sum"}:
        return "neither", (f"'{op.name}' adds a batch-independent term (e.g. a regularizer) "
                           "to a loss summed over the batch: neither summing nor averaging "
                           "the workers' gradients gives one device's (summing them does, "
                           "Config(loss_reduction='sum'), where the graph each worker builds "
                           "divides the term by autopar.num_workers(), 1 outside a job: a "
                           "TF1 graph or a step the script traces, not an autopar.fit "
                           "train_step, which the launcher traces once)"), None
    if names == {"mean", "sum"}:
        return "neither", (f"'{op.name}' adds a loss averaged over the batch to one summed over "
                           "it: summing the workers' gradients counts the mean N times, "
                           "averaging them divides the sum by N"), None
    return "unknown", f"'{op.name}' combines terms reduced differently over the batch", None


def _reduced_in(t: tf.Tensor) -> tf.Tensor | None:
    """What the reduction producing the scalar `t` reduces (through casts
    and identities), or None."""
    t = uncast(t)
    if t.op.type in ("Sum", "Mean") and t.op.inputs[0].shape.rank != 0:
        return t.op.inputs[0]
    return None


def _constant_value(t: tf.Tensor, batch_ops: set[str]):
    """The value of `t` if it is computed from constants alone (a count taken
    from static shapes: tf.shape of a fully defined shape, ones_like...), else
    None. Beyond what graph_utils.folded_value folds, such a small stateless
    subgraph is evaluated once in a throwaway session: it reads no variable,
    input or state, so the value is the same in every run."""
    value = folded_value(t)
    if value is not None:
        return value
    frontier, seen = [t.op], {t.op.name}
    while frontier:
        op = frontier.pop()
        if (op.name in batch_ops or op.type in VARIABLE_OP_TYPES or op.op_def.is_stateful
                or in_gradient_scope(op.name) or len(seen) > 200):
            return None
        for x in [*op.inputs, *op.control_inputs]:
            x_op = x if isinstance(x, tf.Operation) else x.op
            if x_op.name not in seen:
                seen.add(x_op.name)
                frontier.append(x_op)
    with tf1.Session(graph=t.graph) as session:
        return session.run(t)


def _summed_shape(t: tf.Tensor) -> tf.TensorShape | None:
    """The shape of what the reduce_sum (or tf.nn.l2_loss) producing `t` adds."""
    # (a Sum of a scalar, as tf.compat.v1.losses builds, passes it through)
    while t.op.type in ("Identity", "Cast") or (t.op.type == "Sum" and t.op.inputs[0].shape.rank == 0):
        t = t.op.inputs[0]
    if t.op.type not in ("Sum", "L2Loss"):
        return None
    return t.op.inputs[0].shape
