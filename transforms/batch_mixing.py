"""Losses that mix the examples of a batch.

Data-parallel training gives each worker a share of the global batch. Where
the loss of one example depends only on that example, the workers' gradients
combine into one device's on the global batch (averaged or added, as the loss
reduces). Where an example's value depends on other examples of its batch,
each worker mixes only the examples of its own share: in-batch negatives (the
logits of every query against every key of the batch, `q @ k^T`, however
written: MatMul, BatchMatMul, einsum), a statistic of the batch fed back into
each example (centring by the batch's mean, `l2_normalize(x, axis=0)`, class
weights counted over the batch), the batch's hardest examples (a top-k over
them), examples paired with others (a batch rolled along its examples),
examples taken by their place in the batch (its first example, its first two
rows), pieces of the batch cut at a point computed from its size (its halves:
one device cuts the global batch, each worker its share, and that trains
alike only where every piece is treated alike and every share splits as
the global batch does, which is not proven), a loss that is no sum or mean of its examples' terms (the square root
of a mean: one device takes it of the global batch's mean, each worker of its
share's; a sum divided by the batch's longest length). The gradients are
then those of N devices each training on its share, not one device's: such
a loss is refused (the analysis cannot make it equal), unless the program
asks for per-worker semantics (Config(batch_mixing="per_worker")). A mean of
the values a mask of the batch keeps (tf.where, tf.dynamic_partition) is
refused alike: each worker would divide by its own count of them. Batch
normalisation is the case autopar
recognises and can make exact (Config(batch_norm_group),
transforms/batchnorm.py); a masked loss's count of kept positions is made
one device's by transforms.loss_counts.

Found from data flow (transforms.example_rows): the losses' forward
computation is followed from the input batch, and an op whose result depends
on several examples otherwise than by the losses' reductions mixes them; so
does an op autopar has no rule for, since nothing shows it does not.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.example_rows import (DIM, OPAQUE, REDUCTIONS, SELECTIONS_BY_VALUE,
                                              SHARED, ExampleRows, per_example)
from autopar.transforms.features.base import GraphFeature
from autopar.transforms.graph_index import GraphIndex
from autopar.transforms.graph_utils import reads_a_variable
from autopar.transforms.loss_reduction import loss_reduction

# What a loss may do with reductions over the batch and stay a sum or mean of
# its examples' terms, which the workers' gradients combine into one
# device's: add them, cast, reshape, stack or reduce them again; scale them
# by (or divide them by) a value no worker's values make its own
# (_per_worker_factor). The ops of a function (a cond's branch) are not
# looked into here.
_LINEAR_OF_REDUCTIONS = frozenset("""
Add AddV2 Sub AddN BiasAdd Neg Cast Identity IdentityN Snapshot StopGradient PreventGradient
CheckNumerics CheckNumericsV2 EnsureShape Reshape Squeeze ExpandDims StridedSlice Slice Pack
Unpack ConcatV2 Concat Transpose Sum Mean ZerosLike OnesLike PartitionedCall
StatefulPartitionedCall If StatelessIf While StatelessWhile""".split())
_SCALINGS = frozenset({"Mul", "MulNoNan"})
_DIVISIONS = frozenset({"Div", "RealDiv", "DivNoNan"})
_SELECTIONS = frozenset({"Select", "SelectV2"})
# Reductions over the batch that are no sum of its examples' terms.
_NONLINEAR_REDUCTIONS = (REDUCTIONS - {"Sum", "Mean"}) | {
    "UnsortedSegmentMax", "UnsortedSegmentMin", "UnsortedSegmentProd", "SegmentMax",
    "SegmentMin", "SegmentProd"}


class BatchMixing(GraphFeature):
    """Losses that mix the examples of a batch: refused on several workers
    unless Config(batch_mixing="per_worker"), which the report notes."""
    name = "batch_mixing"
    fields = ("batch_mixing",)
    after = ("example_rows",)

    def find(self, facts):
        found = find_batch_mixing(facts.graph, facts.shared["rows"], facts.every_loss,
                                  facts.index)
        for op, why in inner_gradients_of_the_batch(facts).items():
            found.setdefault(op, why)
        return {"batch_mixing": found}

    def check(self, analysis, plan, config):
        if analysis.batch_mixing and plan.num_workers > 1 and config.batch_mixing == "refuse":
            raise UnsupportedGraphError(mixing_refusal(analysis.batch_mixing, plan.num_workers))

    def notes(self, analysis, plan, num_workers):
        return [mixing_note(analysis.batch_mixing, num_workers)] if (
            analysis.batch_mixing and num_workers > 1) else []


def find_batch_mixing(graph: tf.Graph, rows: ExampleRows, losses: list[str | None],
                      index: GraphIndex | None = None) -> dict[str, str]:
    """{op: what it does} for the ops at which the losses' values come to
    depend on several examples of the batch (module docstring), in graph
    order: walking back from each loss through the tensors whose forms say
    so, to the op where each such form began; and the cuts of the share
    (rows.cuts) the losses are computed from. `index`: the graph's
    GraphIndex, when the caller has it."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    stack = [graph.get_tensor_by_name(loss) for loss in dict.fromkeys(x for x in losses if x)]
    while stack:
        t = stack.pop()
        form = rows.form(t)
        if t.name in seen or t.name in rows.stops:   # (a count made one device's)
            continue
        if form[0] == "reduced":
            seen.add(t.name)
            why = _not_a_sum_of_examples(t.op, rows)
            if why:
                found.setdefault(t.op.name, why)
            else:
                stack.extend(t.op.inputs)
            continue
        if form[0] not in OPAQUE:
            continue
        seen.add(t.name)
        if form[1] not in found:
            found[form[1]] = _what(_op_named(graph, form[1]), form[0], rows)
        # (a reduction's value mixed back in is named where the mixing began)
        stack.extend(x for x in t.op.inputs if rows.form(x)[0] != "reduced")
    if rows.cuts:
        index = index or GraphIndex(graph)
        computed_from = index.computing(losses)
        for step_op, (op, op_type) in rows.cuts.items():
            if index.position[step_op] in computed_from:
                found.setdefault(op, _cut(op_type))
    order = index.position if index is not None else {
        op.name: i for i, op in enumerate(graph.get_operations())}
    return dict(sorted(found.items(), key=lambda item: order.get(item[0], 0)))


def inner_gradients_of_the_batch(facts) -> dict[str, str]:
    """{op: why} for the gradients of a loss of the batch that the trained
    losses are computed from (`facts.inner_seeds`: a tf.gradients or an
    inner tape inside the loss), where one device's differs from what each
    worker computes on its share. With respect to a variable (a step of
    MAML's inner loop) such a gradient sums over the batch's examples, each
    worker's over its own; with respect to the batch's own values (an
    adversarial example's step, an input-gradient penalty) it is each
    example's, scaled by 1 / b when the loss is a mean over the batch: the
    worker's b, not one device's. Exact, so left alone: the gradient of a
    loss of one value per example (a critic's outputs: WGAN-GP's penalty)
    or of a sum over the batch, with respect to the batch's values, and one
    read only through its sign (the fast gradient sign method). Which
    values a gradient is taken with respect to is read from its shape: one
    of a trainable variable's (fully known) is a variable's."""
    graph, index = facts.graph, facts.index
    if not facts.inner_seeds:
        return {}
    variable_shapes = {tuple(v.shape.as_list()) for v in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES) if v.shape.is_fully_defined()}
    # (the backward passes that train, which differentiate through the inner ones)
    outer = index.reachable([index.position[seed] for seed, _ in facts.trained_seeds])
    found: dict[str, str] = {}
    for seed, loss in facts.inner_seeds:
        loss_t = graph.get_tensor_by_name(loss)
        if loss_t.op.name not in facts.input_ops:
            continue   # (a regularizer's gradient: no example in it)
        if loss_t.shape.rank == 0:
            kind = loss_reduction(graph, loss, facts.input_ops, facts.shared["rows"])[0]
        else:
            kind = "each example's"   # tf.gradients adds the examples' values up
        for i in index.reachable([index.position[seed]]):
            if not index.in_gradient[i] or i in outer:
                continue
            for k, readers in index.consumers[i].items():
                if all(index.in_gradient[r] for r in readers):
                    continue
                t = index.ops[i].outputs[k]
                if t.shape.is_fully_defined() and tuple(t.shape.as_list()) in variable_shapes:
                    found.setdefault(t.op.name, (
                        f"a gradient of the batch's loss '{loss}' with respect to a variable, "
                        "taken inside the loss (tf.gradients or an inner tape: a step of an "
                        "inner loop): a sum over the batch's examples"))
                elif kind not in ("sum", "each example's") and not _signs_only(t):
                    found.setdefault(t.op.name, (
                        f"a gradient of '{loss}', a loss {_reduced(kind)}, with respect to the "
                        "batch's own values, taken inside the loss (an adversarial example's "
                        "step, an input-gradient penalty): it is scaled by 1 / the batch's "
                        "size, each worker's share's, not one device's; take it of the "
                        "examples' sum (tf.reduce_sum) or of each example's loss"))
    return found


def _signs_only(t: tf.Tensor) -> bool:
    """Whether `t` is read only through its sign (tf.sign, through
    identities: the fast gradient sign method's step), which no positive
    scale changes."""
    readers = [c for c in t.consumers()]
    while readers:
        c = readers.pop()
        if c.type in ("Identity", "StopGradient"):
            readers.extend(c.outputs[0].consumers())
        elif c.type != "Sign":
            return False
    return True


def _reduced(kind: str) -> str:
    return {"mean": "averaged over the batch", "neither": "reduced over the batch in no "
            "single way", "unknown": "whose reduction over the batch the graph does not show"
            }.get(kind, kind)


def _an(op_type: str) -> str:
    """'a Mean', 'an Einsum': an op type as the refusals name it."""
    return f"{'an' if op_type[0] in 'AEIOU' else 'a'} {op_type}"


def _cut(op_type: str) -> str:
    return (f"{_an(op_type)} cutting each worker's share at a point computed from its size (its halves): "
            "one device cuts the global batch, each worker its share, and autopar does not "
            "prove that every piece is treated alike and every share splits as the global "
            "batch does; Config(micro_batches=M) accumulates micro-batches exactly")


def _not_a_sum_of_examples(op: tf.Operation, rows: ExampleRows) -> str | None:
    """Why `op`, on the way from reductions over the batch to a loss, leaves
    the loss no sum or mean of the examples' terms (None when it does not):
    a reduction that is no sum (the batch's largest loss), or a nonlinear
    function of a reduction (the square root of a mean: one device takes it
    of the global batch's mean, each worker of its share's, and no
    combination of the workers' gradients gives one device's)."""
    ins = [rows.form(x) for x in op.inputs]
    reduced = [i for i, f in enumerate(ins) if f[0] == "reduced"]
    a = _an(op.type)
    if not reduced:
        if op.type in _NONLINEAR_REDUCTIONS and any(per_example(f) for f in ins):
            return (f"{a} over the batch's examples: the loss is no sum or mean of each "
                    "example's terms")
        return None
    if op.type in _LINEAR_OF_REDUCTIONS or (op.type in _SELECTIONS and ins[0] == SHARED):
        return None
    if (op.type in _SCALINGS and len(reduced) == 1) or (
            op.type in _DIVISIONS and reduced == [0]):
        factor = op.inputs[1 - reduced[0]] if op.type in _SCALINGS else op.inputs[1]
        return _per_worker_factor(factor, rows, "a division by" if op.type in _DIVISIONS
                                  else "a product with")
    if op.type in _DIVISIONS and reduced == [0, 1] and not reads_a_variable(op.inputs[1]):
        return _per_worker_factor(op.inputs[1], rows, "a division by")
    source = op.inputs[1 if op.type in _DIVISIONS and 1 in reduced else reduced[0]]
    return (f"{a} of a reduction over the batch's examples ('{source.op.name}'): "
            "the loss is no sum or mean of each example's terms (one device applies it to "
            "the global batch's reduction, each worker would to its share's)")


def _per_worker_factor(t: tf.Tensor, rows: ExampleRows, how: str) -> str | None:
    """Why scaling a reduction over the batch by `t` leaves the loss no
    sum or mean of the examples' terms, or None: `t` the same on every
    worker as on one device (a constant, a fed rate), computed from the
    batch's shape alone (its count of examples, the loss's mean, which the
    workers' weights make one device's; a padded length, which
    transforms.padded_lengths checks is), or a count of the batch's values
    that transforms.loss_counts makes the global batch's. A value read from
    the batch's values otherwise (its longest sequence's length, a mean of
    its labels) is its share's, where one device's is the global batch's."""
    source = rows.batch_values_read(t)
    if source is None:
        return None
    return (f"{how} '{t.op.name}', a statistic of the worker's batch's values ('{source}'), "
            "no count of its examples (the batch's longest length, a mean of its labels): "
            "one device takes it of the global batch, each worker would of its share")


def _op_named(graph: tf.Graph, name: str) -> tf.Operation | None:
    """The op `name` of `graph`, or None for one of a function's body (a
    loop's, a cond branch's), whose forms transforms.example_rows follows."""
    try:
        return graph.get_operation_by_name(name)
    except KeyError:
        return None


def _what(op: tf.Operation | None, kind: str, rows: ExampleRows) -> str:
    if op is None:
        return ("an op of a function the step runs (a loop's body, a cond's branch) "
                + {"unknown": "for which autopar has no rule saying whether it keeps each "
                              "example to itself",
                   "picked": "taking examples by their place in the batch",
                   "kept": "averaging or counting the values a mask of the batch keeps"}.get(
                       kind, "combining the values of several examples"))
    a = _an(op.type)
    if kind == "kept":
        return (f"{a} of the values '{rows.selected_by(op.inputs[0])}' keeps by the batch's "
                f"values (tf.where of a mask, tf.dynamic_partition): {_MASK_COUNTS}")
    if kind == "picked":
        return (f"{a} taking examples by their place in the batch (x[0], x[:2], fixed rows): "
                "one device takes them from the global batch, each worker from its share")
    if kind == "unknown":
        return (f"{a} op, for which autopar has no rule saying whether it keeps each "
                "example to itself")
    if op.type in ("Mean", "Sum") and rows.form(op.inputs[0])[0] in ("parts", "cat"):
        return (f"{a} over the batch's rows and rows of no example (a concat of the batch with "
                "other rows, a pad of it): one device takes those rows once with the global "
                "batch, each worker once with its share"
                + (", and divides by the count of both" if op.type == "Mean" else
                   ", so what they give a variable's gradient counts once on every worker"))
    if op.type in ("Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm", "All", "Any"):
        return f"{a} over the batch's examples, fed back into each example"
    if op.type in ("TopKV2", "TopK"):
        return "a top-k over the batch's examples (the batch's hardest examples)"
    if op.type in ("GatherV2", "Gather", "GatherNd") and _by_a_mask(op.inputs[1]):
        return (f"{a} of the values a mask of the batch keeps (tf.boolean_mask, tf.where): "
                + _MASK_COUNTS)
    if op.type in ("While", "StatelessWhile"):
        bound = next((x.op.name for x in op.inputs
                      if rows.form(x) == DIM and rows.batch_values_read(x)), op.name)
        return (f"{a} running as many times as '{bound}', a statistic of the worker's batch's "
                "values, says (a loop to the batch's longest sequence, as dynamic_rnn runs "
                "with a sequence_length): one device runs it for the global batch, each worker "
                "for its share. Loop over a length of the batch's shape (a padded length) or a "
                "fixed one, and mask the ended sequences")
    if op.type in ("Switch", "RefSwitch", "If", "StatelessIf"):
        decided_by = op.inputs[1 if op.type.endswith("Switch") else 0].op.name
        return (f"{a} deciding by a value of the whole batch ('{decided_by}'): one device "
                "decides once for the global batch, each worker for its share (a decision by "
                "whether every example, or any, passes a test is checked alike on every "
                "worker instead: tf.reduce_all, tf.reduce_any)")
    if op.type in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"):
        return f"{a} of examples with other examples (in-batch negatives, a Gram matrix)"
    return f"{a} combining the values of several examples"


_MASK_COUNTS = ("their count differs between the workers' shares otherwise than by their "
                "sizes, and a mean over them, or a division by their count, is not one "
                "device's; a masked loss written sum(loss * mask) / sum(mask) trains exactly")


def _by_a_mask(indices: tf.Tensor) -> bool:
    """Whether gather indices are the positions a mask keeps (tf.where of
    it, squeezed or sliced, as tf.boolean_mask builds them)."""
    op = indices.op
    while op.type in ("Squeeze", "Reshape", "StridedSlice", "Cast", "Identity"):
        op = op.inputs[0].op
    return op.type in SELECTIONS_BY_VALUE


def mixing_refusal(ops: dict[str, str], num_workers: int) -> str:
    """The message refusing a loss that mixes the batch at `ops`."""
    shown = "; ".join(f"'{name}' ({what})" for name, what in list(ops.items())[:3])
    more = f" (+{len(ops) - 3} more)" if len(ops) > 3 else ""
    return (f"the loss mixes the examples of a batch at {shown}{more}: on {num_workers} "
            "workers each would mix only the examples of its own share, so the gradients "
            f"would be those of {num_workers} devices each training on its share, not one "
            "device's on the global batch. Compute the loss of each example from that "
            "example alone (batch normalisation is made exact by Config(batch_norm_group)), "
            "or set Config(batch_mixing=\"per_worker\") to train each worker's share that way")


def mixing_note(ops: dict[str, str], num_workers: int) -> str:
    """What the report and the chief's log say when the program asked for
    per-worker semantics."""
    shown = ", ".join(repr(op) for op in list(ops)[:3]) + (f" (+{len(ops) - 3} more)"
                                                           if len(ops) > 3 else "")
    return (f"the loss mixes the examples of a batch at {shown}; with "
            f"Config(batch_mixing=\"per_worker\") each of the {num_workers} workers mixes only "
            "the examples of its own share, so the gradients are those of "
            f"{num_workers} devices each training on its share, not one device's")
