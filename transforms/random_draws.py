"""Random draws per example: dropout masks, Gaussian noise on activations.

One device draws a mask for the global batch of N*b examples; a worker's
graph draws one for its own b. Seeded the same way on every worker (a graph
seed, or a Keras seed generator's state, which starts equal everywhere),
every worker would draw the same b rows: each worker's examples would get
the masks of the first b examples of one device's batch, the same ones on
every worker, where one device gives every example its own.

A draw is per example when the first element of its shape is the batch's
size: the first dimension of a tensor computed from the input batch
(tf.shape(x), or a noise shape built from tf.shape(x)[0]), or, when
TensorFlow folded that into a constant because the batch's size is static,
a constant first element that is neither 1 nor unlike the batch tensor the
draw is combined with elementwise (a dropout mask multiplying the
activations). A draw whose first dimension is 1 (a noise shape shared over
the batch) or whose shape does not depend on the batch (noise on a weight,
a sampled softmax's candidates) is one device's draw as it is: every
worker draws the same, as one device draws it once.

The rewrite makes worker w draw the global batch's N*b rows, with the
op's own seed and state (a stateful op's generator then advances as one
device's does), and keep rows w, w+N, w+2N, ...: the rows of its examples
when worker w holds examples w, w+N, ... of each global batch, which is how
autopar.shard and autopar.fit split it. The draws then equal one device's.

A random op that depends on the batch otherwise (a categorical draw from
per-example logits, a shuffle of the batch, a shape whose first element is
not the batch's size, a per-example rate) is refused by name: no split of
one device's draw gives each worker its share.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.graph_utils import batch_local_ops
from autopar.transforms.ops import copy_op, new_op, reshape

# Random ops whose output's leading dimensions are a shape input: the input's index.
SHAPED_DRAWS = {
    **dict.fromkeys(("RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                     "RandomUniformInt", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
                     "ParameterizedTruncatedNormal", "StatelessRandomUniform",
                     "StatelessRandomNormal", "StatelessTruncatedNormal",
                     "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
                     "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                     "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
                     "StatelessRandomUniformFullIntV2", "StatelessRandomBinomial",
                     "StatelessRandomGammaV2", "StatelessRandomGammaV3",
                     "StatelessRandomPoisson", "StatelessParameterizedTruncatedNormal"), 0),
    # tf.random.Generator's ops: (state, algorithm, shape, ...)
    **dict.fromkeys(("StatefulUniform", "StatefulStandardNormal", "StatefulStandardNormalV2",
                     "StatefulTruncatedNormal", "StatefulUniformInt",
                     "StatefulUniformFullInt"), 2),
}
# Random ops without such a shape: refused when they depend on the batch.
OTHER_DRAWS = frozenset({"Multinomial", "StatelessMultinomial", "RandomShuffle",
                         "StatelessShuffle", "RandomCrop", "RngSkip",
                         "RandomIndexShuffle", "StatelessRandomGetKeyCounter",
                         "StatelessRandomGetKeyCounterAlg"})
# tf.random.Generator's read of its state, advanced by `delta` (input 2): the
# number of values of the draw that follows, the product of its shape.
SKIP = "RngReadAndSkip"


def draws_randomly(op_type: str) -> bool:
    """Whether an op of this type draws random numbers."""
    return op_type in SHAPED_DRAWS or op_type in OTHER_DRAWS or op_type == SKIP


# Ops between a shape and its first element that keep it.
_PASS = frozenset({"Identity", "Cast", "Snapshot"})
# Elementwise ops through which a draw reaches the batch tensor it is combined with.
_ELEMENTWISE = frozenset({"Mul", "Add", "AddV2", "Sub", "RealDiv", "Div", "DivNoNan",
                          "Maximum", "Minimum", "Select", "SelectV2", "GreaterEqual",
                          "Greater", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
                          "LogicalOr", "LogicalNot", "Cast", "Identity", "Floor", "Neg",
                          "Sqrt", "Exp", "Log", "Snapshot"})


def find_batch_draws(graph: tf.Graph, batch_ops: set[str], averaged: set[str]) -> list[str]:
    """The random ops of `graph` that draw per example (see the module's
    docstring), and the tf.random.Generator state reads advanced by such a
    draw's size, in graph order. `batch_ops`: the ops computed from the
    input batch other than through the `averaged` gradients
    (graph_utils.batch_local_ops). Refuses a random op that depends on the
    batch otherwise."""
    skips = [op for op in graph.get_operations() if op.type == SKIP and op.name in batch_ops
             and _counts_a_batch_shape(op.inputs[2], batch_ops)]
    if skips:
        # a draw's key and counter from such a read are one device's
        batch_ops = batch_local_ops(graph, averaged | {t.name for op in skips
                                                       for t in op.outputs})
    out = []
    for op in graph.get_operations():
        if op.type == SKIP and op in skips:
            out.append(op.name)
        elif (op.type in OTHER_DRAWS or op.type == SKIP) and op.name in batch_ops:
            raise _refusal(op, "its inputs come from the input batch")
        if op.type not in SHAPED_DRAWS:
            continue
        index = SHAPED_DRAWS[op.type]
        shape = op.inputs[index]
        others = [t for i, t in enumerate(op.inputs) if i != index and t.op.name in batch_ops]
        if others:
            raise _refusal(op, f"its input '{others[0].name}' comes from the input batch")
        if shape.op.name in batch_ops:
            if not _first_is_batch_size(shape, batch_ops):
                raise _refusal(op, f"its shape '{shape.name}' comes from the input batch, but "
                                   "its first element is not the batch's size")
        elif not _constant_batch_shape(op, shape, batch_ops):
            continue
        if shape.shape.rank != 1 or shape.shape[0] is None:
            raise UnsupportedGraphError(
                f"the random op '{op.name}' ({op.type}) draws per example, but its shape "
                f"'{shape.name}' has no static length")
        out.append(op.name)
    return out


def _counts_a_batch_shape(delta: tf.Tensor, batch_ops: set[str]) -> bool:
    """Whether a state read's `delta` is the product of a shape whose first
    element is the batch's size (what tf.random.Generator builds)."""
    t = delta
    while t.op.type in _PASS:
        t = t.op.inputs[0]
    return (t.op.type == "Prod" and tf.get_static_value(t.op.inputs[1]) is not None
            and list(np.reshape(tf.get_static_value(t.op.inputs[1]), -1)) == [0]
            and _first_is_batch_size(t.op.inputs[0], batch_ops))


def _refusal(op: tf.Operation, why: str) -> UnsupportedGraphError:
    return UnsupportedGraphError(
        f"the random op '{op.name}' ({op.type}) draws from the input batch: {why}, so no "
        "split of one device's draw over the global batch gives each worker its examples' "
        "share (autopar makes each worker draw the rows of its own examples for a draw whose "
        "shape starts with the batch's size, such as a dropout mask: tf.shape(x) or a noise "
        "shape starting with tf.shape(x)[0])")


def _first_is_batch_size(shape: tf.Tensor, batch_ops: set[str]) -> bool:
    """Whether element 0 of the 1-D `shape` is the first dimension of a
    tensor computed from the input batch (axis 0 is the batch's)."""
    t = shape
    while True:
        op = t.op
        if op.type in _PASS:
            t = op.inputs[0]
        elif op.type == "Pack" and t.shape.rank == 1:
            return _is_batch_size(op.inputs[0], batch_ops)
        elif op.type == "ConcatV2" and op.inputs[0].shape.rank == 1 and \
                (op.inputs[0].shape[0] or 0) > 0:
            t = op.inputs[0]
        elif op.type == "StridedSlice" and _from_element_zero(op) and t.shape.rank == 1:
            t = op.inputs[0]
        elif op.type in ("Shape", "ShapeN"):
            return op.inputs[t.value_index].op.name in batch_ops
        else:
            return False


def _is_batch_size(scalar: tf.Tensor, batch_ops: set[str]) -> bool:
    """Whether the scalar is the first dimension of a batch tensor:
    tf.shape(x)[0], through casts."""
    t = scalar
    while t.op.type in _PASS:
        t = t.op.inputs[0]
    op = t.op
    return (op.type == "StridedSlice" and _from_element_zero(op)
            and op.get_attr("shrink_axis_mask") & 1 == 1
            and _first_is_batch_size(op.inputs[0], batch_ops))


def _from_element_zero(op: tf.Operation) -> bool:
    """A StridedSlice whose first output element is its input's element 0."""
    begin, strides = tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[3])
    if begin is None or strides is None or len(begin) == 0:
        return False
    starts_at_zero = begin[0] == 0 or op.get_attr("begin_mask") & 1
    return bool(starts_at_zero and strides[0] == 1 and not op.get_attr("ellipsis_mask")
                and not op.get_attr("new_axis_mask") & 1)


def _constant_batch_shape(op: tf.Operation, shape: tf.Tensor, batch_ops: set[str]) -> bool:
    """A constant shape (tf.shape of a batch of static size, folded) whose
    first element is not 1 and that the draw, through elementwise ops, is
    combined with a batch tensor of its rank and first dimension."""
    value = tf.get_static_value(shape)
    if value is None or value.ndim != 1 or len(value) == 0 or int(value[0]) == 1:
        return False
    rank, first = len(value), int(value[0])
    mine, frontier = {op.name}, [op]
    while frontier and len(mine) < 64:
        for consumer in {c for t in frontier.pop().outputs for c in t.consumers()}:
            if consumer.type not in _ELEMENTWISE or consumer.name in mine:
                continue
            for t in consumer.inputs:
                if t.op.name in mine or t.op.name not in batch_ops:
                    continue
                dims = t.shape
                if dims.rank == rank and dims[0] is not None and int(dims[0]) == first:
                    return True
            mine.add(consumer.name)
            frontier.append(consumer)
    return False


def rewrite_batch_draws(graph: tf.Graph, draws: list[str], num_workers: int,
                        worker_index: int, constants) -> tuple[dict[str, str], set[str]]:
    """Worker `worker_index`'s per-example draws: a copy of each draw's op
    (its seeds and state) draws N times its first dimension, and the op's
    readers read rows worker_index::N of it; a copy of a generator's state
    read skips N times as far. Returns (each original op's output -> what
    its readers read instead; the ops built here)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    n = num_workers
    with tf.name_scope("autopar/batch_draws/"):
        for name in draws:
            op = graph.get_operation_by_name(name)
            if op.type == SKIP:
                # the generator's state advances by one device's count
                delta = op.inputs[2]
                count = new_op("Cast", [delta], SrcT=delta.dtype.base_dtype,
                               DstT=tf.int64).outputs[0]
                whole = new_op("Cast", [new_op("Mul", [count, constants.get(n, tf.int64)],
                                               T=tf.int64).outputs[0]],
                               SrcT=tf.int64, DstT=delta.dtype.base_dtype).outputs[0]
                rewire[op.outputs[0].name] = copy_op(op, [*op.inputs[:2], whole]).outputs[0].name
                continue
            index = SHAPED_DRAWS[op.type]
            shape = op.inputs[index]
            rank = shape.shape[0]   # static: find_batch_draws refused any other shape
            dtype = shape.dtype.base_dtype
            whole = new_op("Mul", [shape, constants.get([n] + [1] * (rank - 1), dtype)],
                           T=dtype).outputs[0]
            # [N*b, ...] as [b, N, ...]: row w + N*i of the global draw is [i, w]
            split = new_op("ConcatV2", [constants.rows(shape, 0, 1), constants.get([n], dtype),
                                        constants.rows(shape, 1, rank),
                                        constants.get(0, tf.int32)],
                           N=3, T=dtype, Tidx=tf.int32).outputs[0]
            # the draw of the global batch: the op's own seeds and state
            drawn = copy_op(op, [whole if i == index else t
                                 for i, t in enumerate(op.inputs)]).outputs[0]
            mine = new_op("GatherV2", [reshape(drawn, split), constants.get(worker_index, tf.int32),
                                       constants.get(1, tf.int32)],
                          Tparams=drawn.dtype.base_dtype, Tindices=tf.int32, Taxis=tf.int32,
                          batch_dims=0).outputs[0]
            rewire[op.outputs[0].name] = mine.name
    return rewire, {o.name for o in graph.get_operations()} - before
