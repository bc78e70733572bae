"""The rows of a sparse (IndexedSlices) gradient: whether they are distinct
ids of the batch (a tf.unique before the lookup), whether some are rows of
ids every worker looks up alike (a sampled softmax's candidates after the
labels), and whether its update transforms each row before rows of one id
add up (Keras's Adam squares them). The analysis sets VariableInfo.dedup,
shared_rows, row_wise and ps_blocker from them; the methods act on those
(transforms.methods.allgather, ps), splitting off the shared ids' rows and
combining rows of one id with split_shared_rows and combine_rows here.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.example_rows import ExampleRows
from autopar.transforms.graph_utils import folded_value, in_gradient_scope

if TYPE_CHECKING:   # annotations only: the analysis imports this module
    from autopar.transforms.analysis import VariableInfo


# Ops after which rows of one id still add up as they would have before
# them (linear in the rows, taking another operand only as a factor).
_ROW_LINEAR = frozenset({"Identity", "Cast", "Reshape", "ExpandDims", "Squeeze", "Neg", "Mul",
                         "RealDiv", "Div", "StopGradient", "Snapshot", "IdentityN"})


# Ops that add the rows of one id (or write each row where its id says).
_ROW_COMBINING = ("UnsortedSegmentSum", "SparseSegmentSum", "SegmentSum", "ScatterAdd",
                  "ScatterSub", "ResourceScatter", "ResourceSparseApply", "SparseApply",
                  "TensorScatterAdd", "Unique")


def nonlinear_in_rows(graph, info: VariableInfo) -> str:
    """Why the servers cannot combine this sparse gradient's rows of one id
    before its update ("" when they can). A server (and local aggregation)
    adds up the rows of each id before the update sees them; one device's
    update sees every looked-up row. That is the same only if the update
    adds them first, or is linear in them until it does: tf.compat.v1
    optimizers sum duplicate indices before anything else, while Keras's Adam
    squares each row of an IndexedSlices gradient and only then adds them
    (v += g_i^2 for every occurrence i). Walks forward from the gradient's
    values through its path and update to the first op that combines rows."""
    # (a global-norm L2Loss term is summed over workers' uncombined rows instead)
    region = (set(info.update_ops) | set(info.own_path_ops) | set(info.path_ops)) - set(
        info.norm_ops)
    frontier = [graph.get_tensor_by_name(info.grad_values)]
    seen = set()
    while frontier:
        t = frontier.pop()
        for c in t.consumers():
            if c.name in seen or c.name not in region:
                continue
            seen.add(c.name)
            if c.type.startswith(_ROW_COMBINING):
                continue
            if c.type not in _ROW_LINEAR or (c.type in ("Mul", "RealDiv", "Div") and sum(
                    1 for x in c.inputs if x.name == t.name or x.op.name in seen) > 1):
                return (f"its update applies '{c.name}' ({c.type}) to each row of the gradient "
                        "before rows of one id are added (servers add them first); all-gather "
                        "keeps every row")
            frontier.extend(c.outputs)
    return ""


# Ops that only reshape or retype an index tensor on its way to the gradient.
_INDEX_PASS_THROUGH = frozenset({"Reshape", "Identity", "Cast", "Squeeze", "ExpandDims",
                                 "StopGradient", "Snapshot"})


# (op type, output index) producing a set of distinct ids.
_DISTINCT_IDS = {("Unique", 0), ("UniqueV2", 0), ("UniqueWithCounts", 0),
                 ("UniqueWithCountsV2", 0), ("SparseSegmentSumGradV2", 1),
                 ("SparseSegmentMeanGradV2", 1), ("SparseSegmentSqrtNGradV2", 1)}


def rows_of_shared_ids(graph, rows: ExampleRows, info: VariableInfo) -> None:
    """Rows of ids that no example owns. A gradient row of an id looked up
    for an example belongs to that example: the workers' rows together are
    one device's, whatever the update does with them. An id every worker
    looks up alike (tf.range over positions, a constant, a sampler's
    candidates) gets a row on every worker holding its share of the batch's
    sum, where one device has one row of the whole sum: an update that
    transforms each row before adding rows of one id (Keras's Adam squares
    them) sees N rows where one device sees one. Such rows are combined by
    id first (as deduplicated rows are: `dedup`) when the ids are distinct,
    as one device's then are; otherwise they are refused unless the update
    adds rows of one id before anything else."""
    origin, ids = _row_origin(graph, rows, graph.get_tensor_by_name(info.grad_indices))
    if origin == "example":
        return
    if origin == "distinct":
        info.dedup = True
        return
    if isinstance(origin, int):
        info.shared_rows = origin
        return
    nonlinear = nonlinear_in_rows(graph, info)
    if nonlinear or info.norm_ops:
        what = (nonlinear.split(" (servers add")[0] if nonlinear else
                f"the global norm reads its rows ('{info.norm_ops[0]}')")
        raise UnsupportedGraphError(
            f"variable '{info.name}': its gradient's rows are for ids '{ids.name}' that no "
            "example of the batch owns (every worker looks them up alike, each row holding "
            "its share of the batch's sum) and that may repeat, and " + what + ": one device "
            "would see one row per id and use. Look the ids up once (tf.unique), or apply "
            "the gradient with an optimizer that adds an id's rows first")


def _row_origin(graph, rows: ExampleRows, indices: tf.Tensor) -> tuple[str, tf.Tensor]:
    """Where a sparse gradient's ids come from: "example" (each one an
    example's: rows of the batch's forms), "distinct" (ids no example owns
    that cannot repeat: a tf.range, distinct constants), the number of ids
    every worker looks up alike after its examples' (an int: a sampled
    softmax's candidates after its labels) or "shared" (any other); and the
    forward tensor of the ids. The backward pass reshapes and concatenates
    the lookups' ids: followed back to them."""
    forward, stack = [], [indices]
    while stack:
        t = stack.pop()
        if not in_gradient_scope(t.op.name):
            forward.append(t)
        elif t.op.type in _INDEX_PASS_THROUGH and t.op.inputs:
            stack.append(t.op.inputs[0])
        elif t.op.type == "ConcatV2":
            stack.extend(t.op.inputs[:-1])
        else:
            forward.append(t)
    forms = [rows.form(t) for t in forward]
    if len(forms) == 1 and forms[0][0] == "cat" and forms[0][2]:
        return int(forms[0][2]), forward[0]
    if all(f[0] in ("rows", "elems") or _looked_up_per_example(rows, t)
           for t, f in zip(forward, forms)):
        return "example", forward[0]
    if len(forward) == 1 and _distinct_ids(forward[0]):
        return "distinct", forward[0]
    shared = next((t for t, f in zip(forward, forms) if f[0] not in ("rows", "elems")), forward[0])
    return "shared", shared


# Ops through which looked-up rows reach the examples they are combined with.
_ROWS_PASS = frozenset({"Identity", "Cast", "Reshape", "Snapshot", "Mul", "Add", "AddV2",
                        "Sub", "RealDiv", "Div", "Maximum", "Minimum", "SelectV2", "Select"})


def _looked_up_per_example(rows: ExampleRows, ids: tf.Tensor) -> bool:
    """Whether the rows looked up for `ids`, ids that no example's values
    gave (a constant), are still each an example's: combined elementwise
    with a tensor of the examples' rows of their own rank and first
    dimension, not broadcast over it (zeros_like of the batch's ids, folded
    into a constant for a batch of static size, as BERT's segment ids)."""
    lookups = [c.outputs[0] for c in ids.consumers()
               if c.type in ("GatherV2", "ResourceGather", "Gather") and c.inputs[1] is ids]
    for looked_up in lookups:
        seen, frontier = set(), [looked_up]
        while frontier and len(seen) < 32:
            t = frontier.pop()
            for c in t.consumers():
                if c.type not in _ROWS_PASS or c.name in seen or in_gradient_scope(c.name):
                    continue
                seen.add(c.name)
                for x in c.inputs:
                    form = rows.form(x)
                    if (form[0] == "rows" and form[1] == 0 and x.shape.rank == t.shape.rank
                            and x.shape.rank and x.shape[0] is not None
                            and x.shape[0] == t.shape[0]):
                        return True
                frontier.extend(c.outputs)
    return False


def _distinct_ids(t: tf.Tensor) -> bool:
    """Whether ids `t` cannot repeat: a tf.range, a tf.unique, distinct
    constants, through reshapes and casts."""
    for _ in range(64):
        if (t.op.type, t.value_index) in _DISTINCT_IDS or t.op.type == "Range":
            return True
        value = tf.get_static_value(t)
        if value is not None:
            return len(np.unique(value)) == np.size(value)
        wrapped = _negative_ids_wrapped(t)
        if wrapped is None:
            wrapped = _partitioned_ids_source(t)
        if wrapped is not None:
            t = wrapped
            continue
        if t.op.type not in _INDEX_PASS_THROUGH or not t.op.inputs:
            return False
        t = t.op.inputs[0]
    return False


def _negative_ids_wrapped(t: tf.Tensor) -> tf.Tensor | None:
    """x of where(x < 0, x + n, x) (Keras's take of a table of n rows): one
    id per distinct x in [-n, n), the only ids a lookup accepts; else None."""
    op = t.op
    if op.type not in ("Select", "SelectV2") or len(op.inputs) != 3:
        return None
    cond, wrapped, x = op.inputs
    if (cond.op.type == "Less" and cond.op.inputs[0] is x
            and tf.get_static_value(cond.op.inputs[1]) == 0
            and wrapped.op.type in ("Add", "AddV2") and any(i is x for i in wrapped.op.inputs)):
        return x
    return None


def deduplicated(indices: tf.Tensor) -> bool:
    """True when the IndexedSlices indices are distinct ids of the batch: the
    gather's gradient reuses the gather's indices, so walking back through
    reshapes/casts reaches a tf.unique output (embedding_lookup_sparse,
    unique+gather lookups). A plain embedding_lookup reaches the raw ids.
    Indices concatenated from several lookups are not one distinct set."""
    t = indices
    for _ in range(64):
        if (t.op.type, t.value_index) in _DISTINCT_IDS:
            return True
        within = _partitioned_ids_source(t)
        if within is not None:
            t = within
            continue
        if t.op.type not in _INDEX_PASS_THROUGH or not t.op.inputs:
            return False
        t = t.op.inputs[0]
    return False


def _partitioned_ids_source(t: tf.Tensor) -> tf.Tensor | None:
    """For one partition's ids of a partitioned table's lookup
    (tf.dynamic_partition of a function of the ids by another, as
    embedding_lookup's "mod" and "div" strategies split them): the ids they
    were computed from, when every id of the table maps to a row of one
    partition of its own (so that ids distinct there are distinct in each
    partition), which the functions evaluated at every id show; else None."""
    op = t.op
    if op.type != "DynamicPartition":
        return None
    known = _PARTITIONED_IDS.setdefault(op.graph, {})
    if op.name not in known:   # (each partition's variable asks, several times)
        ids = _ids_partitioned_by(op)
        known[op.name] = None if ids is None else ids.name
    return None if known[op.name] is None else op.graph.get_tensor_by_name(known[op.name])


# {graph: {DynamicPartition op: the name of _ids_partitioned_by's answer}}
# (names: a tensor would keep its graph, the key, alive)
_PARTITIONED_IDS: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()


def _ids_partitioned_by(op: tf.Operation) -> tf.Tensor | None:
    data, partitions = op.inputs
    ids, by = _computed_from(data), _computed_from(partitions)
    if ids is None or by is None or by.name != ids.name:
        return None
    if _through_casts(data).name == ids.name:
        return ids   # the ids themselves, dealt out
    rows = [_rows_gathered(out) for out in op.outputs]
    if None in rows or not ids.dtype.is_integer:
        return None
    # every id's row, in chunks (a table may have hundreds of millions):
    # each row of each partition taken once is a map of one row per id
    sizes, total = np.asarray(rows), sum(rows)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    taken = np.zeros(total, bool)
    for start in range(0, total, _IDS_A_CHUNK):
        chunk = {ids.name: np.arange(start, min(start + _IDS_A_CHUNK, total),
                                     dtype=ids.dtype.as_numpy_dtype)}
        row, part = folded_value(data, chunk), folded_value(partitions, chunk)
        if row is None or part is None or \
                not np.shape(row) == np.shape(part) == np.shape(chunk[ids.name]):
            return None
        if not ((0 <= part) & (part < len(rows))).all():
            return None
        part = part.astype(np.int64)
        if not ((0 <= row) & (row < sizes[part])).all():
            return None
        taken[first[part] + row.astype(np.int64)] = True
    # (as many ids as rows: every row taken is every id on a row of its own)
    return ids if taken.all() else None


_IDS_A_CHUNK = 1 << 20


# Elementwise integer ops a partition strategy computes rows and partitions with.
_ELEMENTWISE_IDS = frozenset({"Cast", "Identity", "AddV2", "Add", "Sub", "Mul", "FloorDiv",
                              "FloorMod", "Maximum", "Minimum", "Less", "LessEqual", "Greater",
                              "GreaterEqual", "Equal", "Select", "SelectV2"})


def _computed_from(t: tf.Tensor, depth: int = 0) -> tf.Tensor | None:
    """The one tensor `t` is computed from elementwise with values that fold
    to constants (the ids a partition strategy maps: its arithmetic is then
    evaluated at every id), or None if several are."""
    if depth > 32:
        return None
    op = t.op
    if op.type not in _ELEMENTWISE_IDS or folded_value(t) is not None:
        return t
    sources = {s.name if s is not None else None: s for x in op.inputs
               if folded_value(x) is None for s in [_computed_from(x, depth + 1)]}
    if len(sources) != 1 or None in sources:
        return None
    return next(iter(sources.values()))


def _rows_gathered(ids: tf.Tensor) -> int | None:
    """The static row count of the table partition a lookup gathers at
    `ids` (a partition's ids), or None."""
    for consumer in ids.consumers():
        if consumer.type in ("GatherV2", "Gather", "ResourceGather") \
                and consumer.inputs[1] is ids:
            table = _through_casts(consumer.inputs[0])
            shape = (table.op.get_attr("shape") if table.op.type == "VarHandleOp"
                     else table.shape)
            first = tf.TensorShape(shape)[0] if tf.TensorShape(shape).rank else None
            if first is not None:
                return int(first)
    return None


def _through_casts(t: tf.Tensor) -> tf.Tensor:
    while t.op.type in _INDEX_PASS_THROUGH and t.op.inputs:
        t = t.op.inputs[0]
    return t


# The rows as the methods move them (allgather, ps): shared ids split off,
# rows of one id combined.

def split_shared_rows(values: tf.Tensor, indices: tf.Tensor, shared: int):
    """((values, indices) of the examples' rows, (values, indices) of the
    last `shared` rows: ids every worker looks up alike, analysis
    VariableInfo.shared_rows)."""
    head = tf.shape(values, out_type=tf.int64)[0] - shared
    return ((values[:head], tf.cast(indices[:head], tf.int64)),
            (values[head:], tf.cast(indices[head:], tf.int64)))


def combine_rows(values: tf.Tensor, indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """IndexedSlices rows with duplicate indices summed: one row per distinct
    index (in order of first occurrence)."""
    unique, position = tf.unique(indices)
    return tf.math.unsorted_segment_sum(values, position, tf.shape(unique)[0]), unique
