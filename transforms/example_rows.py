"""How each tensor of a training step relates to the examples of the batch.

Data-parallel training gives each worker a share of the global batch; a step
equals one device's only where what a worker computes from its share is what
one device computes from those examples. That is a property of data flow, so
it is decided here once, for every tensor computed from the input batch, by
one forward pass over the graph with a rule per op type (as sharding
propagation does for a batch axis), and read by the analyses that need it:
which ops mix examples (transforms.batch_mixing), which rows of a random draw
belong to which example (transforms.random_draws), and whether an embedding's
gradient rows belong to examples or are shared by the batch
(transforms.sparse_rows).

A tensor's form is one of (tuples, compared by value):

- SHARED: computed from no input, or only from static shapes: the same on
  every worker as on one device (constants, variables, a learning rate fed
  as a scalar).
- ("rows", axis, rowset, blocks, group): axis `axis` runs over this worker's
  examples, each element depending on its own example alone (and on SHARED
  values). `rowset` names the examples ("batch": the whole share, in order;
  an op's name: the rows a selection kept), along the axis in `blocks`
  consecutive blocks (a concatenation: a GAN's fake rows then its real
  ones), each example's rows `group` consecutive ones ([b, L, d] reshaped to
  [b*L, d]: L; None when that count is only known at run time).
- ELEMS: every element depends on one example alone, laid out otherwise
  (rows holding parts of two examples, selected elements, nonzeros).
- PARTS: every element depends on one example or on none (SHARED), laid
  out otherwise: the ids of a sampled softmax's lookup, partitioned; the
  batch's rows padded along the example axis. A mean over such rows (or a
  cat's) divides by more than the examples' count, and a sum takes the
  rows of no example once on every worker: both mix the batch, but a sum
  whose rows of no example no variable's value reaches.
- ("cat", head, count, rows): the examples' rows `head` (a rows form along
  axis 0; `rows` of them where static, else None), then SHARED rows, `count`
  of them (None: known when run), along axis 0: a sampled softmax's ids,
  the labels' then the sampler's candidates.
- ("size", blocks, group): an integer scalar, blocks * b * group (b the
  worker's examples): tf.shape(x)[0].
- ("shape", blocks, group, rest): an integer vector whose element 0 is such a
  size; `rest`: its other elements, each an int (static), "s" (SHARED, known
  at run time) or "d" (per worker: DIM).
- DIM: a per-worker value that is no example's: computed from the batch's
  shape otherwise (a padded length), or an integer statistic of it (a
  maximum length); differs between workers and from one device's.
- ("reduced", op): a reduction over the examples at `op` (a sum, a mean, a
  count): what a loss is. Combined with an example's values again, it mixes
  the examples.
- ("distinct", op): the distinct values of the batch's ids (tf.unique at
  `op`), or rows gathered for them.
- ("list", form): a TensorList whose elements have `form` (a loop's
  per-time-step outputs).
- ("mixed", op): depends on several examples' values otherwise, first at `op`.
- ("picked", op): depends on examples chosen by their place in the batch, at
  `op` (x[0], x[:2], a gather of fixed rows): one device picks them from the
  global batch, each worker from its share. Selections whose bounds are
  computed from the batch's size (its halves) keep a rowset of their own,
  and are recorded as cuts of the share (`cuts`: each piece holds other
  examples than one device's same piece; transforms.batch_mixing refuses
  the cuts a loss is computed from). An ELEMS's first axis is read as
  running over its examples: kept[:2] of the values a mask kept is a pick.
  So is an example's place in the worker's rows (tf.range of the batch's
  size: a rows form marked PLACE) read as a value (a weight, a comparison),
  where indices of the example's own rows are not (PLACES_KEPT,
  PLACE_INDICES).
- ("kept", op): a mean or a count of examples' values that the batch's own
  values select (tf.where of a mask, tf.dynamic_partition), at `op`: each
  worker divides by its share's count of them, one device by the global
  batch's, and no weighing of the workers' gradients by their sizes makes
  those alike.
- ("unknown", op): no rule for `op`, whose inputs depend on the batch.

Functional ops (a While's body, an If's branches, a PartitionedCall) are
followed into their functions.
"""
from __future__ import annotations

import heapq

import numpy as np
import tensorflow as tf

from autopar.transforms.example_maps import mapped_outputs
from autopar.transforms.features.base import GraphFeature
from autopar.transforms.graph_utils import (INPUT_OP_TYPES, OF_SHAPES_ALONE, SHAPE_OPS,
                                            folded_value, in_gradient_scope, op_name_of,
                                            reads_a_variable, reduces_batch_axis, static_int)

SHARED = ("shared",)
ELEMS = ("elems",)
PARTS = ("parts",)
DIM = ("dim",)
BATCH = "batch"

# ---------------------------------------------------------------- op tables
UNARY = frozenset("""Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Digamma Elu Erf Erfc
Erfinv Exp Expm1 Floor Inv IsFinite IsInf IsNan Lgamma Log Log1p LogicalNot Neg OnesLike
Reciprocal Relu Relu6 Rint Round Rsqrt Selu Sigmoid Sign Sin Sinh Softplus Softsign Sqrt
Square Tan Tanh ZerosLike Cast Identity Snapshot StopGradient PreventGradient CheckNumerics
CheckNumericsV2 LeakyRelu Gelu Real Imag Conj Invert PopulationCount EnsureShape
DebugIdentity DebugIdentityV2 DebugIdentityV3 Ndtri Bucketize FakeQuantWithMinMaxArgs
QuantizeAndDequantizeV2 Dawsn Expint FresnelCos FresnelSin Spence BesselI0e BesselI1e
BesselI0 BesselI1 BesselJ0 BesselJ1 BesselK0 BesselK0e BesselK1 BesselK1e BesselY0 BesselY1
Angle ComplexAbs Bitcast IdentityN AsString StringToHashBucketFast StringToHashBucketStrong
StringToHashBucket StringLower StringUpper StringStrip StringLength StringToNumber
StaticRegexReplace""".split())
# Elementwise ops of two or more inputs, broadcast.
NARY = frozenset("""Add AddV2 Sub Mul MulNoNan Div DivNoNan RealDiv FloorDiv FloorMod Mod
TruncateDiv TruncateMod Maximum Minimum Pow SquaredDifference Atan2 Xdivy Xlogy Xlog1py Equal
NotEqual Greater GreaterEqual Less LessEqual LogicalAnd LogicalOr BitwiseAnd BitwiseOr
BitwiseXor LeftShift RightShift ApproximateEqual Igamma Igammac Zeta Polygamma Select
SelectV2 ClipByValue Betainc AddN Complex BiasAdd""".split())
# Reductions of input 0 over the axes in input 1.
REDUCTIONS = frozenset({"Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm", "All", "Any",
                        "ArgMax", "ArgMin"})
# Ops that act on each row of input 0 alone (its last axes), the other inputs
# parameters: (op type) -> the inputs that must be SHARED.
ROW_WISE = {
    **dict.fromkeys(("Softmax", "LogSoftmax", "L2Normalize", "LRN", "MaxPool", "AvgPool",
                     "MaxPool3D", "AvgPool3D", "MaxPoolWithArgmax", "FractionalMaxPool",
                     "FractionalAvgPool", "ResizeBilinear", "ResizeNearestNeighbor",
                     "ResizeBicubic", "ResizeArea", "AdjustContrastv2", "AdjustHue",
                     "AdjustSaturation", "RGBToHSV", "HSVToRGB", "MatrixDiag",
                     "MatrixDiagPart", "MatrixBandPart", "FFT", "IFFT", "RFFT", "IRFFT",
                     "FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D", "FFT3D", "IFFT3D",
                     "MatrixInverse", "Cholesky", "MatrixDeterminant", "LogMatrixDeterminant",
                     "MatrixSquareRoot", "MatrixSolve", "ExtractImagePatches"), ()),
    **dict.fromkeys(("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Dilation2D",
                     "MaxPoolV2", "OneHot", "ImageProjectiveTransformV3",
                     "ImageProjectiveTransformV2", "ResizeBilinearV2", "CropAndResize"),
                    (1, 2, 3)),
}
# Ops whose outputs follow input 0's form (the others SHARED or per-worker lengths).
FOLLOW_FIRST = frozenset({"Pad", "PadV2", "MirrorPad", "Tile", "Roll", "ReverseV2",
                          "ReverseSequence", "Cumsum", "Cumprod", "CumulativeLogsumexp",
                          "TopKV2", "TopK", "InTopKV2", "Squeeze", "ExpandDims", "Transpose",
                          "Reshape", "StridedSlice", "Slice", "Split", "SplitV", "Unpack",
                          "MatrixSetDiagV3", "QuantizeV2"})
# TensorFlow 1's TensorArrays (a V1 loop's, dynamic_rnn's under
# disable_v2_behavior()) read as the TensorList op each acts as, the list's
# form carried by the flow tensor every one of them takes and gives.
TENSOR_ARRAYS_AS_LISTS = {"TensorArrayV3": "TensorListReserve",
                          "TensorArrayScatterV3": "TensorListFromTensor",
                          "TensorArrayReadV3": "TensorListGetItem",
                          "TensorArrayWriteV3": "TensorListSetItem",
                          "TensorArrayGatherV3": "TensorListStack",
                          "TensorArraySizeV3": "TensorListLength"}


def _as_list_op_inputs(t: str, ins: list) -> list:
    """A TensorArray op's input forms in its TensorList op's order: (flow,
    index, value) for (handle, index, value, flow)."""
    if t == "TensorArrayScatterV3":   # (handle, indices, value, flow)
        return [ins[2], ins[3]]
    if t == "TensorArrayWriteV3":     # (handle, index, value, flow)
        return [ins[3], ins[1], ins[2]]
    if t in ("TensorArrayReadV3", "TensorArrayGatherV3"):   # (handle, index, flow)
        return [ins[2], ins[1]]
    if t == "TensorArraySizeV3":      # (handle, flow)
        return [ins[1]]
    return []


# Ops that make a tensor of a given shape from SHARED values.
FILLS = {"Fill": 0, "Zeros": 0, "Ones": 0, "BroadcastTo": 1, "Empty": 0,
         "RandomUniform": 0, "RandomStandardNormal": 0, "TruncatedNormal": 0}
SOFTMAX_XENT = frozenset({"SparseSoftmaxCrossEntropyWithLogits",
                          "SoftmaxCrossEntropyWithLogits"})
SPARSE_SEGMENTS = frozenset({"SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                             "SparseSegmentSumWithNumSegments",
                             "SparseSegmentMeanWithNumSegments",
                             "SparseSegmentSqrtNWithNumSegments"})
GATHERS = frozenset({"GatherV2", "Gather", "ResourceGather"})
# Crosses of features, row by row (tf.sparse.cross, tf.sparse.cross_hashed,
# Keras's HashedCrossing): inputs N SparseTensors' indices, values and
# shapes, then dense tensors, then SHARED scalars (a separator, buckets,
# salt); outputs a SparseTensor whose row i crosses row i of every input.
SPARSE_CROSSES = frozenset({"SparseCross", "SparseCrossHashed", "SparseCrossV2"})
# Lookups of each key (input 1) in a table (a StringLookup's vocabulary): the
# keys' form, the table and the default value SHARED.
LOOKUPS = frozenset({"LookupTableFind", "LookupTableFindV2"})
# An example's place in the worker's rows (tf.range of the batch's size):
# the mark a rows form carries (its last element) where its values are
# places. A place locates the example's own values (gather and scatter
# indices, a SparseTensor's rows) through the ops of PLACES_KEPT; read as a
# value by any other op (a weight, a comparison: the first half of the
# batch) it picks examples by their place, one device's in the global
# batch, each worker's in its share.
PLACE = "\x00place"   # (no op name holds a NUL: a forms tuple's last element)
PLACES_KEPT = frozenset({"Cast", "Identity", "Snapshot", "StopGradient", "EnsureShape",
                         "ExpandDims", "Squeeze", "Reshape", "Pack", "StridedSlice", "Slice"})
# (op type) -> the inputs that may be places: indices of the rows of another
# input, segment ids, a SparseTensor's indices.
PLACE_INDICES = {
    **dict.fromkeys(("GatherNd", "ResourceGatherNd", "GatherV2", "Gather", "ResourceGather",
                     "TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub",
                     "TensorScatterMax", "TensorScatterMin", "UnsortedSegmentSum",
                     "UnsortedSegmentMean", "UnsortedSegmentMax", "UnsortedSegmentMin",
                     "UnsortedSegmentProd", "CTCLoss", "CTCLossV2"), {1}),
    **dict.fromkeys(("ScatterNd", "SparseToDense", "SparseTensorDenseMatMul",
                     "SparseReduceSum", "SparseReduceMax", "SparseSoftmax"), {0}),
    **dict.fromkeys(("SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                     "SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments",
                     "SparseSegmentSqrtNWithNumSegments"), {1, 2}),
}
# Connectionist temporal classification's loss, of time-major logits and a
# SparseTensor of labels (tf.compat.v1.nn.ctc_loss, tf.nn.ctc_loss of
# sparse labels, tf_keras's ctc_batch_cost).
CTC_LOSSES = frozenset({"CTCLoss", "CTCLossV2"})
UNIQUE = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2"})
FUNCTION_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
CANDIDATE_SAMPLERS = frozenset({"UniformCandidateSampler", "LogUniformCandidateSampler",
                                "LearnedUnigramCandidateSampler", "FixedUnigramCandidateSampler",
                                "ThreadUnsafeUnigramCandidateSampler", "AllCandidateSampler"})
IFS = frozenset({"If", "StatelessIf"})
WHILES = frozenset({"While", "StatelessWhile"})
# V1 control flow: each output has its data input's form (Merge: the join).
V1_FLOW = frozenset({"Switch", "RefSwitch", "Enter", "RefEnter", "Exit", "RefExit",
                     "NextIteration", "RefNextIteration", "Merge", "RefMerge", "LoopCond"})


def rows(axis: int = 0, rowset: str = BATCH, blocks: int = 1, group: int | None = 1):
    return ("rows", axis, rowset, blocks, group)


def is_rows(form) -> bool:
    return form[0] == "rows"


def per_example(form) -> bool:
    """Whether each element of a tensor of this form depends on one example
    at most (no element on several)."""
    return form[0] in ("rows", "elems", "parts", "cat")


# Forms no rule looks into: every op computed from one has it.
OPAQUE = frozenset({"mixed", "picked", "kept", "unknown"})
# Ops that keep those of their input's elements the batch's values select.
SELECTIONS_BY_VALUE = frozenset({"Where", "DynamicPartition"})


def mixing_op(form) -> str | None:
    """The op at which a form stopped being per example or shared (a
    mixing, picking, unknown or reducing op), else None."""
    return form[1] if form[0] in OPAQUE | {"reduced"} else None


class ExampleRowsFeature(GraphFeature):
    """Not a rewrite of its own: the forms of the graph's tensors, which the
    features after it and the analysis of sparse gradients read
    (facts.shared["rows"]), and the batch's input tensor."""
    name = "example_rows"
    fields = ("batch_input", "batch_statistics")
    # loss counts: the rewrite makes them the same on every worker;
    # batch-norm statistics: the rewrite takes them over the group
    after = ("batch_norm", "loss_counts")

    def find(self, facts):
        def forms(shared=frozenset()):
            return ExampleRows(facts.graph, stops=facts.gradients,
                               shared=set(facts.found["loss_counts"]) | set(shared),
                               exempt={op for b in facts.found["batch_norms"] for op in b.ops},
                               index=facts.index)
        rows = forms()
        computed = facts.index.computing([loss for _, loss in facts.trained_seeds])
        # the batch's statistics a trained loss is computed from: each
        # training step takes the global batch's (transforms.padded_lengths),
        # the same on every worker
        statistics = {t: kind for t, kind in rows.statistics.items()
                      if facts.index.position[op_name_of(t)] in computed
                      and _decides_control_only(facts.graph.get_tensor_by_name(t), rows)}
        if statistics:
            rows = forms(statistics)
        facts.shared["rows"] = rows
        return {"batch_input": rows.batch_input, "batch_statistics": statistics}


# Where a statistic of the batch decides how the step runs: a loop's
# inputs (its bound), a cond's predicate (input 0 of an If, 1 of a Switch).
_CONTROL_INPUTS = {"While": None, "StatelessWhile": None, "If": 0, "StatelessIf": 0,
                   "Switch": 1, "RefSwitch": 1}


def _decides_control_only(statistic: tf.Tensor, rows: "ExampleRows") -> bool:
    """Whether every use of `statistic`, through integer and boolean
    arithmetic of per-worker lengths (DIM: comparisons, min(steps, it)),
    is a loop's bound (and what the loop returns of it is used so too) or a
    cond's predicate, where the global batch's value makes the step run as
    one device's. A value read otherwise (a loss divided by the batch's
    longest length) stays the worker's, and the rules for it decide (a
    loss's reduction would read a global statistic as the batch's count)."""
    seen, stack = set(), [statistic]
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        for reader in t.consumers():
            position = _CONTROL_INPUTS.get(reader.type, -1)
            if position is None:
                # a loop's input, and its value after the loop (each input a
                # loop variable or a capture, which the loop returns too)
                stack.extend(out for x, out in zip(reader.inputs, reader.outputs) if x is t)
                continue
            if position >= 0 and reader.inputs[position] is t:
                continue
            if position >= 0 or any(not _decided_by_a_length(rows.form(out), rows.graph)
                                    and out.consumers() for out in reader.outputs):
                return False
            stack.extend(reader.outputs)
    return True


def _decided_by_a_length(form: tuple, graph: tf.Graph) -> bool:
    """A per-worker length (DIM), or a value that a V1 loop's Switch mixes
    as deciding by one (its counter, compared with the statistic, after
    the Switch that statistic decides: what the statistic made global
    leaves as a length; the forms then computed decide)."""
    if form == DIM:
        return True
    if form[0] != "mixed":
        return False
    try:
        return graph.get_operation_by_name(form[1]).type in ("Switch", "RefSwitch")
    except KeyError:   # an op of a function's body
        return False


class ExampleRows:
    """Forms of a graph's tensors (module docstring). `stops`: tensors
    treated as SHARED (the averaged gradients, which every worker replaces
    by the same aggregate); `shared`: tensors also treated as SHARED (counts
    that the rewrite makes the same on every worker); `exempt`: ops whose
    outputs are taken as computed per example (batch-norm statistics, which
    transforms.batchnorm handles). `index`: the analysis' GraphIndex of
    `graph` (transforms.graph_index), when it has one."""

    def __init__(self, graph: tf.Graph, stops=frozenset(), shared=frozenset(),
                 exempt=frozenset(), index=None):
        self.graph = graph
        self.stops = set(stops) | set(shared)
        self.exempt = set(exempt)
        self.forms: dict[str, tuple] = {}
        self.assumed: dict[str, str] = {}   # op -> the assumption its rule made
        # {op of the step's graph: (name, type) of the first cut of the
        # worker's share at a computed point (its halves) it makes, or its
        # function body (a loop's) makes}: transforms.batch_mixing refuses
        # the cuts a loss is computed from
        self.cuts: dict[str, tuple[str, str]] = {}
        # {boolean of the whole batch (tf.reduce_all, tf.reduce_any) a cond
        # of the step's graph decides by: that cond}: transforms.padded_lengths
        # checks in each training step that every worker holds it alike
        self.alike: dict[str, str] = {}
        self._step_op = ""   # the op of the step's graph whose rule runs
        input_ops = ([op for op in graph.get_operations() if op.type in INPUT_OP_TYPES]
                     if index is None else index.of_types(INPUT_OP_TYPES))
        self.static_batch = _static_batch(input_ops)
        # No fed or dataset tensor has a length of its own beyond the
        # examples' (a padded sequence's): every dimension the graph leaves
        # unknown, but the batch's, is then the same on every worker as on
        # one device (an einsum's output whose shape TensorFlow did not infer)
        self.fixed_lengths, self.batch_input = _inputs_of(input_ops, self.static_batch)
        self._shape_sources: dict = {}
        self._function_graphs: dict = {}   # _function_graph's
        # {the largest or smallest integer of the batch's values (its longest
        # sequence's length) in the step's graph: "Max" or "Min"}
        self.statistics: dict[str, str] = {}
        if index is None:
            self._run(graph.get_operations(), self.forms, inputs=None)
        else:
            self._run(index.ops, self.forms, inputs=None,
                      known=(index.names, index.types, index.in_gradient))

    def form(self, t: tf.Tensor) -> tuple:
        return self.forms.get(t.name, SHARED)

    # ------------------------------------------------------------ the pass
    def _run(self, ops, forms: dict, inputs: dict | None, known=None) -> None:
        """Forms of `ops` (topological order) into `forms`. `inputs`: for a
        function body, the forms of its Placeholder args by name. `known`:
        the ops' names, types and whether each is in a gradients scope,
        when an index has them."""
        if known is None:
            names = [op.name for op in ops]
            known = (names, [op.type for op in ops], [in_gradient_scope(n) for n in names])
        names, types, in_gradient = known
        loops = any(t in ("NextIteration", "RefNextIteration") for t in types)
        rows_of = list(zip(ops, names, types, in_gradient))
        if any(t in ("Switch", "RefSwitch") for t in types):
            rows_of = _data_order(rows_of)
        for _ in range(2 if loops else 1):   # V1 loops: their back edges, once more
            for op, name, op_type, gradient in rows_of:
                if gradient:
                    continue
                if inputs is not None and op_type == "Placeholder":
                    forms[op.outputs[0].name] = inputs.get(name, SHARED)
                    continue
                if inputs is None:
                    self._step_op = name
                if op_type in INPUT_OP_TYPES and inputs is None:
                    for t in op.outputs:
                        forms[t.name] = self._input_form(t)
                    continue
                ins = [SHARED if x.name in self.stops else forms.get(x.name, SHARED)
                       for x in op.inputs]
                if all(f == SHARED for f in ins) and op_type not in ("Merge", "RefMerge"):
                    continue
                if name in self.exempt:
                    # batch-norm statistics: made the same everywhere or kept
                    # per worker by transforms.batchnorm; a fused op's
                    # normalised output stays the rows it normalised
                    outs = [SHARED] * len(op.outputs)
                    if op_type.startswith("FusedBatchNorm"):
                        outs[0] = ins[0]
                else:
                    marked = [i for i, f in enumerate(ins) if f[-1] == PLACE]
                    if marked:
                        ins = [f[:-1] if f[-1] == PLACE else f for f in ins]
                    outs = self._rule(op, ins, forms)
                    if marked:
                        outs = _after_places(op, marked, outs, forms)
                for t, f in zip(op.outputs, outs):
                    if f != SHARED:
                        forms[t.name] = f

    def _input_form(self, t: tf.Tensor) -> tuple:
        """A fed or dataset tensor: rows of the batch when it has a first
        dimension the batch's (unknown, or the static batch size)."""
        if t.dtype == tf.resource or t.shape.rank is None:
            return ELEMS if t.dtype != tf.resource else SHARED
        if t.shape.rank == 0:
            return SHARED
        first = t.shape[0]
        if first is None or first == self.static_batch:
            return rows()
        return SHARED

    def _rule(self, op: tf.Operation, ins: list, forms: dict) -> list:
        t = op.type
        if ins and ins[0][0] == "cat":
            kept = self._of_cat(op, ins)
            if kept is not None:
                return kept
        if (t in GATHERS and len(ins) > 1 and ins[1][0] == "cat" and ins[0] == SHARED
                and op.inputs[1].shape.rank == 1 and (t != "GatherV2" or
                                                      static_int(op.inputs[2]) == 0)):
            return [ins[1]]   # the head's ids' rows, then the shared ids'
        if t in ("Mean", "Sum") and ins[0][0] in ("parts", "cat") and \
                self._over_rows_of_no_example(op, forms):
            return [("mixed", op.name)]
        if any(f[0] in ("parts", "cat") for f in ins):
            # the rules read PARTS as ELEMS; rows of no example stay among
            # what they give
            outs = self._rule_of(op, [ELEMS if f[0] in ("parts", "cat") else f for f in ins],
                                 forms)
            return [PARTS if f[0] in ("rows", "elems") else f for f in outs]
        return self._rule_of(op, ins, forms)

    def _rule_of(self, op: tf.Operation, ins: list, forms: dict) -> list:
        t = op.type
        n_out = len(op.outputs)
        if t in CANDIDATE_SAMPLERS:
            # (true classes): the candidates and their expected counts drawn
            # alike on every worker, as one device draws them; the true
            # classes' expected counts each an example's
            return [SHARED, ins[0] if is_rows(ins[0]) else ELEMS, SHARED]
        special = [f for f in ins if f[0] in OPAQUE]
        if special and t not in SHAPE_OPS:
            return [special[0]] * n_out
        if t in UNARY or t in V1_FLOW:
            if t in ("Merge", "RefMerge"):
                return [_join([f for f in ins])] + [SHARED] * (n_out - 1)
            if t in ("Switch", "RefSwitch"):   # a V1 cond's, or loop's, predicate
                if ins[1][0] not in ("shared", "dim", "size", "shape") and \
                        not self._decided_alike(op, op.inputs[1], ins[1], forms) \
                        or self._decides_by_values(op.inputs[1], forms):
                    return [self._mixed(op, ins)] * n_out
                return [ins[0]] * n_out
            if t == "IdentityN":
                return ins
            return [ins[0]] * n_out
        if t in ("Minimum", "Maximum") and _clamped_to_a_constant(op):
            return [SHARED]
        if t in NARY:
            return [self._elementwise(op, ins, forms)] * n_out
        if t in LOOKUPS and ins[0] == SHARED and ins[2] == SHARED:
            return [ins[1]] * n_out
        if t == "DenseBincount" and ins[1] == SHARED and ins[2] in (SHARED, ins[0]):
            # counts of each row's values (a StringLookup's multi-hot
            # output): a matrix's row i counts row i; a vector's counts are
            # of the whole batch
            rank = self._rank(op.inputs[0])
            if rank == 2 and is_rows(ins[0]) and ins[0][1] == 0:
                return [ins[0]]
            if rank == 1 and per_example(ins[0]):
                return [("reduced", op.name)]
        if t in SHAPE_OPS:
            return self._shapes(op, ins, forms)
        if t in REDUCTIONS:
            return [self._reduction(op, ins, forms)] * n_out
        if t == "MatMul":
            return [self._matmul(op, ins)]
        if t in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
            return [self._batch_matmul(op, ins)]
        if t == "Einsum":
            return [self._einsum(op, ins)]
        if t in ("ImageProjectiveTransformV2", "ImageProjectiveTransformV3") \
                and is_rows(ins[0]) and ins[0][1] == 0 and ins[1] == ins[0]:
            # (images, transforms, ...): each image by its own example's
            # transform (Keras's RandomZoom, RandomTranslation, RandomRotation
            # draw one per example)
            return [self._row_wise(op, [ins[0], SHARED, *ins[2:]], ROW_WISE[t])]
        if t in ROW_WISE:
            return [self._row_wise(op, ins, ROW_WISE[t])] * n_out
        if t in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
            # (input_sizes, filter, out_backprop): a transposed convolution
            return [self._row_wise(op, [ins[2], ins[1], ins[0]], (1,), sizes=ins[0])]
        if t in FOLLOW_FIRST:
            return self._follow_first(op, ins, forms)
        if t in ("ConcatV2", "Concat"):
            return [self._concat(op, ins)]
        if t == "Pack":
            return [self._pack(op, ins)]
        if t == "BroadcastArgs":
            # the shape two shapes broadcast to: a shape of the examples'
            # rows where the other is one, or one it broadcasts into
            # (tf.random.stateless_gamma's of its alpha's and its beta's, [])
            shapes = [(f, x) for f, x in zip(ins, op.inputs) if f[0] == "shape"]
            if len(shapes) == 2 and ins[0] == ins[1]:
                return [ins[0]]
            if len(shapes) == 1 and all(f == SHARED for f in ins if f[0] != "shape"):
                form = shapes[0][0]
                other = tf.get_static_value(op.inputs[1 - ins.index(form)])
                dims = (1, *form[3])   # the size: broadcast into by 1 alone
                if other is not None and len(other) <= len(dims) and all(
                        int(v) == 1 or v == d for v, d in zip(reversed(other), reversed(dims))):
                    return [form]
            return [SHARED if all(f == SHARED for f in ins) else DIM]
        if t in FILLS:
            return [self._fill(op, ins, FILLS[t])]
        if t in GATHERS or t == "GatherNd" or t == "ResourceGatherNd":
            return [self._gather(op, ins, forms)]
        if t in SOFTMAX_XENT:
            return [self._same_rows(op, ins, ins)] * n_out
        if t in UNIQUE:
            form = ("distinct", op.name) if per_example(ins[0]) else self._mixed(op, ins)
            return [form, ELEMS if per_example(ins[0]) else form] + [form] * (n_out - 2)
        if t in SPARSE_SEGMENTS:
            return [self._sparse_segments(op, ins)]
        if t in SPARSE_CROSSES:
            return self._sparse_cross(op, ins)
        if t in ("UnsortedSegmentSum", "UnsortedSegmentMean", "UnsortedSegmentMax",
                 "UnsortedSegmentMin", "UnsortedSegmentProd", "SegmentSum", "SegmentMean",
                 "SegmentMax", "SegmentMin", "SegmentProd", "SegmentSumV2"):
            return [self._segments(op, ins)]
        if t == "Range":
            if ins[1][0] == "size" and ins[1][1:] == (1, 1) and ins[0] == SHARED == ins[2] \
                    and static_int(op.inputs[0]) == 0 and static_int(op.inputs[2]) == 1:
                # tf.range(batch size): each example's place in the worker's
                # share, not in the global batch: marked PLACE (indices of
                # the example's own rows, else a pick by place)
                return [rows() + (PLACE,)]
            if all(f[0] in ("shared", "size", "dim") for f in ins):
                return [DIM]
            return [self._mixed(op, ins)]
        if t in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"):
            training = op.get_attr("is_training")
            if not training and is_rows(ins[0]) and all(f == SHARED for f in ins[1:]):
                return [ins[0]] + [SHARED] * (n_out - 1)
            return [("mixed", op.name)] * n_out
        if t == "DynamicPartition":
            if ins[0][0] == "distinct" and ins[1] in (ins[0], SHARED):
                # a partitioned variable's lookup of the batch's distinct ids
                # (embedding_lookup_sparse): each partition's share of them
                return [ins[0]] * n_out
            if per_example(ins[0]):
                return [ELEMS] * n_out
            if ins[0][0] in ("shared", "dim", "size") and (per_example(ins[1])
                                                         or ins[1][0] == "distinct"):
                return [DIM] * n_out   # positions of the worker's elements
            return [self._mixed(op, ins)] * n_out
        if t in ("DynamicStitch", "ParallelDynamicStitch"):
            return [self._stitch(op, ins)]
        if t == "Where":
            return [ELEMS if per_example(ins[0]) else self._mixed(op, ins)]
        if t in CTC_LOSSES:
            return self._ctc_loss(op, ins)
        if t == "ComputeAccidentalHits" and per_example(ins[0]) and ins[1] == SHARED:
            # each hit is a true class's, one example's (its indices are the
            # example's row, SparseToDense puts it back there)
            return [ELEMS] * n_out
        if t == "SparseToDense" and per_example(ins[0]) and ins[3] == SHARED:
            first = _element(op.inputs[1], 0, forms)
            if ins[1][0] == "shape" and "d" not in ins[1][3]:
                layout = (ins[1][1], ins[1][2])
            elif isinstance(first, int) and self.static_batch and first % self.static_batch == 0:
                layout = (1, first // self.static_batch)   # a static batch, folded
            else:
                layout = None
            if layout is not None:
                self.assumed[op.name] = "its indices' first column is each value's example row"
                return [rows(0, BATCH, *layout)]
        if t == "SparseTensorDenseMatMul" and not op.get_attr("adjoint_a") \
                and per_example(ins[0]) and ins[3] == SHARED:
            # (indices, values, dense shape, b): row i of the product sums
            # the sparse row i's entries, one per example
            self.assumed[op.name] = "the SparseTensor's rows are the examples"
            return [rows()]
        if t == "SparseReshape" and per_example(ins[0]) and ins[1][0] == "shape" \
                and ins[2][0] == "shape":
            # (indices, shape, new shape): the entries, and the new shape,
            # whose first element is the examples' count where the new
            # shape's is (safe_embedding_lookup_sparse's [prod(shape[:-1]),
            # shape[-1]] of a [b, k] SparseTensor)
            return [ELEMS, ins[2]]
        if t == "SparseFillEmptyRows" and ins[0] == ELEMS == ins[1] and ins[3] == SHARED \
                and ins[2][0] == "shape" and _entries_of(op.inputs[0], forms) is not None \
                and _entries_of(op.inputs[0], forms) == _entries_of(op.inputs[1], forms):
            # (indices, values, dense_shape, default): the entries, one more
            # in each row that had none; which rows had none, one flag per
            # row of the dense shape, whose rows are the examples'
            self.assumed[op.name] = "its indices' first column is each entry's example row"
            return [ELEMS, ELEMS, rows(0, BATCH, ins[2][1], ins[2][2]), ELEMS]
        if t in ("SparseReshape", "SparseTensorDenseMatMul", "SparseToDense",
                 "SparseFillEmptyRows"):
            return [ELEMS if all(per_example(f) or f == SHARED or f[0] in ("shape", "dim")
                                 for f in ins) else self._mixed(op, ins)] * n_out
        if t in ("SpaceToBatchND", "BatchToSpaceND"):
            return [self._space_batch(op, ins)]
        if t in WHILES:
            return self._while(op, ins, forms)
        if t in IFS:
            return self._if(op, ins, forms)
        if t in FUNCTION_CALLS:
            return self._call(op, ins, op.get_attr("f").name)
        if t.startswith("TensorList"):
            return self._tensor_list(op, ins)
        if t in TENSOR_ARRAYS_AS_LISTS:
            return self._tensor_list(op, _as_list_op_inputs(t, ins),
                                     TENSOR_ARRAYS_AS_LISTS[t])
        if t == "RngReadAndSkip":
            # a generator's state, advanced by a draw's size: one device's
            # once transforms.random_draws skips as far as it
            return [SHARED] * n_out
        if t.startswith(("Stateless", "Random", "Stateful", "Multinomial")):
            # a draw (transforms.random_draws decides whether it is per example)
            return [self._draw(op, ins)] * n_out
        return [("unknown", op.name)] * n_out

    def _rank(self, t: tf.Tensor) -> int | None:
        """`t`'s rank, or that of a tensor it provably has the shape of (a
        table lookup's output has its keys' shape, which TensorFlow's shape
        function leaves unknown)."""
        if t.shape.rank is not None:
            return t.shape.rank
        return shape_source(t, self._shape_sources).shape.rank

    # ------------------------------------------------------------ rules
    def _mixed(self, op, ins) -> tuple:
        return ("mixed", op.name)

    def _elementwise(self, op, ins, forms) -> tuple:
        kinds = {f[0] for f in ins}
        if kinds <= {"shared", "size", "dim", "shape"}:
            return self._arithmetic(op, ins)
        if op.type == "Select" and op.inputs[0].shape.rank == 1 \
                and (op.inputs[1].shape.rank or 0) > 1:
            return self._select_rows(op, ins)
        if kinds & {"reduced", "distinct"}:
            if kinds & {"rows", "elems"}:
                # a statistic of the batch meets an example's values
                source = next(f for f in ins if f[0] in ("reduced", "distinct"))
                return ("mixed", source[1] if source[0] == "reduced" else op.name)
            return next(f for f in ins if f[0] in ("reduced", "distinct"))
        out = op.outputs[0]
        per = [(f, x) for f, x in zip(ins, op.inputs) if per_example(f)]
        if any(f == ELEMS for f, _ in per):
            known: dict = {}
            if len({_elementwise_source(x, forms, known=known) for _, x in per}) > 1:
                # ELEMS says each element is one example's, not which: beside
                # another tensor of the examples its elements may meet other
                # examples' (a batch rotated by a concatenation, its first
                # row broadcast to every row, rows reshaped in pairs), unless
                # both are computed element by element from one tensor
                return self._mixed(op, ins)
            return ELEMS if out.shape.rank == max(x.shape.rank or 0 for _, x in per) \
                else self._mixed(op, ins)
        first, _ = per[0]
        if any(not aligned(f, first) for f, _ in per):
            return self._mixed(op, ins)
        first = _known_group([f for f, _ in per])
        # broadcast: the example axis keeps its place when no input has a higher rank
        ranks = [x.shape.rank for _, x in per]
        if out.shape.rank is None or None in ranks or any(r != out.shape.rank for r in ranks):
            if out.shape.rank is not None and None not in ranks and len(set(ranks)) == 1:
                shift = out.shape.rank - ranks[0]
                return ("rows", first[1] + shift, *first[2:])
            if _key(shape_source(out, self._shape_sources)) != _key(out):
                # of unknown rank, but provably of its inputs' one shape
                # (a scalar beside them broadcasts to nothing new): Keras's
                # Embedding wrapping negative ids of a StringLookup's output
                return first
            return ELEMS
        return first

    def _select_rows(self, op, ins) -> tuple:
        """tf.compat.v1.where(c, a, b) of a vector c (TF1's Select): c[i]
        picks row i of a or of b whole (dynamic_rnn copies each example's
        state through once its sequence has ended). The rows of a and b
        when c, a and b each hold the examples' rows along axis 0, aligned."""
        if all(is_rows(f) and f[1] == 0 for f in ins) and all(aligned(f, ins[0]) for f in ins):
            return _known_group(ins)
        return self._mixed(op, ins)

    def _arithmetic(self, op, ins) -> tuple:
        """Integer arithmetic on sizes and shapes."""
        kinds = [f[0] for f in ins]
        if "dim" in kinds or "shape" in kinds:
            return DIM
        sizes = [f for f in ins if f[0] == "size"]
        if op.type == "Mul" and len(sizes) == 1:
            factor = static_int(op.inputs[1 - ins.index(sizes[0])])
            if factor is not None and factor > 0:
                return ("size", sizes[0][1] * factor, sizes[0][2])
        if op.type in ("Add", "AddV2") and len(sizes) == 2 and sizes[0][2] == sizes[1][2]:
            return ("size", sizes[0][1] + sizes[1][1], sizes[0][2])
        if op.type in ("Cast", "Identity"):
            return ins[0]
        return DIM

    def _shapes(self, op, ins, forms) -> list:
        out = []
        for i, t in enumerate(op.outputs):
            src = ins[i] if op.type == "ShapeN" else ins[0]
            x = op.inputs[i] if op.type == "ShapeN" else op.inputs[0]
            if op.type == "Rank" or src == SHARED or not (per_example(src) or src[0] == "list"):
                static = x.shape.is_fully_defined()
                out.append(SHARED if static or src == SHARED else DIM)
                continue
            if not is_rows(src) and self.selected_by(x, forms):
                out.append(("kept", op.name))   # a count of what a mask keeps
                continue
            if op.type == "Size":
                out.append(DIM)
                continue
            if is_rows(src) and src[1] == 0 and src[2] == BATCH and x.shape.rank is not None:
                unknown = "s" if self.fixed_lengths else "d"
                out.append(("shape", src[3], src[4],
                            tuple(int(d) if d is not None else unknown for d in x.shape[1:])))
            elif x.shape.is_fully_defined():
                out.append(SHARED)
            else:
                out.append(DIM)
        return out

    def _reduction(self, op, ins, forms) -> tuple:
        src = ins[0]
        if src[0] in ("reduced", "distinct"):
            return src
        if src[0] == "shape" and op.type == "Prod":
            static = [d for d in src[3] if isinstance(d, int)]
            if len(static) == len(src[3]) and src[2] is not None:
                return ("size", src[1], src[2] * int(np.prod(static, dtype=np.int64)))
            return ("size", src[1], None)   # each example's rows: a count known when run
        if src[0] == "shape" and src[3] == () and op.type in ("Max", "Min"):
            return ("size", src[1], src[2])   # of [tf.shape(x)[0]]: tf.vectorized_map's count
        if src[0] in ("size", "dim", "shape"):
            return DIM
        if not per_example(src):
            return self._mixed(op, ins)
        axes = folded_value(op.inputs[1])
        rank = op.inputs[0].shape.rank
        if src == ELEMS or axes is None or rank is None:
            over = True
        else:
            axes = {int(a) % rank for a in np.reshape(axes, -1)}
            over = src[1] in axes
            if not over:
                keep = op.get_attr("keep_dims") if "keep_dims" in op.node_def.attr else False
                shift = 0 if keep else sum(1 for a in axes if a < src[1])
                return ("rows", src[1] - shift, *src[2:])
        if op.outputs[0].dtype.is_integer and op.type in ("Max", "Min"):
            if forms is self.forms:
                self.statistics[op.outputs[0].name] = op.type
            return DIM   # a length: shapes the batch, no example's value
        if op.type == "Mean" and not is_rows(src) and self.selected_by(op.inputs[0], forms):
            return ("kept", op.name)   # divides by how many values a mask kept
        return ("reduced", op.name)

    def _over_rows_of_no_example(self, op, forms: dict) -> bool:
        """Whether a Mean or Sum over a tensor holding the batch's rows among
        rows of no example (a concat with other rows, a pad; a PARTS or cat
        form) takes those rows as one device does not: over its first axis
        (or an axis not known), a mean divides by the share's rows and
        those where one device divides by the global batch's and those,
        and a sum takes those rows once on every worker, which weighs what
        they give the gradients of variables N times (nothing, when no
        variable's value reaches them)."""
        # (of an input of unknown rank, a negative axis may be its first)
        if op.inputs[0].shape.rank and not reduces_batch_axis(op):
            return False
        return op.type == "Mean" or self._shared_rows_read_a_variable(op.inputs[0], forms)

    @staticmethod
    def _shared_rows_read_a_variable(t: tf.Tensor, forms: dict) -> bool:
        """Whether rows of no example among the examples' rows of `t` (a
        PARTS or cat form), or what they meet on their way to it, are
        computed from a variable's value: followed back through tensors of
        those forms to the shared values that joined them."""
        return any(forms.get(i.name, SHARED) == SHARED and reads_a_variable(i)
                   for x in _back_through(t, forms, ("parts", "cat")) for i in x.op.inputs)

    def selected_by(self, t: tf.Tensor, forms: dict | None = None) -> str | None:
        """The op that selected `t`'s elements, examples' values laid out
        otherwise, by the batch's own values (SELECTIONS_BY_VALUE): followed
        back through tensors of such elements. None when there is none:
        their count is then the batch's layout's (a reshape, a concat)."""
        return next((x.op.name for x in _back_through(t, self.forms if forms is None else forms,
                                                      ("elems", "parts"))
                     if x.op.type in SELECTIONS_BY_VALUE), None)

    def _matmul(self, op, ins) -> tuple:
        a, b = ins
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        if b == SHARED and is_rows(a):
            return rows(1, *a[2:]) if (a[1] == 1) != ta else \
                (rows(0, *a[2:]) if not ta else ("reduced", op.name))
        if a == SHARED and is_rows(b):
            axis = 1 - b[1] if tb else b[1]
            return ("rows", axis, *b[2:]) if axis == 1 else ("reduced", op.name)
        if b == SHARED and a[0] in ("reduced", "distinct"):
            return a
        if a == SHARED and b[0] in ("reduced", "distinct"):
            return b
        if a == ELEMS or b == ELEMS:
            return self._mixed(op, ins)
        return self._mixed(op, ins)

    def _batch_matmul(self, op, ins) -> tuple:
        a, b = ins
        if a == SHARED and is_rows(b) and b[1] == 0 and (op.inputs[1].shape.rank or 0) > 2:
            return b
        if b == SHARED and is_rows(a) and a[1] == 0 and (op.inputs[0].shape.rank or 0) > 2:
            return a
        if is_rows(a) and is_rows(b) and a[1] == b[1] == 0 and aligned(a, b):
            return _known_group([a, b])     # example by example
        return self._mixed(op, ins)

    def _einsum(self, op, ins) -> tuple:
        equation = op.get_attr("equation").decode().replace(" ", "")
        sides = equation.split("->")
        if len(sides) != 2 or "." in equation:
            return ("unknown", op.name)
        labels, out = sides[0].split(","), sides[1]
        batch = None
        for f, lab in zip(ins, labels):
            if f == SHARED:
                continue
            if not is_rows(f) or f[1] >= len(lab):
                return self._mixed(op, ins)
            mine = (lab[f[1]], f[2:])
            if batch is not None and batch != mine:
                return self._mixed(op, ins)
            batch = mine
        if batch is None:
            return SHARED
        label, rest = batch
        if label not in out:
            return ("reduced", op.name)
        # every input that has the label must carry the examples on it
        for f, lab in zip(ins, labels):
            if f == SHARED and label in lab:
                return self._mixed(op, ins)
        return ("rows", out.index(label), *rest)

    def _row_wise(self, op, ins, shared_inputs, sizes=None) -> tuple:
        src = ins[0]
        if any(ins[i] != SHARED for i in shared_inputs if i < len(ins)) and sizes is None:
            if not all(ins[i][0] in ("shared", "shape", "dim") for i in shared_inputs
                       if i < len(ins)):
                return self._mixed(op, ins)
        if is_rows(src) and src[1] == 0:
            return src
        if src[0] in ("reduced", "distinct"):
            return src
        return ELEMS if src == ELEMS else self._mixed(op, ins)

    def _follow_first(self, op, ins, forms) -> list:
        src, t, n_out = ins[0], op.type, len(op.outputs)
        if src[0] in ("reduced", "distinct", "size", "shape", "dim"):
            if src[0] == "shape" and t in ("StridedSlice", "Slice"):
                return [self._shape_slice(op, src)]
            if src == DIM and t == "StridedSlice":
                element = self._element_of_a_shape(op, forms)
                if element is not None:
                    return [element]
            if src[0] == "size" and t in ("Reshape", "Squeeze") \
                    and op.outputs[0].shape.rank == 0:
                return [src]   # tf.repeat's count, reshaped to a scalar
            if src[0] == "size" and t in ("ExpandDims", "Reshape") \
                    and op.outputs[0].shape.as_list() == [1]:
                # [tf.shape(x)[0]]: the shape of a tensor of the examples'
                # rows, whose other dimensions a concatenation adds
                # (an RNN cell's zero_state(batch_size))
                return [("shape", src[1], src[2], ())]
            if src[0] == "shape" and t == "SplitV":
                return self._shape_split(op, src)
            if src[0] in ("shape", "size", "dim"):
                return [DIM] * n_out
            return [src] * n_out
        if t in ("Split", "SplitV"):
            src, axis_input = (ins[1], op.inputs[0]) if t == "Split" else (ins[0], op.inputs[2])
            if src[0] == "shape":
                return self._shape_split(op, src)
            if not per_example(src):
                return [src if src[0] in ("reduced", "distinct") else DIM] * n_out
            axis = static_int(axis_input)
            if src[0] in ("rows", "elems") and axis is not None:
                rank = op.outputs[0].shape.rank or 1
                if is_rows(src) and axis % rank != src[1]:
                    return [src] * n_out
                # pieces of fixed sizes along the example axis (an ELEMS's
                # first: the values a mask kept)
                if (is_rows(src) or axis % rank == 0) and t == "SplitV" \
                        and _static_vector(op.inputs[1]) is not None:
                    return [("picked", op.name)] * n_out
                if is_rows(src):
                    self._cut(op)   # tf.split(x, 2): pieces of the share's size
            return [ELEMS] * n_out
        if t == "Tile" and src == SHARED:
            return [self._tiled_over_the_batch(op, forms)]
        if not per_example(src):
            return [DIM if src[0] != "list" else ("unknown", op.name)] * n_out
        if src == ELEMS:
            if t in ("Cumsum", "Cumprod", "CumulativeLogsumexp", "TopKV2", "TopK",
                     "ReverseSequence"):
                return [self._mixed(op, ins)] * n_out
            # values laid out otherwise (those a mask kept, nonzeros) run
            # over their examples along their first axis: a selection of it
            # by place takes the worker's first ones, one device's the
            # global batch's (kept[:2], kept[0])
            if t in ("StridedSlice", "Slice") and not self._first_axis_whole(op, forms):
                return [("picked", op.name)]
            if t == "Unpack" and op.get_attr("axis") % (op.inputs[0].shape.rank or 1) == 0:
                return [("picked", op.name)] * n_out
            return [ELEMS] * n_out
        axis = src[1]
        x = op.inputs[0]
        if t == "Transpose":
            # where the example axis goes: the one place of the permutation
            # holding it, found though others may be computed (tf.nn.softmax
            # over another axis swaps it last by a perm built from the rank)
            perm = op.inputs[1]
            places = perm.shape[0] if perm.shape.rank == 1 else None
            moved = next((k for k in range(places or 0)
                          if _static_element(perm, k) == axis), None)
            return [ELEMS if moved is None else ("rows", moved, *src[2:])]
        if t == "ExpandDims":
            at = static_int(op.inputs[1])
            if at is None:
                return [ELEMS]
            rank = (x.shape.rank or 0) + 1
            at %= rank
            return [("rows", axis + (1 if at <= axis else 0), *src[2:])]
        if t == "Squeeze":
            dims = op.get_attr("squeeze_dims")
            if not dims or x.shape.rank is None:
                return [ELEMS]
            dims = {d % x.shape.rank for d in dims}
            if axis in dims:
                return [ELEMS]
            return [("rows", axis - sum(1 for d in dims if d < axis), *src[2:])]
        if t == "Reshape":
            return [self._reshape(op, src)]
        if t in ("StridedSlice", "Slice"):
            taken = self._slice(op, src, forms)
            if is_rows(taken) and taken[2] != src[2]:
                self._cut(op)
            return [taken]
        if t == "Unpack":
            along = op.get_attr("axis") % (x.shape.rank or 1)
            if along == axis:   # each example by its place
                return [("picked", op.name)] * n_out
            return [("rows", axis - (1 if along < axis else 0), *src[2:])] * n_out
        if t in ("Cumsum", "Cumprod", "CumulativeLogsumexp"):
            along = static_int(op.inputs[1])
            if along is None or x.shape.rank is None or along % x.shape.rank == axis:
                return [self._mixed(op, ins)]
            return [src]
        if t in ("TopKV2", "TopK", "InTopKV2"):
            rank = x.shape.rank
            if rank is None or rank - 1 == axis or rank < 2:
                return [self._mixed(op, ins)] * n_out
            return [src] * n_out
        if t in ("ReverseV2", "Roll"):
            # ReverseV2(tensor, axis), Roll(input, shift, axis)
            along = tf.get_static_value(op.inputs[1 if t == "ReverseV2" else 2])
            if along is None or x.shape.rank is None or \
                    axis in {int(a) % x.shape.rank for a in np.reshape(along, -1)}:
                return [self._mixed(op, ins)]
            return [src]
        if t == "Tile":
            # tf.repeat (Keras's UpSampling2D) tiles an axis by a computed count
            times = _static_element(op.inputs[1], axis)
            if times == 1:
                return [src]
            # copies of the examples' rows: each example as often as any other
            # only when the whole batch is tiled a constant number of times
            # (a selection's rows, tiled by the batch's size, are the first
            # example's against every example)
            return [ELEMS if isinstance(times, int) and src[2] == BATCH
                    else self._mixed(op, ins)]
        if t in ("Pad", "PadV2", "MirrorPad"):
            spec = _padding_of(op.inputs[1], axis)
            if spec is not None and not any(spec):
                return [src]
            # rows added along the example axis: a mirror copies the
            # share's first and last examples' (one device's, the global
            # batch's), a constant pad adds rows of no example's
            return [("picked", op.name) if t == "MirrorPad" else PARTS]
        if t == "ReverseSequence":
            batch_dim = op.get_attr("batch_dim")
            return [src if batch_dim == axis and ins[1] == src else self._mixed(op, ins)]
        return [src] * n_out

    def _tiled_over_the_batch(self, op, forms) -> tuple:
        """A value every worker holds alike (a ViT's class token, a position
        embedding), tiled by the batch's size along an axis where it has
        one row: tf.tile(cls, [tf.shape(x)[0], 1, 1]), or tf.repeat's
        Tile of multiples [1, size, 1, ...]. Every example gets the same
        copy, so the copies are rows of the examples: each worker's share
        of one device's."""
        x, multiples = op.inputs
        rank = x.shape.rank
        if rank is None:
            return DIM
        elements = [_element(multiples, k, forms) for k in range(rank)]
        sizes = [k for k, e in enumerate(elements) if isinstance(e, tuple) and e[0] == "size"]
        if len(sizes) != 1 or x.shape[sizes[0]] != 1 \
                or not all(isinstance(e, int) for k, e in enumerate(elements) if k != sizes[0]):
            return DIM
        size = elements[sizes[0]]
        return ("rows", sizes[0], BATCH, size[1], size[2])

    def _space_batch(self, op, ins) -> tuple:
        """A dilated convolution's SpaceToBatchND makes the batch axis P =
        prod(block_shape) consecutive copies of its rows' layout, each
        holding one block offset's pixels of every row; BatchToSpaceND
        takes P such blocks back into one. An example's rows stay its own:
        the blocks multiply, or divide, by P."""
        src = ins[0]
        block = _static_vector(op.inputs[1])
        if not (is_rows(src) and src[1] == 0) or block is None \
                or any(f != SHARED for f in ins[1:]):
            return ELEMS if per_example(src) and all(f == SHARED for f in ins[1:]) \
                else ("unknown", op.name)
        blocks = int(np.prod(block))
        if op.type == "SpaceToBatchND":
            return ("rows", 0, src[2], src[3] * blocks, src[4])
        if src[3] % blocks:
            return ELEMS
        return ("rows", 0, src[2], src[3] // blocks, src[4])

    def _reshape(self, op, src) -> tuple:
        """Rows through a reshape: kept where each example's elements fill a
        whole number of the new rows, else ELEMS."""
        x, out = op.inputs[0], op.outputs[0]
        if x.shape.rank is None or out.shape.rank is None or out.shape.rank == 0:
            return ELEMS
        # axes of one element before the examples' (tf.repeat's [1, b, ...]
        # merged to [b, ...]) leave them leading
        if src[1] != 0 and any(d != 1 for d in x.shape[:src[1]]):
            return ELEMS
        old_rest, new_rest = _product(x.shape[src[1] + 1:]), _product(out.shape[1:])
        if src[4] is not None and old_rest is not None and new_rest is not None:
            elements = src[4] * old_rest   # one example's elements in one block
            if elements % new_rest:
                return ELEMS
            return ("rows", 0, src[2], src[3], elements // new_rest)
        target = self.forms.get(op.inputs[1].name, SHARED)
        if target[0] == "shape" and target[1] == src[3]:
            return ("rows", 0, src[2], src[3], target[2])   # [b * g', ...]
        first = _static_element(op.inputs[1], 0)
        if first == -1:
            # [-1, ...]: TensorFlow's flattening of the outer axes (a loss
            # over every position); rows per example known when run
            self.assumed.setdefault(op.name, "reshaped to [-1, ...], each example's elements "
                                             "fill whole rows")
            return ("rows", 0, src[2], src[3], None)
        return ELEMS

    def _slice(self, op, src, forms) -> tuple:
        """Rows through a slice: kept when the example axis is taken whole,
        else the kept rows are a rowset of their own (named by how they were
        taken, so that x[:h] and y[:h] are the same rows)."""
        axis = src[1]
        if op.type == "StridedSlice":
            spec_len = op.inputs[1].shape[0] if op.inputs[1].shape.rank == 1 else None
            if spec_len is None:
                return ELEMS
            shrink, new_axis = op.get_attr("shrink_axis_mask"), op.get_attr("new_axis_mask")
            ellipsis = op.get_attr("ellipsis_mask")
            # an ellipsis (x[..., 0]) takes whole the axes the other entries
            # leave, which the input's rank tells
            rank = op.inputs[0].shape.rank
            if ellipsis and rank is None:
                return ELEMS
            spanned = rank - sum(1 for i in range(spec_len) if not (new_axis | ellipsis) & (1 << i)
                                 ) if ellipsis else 0
            # walk the spec: which entry takes the example axis, and where it lands
            consumed, produced, entry = 0, 0, None
            for i in range(spec_len):
                if ellipsis & (1 << i):
                    if consumed <= axis < consumed + spanned:
                        return ("rows", produced + axis - consumed, *src[2:])
                    consumed, produced = consumed + spanned, produced + spanned
                    continue
                if new_axis & (1 << i):
                    produced += 1
                    continue
                if consumed == axis:
                    entry = i
                    break
                consumed += 1
                produced += 0 if shrink & (1 << i) else 1
            if entry is None:   # past the spec: taken whole
                return ("rows", produced + axis - consumed, *src[2:])
            if shrink & (1 << entry):
                return ("picked", op.name)   # one example, by its place: x[0]
            # the example axis' own bounds, though others' may be computed
            # (Keras's RandomCrop takes every row at a drawn offset)
            whole = (((op.get_attr("begin_mask") >> entry) & 1
                      or _static_element(op.inputs[1], entry) == 0)
                     and ((op.get_attr("end_mask") >> entry) & 1
                          or self._whole_count(op.inputs[2], entry, src, forms))
                     and _static_element(op.inputs[3], entry) == 1)
            if whole:
                return ("rows", produced, *src[2:])
            masks = (op.get_attr("begin_mask"), op.get_attr("end_mask"))
            bounds = [t for t, mask in zip(op.inputs[1:3], masks) if not (mask >> entry) & 1]
            if self._by_place([*bounds, op.inputs[3]], entry, forms):
                return ("picked", op.name)
            return ("rows", produced, _selection_key(op, src, axis), 1, src[4])
        # the example axis taken whole: from 0, all of it (-1, or the
        # batch's own count: keras.ops.image.crop_images' tf.shape(x)[0])
        if _static_element(op.inputs[1], axis) == 0 and (
                _static_element(op.inputs[2], axis) == -1
                or self._whole_count(op.inputs[2], axis, src, forms)):
            return src
        if self._by_place(op.inputs[1:3], axis, forms):
            return ("picked", op.name)
        return ("rows", axis, _selection_key(op, src, axis), 1, src[4])

    def _ctc_loss(self, op, ins) -> list:
        """CTCLoss(inputs [time, batch, classes], labels' indices and values
        (a SparseTensor of each example's labels: its row, the example's
        place in the worker's batch), sequence lengths [batch]): each
        example's loss, and its gradient [time, batch, classes], from that
        example's own logits, labels and length."""
        logits, indices, values, lengths = ins
        if is_rows(logits) and logits[1] == 1 and \
                (lengths == SHARED or (is_rows(lengths) and lengths[1] == 0 and
                                       aligned(lengths, rows(0, *logits[2:])))) and \
                all(f[0] in ("rows", "elems") for f in (indices, values)):
            return [rows(0, *logits[2:]), logits]
        return [self._mixed(op, ins)] * len(op.outputs)

    def _cut(self, op) -> None:
        """A selection along the example axis at a point computed from the
        share's size (x[:tf.shape(x)[0] // 2], tf.split(x, 2)): its examples
        are a part of the worker's share where one device's are the same
        part of the global batch."""
        self.cuts.setdefault(self._step_op, (op.name, op.type))

    def _first_axis_whole(self, op, forms: dict) -> bool:
        """Whether a slice takes its input's first axis whole, read as the
        example axis of rows of their own (its bounds 0, the end, stride 1;
        x[..., k])."""
        if op.type == "StridedSlice" and op.get_attr("ellipsis_mask") & 1:
            return True
        first = rows(0, ELEMS[0])
        taken = self._slice(op, first, forms)
        return is_rows(taken) and taken[2] == first[2]

    def _by_place(self, bounds, k: int, forms: dict) -> bool:
        """Whether a selection along the example axis, element k of each of
        `bounds` (its begin, end or size, stride), picks the examples by
        their place in the batch: every bound a number, or a value no
        example gives (x[:2], x[1:], x[::2], x[:n] of a fed n). Bounds
        computed from the batch's size (its halves) are not: each worker's
        are its share's, as one device's are the global batch's."""
        for t in bounds:
            e = _element(t, k, forms)
            if e is None and forms.get(t.name, SHARED) == SHARED:
                e = SHARED   # a vector computed from no input
            if not (isinstance(e, int) or e == SHARED or _offset_of_a_size(t, k, forms)):
                return False
        return True

    def _whole_count(self, bounds: tf.Tensor, k: int, src, forms: dict) -> bool:
        """Whether element k of a slice's end (or size) is the count of the
        batch's rows `src` lays out: tf.shape(x)[0] (keras.ops.image's
        crops, tf.signal.frame's outer dimensions)."""
        return src[2] == BATCH and _element(bounds, k, forms) == ("size", src[3], src[4])

    def _shape_slice(self, op, src) -> tuple:
        """tf.shape(x)[0] is a size, tf.shape(x)[:k] a shape; other elements
        SHARED or DIM."""
        rank = len(src[3]) + 1
        if op.type == "Slice":
            # tf.slice(tf.shape(x), [0], [rank - 1]): the shape of x but its
            # last axis, which tf.nn.softmax_cross_entropy_with_logits
            # reshapes its per-position losses to
            begin, size = folded_value(op.inputs[1]), folded_value(op.inputs[2])
            if begin is None or size is None or np.size(begin) != 1 or np.size(size) != 1:
                return DIM
            start, size = int(np.reshape(begin, -1)[0]), int(np.reshape(size, -1)[0])
            stop = rank if size == -1 else min(start + size, rank)
            if start == 0:
                return ("shape", src[1], src[2], src[3][:max(stop - 1, 0)])
            return SHARED if all(d != "d" for d in src[3][start - 1:stop - 1]) else DIM
        if op.type != "StridedSlice":
            return DIM
        begin = tf.get_static_value(op.inputs[1])
        end = tf.get_static_value(op.inputs[2])
        strides = tf.get_static_value(op.inputs[3])
        if begin is None or strides is None or len(begin) != 1 or strides[0] != 1:
            return DIM
        start = 0 if op.get_attr("begin_mask") & 1 else int(begin[0]) % rank
        if op.get_attr("shrink_axis_mask") & 1:
            if start == 0:
                return ("size", src[1], src[2])
            return SHARED if src[3][start - 1] != "d" else DIM
        stop = rank if op.get_attr("end_mask") & 1 or end is None else int(end[0])
        stop = stop % rank if stop < 0 else min(stop, rank)
        if start == 0:
            return ("shape", src[1], src[2], src[3][:max(stop - 1, 0)])
        return SHARED if all(d != "d" for d in src[3][start - 1:stop - 1]) else DIM

    def _element_of_a_shape(self, op, forms) -> tuple | None:
        """tf.shape(x)[k] of a tensor x whose examples run along an axis
        other than its first (a time-major sequence [T, b, d], which
        dynamic_rnn makes and reads its batch's size from as
        tf.shape(x)[1]): the batch's size where k is that axis; SHARED where
        the dimension is static or of a fixed length, DIM otherwise. None
        for any other slice (a "shape" form holds the size at element 0
        only)."""
        shape = op.inputs[0].op
        if shape.type != "Shape" or not op.get_attr("shrink_axis_mask") & 1:
            return None
        src = forms.get(shape.inputs[0].name, SHARED)
        rank = shape.inputs[0].shape.rank
        begin = tf.get_static_value(op.inputs[1])
        if not is_rows(src) or src[2] != BATCH or rank is None or begin is None \
                or np.size(begin) != 1:
            return None
        k = int(np.reshape(begin, -1)[0]) % rank
        if k == src[1]:
            return ("size", src[3], src[4])
        known = shape.inputs[0].shape[k] is not None or self.fixed_lengths
        return SHARED if known else DIM

    def _shape_split(self, op, src) -> list:
        """tf.split of tf.shape(x) (tf.signal.frame's outer, framed and inner
        dimensions): the piece starting with the batch's size a shape, the
        others SHARED, or DIM where they hold a per-worker length."""
        whole = [None, *src[3]]
        if op.type == "SplitV":
            # one size left unknown (or -1) is what the others leave: the
            # sizes add up to the length, or the op fails
            sizes = [_static_element(op.inputs[1], k) for k in range(len(op.outputs))]
            sizes = [-1 if n is None else n for n in sizes]
            if sizes.count(-1) > 1:
                return [DIM] * len(op.outputs)
            if -1 in sizes:
                sizes[sizes.index(-1)] = len(whole) - (sum(sizes) + 1)
        else:
            sizes = [len(whole) // len(op.outputs)] * len(op.outputs)
        if sum(sizes) != len(whole) or min(sizes) < 0:
            return [DIM] * len(op.outputs)
        out, start = [], 0
        for n in sizes:
            piece = whole[start:start + n]
            if start == 0 and n:
                out.append(("shape", src[1], src[2], tuple(piece[1:])))
            else:
                out.append(SHARED if "d" not in piece else DIM)
            start += n
        return out

    def _concat(self, op, ins) -> tuple:
        values, axis_form = ins[:-1], ins[-1]
        axis = static_int(op.inputs[-1])
        if axis_form != SHARED or axis is None:
            return self._mixed(op, ins)
        out = op.outputs[0]
        rank = out.shape.rank
        if rank is None:
            return ELEMS if all(per_example(f) or f == SHARED for f in values) \
                else self._mixed(op, ins)
        axis %= max(rank, 1)
        kinds = {f[0] for f in values}
        if kinds <= {"shared", "size", "dim", "shape"} and rank == 1:
            # a shape being built: [b, 4] from tf.shape(x)[:1] and a constant
            head = values[0]
            if head[0] != "shape":
                return DIM
            rest = list(head[3])
            for f, x in zip(values[1:], op.inputs[1:-1]):
                if f[0] == "shape" or x.shape.rank != 1 or x.shape[0] is None:
                    return DIM
                rest += _entries(x, f, int(x.shape[0]))
            return ("shape", head[1], head[2], tuple(rest))
        if kinds & {"reduced", "distinct", "dim", "size", "shape"}:
            if kinds & {"rows", "elems"}:
                return self._mixed(op, ins)
            return next(f for f in values if f[0] in ("reduced", "distinct", "dim", "size",
                                                      "shape"))
        per = [f for f in values if per_example(f)]
        if (axis == 0 and len(values) == 2 and is_rows(values[0]) and values[0][1] == 0
                and values[1] == SHARED):
            return ("cat", values[0], _cat_count(op.inputs[1]), _cat_count(op.inputs[0]))
        if any(f[0] != "rows" for f in per):
            return ELEMS if all(f[0] in ("rows", "elems") for f in per) and \
                SHARED not in values else PARTS
        if axis == per[0][1]:
            if all(f != SHARED for f in values) and all(
                    f[1] == axis and f[2] == BATCH and f[4] == per[0][4] for f in per):
                return ("rows", axis, BATCH, sum(f[3] for f in per), per[0][4])
            return ELEMS
        if any(not aligned(f, per[0]) for f in per):
            return ELEMS if all(f[1] == per[0][1] for f in per) and SHARED not in values \
                else self._mixed(op, ins)
        # along another axis: row i of each input, SHARED ones included (they
        # have the examples' count of rows there), makes row i
        return _known_group(per)

    def _of_cat(self, op, ins) -> list | None:
        """The ops that keep a ("cat", head, count) form apart: reads,
        casts, a flattening reshape of the ids, a lookup of them, and the
        slices that take the head or the rest back (sampled_softmax_loss's
        true_w and sampled_w); None for any other (PARTS then)."""
        cat, t = ins[0], op.type
        if t in ("Identity", "Cast", "Snapshot", "StopGradient"):
            return [cat]
        if t == "Reshape" and op.outputs[0].shape.rank == op.inputs[0].shape.rank and \
                op.inputs[0].shape.rank == 1:
            return [cat]
        if t in GATHERS and ins[0] != SHARED:
            return None
        if t == "Slice":
            begin, size = op.inputs[1], op.inputs[2]
            # the head's row count, as a size of the batch or a static number
            head = (("size", cat[1][3], cat[1][4]), cat[3])
            first_begin = _element(begin, 0, self.forms)
            first_size = _element(size, 0, self.forms)
            if first_begin == 0 and first_size in head and first_size is not None:
                return [cat[1]]
            if first_begin in head and first_begin is not None and first_size == -1:
                return [SHARED]
        return None

    def _pack(self, op, ins) -> tuple:
        axis = op.get_attr("axis")
        out = op.outputs[0]
        if out.shape.rank == 1 and all(f[0] in ("shared", "size", "dim") for f in ins):
            head = ins[0]
            if head[0] == "size":
                return ("shape", head[1], head[2],
                        tuple(e for f, x in zip(ins[1:], op.inputs[1:]) for e in _entries(x, f, 1)))
            return DIM
        kinds = {f[0] for f in ins}
        if kinds & {"reduced", "distinct"}:
            return self._mixed(op, ins) if kinds & {"rows", "elems"} else \
                next(f for f in ins if f[0] in ("reduced", "distinct"))
        per = [f for f in ins if per_example(f)]
        if not per or any(f == ELEMS for f in per) or any(f != per[0] for f in per) \
                or len(per) != len(ins):
            return ELEMS if all(per_example(f) or f == SHARED for f in ins) \
                else self._mixed(op, ins)
        rank = out.shape.rank or 1
        axis %= rank
        src = per[0]
        return ("rows", src[1] + (1 if axis <= src[1] else 0), *src[2:])

    def _fill(self, op, ins, shape_input: int) -> tuple:
        shape = ins[shape_input]
        values = [f for i, f in enumerate(ins) if i != shape_input]
        if any(per_example(f) for f in values) and op.type == "BroadcastTo":
            src = ins[0]
            if is_rows(src) and op.outputs[0].shape.rank == op.inputs[0].shape.rank:
                return src
            return ELEMS
        if any(f[0] not in ("shared",) for f in values):
            return self._mixed(op, ins)
        if shape[0] == "shape":
            return ("rows", 0, BATCH, shape[1], shape[2]) if "d" not in shape[3] else DIM
        return DIM

    def _gather(self, op, ins, forms) -> tuple:
        params, indices = ins[0], ins[1]
        t = op.type
        if t in ("GatherV2",):
            axis = _static_scalar(op.inputs[2])   # tf.signal.frame's: range(rank)[-1]
            batch_dims = op.get_attr("batch_dims")
        else:
            axis, batch_dims = 0, op.get_attr("batch_dims") if "batch_dims" in \
                op.node_def.attr else 0
        if axis is None:
            return self._mixed(op, ins)
        if params[0] in ("shape", "size", "dim") and indices[0] in ("shared", "dim"):
            picked = tf.get_static_value(op.inputs[1])
            if params[0] == "shape" and indices == SHARED and picked is not None:
                picked = [int(i) for i in np.reshape(picked, -1)]
                if picked and picked[0] == 0 and 0 not in picked[1:]:
                    return ("shape", params[1], params[2],
                            tuple(params[3][i - 1] for i in picked[1:]))
                if 0 not in picked:
                    return SHARED if all(params[3][i - 1] != "d" for i in picked) else DIM
            return DIM
        if params == SHARED and t in ("GatherNd", "ResourceGatherNd"):
            return ELEMS if per_example(indices) else indices
        if is_rows(params) and indices[0] in ("shared", "dim") and \
                self._gathers_examples(op, params[1], axis):
            # rows of the batch by their place: x[[0, 0, 1]], its last one
            # (keras.ops.take's indices, made positive by the batch's size)
            return ("picked", op.name)
        if params == SHARED:
            if is_rows(indices):
                return indices    # an embedding lookup: each example's ids' rows
            if indices[0] in ("distinct", "elems", "dim", "reduced"):
                return indices if indices[0] != "dim" else DIM
            return self._mixed(op, ins)
        if per_example(params) and indices[0] in ("shared", "dim"):
            rank = op.inputs[0].shape.rank
            if is_rows(params) and rank is not None and axis % rank != params[1]:
                return params
            if params == ELEMS and self._gathers_examples(op, 0, axis):
                return ("picked", op.name)   # tf.gather(kept, [0, 1]): as kept[:2]
            return ELEMS
        if is_rows(params) and is_rows(indices) and batch_dims >= 1 and params[1] == 0 \
                and indices[1] == 0 and params[2:] == indices[2:]:
            return params    # gathered within each example
        if t in ("GatherV2", "Gather") and batch_dims == 0 and axis == 0 and \
                is_rows(params) and params[1] == 0 and \
                self._kept_places(op.inputs[1], params, forms):
            return ELEMS   # tf.boolean_mask: the rows a mask of the same rows keeps
        if t in ("GatherV2", "Gather") and batch_dims == 0 and axis == 0 and \
                params == ELEMS and indices == ELEMS and _retained_elements(op, forms) is not None:
            return ELEMS   # tf.sparse.retain: the entries a mask of the same entries keeps
        if per_example(params) and per_example(indices):
            return ELEMS if t in ("GatherNd", "ResourceGatherNd") else self._mixed(op, ins)
        if params[0] in ("reduced", "distinct") and indices == SHARED:
            return params
        return self._mixed(op, ins)

    @staticmethod
    def _kept_places(indices: tf.Tensor, params: tuple, forms: dict) -> bool:
        """Whether gather indices are the places in the worker's rows
        `params` that a mask of those same rows keeps (tf.where of a 1-D
        mask, squeezed or reshaped, as tf.boolean_mask builds them): each
        gathered row is then a kept example's own."""
        op = indices.op
        while op.type in ("Squeeze", "Reshape", "Cast", "Identity", "StridedSlice"):
            op = op.inputs[0].op
        if op.type != "Where":
            return False
        mask = op.inputs[0]
        return mask.shape.rank == 1 and forms.get(mask.name) == params

    @staticmethod
    def _gathers_examples(op, example_axis: int, axis: int) -> bool:
        """Whether a gather indexes the example axis of its params (a
        GatherNd: when that axis is among those its index vectors address,
        or their length is unknown)."""
        if op.type in ("GatherNd", "ResourceGatherNd"):
            indices = op.inputs[1].shape
            depth = indices[-1] if indices.rank else None
            return depth is None or example_axis < depth
        rank = op.inputs[0].shape.rank
        return rank is None or axis % rank == example_axis

    def _same_rows(self, op, ins, forms) -> tuple:
        per = [f for f in forms if f != SHARED]
        if all(is_rows(f) for f in per) and all(aligned(f, per[0]) for f in per) \
                and per[0][1] == 0:
            return _known_group(per)
        return self._mixed(op, ins)

    def _sparse_cross(self, op, ins) -> list:
        """A cross of features row by row (SPARSE_CROSSES): its indices and
        values each an example's when every input's are, the dense inputs
        the batch's rows. Its dense shape: the examples' count in the dense
        inputs' layout, then the crosses per row, static (their product)
        for dense inputs of static width alone, else the largest count of a
        row's crosses in the worker's rows ("d": a SparseToDense of it is
        padded to each worker's own width); DIM without a dense input (a
        SparseTensor's shape is no form of the examples' count)."""
        n = op.get_attr("N")
        dense = len(op.get_attr("dense_types"))
        sparse_parts, shapes = ins[:2 * n], ins[2 * n:3 * n]
        dense_forms, scalars = ins[3 * n:3 * n + dense], ins[3 * n + dense:]
        layouts = {(f[3], f[4]) if is_rows(f) and f[1] == 0 and f[2] == BATCH else None
                   for f in dense_forms}
        layouts |= {(f[1], f[2]) for f in shapes if f[0] == "shape"}
        if None in layouts or len(layouts) > 1 or any(f != SHARED for f in scalars) \
                or not all(per_example(f) for f in sparse_parts) \
                or not all(f == SHARED or f[0] in ("shape", "dim") for f in shapes):
            return [self._mixed(op, ins)] * 3
        self.assumed[op.name] = "its output's row i crosses row i of every input"
        if not layouts:
            return [ELEMS, ELEMS, DIM]
        (blocks, group), = layouts
        widths = [x.shape[1] if x.shape.rank == 2 else None
                  for x in op.inputs[3 * n:3 * n + dense]]
        crosses = "d" if n or None in widths else int(np.prod(widths, dtype=np.int64))
        return [ELEMS, ELEMS, ("shape", blocks, group, (crosses,))]

    def _sparse_segments(self, op, ins) -> tuple:
        # (data, indices, segment_ids[, num_segments]): embedding_lookup_sparse
        # sums the rows of each example's ids; segment ids are the rows of the
        # SparseTensor of ids, one per example
        data, indices, segments = ins[:3]
        if per_example(segments) and indices[0] in ("elems", "rows") \
                and data[0] in ("shared", "distinct", "elems", "rows"):
            self.assumed[op.name] = "its segment ids are the example rows of a SparseTensor"
            return rows()
        return self._mixed(op, ins)

    def _stitch(self, op, ins) -> tuple:
        """The partitioned lookup's stitch (embedding_lookup over a
        partitioned variable): the rows gathered for each partition of the
        ids put back at their ids' places, so they follow the flat ids."""
        n = len(op.inputs) // 2
        indices, data = op.inputs[:n], op.inputs[n:]
        source = _stitched_source(indices, data)
        if source is None:
            return ELEMS if all(per_example(f) or f == SHARED for f in ins) \
                else self._mixed(op, ins)
        form = self.forms.get(source.name, SHARED)
        if not is_rows(form) or form[1] != 0:
            return ELEMS if per_example(form) else form
        rest = _product(source.shape[1:]) if source.shape.rank is not None else None
        group = form[4] * rest if form[4] is not None and rest is not None else None
        return ("rows", 0, form[2], form[3], group)

    def _segments(self, op, ins) -> tuple:
        """A segment reduction of per-example rows: rows of the examples when
        there are as many segments as examples (a bag of ids per example, fed
        flat with each id's example), else a reduction over the examples."""
        data, segments = ins[0], ins[1]
        if not per_example(data) and data != SHARED:
            return self._mixed(op, ins)
        count = ins[2] if len(ins) > 2 else None
        if per_example(segments) and count is not None and count[0] == "size" \
                and count[1:] == (1, 1):
            self.assumed[op.name] = "its segment ids are the rows of the examples"
            return rows()
        return ("reduced", op.name)

    def _draw(self, op, ins) -> tuple:
        shape = ins[0] if op.type not in ("StatefulUniform", "StatefulStandardNormal",
                                          "StatefulStandardNormalV2", "StatefulTruncatedNormal",
                                          "StatefulUniformInt", "StatefulUniformFullInt") \
            else ins[2]
        if shape[0] == "shape" and "d" not in shape[3]:
            return ("rows", 0, BATCH, shape[1], shape[2])
        if all(f == SHARED for f in ins):
            return SHARED
        return DIM if all(f[0] in ("shared", "dim", "shape", "size") for f in ins) \
            else self._mixed(op, ins)

    # ------------------------------------------------------------ functions
    def _function_graph(self, name: str, input_shapes=None):
        """function_graph, once per function and argument shapes: a loop's
        body is read again for each round of its fixpoint and by the map
        rule, a function's graph is only read."""
        key = (name, None if input_shapes is None else tuple(str(s) for s in input_shapes))
        if key not in self._function_graphs:
            self._function_graphs[key] = function_graph(self.graph, name, input_shapes)
        return self._function_graphs[key]

    def _body_forms(self, name: str, arg_forms: list, input_shapes=None) -> list | None:
        body = self._function_graph(name, input_shapes)
        if body is None:
            return None
        forms: dict[str, tuple] = {}
        args = {t.op.name: f for t, f in zip(body.inputs, arg_forms)}
        self._run(body.get_operations(), forms, inputs=args)
        return [forms.get(t.name, SHARED) if t.op.type != "Placeholder"
                else args.get(t.op.name, SHARED) for t in body.outputs]

    def _call(self, op, ins, name: str) -> list:
        outs = self._body_forms(name, ins, [t.shape for t in op.inputs])
        return outs if outs is not None else [("unknown", op.name)] * len(op.outputs)

    def _if(self, op, ins, forms) -> list:
        branches = [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
        shapes = [t.shape for t in op.inputs[1:]]
        results = [self._body_forms(b, ins[1:], shapes) for b in branches]
        if any(r is None for r in results):
            return [("unknown", op.name)] * len(op.outputs)
        if ins[0] not in (SHARED,) and ins[0][0] != "dim" and \
                not self._decided_alike(op, op.inputs[0], ins[0], forms) \
                or self._decides_by_values(op.inputs[0], forms):
            return [self._mixed(op, ins)] * len(op.outputs)
        return [_join(list(pair)) for pair in zip(*results)]

    def _decided_alike(self, cond: tf.Operation, pred: tf.Tensor, form: tuple,
                       forms: dict) -> bool:
        """Whether a cond of the step's graph decides by whether every
        example, or any, of the batch passes a test (Keras's Hinge: whether
        all labels are 0 or 1): one device's decision for the global batch
        is each worker's for its share wherever the workers decide alike,
        which a training step then checks (transforms.padded_lengths). Any
        other statistic of the batch (its mean over a threshold) may hold on
        every share and not on the global batch, or the reverse."""
        if form[0] != "reduced" or forms is not self.forms:
            return False
        t = pred
        while t.op.type in ("Identity", "Snapshot", "LogicalNot"):
            t = t.op.inputs[0]
        if t.op.type not in ("All", "Any"):
            return False
        # (a V1 cond's Switch ops are named in its scope)
        self.alike.setdefault(t.name, cond.name.rpartition("/")[0] or cond.name
                              if cond.type in ("Switch", "RefSwitch") else cond.name)
        return True

    def _while(self, op, ins, forms) -> list:
        if any(self._decides_by_values(x, forms) for x in op.inputs):
            # (its condition may read any of them: how many times it runs)
            return [self._mixed(op, ins)] * len(op.outputs)
        body = op.get_attr("body").name
        # the loop variables' shape invariants, which the body was traced with
        shapes = [tf.TensorShape(s) for s in op.get_attr("output_shapes")] or \
            [t.shape for t in op.inputs]
        state = list(ins)
        for _ in range(4):
            outs = self._body_forms(body, state, shapes)
            if outs is None:
                return [("unknown", op.name)] * len(op.outputs)
            joined = [_join([a, b]) for a, b in zip(state, outs)]
            if joined == state:
                break
            state = joined
        if ("list", ELEMS) in ins:
            # a map over the examples (tf.map_fn): each output list's
            # element i example i's alone (transforms/example_maps.py)
            cond = op.get_attr("cond").name
            for k in mapped_outputs(op, forms, self._function_graph(body, shapes),
                                    self._function_graph(cond, shapes), rows(), ("size", 1, 1)):
                state[k] = ("list", ("example", BATCH))
        return state

    def _decides_by_values(self, t: tf.Tensor, forms: dict) -> bool:
        """Whether `t`, of a per-worker length's form (DIM: no example's
        value, one of the worker's batch), is a statistic of the batch's
        values (its longest sequence, tf.reduce_max of lengths the program
        computes), which one device takes of the global batch and each
        worker of its share: a cond deciding by it, or a loop running as
        many times, is each worker's own. A length of the batch's shape
        (a padded length) is not: transforms.padded_lengths checks in
        every training step that the workers' are one device's."""
        return forms.get(t.name, SHARED) == DIM and self.batch_values_read(t, forms) is not None

    def batch_values_read(self, t: tf.Tensor, forms: dict | None = None) -> str | None:
        """The first op through which `t` reads values of the batch (not
        its shape alone, nor a count transforms.loss_counts makes one
        device's: `stops`), or None. In a function's body (`forms` its
        own), an argument of a per-worker length, a size or a shape was
        checked where the function runs; one of another form reads the
        examples' values."""
        forms = self.forms if forms is None else forms
        seen, stack = set(), [t]
        while stack:
            x = stack.pop()
            form = SHARED if x.name in self.stops else forms.get(x.name, SHARED)
            if x.name in seen or form == SHARED or x.op.type in OF_SHAPES_ALONE:
                continue
            seen.add(x.name)
            if x.op.type == "Placeholder" and forms is not self.forms:
                if form[0] in ("dim", "size", "shape"):
                    continue
                return x.op.name
            if not x.op.inputs or x.op.type in INPUT_OP_TYPES:
                return x.op.name
            inner = [i for i in x.op.inputs if i.name not in self.stops
                     and forms.get(i.name, SHARED) != SHARED]
            if not inner:
                return x.op.name
            stack.extend(inner)
        return None

    def _tensor_list(self, op, ins, as_type: str | None = None) -> list:
        """TensorList ops; a V1 TensorArray's (`as_type`: the TensorList op
        it acts as, its inputs reordered so, the list's form carried by its
        flow tensor)."""
        t = as_type or op.type
        n_out = len(op.outputs)
        if t == "TensorListFromTensor":
            unstacked = ("list", _list_of(ins[0]))
            # (a TensorArray's scatter: into the list its flow carries)
            return [unstacked if as_type is None else _join([ins[1], unstacked])]
        if as_type == "TensorListReserve":
            return [SHARED, ("list", SHARED)]   # (handle, flow)
        if t in ("TensorListReserve", "EmptyTensorList"):
            return [("list", SHARED)]
        lst = ins[0]
        elem = lst[1] if lst[0] == "list" else (SHARED if lst == SHARED else ELEMS)
        if elem[0] == "example":
            # element i example i's (a map's output): stacked, the
            # examples' rows; an element taken or changed by its place, a pick
            if t == "TensorListStack":
                return [("rows", 0, elem[1], 1, 1)]
            if t in ("TensorListLength", "TensorListElementShape"):
                return [SHARED] * n_out
            return [("picked", op.name)] * n_out
        if t == "TensorListGetItem":
            # an element of a list of the examples' rows is an example
            # taken by its place (a scan's first, a loop's i-th; a map's
            # are the examples' own, found at its loop)
            return [("picked", op.name) if elem == ELEMS else elem]
        if t == "TensorListSetItem":
            return [("list", _join([elem, ins[2]]))]
        if t == "TensorListPushBack":
            return [("list", _join([elem, ins[1]]))]
        if t == "TensorListStack":
            if is_rows(elem):
                return [("rows", elem[1] + 1, *elem[2:])]
            return [elem if elem[0] != "rows" else ELEMS]
        if t in ("TensorListLength", "TensorListElementShape"):
            return [SHARED] * n_out
        if t == "TensorListPopBack":
            return [lst, ("picked", op.name) if elem == ELEMS else elem]
        return [("unknown", op.name)] * n_out


def _list_of(src: tuple) -> tuple:
    """The form of the elements of a list unstacked from a tensor of form
    `src` along its axis 0."""
    if is_rows(src):
        return ELEMS if src[1] == 0 else ("rows", src[1] - 1, *src[2:])
    return src if src == SHARED or not per_example(src) else ELEMS


def aligned(a: tuple, b: tuple) -> bool:
    """Whether two rows forms hold the same examples along the same axis,
    row for row (a group known only at run time matches any)."""
    return (a[1:4] == b[1:4] and (a[4] == b[4] or a[4] is None or b[4] is None))


def _known_group(forms: list) -> tuple:
    """Of aligned rows forms, one whose group is known, if any."""
    return next((f for f in forms if f[4] is not None), forms[0])


def _clamped_to_a_constant(op: tf.Operation) -> bool:
    """Whether a scalar Minimum(c, Maximum(d, x)) with constants d >= c (a
    Maximum(c, Minimum(d, x)) with d <= c) is c whatever x is:
    tf.math.bincount's size with minlength == maxlength, a StringLookup's
    multi-hot depth, computed from the batch's largest id."""
    inner_type = "Maximum" if op.type == "Minimum" else "Minimum"
    for outer, inner in (op.inputs, reversed(op.inputs)):
        c = tf.get_static_value(outer)
        if c is None or np.ndim(c) != 0 or inner.op.type != inner_type:
            continue
        for x in inner.op.inputs:
            d = tf.get_static_value(x)
            if d is not None and np.ndim(d) == 0 and (d >= c if op.type == "Minimum" else d <= c):
                return True
    return False


# Elementwise ops whose output has the shape of input 0 whatever the others'.
_SHAPE_OF_FIRST = frozenset({"BiasAdd"})


def _key(t: tf.Tensor) -> tuple:
    return (id(t.graph), t.name)


def _shape_deps(t: tf.Tensor) -> list | None:
    """The tensors whose one shape `t` provably has (None: no rule, `t` is
    its own): an elementwise op's inputs of rank other than 0 (a scalar
    broadcasts to nothing new), a lookup's keys (its default a scalar)."""
    op = t.op
    if op.type == "IdentityN":
        return [op.inputs[t.value_index]]
    if op.type in UNARY and op.type != "Bitcast":
        return [op.inputs[0]]
    if op.type in _SHAPE_OF_FIRST:
        return [op.inputs[0]]
    if op.type in NARY and op.type != "Select":   # Select's condition may be a vector
        shaped = [x for x in op.inputs if x.shape.rank != 0]
        return shaped or None
    if op.type in LOOKUPS and op.inputs[2].shape.rank == 0:
        return [op.inputs[1]]
    return None


def shape_source(t: tf.Tensor, memo: dict) -> tf.Tensor:
    """The first tensor up `t`'s chain of shape-keeping ops that `t` provably
    has the shape of (`t` itself when none): two tensors with one source have
    one shape, whatever their rank. `memo` caches by tensor; the walk is
    iterative (a chain may be longer than Python's recursion limit)."""
    stack = [t]
    while stack:
        x = stack[-1]
        if _key(x) in memo:
            stack.pop()
            continue
        deps = _shape_deps(x)
        pending = [d for d in deps or () if _key(d) not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        sources = {_key(memo[_key(d)]): memo[_key(d)] for d in deps or ()}
        memo[_key(x)] = next(iter(sources.values())) if len(sources) == 1 else x
    return memo[_key(t)]


def _cat_count(t: tf.Tensor) -> int | None:
    """The static number of rows of a concatenated part (None: unknown)."""
    return t.shape[0] if t.shape.rank else None


def _join(forms: list) -> tuple:
    """The form of a value that is one of `forms` (a Merge's inputs, a loop's
    state before and after its body, an If's branches)."""
    known = [f for f in forms if f != SHARED]
    if not known:
        return SHARED
    first = known[0]
    if all(f == first for f in known):
        return first
    if any(f[0] in OPAQUE for f in known):
        return next(f for f in known if f[0] in OPAQUE)
    if first[0] == "list" and all(f[0] == "list" for f in known):
        return ("list", _join([f[1] for f in known]))
    if all(per_example(f) for f in known):
        return ELEMS
    if all(f[0] in ("dim", "size", "shape") for f in known):
        return DIM
    return next((f for f in known if f[0] in ("reduced", "distinct")), ("unknown", "join"))


def function_graph(graph: tf.Graph, name: str, input_shapes=None):
    """The graph of the function `name` of `graph`'s library (a While's
    body, an If's branch), or None. Graph._get_function is the only way to
    the functions a graph holds; every caller goes through here.
    `input_shapes`: its arguments' shapes at the call, for a function that
    only a FunctionDef holds (a graph imported from a GraphDef, as a lifted
    step is): without them every shape in its body is unknown, and a bias
    added to rows of unknown rank could broadcast them anywhere."""
    try:
        fn = graph._get_function(name)  # pylint: disable=protected-access
    except Exception:   # noqa: BLE001 - a library without it
        fn = None
    if fn is None:
        return None
    body = getattr(fn, "graph", None)
    if body is None:
        from tensorflow.python.framework import function_def_to_graph  # noqa: E501 pylint: disable=import-outside-toplevel
        definition = _function_def(fn)
        if input_shapes is not None and len(input_shapes) != len(definition.signature.input_arg):
            input_shapes = None
        body = function_def_to_graph.function_def_to_graph(definition, input_shapes=input_shapes)
    return body


def _function_def(fn):
    """The FunctionDef of a function of a graph's library, read without
    adding it to the eager context, which its `.definition` does: a lifted
    step's functions keep the traced functions' names, with the shapes
    tracing inferred added (transforms.lift), and the context refuses a
    second definition of a name."""
    c_func = getattr(fn, "_c_func", None)
    if c_func is None:
        return fn.definition
    from tensorflow.core.framework import function_pb2  # noqa: E501 pylint: disable=import-outside-toplevel
    from tensorflow.python.client import pywrap_tf_session as c_api  # noqa: E501 pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import c_api_util  # noqa: E501 pylint: disable=import-outside-toplevel
    with c_api_util.tf_buffer() as buf:
        with c_func.get() as func:
            c_api.TF_FunctionToFunctionDef(func, buf)
            return function_pb2.FunctionDef.FromString(c_api.TF_GetBuffer(buf))


def _selection_key(op: tf.Operation, src: tuple, axis: int) -> str:
    """A name for the rows a slice keeps along the example axis: the rows of
    `src` and how the slice's bounds were computed (their static values, or
    the tensors packed into them), so that slices of two tensors with the
    same bounds keep the same examples."""
    parts = [src[2], op.type, str(axis)]
    for t in op.inputs[1:]:
        value = tf.get_static_value(t)
        if value is not None:
            parts.append(str(np.reshape(value, -1).tolist()))
        elif t.op.type == "Pack":
            parts.append(str([tf.get_static_value(x).tolist() if tf.get_static_value(x) is not None
                              else x.name for x in t.op.inputs]))
        else:
            parts.append(t.name)
    if op.type == "StridedSlice":
        parts += [str(op.get_attr(m)) for m in ("begin_mask", "end_mask", "shrink_axis_mask")]
    return "|".join(parts)


def _entries(t: tf.Tensor, form: tuple, count: int) -> list:
    """The `count` entries a shape form gets from `t` (module docstring:
    ints where static, "s" where SHARED, "d" where per worker)."""
    value = tf.get_static_value(t)
    if value is not None:
        return [int(v) for v in np.reshape(value, -1)]
    return ["s" if form == SHARED else "d"] * count


def _stitched_source(indices, data):
    """The tensor X of a stitch that puts back, at their places, values
    computed from X's partitions: each index is DynamicPartition of a
    range over X's elements, each data input is computed from the
    DynamicPartition of X by the same partitions (through gathers, reads and
    reshapes). None when the stitch is not of that shape."""
    partitions, source = None, None
    for t in indices:
        if t.op.type != "DynamicPartition" or t.op.inputs[0].op.type != "Range":
            return None
        partitions = t.op.inputs[1] if partitions is None else partitions
        if t.op.inputs[1] is not partitions:
            return None
    for t in data:
        for _ in range(8):
            if t.op.type == "DynamicPartition":
                break
            if t.op.type in GATHERS:     # the rows gathered for a partition's ids
                t = t.op.inputs[1]
                continue
            ids = [x for x in t.op.inputs if x.dtype.is_integer
                   and tf.get_static_value(x) is None]
            if len(ids) != 1:
                return None
            t = ids[0]
        else:
            return None
        if t.op.inputs[1] is not partitions or (source is not None and
                                                t.op.inputs[0] is not source):
            return None
        source = t.op.inputs[0]
    return source


def _element(t: tf.Tensor, i: int, forms: dict):
    """Element i of a 1-D tensor built by a Pack or held as a constant: its
    static value, or the form of the scalar packed there."""
    value = tf.get_static_value(t)
    if value is not None:
        value = np.reshape(value, -1)
        return int(value[i]) if i < np.size(value) else None
    whole = forms.get(t.name, SHARED)
    if whole[0] == "shape" and i == 0:
        return ("size", whole[1], whole[2])
    if t.op.type == "Pack" and len(t.op.inputs) > i:
        x = t.op.inputs[i]
        static = _static_scalar(x)
        return static if static is not None else forms.get(x.name, SHARED)
    if t.op.type == "ConcatV2":
        for piece in t.op.inputs[:-1]:
            length = piece.shape[0] if piece.shape.rank == 1 else None
            if length is None:
                return None
            if i < length:
                vector = _static_vector(piece)
                return int(vector[i]) if vector is not None else _element(piece, i, forms)
            i -= length
    return None


def _data_order(rows_of: list) -> list:
    """(op, name, type, in gradient scope) tuples in an order where every op
    comes after the producers of its inputs, else in graph order: a V1
    cond makes a branch's op before the Switch that feeds it its input
    (tf.compat.v1's control flow, under disable_v2_behavior()). A V1 loop's
    back edges (NextIteration's) are left to the pass's second round."""
    position = {row[1]: i for i, row in enumerate(rows_of)}
    waiting = [0] * len(rows_of)
    readers: list[list[int]] = [[] for _ in rows_of]
    for i, (op, _, _, _) in enumerate(rows_of):
        for x in op.inputs:
            j = position.get(x.op.name)
            if j is not None and x.op.type not in ("NextIteration", "RefNextIteration"):
                waiting[i] += 1
                readers[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(rows_of[i])
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(rows_of):   # (a cycle the back edges do not explain)
        return rows_of
    return order


def _after_places(op: tf.Operation, marked: list[int], outs: list, forms: dict) -> list:
    """The forms of `op`, whose inputs `marked` are examples' places (PLACE),
    from those its rule gave the inputs unmarked: places kept (the mark on
    rows outputs), used as indices (unmarked), or read as values (picked)."""
    if marked == [1] and _place_unless_one_example(op, forms):
        return [rows() + (PLACE,)]
    if marked == [1] and op.type == "GatherV2" and static_int(op.inputs[2]) == 0 \
            and op.get_attr("batch_dims") == 0 \
            and forms.get(op.inputs[0].name) == rows() and op.inputs[1].shape.rank == 1:
        return [rows()]   # x's rows by the examples' places: x (tf.vectorized_map's gather)
    if op.type in SHAPE_OPS or (op.type in PLACE_INDICES and
                                set(marked) <= PLACE_INDICES[op.type]) \
            or any(f[0] in OPAQUE for f in outs):   # (the first cause named)
        return outs
    if op.type in PLACES_KEPT and all(is_rows(f) for f in outs):
        return [f + (PLACE,) for f in outs]
    return [("picked", op.name)] * len(outs)


def _place_unless_one_example(op: tf.Operation, forms: dict) -> bool:
    """tf.where(tf.shape(x)[0] > 1, place, 0) (tf.vectorized_map's gather
    of each example, broadcasting a batch of one): the place itself, since
    a batch of one example has no other place than 0."""
    if op.type not in ("SelectV2", "Select") or len(op.inputs) != 3:
        return False
    test = op.inputs[0]
    return test.op.type == "Greater" and static_int(test.op.inputs[1]) == 1 \
        and forms.get(test.op.inputs[0].name) == ("size", 1, 1) \
        and static_int(op.inputs[2]) == 0


def _elementwise_source(t: tf.Tensor, forms: dict, depth: int = 0,
                        known: dict | None = None) -> str:
    """The tensor `t` is computed from element by element, with values the
    same on every worker (its name): through elementwise ops of its rank
    whose other inputs are SHARED, or whose inputs all have one such source
    (tf.where(v < c, v, v - 1) of the values v a SparseTensor holds); else
    `t` itself. `known`: the sources found so far (each tensor looked at
    once, however many paths lead to it)."""
    known = {} if known is None else known
    if t.name in known:
        return known[t.name]
    op = t.op
    source = t.name
    if depth <= 32 and (op.type in UNARY or op.type in NARY) and t.shape.rank is not None:
        inner = [x for x in op.inputs if forms.get(x.name, SHARED) != SHARED]
        if inner and all(x.shape.rank == t.shape.rank for x in inner):
            sources = {_elementwise_source(x, forms, depth + 1, known) for x in inner}
            if len(sources) == 1:
                source = sources.pop()
    known[t.name] = source
    return source


def _offset_of_a_size(vector: tf.Tensor, k: int, forms: dict) -> bool:
    """Whether element k of a selection's bounds is the batch's size less
    or more a fixed number (x[tf.shape(x)[0] - 2:]: the last two examples,
    by their place), where a fraction of it (its half) is each share's own."""
    if vector.op.type != "Pack" or len(vector.op.inputs) <= k:
        return False
    op = vector.op.inputs[k].op
    while op.type in ("Cast", "Identity"):
        op = op.inputs[0].op
    if op.type not in ("Sub", "Add", "AddV2"):
        return False
    kinds = sorted(forms.get(x.name, SHARED)[0] for x in op.inputs)
    return kinds == ["shared", "size"]


def _entries_of(t: tf.Tensor, forms: dict, depth: int = 0) -> str | None:
    """The op whose entries `t` holds one element (or index row) per entry
    of, in their order, when data flow shows it: the positions tf.where
    finds (a SparseTensor made from a dense tensor: its indices, and its
    values gathered there by GatherNd), carried through a SparseReshape's
    indices, elementwise ops with values the same on every worker (a mask
    of the values, _elementwise_source), a tf.sparse.retain of them
    (_retained_elements) and SparseFillEmptyRows. None otherwise: two
    tensors of entries are known to be aligned, entry by entry, only when
    this names the same op for both."""
    op = t.op
    if depth > 32:
        return None
    if op.type == "Where":
        return op.name
    if op.type in ("GatherNd", "ResourceGatherNd") and op.inputs[1].shape.rank == 2 \
            and op.inputs[1].shape[1] is not None \
            and op.inputs[1].shape[1] == op.inputs[0].shape.rank:
        return _entries_of(op.inputs[1], forms, depth + 1)   # the values at those positions
    if op.type == "SparseReshape" and t is op.outputs[0]:
        return _entries_of(op.inputs[0], forms, depth + 1)
    if op.type == "SparseFillEmptyRows" and t in (op.outputs[0], op.outputs[1]):
        return op.name
    if op.type in ("GatherV2", "Gather"):
        return _retained_elements(op, forms, depth + 1)
    source = _elementwise_source(t, forms)
    if source != t.name:
        return _entries_of(t.graph.get_tensor_by_name(source), forms, depth + 1)
    return None


def _retained_elements(op: tf.Operation, forms: dict, depth: int = 0) -> str | None:
    """For a gather of a SparseTensor's entries (its indices or values) at
    the places a 1-D mask of the same entries keeps, as tf.sparse.retain
    builds it (gather(x, reshape(where(mask), [-1]))): the Where, which
    names the kept entries (_entries_of); else None."""
    if op.type == "GatherV2" and (static_int(op.inputs[2]) != 0
                                  or op.get_attr("batch_dims") != 0):
        return None
    places = op.inputs[1].op
    while places.type in ("Reshape", "Squeeze", "Cast", "Identity"):
        places = places.inputs[0].op
    if places.type != "Where" or places.inputs[0].shape.rank != 1:
        return None
    kept_from = _entries_of(places.inputs[0], forms, depth + 1)
    if kept_from is None or kept_from != _entries_of(op.inputs[0], forms, depth + 1):
        return None
    return places.name


def _static_vector(t: tf.Tensor):
    """A 1-D tensor's static value: TensorFlow's, or a constant sliced by a
    StridedSlice with static bounds (tf.shape(x)[:1] of a static shape)."""
    value = tf.get_static_value(t)
    if value is not None:
        return np.reshape(value, -1)
    op = t.op
    if op.type == "StridedSlice" and not (op.get_attr("shrink_axis_mask")
                                          or op.get_attr("ellipsis_mask")
                                          or op.get_attr("new_axis_mask")):
        source, begin, end, strides = (tf.get_static_value(x) for x in op.inputs)
        if source is not None and begin is not None and end is not None and strides is not None \
                and np.ndim(source) == 1:
            start = None if op.get_attr("begin_mask") & 1 else int(begin[0])
            stop = None if op.get_attr("end_mask") & 1 else int(end[0])
            return np.asarray(source)[start:stop:int(strides[0])]
    return None


def _back_through(t: tf.Tensor, forms: dict, kinds: tuple):
    """`t`, then the tensors it is computed from through tensors whose forms
    are of `kinds`, each once."""
    stack, seen = [t], set()
    while stack:
        x = stack.pop()
        if x.name in seen:
            continue
        seen.add(x.name)
        yield x
        stack.extend(i for i in x.op.inputs if forms.get(i.name, SHARED)[0] in kinds)


def _padding_of(paddings: tf.Tensor, axis: int) -> list | None:
    """A pad's [before, after] along `axis` when static, though other axes'
    may be computed (tf.pad(x, [[0, 0], [0, n - length]])); None when not."""
    spec = tf.get_static_value(paddings)
    if spec is not None:
        return [int(v) for v in np.asarray(spec)[axis]]
    op = paddings.op
    if op.type == "Pack" and op.get_attr("axis") == 0 and axis < len(op.inputs):
        row = _static_vector(op.inputs[axis])
        return None if row is None else [int(v) for v in row]
    return None


def _static_scalar(t: tf.Tensor) -> int | None:
    """A scalar's static value: TensorFlow's, or element k of a constant
    (tf.shape of a tensor of static shape folds into one, and
    tf.get_static_value does not follow the StridedSlice taking its k)."""
    value = tf.get_static_value(t)
    if value is not None:
        return int(value) if np.ndim(value) == 0 else None
    op = t.op
    if op.type == "StridedSlice" and op.get_attr("shrink_axis_mask") == 1 \
            and not op.get_attr("ellipsis_mask") and not op.get_attr("new_axis_mask"):
        source, begin = tf.get_static_value(op.inputs[0]), tf.get_static_value(op.inputs[1])
        if source is not None and begin is not None and np.ndim(source) == 1:
            return int(np.reshape(source, -1)[int(begin[0])])
    return None


def _static_element(vector: tf.Tensor, k: int) -> int | None:
    """Element k of a 1-D integer tensor when it is static, though the rest
    may not be (_element: tf.repeat's Tile multiples, whose repeated axis'
    element is computed, or a shape [-1, ...])."""
    value = _element(vector, k, {})
    return value if isinstance(value, int) else None


def _product(dims) -> int | None:
    out = 1
    for d in dims:
        if d is None:
            return None
        out *= int(d)
    return out


def _inputs_of(input_ops: list[tf.Operation], static_batch: int | None
               ) -> tuple[bool, str | None]:
    """(whether every fed or dataset tensor's dimensions but the first are
    static, a tensor of the batch's rows among them (None if none)).
    `input_ops`: the graph's ops of INPUT_OP_TYPES, in graph order."""
    fixed, batch = True, None
    for op in input_ops:
        for t in op.outputs:
            if t.dtype == tf.resource or not t.shape.rank:
                continue
            if t.shape[0] is None or t.shape[0] == static_batch:
                batch = batch or t.name
                fixed = fixed and all(d is not None for d in t.shape[1:])
    return fixed, batch


def _static_batch(input_ops: list[tf.Operation]) -> int | None:
    """The inputs' static first dimension when the graph fixes the batch's
    size (the most common among fed and dataset tensors), else None.
    `input_ops`: the graph's ops of INPUT_OP_TYPES."""
    firsts = [t.shape[0] for op in input_ops
              for t in op.outputs if t.dtype != tf.resource and t.shape.rank]
    if not firsts or None in firsts:
        return None
    return max(set(firsts), key=firsts.count)
