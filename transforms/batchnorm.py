"""Distributed batch normalisation (TPU-pod scaling paper §3): batch-norm
layers in training mode take their batch statistics over the workers of a
group, so with the group = all workers the forward pass, the gradients and
the moving statistics are one device's on the global batch.

Two forms of a training-mode batch-norm layer are recognised:

- "moments": ``tf.nn.moments`` (what Keras BatchNormalization and the
  unfused ``tf.nn.batch_normalization`` path build): ``mean = Mean(x)``,
  ``variance = Mean(SquaredDifference(x, StopGradient(mean)))``.
  The rewrite replaces the local mean by the group's (an all-reduce of
  count-weighted means and of the counts), so the squared differences are
  taken around the group mean, and the local variance by the group's (an
  all-reduce of count-weighted variances). Every consumer, in the forward
  and in the backward pass, reads the group statistics. The backward pass of
  the two Mean ops then needs the gradient of the *group's* losses with
  respect to the shared statistics: the upstream gradient entering each
  Mean's gradient ops is all-reduced (summed) and scaled by this worker's
  share of the count, after which TensorFlow's own Mean gradient divides by
  the local count: d(sum of losses)/dx = sum of upstream / total count.
- "fused": ``FusedBatchNorm{,V2,V3}`` with ``is_training=True``. Its
  gradient op (FusedBatchNormGrad*) computes local batch means of the
  incoming gradient internally, which no edit of its inputs can make global,
  so both ops are replaced by an equivalent unfused computation with the
  group moments (forward) and group sums of dy and dy*x_hat (backward). The
  original ops stay in the graph unread.

All collectives go through the communication backend (transforms.comm).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import tensorflow as tf

from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.transforms.features.base import (GraphFeature, Rewiring, in_step_cond,
                                               in_step_flag)
from autopar.transforms.example_rows import IFS, function_graph
from autopar.transforms.graph_utils import in_gradient_scope, node_input_name
from autopar.transforms.keys import BATCH_NORM, BATCH_NORM_GROUPS

_FUSED_TYPES = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
_FUSED_GRAD_TYPES = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2",
                               "FusedBatchNormGradV3"})
# Collectives of one layer: forward mean, forward variance, then one per
# backward all-reduce: the one backward pass's (the common case), or, for a
# layer several backward passes go through (a GAN's two tapes), one per
# pass (fused) or per upstream gradient (moments).
BACKWARD_KEYS = 8
KEYS_PER_LAYER = 2 + BACKWARD_KEYS


@dataclass
class BatchNormInfo:
    name: str                 # the layer's scope, e.g. "block1/bn"
    kind: str                 # "moments" or "fused"
    ops: list[str]            # moments: [mean op, variance op]; fused: [the fused op]
    grad_ops: list[str] = field(default_factory=list)   # fused: its gradient op
    # Non-trainable state the layer's batch statistics update (moving mean/variance).
    moving: list[str] = field(default_factory=list)


def find_batch_norms(graph: tf.Graph, batch_local: set[str],
                     writers: dict[str, list[str]], candidates=None) -> list[BatchNormInfo]:
    """Training-mode batch-norm layers whose input depends on the input batch
    (`batch_local`: ops fed by it), in graph order. `writers`: variable ->
    the ops writing it (to name the moving statistics each layer updates).
    `candidates`: the graph's Mean and fused batch-norm ops in graph order,
    when the caller's index has them (else every op is looked at)."""
    written = {w: var for var, ws in writers.items() for w in ws}
    out = []
    for op in graph.get_operations() if candidates is None else candidates:
        if in_gradient_scope(op.name) or op.name not in batch_local:
            continue
        info = None
        if op.type == "Mean":
            variance = _moments_variance(op)
            if variance is not None and _normalises_examples(variance, batch_local):
                info = BatchNormInfo(_scope(op.name), "moments", [op.name, variance.name])
                stats = [op.outputs[0], variance.outputs[0]]
        elif (op.type in _FUSED_TYPES and op.get_attr("is_training")
              and op.inputs[0].shape.rank is not None and op.inputs[0].shape[0] != 1):
            # (a batch of one is the layer-normalisation trick: examples as channels)
            grads = sorted(c.name for c in op.outputs[3].consumers()
                           if c.type in _FUSED_GRAD_TYPES)
            info = BatchNormInfo(_scope(op.name), "fused", [op.name], grads)
            stats = [op.outputs[1], op.outputs[2]]
        if info is not None:
            info.moving = _moving_statistics(stats, written)
            if info.moving:   # the layer's own scope reads better than the op's
                info.name = info.moving[0].rsplit("/", 1)[0] if "/" in info.moving[0] else info.name
            out.append(info)
    return out


def _scope(name: str) -> str:
    scope = name.rsplit("/", 1)[0] if "/" in name else name
    return scope[: -len("/moments")] if scope.endswith("/moments") else scope


def _moments_variance(mean: tf.Operation) -> tf.Operation | None:
    """The variance Mean of tf.nn.moments whose mean is `mean`, or None."""
    x = mean.inputs[0]
    axes = tf.get_static_value(mean.inputs[1])
    if axes is None or x.shape.rank is None:
        return None
    # Batch statistics reduce the batch axis; moments over features only
    # (layer normalisation) are per example and stay local.
    if not any(int(a) % x.shape.rank == 0 for a in axes.reshape(-1)):
        return None
    for stop in mean.outputs[0].consumers():
        if stop.type != "StopGradient":
            continue
        for diff in stop.outputs[0].consumers():
            if (diff.type != "SquaredDifference" or diff.inputs[0] is not x
                    or diff.inputs[1] is not stop.outputs[0]):
                continue
            for var in diff.outputs[0].consumers():
                other = tf.get_static_value(var.inputs[1]) if var.type == "Mean" else None
                if other is not None and sorted(other.reshape(-1).tolist()) == \
                        sorted(axes.reshape(-1).tolist()):
                    return var
    return None


# V1 control flow a statistic passes unchanged: a TF1 layer's choice between
# the batch's statistics and the moving ones, tf.cond(training, ...) after
# disable_v2_behavior() (tf.compat.v1.layers.batch_normalization with a
# `training` tensor takes the moments outside it, then picks).
_V1_CHOICE = frozenset({"Switch", "RefSwitch", "Merge", "RefMerge"})
# What lies between a layer's variance and its examples' normalisation:
# tf.nn.batch_normalization's rsqrt(variance + epsilon) * scale, reshaped or
# cast for the layer's axis and dtype.
_TOWARDS_NORMALISATION = frozenset({"AddV2", "Add", "Rsqrt", "Sqrt", "Mul", "RealDiv", "Div",
                                    "Reciprocal", "Reshape", "Squeeze", "ExpandDims",
                                    "Identity", "Cast"}) | _V1_CHOICE
_NORMALISATIONS = frozenset({"Mul", "RealDiv", "Div"})


def _passed_through(cond: tf.Operation, t: tf.Tensor) -> list[tf.Tensor]:
    """The outputs of a functional cond that are its input `t` unchanged when
    the cond is true (TensorFlow 2's tf.cond(training, the batch's statistic,
    the moving one): tf.compat.v1.layers.batch_normalization with a
    `training` tensor in control flow v2); [] when none is."""
    body = function_graph(cond.graph, cond.get_attr("then_branch").name,
                          [x.shape for x in cond.inputs[1:]])
    if body is None or len(body.inputs) < len(cond.inputs) - 1:
        return []
    args = {body.inputs[i - 1].name for i, x in enumerate(cond.inputs) if i and x is t}
    out = []
    for j, result in enumerate(body.outputs):
        while result.op.type == "Identity":
            result = result.op.inputs[0]
        if result.name in args and j < len(cond.outputs):
            out.append(cond.outputs[j])
    return out


def _normalises_examples(variance: tf.Operation, batch_local: set[str],
                         depth: int = 8) -> bool:
    """Whether a batch variance normalises the batch's values, as a
    batch-norm layer's does (x * rsqrt(variance + epsilon) * scale): a Mul
    or division of what it gives by a value of the batch within `depth`
    ops. tf.nn.moments of the batch read otherwise (the batch's variance in
    a loss) is a statistic of the batch like any other, which
    transforms.batch_mixing judges."""
    frontier, seen = [variance.outputs[0]], {variance.name}
    for _ in range(depth):
        reached = []
        for t in frontier:
            for op in t.consumers():
                if op.type in IFS and not in_gradient_scope(op.name):
                    reached.extend(_passed_through(op, t))
                    continue
                if op.name in seen or in_gradient_scope(op.name) \
                        or op.type not in _TOWARDS_NORMALISATION:
                    continue
                seen.add(op.name)
                if op.type in _NORMALISATIONS and any(
                        x is not t and x.op.name in batch_local and x.op.name not in seen
                        for x in op.inputs):
                    return True
                reached.extend(op.outputs)
        frontier = reached
    return False


def _moving_statistics(stats: list[tf.Tensor], written: dict[str, str]) -> list[str]:
    """Variables written from the statistics within a few elementwise ops
    (moving = moving * m + stat * (1 - m), or the fused op's own average),
    through conds that pass them on unchanged and identities."""
    found, frontier, seen = set(), [(t, 0) for t in stats], set()
    while frontier:
        t, depth = frontier.pop()
        for c in t.consumers():
            if in_gradient_scope(c.name):
                continue
            if c.type in IFS:   # (only the outputs that are t)
                frontier.extend((out, depth) for out in _passed_through(c, t))
                continue
            if c.name in seen:
                continue
            seen.add(c.name)
            if c.name in written:
                found.add(written[c.name])
            elif c.type in _V1_CHOICE or c.type == "Identity":   # (not counted)
                frontier.extend((out, depth) for out in c.outputs)
            elif depth < 4 and c.type in ("Squeeze", "Mul", "Sub", "AddV2", "Add", "Cast",
                                          "Reshape"):
                frontier.extend((out, depth + 1) for out in c.outputs)
    return sorted(found)


class BatchNorm(GraphFeature):
    """Config(batch_norm_group): training-mode batch-norm layers on the input
    batch take their statistics over a group of workers."""
    name = "batch_norm"
    fields = ("batch_norms",)
    keys = (BATCH_NORM, BATCH_NORM_GROUPS)

    def find(self, facts):
        return {"batch_norms": find_batch_norms(facts.graph, facts.batch_local, facts.writers,
                                                facts.index.of_types(("Mean", *_FUSED_TYPES)))}

    def plan_fields(self, analysis, options, topology, variables):
        BATCH_NORM.check_end(BATCH_NORM.first + KEYS_PER_LAYER * len(analysis.batch_norms))
        option = options.batch_norm_group
        if option == "auto":
            option = "all" if analysis.batch_norms else None
        return {"batch_norm_group": batch_norm_group_size(option, topology.num_workers)}

    def check(self, analysis, plan, config):
        if plan.batch_norm_group and analysis.batch_norms and config.micro_batches > 1:
            raise UnsupportedGraphError(
                f"batch norm '{analysis.batch_norms[0].name}': with Config(micro_batches="
                f"{config.micro_batches}) each worker computes a step in micro-batches, whose "
                "batch statistics are neither the global batch's nor taken over the workers "
                "(a micro-batch's run is no training step of every worker); use "
                "micro_batches=1, or Config(batch_norm_group=None) for each micro-batch's own "
                "statistics")

    def rewrite(self, ctx):
        plan = ctx.plan
        if not plan.batch_norm_group or not ctx.analysis.batch_norms:
            return None
        size, group_key = group_of(ctx.worker_index, plan.batch_norm_group, plan.num_workers,
                                   plan.group_key, BATCH_NORM_GROUPS.first)
        group = ctx.backend if size == plan.num_workers else ctx.backend.subgroup(size, group_key)
        flag = in_step_flag(ctx.graph)
        rewire, exempt = rewrite_batch_norms(ctx.graph, ctx.analysis.batch_norms,
                                             InTrainingSteps(group, flag), plan.batch_norm_key,
                                             ctx.constants)
        return Rewiring(rewire, exempt | {flag.op.name}, outputs={"in_step": flag.name})

    def notes(self, analysis, plan, num_workers):
        if plan.batch_norm_group and not analysis.batch_norms:
            return ["Config(batch_norm_group) is set but the graph has no training-mode "
                    "batch-norm layer on the input batch: nothing to synchronise"]
        return []

    def report_fields(self, analysis, plan):
        return {"batch_norms": [{"name": b.name, "kind": b.kind, "ops": b.ops,
                                 "group": plan.batch_norm_group, "moving": b.moving}
                                for b in analysis.batch_norms]}


class InTrainingSteps:
    """A group's sum over its workers in a training step (which every worker
    runs), and the worker's own value (a group of one) in any other run: a
    forward pass the chief runs alone (an evaluation, a prediction) then
    normalises by the batch it was given, as one device does, instead of
    waiting for workers that never join."""

    def __init__(self, group, flag: tf.Tensor):
        self._group = group
        self._flag = flag

    def allreduce_sum(self, x: tf.Tensor, key: int) -> tf.Tensor:
        return in_step_cond(self._flag, lambda: self._group.allreduce_sum(x, key),
                            lambda: tf.identity(x))


def batch_norm_group_size(option: str | int | None, num_workers: int) -> int:
    """Workers per batch-norm group for Config(batch_norm_group=option); 0 =
    off (None, or groups of one worker: each normalises by its own batch)."""
    if option is None:
        return 0
    size = num_workers if option == "all" else option
    if not isinstance(size, int) or size < 1 or num_workers % size:
        raise AutoparError(
            f"Config.batch_norm_group={option!r} does not split the job's {num_workers} workers "
            "into equal groups: use 'all', None, or a group size dividing the worker count")
    return 0 if size == 1 else size


# ---------------------------------------------------------------------------
# The rewrite

def group_of(worker_index: int, group_size: int, num_workers: int,
             all_group_key: int, group_key_base: int) -> tuple[int, int]:
    """(group size, collective group key) of worker_index's batch-norm group:
    consecutive workers [g*k, (g+1)*k); the group of all workers is the job's
    own collective group."""
    if group_size == num_workers:
        return num_workers, all_group_key
    return group_size, group_key_base + worker_index // group_size


def rewrite_batch_norms(graph: tf.Graph, layers: list[BatchNormInfo], backend,
                        first_key: int, constants) -> tuple[dict[str, str], set[str]]:
    """Build each layer's group statistics in `graph` (the worker's scratch
    copy). Returns (tensor -> replacement every original node, forward and
    backward, must read instead; the names of the ops built here, which keep
    reading the originals)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    with tf.name_scope("autopar/batch_norm/"):
        for i, layer in enumerate(layers):
            key = first_key + KEYS_PER_LAYER * i
            if layer.kind == "moments":
                _moments(graph, layer, backend, key, rewire, constants)
            else:
                _fused(graph, layer, backend, key, rewire)
    built = {op.name for op in graph.get_operations()} - before
    return {node_input_name(k): node_input_name(v) for k, v in rewire.items()}, built


def _count(x: tf.Tensor, stat: tf.Tensor, dtype) -> tf.Tensor:
    """Elements of x reduced into each element of stat, shape [1]."""
    return tf.reshape(tf.cast(tf.size(x), dtype) / tf.cast(tf.size(stat), dtype), [1])


def _moments(graph, layer: BatchNormInfo, backend, key: int, rewire: dict, constants) -> None:
    mean_op = graph.get_operation_by_name(layer.ops[0])
    var_op = graph.get_operation_by_name(layer.ops[1])
    mean, var = mean_op.outputs[0], var_op.outputs[0]
    flat = constants.get([-1])
    count = _count(mean_op.inputs[0], mean, mean.dtype)
    packed = backend.allreduce_sum(tf.concat([tf.reshape(mean * count, flat), count], 0), key)
    total = packed[-1:]
    group_mean = tf.reshape(packed[:-1] / total, tf.shape(mean))
    # The local variance is taken around the group mean once its
    # StopGradient input is rewired; weighted by count, summed, it is the
    # group's sum of squared deviations.
    summed = backend.allreduce_sum(tf.reshape(var * count, flat), key + 1)
    group_var = tf.reshape(summed / total, tf.shape(var))
    rewire[mean.name] = group_mean.name
    rewire[var.name] = group_var.name
    upstream = [(op, g) for op in (mean_op, var_op) for g in _upstream_gradients(graph, op)]
    if len({op.name for op, _ in upstream}) < 2 and _differentiated(var_op):
        missing = sorted({mean_op.name, var_op.name} - {op.name for op, _ in upstream})
        raise UnsupportedGraphError(
            f"batch-norm statistics {', '.join(repr(m) for m in missing)}: their gradient "
            "ops were not found (a backward pass built with static shapes by "
            "tf.GradientTape), so the group statistics could not be differentiated; use "
            "Config(batch_norm_group=None) for this graph, or give the model's batch "
            "dimension as None")
    if not upstream:
        return
    grads = [g for _, g in upstream]
    share = count / total      # d(group statistic) / d(local statistic)
    if len(grads) == len({op.name for op, _ in upstream}):   # one backward pass: one all-reduce
        reduced = backend.allreduce_sum(tf.concat([tf.reshape(g, flat) for g in grads], 0),
                                        key + 2)
        pieces = tf.split(reduced, [int(g.shape.num_elements()) for g in grads])
    else:   # each pass's on its own, so a step that runs one pass needs no other's
        _check_backward_keys(mean_op, len(grads))
        pieces = [backend.allreduce_sum(tf.reshape(g, flat), key + 2 + j)
                  for j, g in enumerate(grads)]
    for g, piece in zip(grads, pieces):
        rewire[g.name] = tf.reshape(piece * share, tf.shape(g)).name


def _check_backward_keys(op: tf.Operation, needed: int) -> None:
    if needed > BACKWARD_KEYS:
        raise UnsupportedGraphError(
            f"batch-norm statistics '{op.name}' are differentiated by {needed} backward "
            f"gradients (at most {BACKWARD_KEYS} are supported: {BACKWARD_KEYS // 2} backward "
            "passes); use Config(batch_norm_group=None) for this graph")


def _grad_region(graph, op: tf.Operation) -> list[tf.Operation]:
    """The ops tf.gradients built for `op`: <...>/gradients[_k]/<op>_grad/..."""
    pattern = re.compile(r"(^|/)gradients(_\d+)?/" + re.escape(op.name) + "_grad/")
    return [o for o in graph.get_operations() if pattern.search(o.name)]


def _upstream_gradients(graph, op: tf.Operation) -> list[tf.Tensor]:
    """The gradients of op's output entering op's gradient ops, one per
    backward pass that goes through op (none when no gradient reaches op):
    from data flow (_upstream_from_axes), else from tf.gradients' names
    (<...>/gradients[_k]/<op>_grad/). Several passes: a GAN's two tapes, of
    which the discriminator's also differentiates the generator (TensorFlow's
    tape differentiates every watched variable's path; its result unused)."""
    found = _upstream_from_axes(op)
    if found:
        return found
    region = _grad_region(graph, op)
    names = {o.name for o in region}
    return sorted({t.name: t for o in region for t in o.inputs
                   if t.op.name not in names and in_gradient_scope(t.op.name)
                   and t.dtype == op.outputs[0].dtype}.values(), key=lambda t: t.name)


# The ops TensorFlow's Mean gradient spreads the upstream gradient with
# (math_grad._SumGrad: a broadcast to the input's shape; Tile in older graphs).
_SPREAD_TYPES = frozenset({"BroadcastTo", "Tile"})
_DIVIDE_TYPES = frozenset({"RealDiv", "Div", "TrueDiv"})


def _upstream_from_axes(mean: tf.Operation, max_hops: int = 8) -> list[tf.Tensor]:
    """The upstream gradients of a Mean whose input shape is dynamic, found
    from data flow whatever built the backward pass (tf.gradients, or
    tf.GradientTape in a tf.function, which names its ops after the forward
    op's scope, not <op>_grad): TensorFlow's Mean gradient then counts the
    averaged elements from the Mean's own reduction axes (mean.inputs[1])
    and divides the upstream gradient, broadcast to the input's shape, by
    that count. So every division reached from the axes (within a few ops,
    not through the Mean itself) is one backward pass's; walking back over
    the broadcast (and, for a Mean without keep_dims, the reshape to the
    kept dims) gives the gradient of the Mean's output."""
    out = mean.outputs[0]
    seen, frontier, divisions = {mean.name}, [(mean.inputs[1].op, 0)], []
    while frontier:
        node, depth = frontier.pop()
        for t in node.outputs:
            for c in t.consumers():
                if c.name in seen:
                    continue
                seen.add(c.name)
                if c.type in _DIVIDE_TYPES:
                    divisions.append(c)
                elif depth < max_hops:
                    frontier.append((c, depth + 1))
    found = []
    for div in sorted(divisions, key=lambda d: d.name):
        t = div.inputs[0]
        spread = False
        while t.op.type in _SPREAD_TYPES:
            t, spread = t.op.inputs[0], True
        if not spread:
            continue
        if not mean.get_attr("keep_dims") and t.op.type == "Reshape":
            t = t.op.inputs[0]
        known = t.shape.num_elements(), out.shape.num_elements()
        if t.dtype == out.dtype and (None in known or known[0] == known[1]):
            found.append(t)
    return found


def _differentiated(variance: tf.Operation) -> bool:
    """Whether a backward pass goes through the moments whose variance Mean
    is `variance`: the gradient of its SquaredDifference(x, StopGradient(mean))
    reads the StopGradient too (x - y), which the forward pass reads only
    there."""
    squared = variance.inputs[0].op
    stop = squared.inputs[1]
    return any(c is not squared for c in stop.consumers())


def _fused(graph, layer: BatchNormInfo, backend, key: int, rewire: dict) -> None:
    op = graph.get_operation_by_name(layer.ops[0])
    _check_backward_keys(op, len(layer.grad_ops))
    x, scale, offset = op.inputs[0], op.inputs[1], op.inputs[2]
    u = scale.dtype
    eps = op.get_attr("epsilon")
    nchw = op.get_attr("data_format") in (b"NCHW", "NCHW")
    avg = op.get_attr("exponential_avg_factor") if "exponential_avg_factor" in op.node_def.attr else 1.0
    axes = [0, 2, 3] if nchw else [0, 1, 2]

    def per_channel(t):   # a [C] tensor broadcast along x's channel axis
        return tf.reshape(t, [1, -1, 1, 1]) if nchw else t

    xu = tf.cast(x, u)
    count = _count(x, scale, u)
    packed = backend.allreduce_sum(tf.concat([tf.reduce_sum(xu, axes), count], 0), key)
    total = packed[-1:]
    mean = packed[:-1] / total
    centred = xu - per_channel(mean)
    var = backend.allreduce_sum(tf.reduce_sum(tf.square(centred), axes), key + 1) / total
    inv = tf.math.rsqrt(var + eps)
    y = centred * per_channel(inv * scale) + per_channel(offset)
    # The op's batch_variance output is Bessel-corrected (what moving
    # averages take); normalisation uses the biased one.
    unbiased = var * total / tf.maximum(total - 1, 1)
    if avg != 1.0:
        mean = (1 - avg) * op.inputs[3] + avg * mean
        unbiased = (1 - avg) * op.inputs[4] + avg * unbiased
    rewire[op.outputs[0].name] = tf.cast(y, x.dtype).name
    rewire[op.outputs[1].name] = mean.name
    rewire[op.outputs[2].name] = unbiased.name
    for j, name in enumerate(layer.grad_ops):   # one per backward pass
        grad = graph.get_operation_by_name(name)
        dy = tf.cast(grad.inputs[0], u)
        x_hat = centred * per_channel(inv)
        d_offset = tf.reduce_sum(dy, axes)          # this worker's share of the
        d_scale = tf.reduce_sum(dy * x_hat, axes)   # parameter gradients
        sums = backend.allreduce_sum(tf.concat([d_offset, d_scale], 0), key + 2 + j)
        group_dy, group_dy_xhat = tf.split(sums, 2)
        dx = per_channel(inv * scale) * (dy - per_channel(group_dy / total)
                                         - x_hat * per_channel(group_dy_xhat / total))
        rewire[grad.outputs[0].name] = tf.cast(dx, x.dtype).name
        rewire[grad.outputs[1].name] = d_scale.name
        rewire[grad.outputs[2].name] = d_offset.name
