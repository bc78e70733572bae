"""Row partitions of a server variable (Parallax §5.1; AutoDist-style greedy
placement is in plan.py).

A variable of V rows becomes P variables, each on its server, and so do its
optimizer slots. Which rows each partition holds is its RowLayout:
- a variable with a sparse gradient deals its rows round-robin (TensorFlow's
  partition_strategy="mod"): row r is row r // P of partition r % P.
  Contiguous ranges would put the most frequent ids of a vocabulary sorted by
  frequency (most are) on one server, whose link then carries most of every
  step's pulls and pushes: measured on the emulated cluster, 0.9 of 1 MB of a
  Zipf-skewed LM's rows came from the first of four range partitions.
- a variable with a dense gradient moves whole every step, so any split is
  even; it is cut into contiguous ranges, which makes its gradient's pieces
  views of the gradient and its read one concatenation. Dealt, each was a
  strided copy (element by element for a vector): on the 32 MiB averaging
  benchmark (4 workers, 4 servers) those copies were half of a worker's CPU.
Either way partition p holds dealt_sizes(V, P)[p] rows, and a plan's [start,
end) of partition p counts them (for ranges, they are its rows).
What used the whole variable keeps its name but now reads the partitions:
  a read           -> Identity(the partitions' reads, put back in row order)
  a row gather     -> Identity(the distinct ids' rows gathered on their partitions,
                      stitched back and expanded to every id: a worker pulls
                      each touched row once per step; with a PullGroup
                      (Config.aggregation_group) the group's workers gather
                      their distinct ids, the first pulls the union's rows
                      and sends each worker its own)
  its initializer  -> NoOp depending on each partition's rows of the initial value
  "is initialized" -> all partitions initialized
Its update (and the ops only it uses between gradient and update) is copied
once per partition, reading that partition's aggregated rows with indices
made local to it. The user's graph, fetches and checkpoint names are unchanged.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import tensorflow as tf

from autopar.transforms.graph_utils import in_gradient_scope, initialization_guard, op_name_of
from autopar.transforms.ops import new_op

tf1 = tf.compat.v1
log = logging.getLogger("autopar.partition")

# Ops on a variable handle this module knows how to redirect to partitions.
_READS = {"ReadVariableOp"}
_GATHERS = {"ResourceGather"}


def dealt_sizes(rows: int, n: int) -> list[int]:
    """Rows of each of n partitions (when V rows are dealt round-robin; ranges
    have the same sizes)."""
    return [len(range(p, rows, n)) for p in range(n)]


@dataclass(frozen=True)
class RowLayout:
    """Which rows of a `rows`-row variable each of its `n` partitions holds:
    dealt round-robin (row r is row r // n of partition r % n) or, with
    `dealt` False, contiguous ranges of dealt_sizes(rows, n) rows each."""
    rows: int
    n: int
    dealt: bool = True

    @staticmethod
    def for_gradient(gradient: str, rows: int, n: int) -> "RowLayout":
        """The layout of a variable whose gradient is `gradient` ("dense" or
        "sparse"; the module's docstring says why)."""
        return RowLayout(rows, n, dealt=gradient != "dense")

    def starts(self) -> list[int]:
        """For ranges: the first row of each partition, then `rows`."""
        return list(itertools.accumulate(dealt_sizes(self.rows, self.n), initial=0))

    def slice_of(self, p: int) -> tuple[int, int, int]:
        """(begin, end, stride) of partition p's rows in the whole value."""
        if self.dealt:
            return p, self.rows, self.n
        starts = self.starts()
        return starts[p], starts[p + 1], 1

    def rows_of(self, p: int) -> range:
        return range(*self.slice_of(p))

    def piece(self, value: tf.Tensor, p: int) -> tf.Tensor:
        """Partition p's rows of a whole-variable value."""
        begin, end, stride = self.slice_of(p)
        return value[begin:end:stride]

    def whole(self, pieces: list[tf.Tensor]) -> tf.Tensor:
        """The whole value from the partitions' values (the inverse of piece)."""
        if self.n == 1:
            return pieces[0]
        return interleave_rows(pieces, self.rows) if self.dealt else tf.concat(pieces, axis=0)

    def locate(self, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(partition of each id as int32, its row there) for row ids."""
        if self.dealt:
            n = tf.constant(self.n, dtype=ids.dtype)
            return tf.cast(tf.math.floormod(ids, n), tf.int32), tf.math.floordiv(ids, n)
        starts = tf.constant(self.starts()[:-1], dtype=ids.dtype)
        which = tf.searchsorted(starts, ids, side="right", out_type=tf.int32) - 1
        return which, ids - tf.gather(starts, which)


@dataclass(frozen=True)
class PartitionedVariable:
    """A variable split into partitions: their handles (node names), in
    order, and which rows each holds."""
    handles: list[str]
    layout: RowLayout


def interleave_rows(pieces: list[tf.Tensor], rows: int) -> tf.Tensor:
    """The whole variable from its dealt partitions' values (the inverse of
    RowLayout.piece): pieces padded to the longest, stacked so row i of every
    partition is adjacent, flattened in row order and cut to `rows`."""
    n = len(pieces)
    if n == 1:
        return pieces[0]
    longest = -(-rows // n)
    padded = [piece if size == longest else
              tf.pad(piece, [[0, 1]] + [[0, 0]] * (piece.shape.rank - 1))
              for piece, size in zip(pieces, dealt_sizes(rows, n))]
    stacked = tf.stack(padded, axis=1)
    whole = tf.reshape(stacked, tf.concat([[longest * n], tf.shape(stacked)[2:]], axis=0))
    return whole[:rows]


def read_order(read: tf.Operation) -> tuple[str, ...]:
    """What orders a variable read against the variable's writes: its
    control inputs (its only data input is the handle). Reads with the same
    order see the same value, so they may share one transfer."""
    return tuple(sorted(c.name for c in read.control_inputs))


def part_name(var: str, p: int) -> str:
    return f"{var}/part_{p}"


def copy_prefix(p: int) -> str:
    return f"autopar/part_{p}/"


@dataclass(frozen=True)
class PullGroup:
    """Workers that pull a sparse variable's rows together: the collective
    backend of their group, this worker's rank in it and the rank of the
    member that pulls (ranks as TensorFlow orders the group:
    comm.collective_rank), and one variable's instance keys: (count, values,
    indices) of the ids' gather (comm.allgather_rows), the first of the
    rows' scatter (comm.scatter_rows)."""
    backend: object
    rank: int
    source: int = 0
    keys: tuple = ((), 0)


def _row_gathers_of(read: tf.Operation) -> list[tf.Operation]:
    """The GatherV2 ops taking rows (axis 0, no batch dimensions) of a
    ReadVariableOp's value, outside the backward pass (whose ops keep their
    inputs)."""
    if read.type not in _READS:
        return []
    out = []
    for g in read.outputs[0].consumers():
        if (g.type == "GatherV2" and g.inputs[0] is read.outputs[0]
                and g.get_attr("batch_dims") == 0 and not in_gradient_scope(g.name)):
            axis = tf.get_static_value(g.inputs[2])
            if axis is not None and int(axis) == 0:
                out.append(g)
    return out


class Partitioner:
    """Builds the partition variables and the ops replacing whole-variable uses
    in `graph` (the scratch graph), recording node edits in `edits`. The
    per-partition ops are written as NodeDefs by `nodes` (a
    ops.NodeWriter flushed into the scratch graph's export), except
    a row gather's, which are built in `graph` (on handles in `graph` then)."""

    def __init__(self, graph: tf.Graph, edits, devices_of, constants, nodes,
                 pull_group: PullGroup | None = None):
        self.g = graph
        self.pull_group = pull_group
        self.edits = edits
        self.devices_of = devices_of   # partition index -> device
        self.constants = constants     # a ops.ConstantPool
        self.nodes = nodes
        self.device = nodes.device     # where the whole-variable replacements run
        self.lookups: dict[str, tf.Tensor] = {}   # row gather op -> the rows it now reads
        self._whole_reads: dict[tuple, str] = {}   # (variable, control inputs) -> its value

    def split(self, var: str, layout: RowLayout, region: set[str]) -> list[str]:
        """The partitions' handles (node names), holding `layout`'s rows."""
        op = self.g.get_operation_by_name(var)
        if op.type != "VarHandleOp":
            raise ValueError(f"only resource variables can be partitioned, '{var}' is {op.type}")
        dtype = tf.as_dtype(op.get_attr("dtype"))
        shape = tf.TensorShape(op.get_attr("shape")).as_list()
        consumers = [c for c in op.outputs[0].consumers() if c.name not in region]
        # A gather's index arithmetic is built through the API, and with it
        # the handles it reads.
        in_graph = any(c.type in _GATHERS or _row_gathers_of(c) for c in consumers)
        handles = []
        for p, size in enumerate(dealt_sizes(layout.rows, layout.n)):
            attrs = dict(dtype=dtype, shape=[size, *shape[1:]],
                         shared_name=part_name(var, p))
            if in_graph:
                with tf.device(self.devices_of(p)):
                    handles.append(new_op("VarHandleOp", [], **attrs).outputs[0])
            else:
                handles.append(self.nodes.add("VarHandleOp", [], self.devices_of(p),
                                              name=self._handle_name(part_name(var, p)), **attrs))
        names = [h if isinstance(h, str) else h.op.name for h in handles]
        for c in consumers:
            self._redirect(var, c, handles, names, layout, dtype, shape)
        return names

    def _handle_name(self, name: str) -> str:
        """The name a handle built in the current name scope would get."""
        return self.g.unique_name(name, mark_as_used=True)

    def _redirect(self, var: str, c: tf.Operation, handles, names, layout: RowLayout, dtype,
                  shape) -> None:
        nodes = self.nodes
        if c.type in _READS:
            # A gather of the read's rows (Keras 3's Embedding: tf.gather of
            # the value, not ResourceGather) reads only its rows too; a read
            # used for nothing else (a traced function's ops also wait for it)
            # becomes a NoOp after them instead of a read of every partition.
            gathers = _row_gathers_of(c)
            for g in gathers:
                self._row_gather(g, c.control_inputs + g.control_inputs, handles, layout, dtype)
            if gathers and len(gathers) == len(c.outputs[0].consumers()):
                self.edits.noop_deps[c.name] = [self.lookups[g.name].op.name for g in gathers]
                return
            # The partitions' reads keep the whole read's control inputs: a read
            # ordered after the update (an ExponentialMovingAverage of the
            # variable) must see the updated rows. Reads with the same control
            # inputs see the same value and share one set of partition reads
            # (an unrolled RNN reads its kernel at every time step; see
            # PsBuilder._merge_reads).
            key = (var, read_order(c))
            if key not in self._whole_reads:
                reads = [nodes.add("ReadVariableOp", [h, *c.control_inputs], self.devices_of(p),
                                   dtype=dtype)
                         for p, h in enumerate(names)]
                self._whole_reads[key] = self._whole(reads, layout, dtype, shape)
            self.edits.identities[c.name] = self._whole_reads[key]
        elif c.type in _GATHERS:
            self._row_gather(c, c.control_inputs, handles, layout, dtype)
        elif c.type == "VarIsInitializedOp":
            flags = [nodes.add("VarIsInitializedOp", [h]) for h in names]
            stacked = nodes.add("Pack", flags, N=len(flags), T=tf.bool, axis=0)
            self.edits.identities[c.name] = nodes.add(
                "All", [stacked, nodes.add_const([0], tf.int32)], Tidx=tf.int32, keep_dims=False)
        elif c.type == "VariableShape":
            out_type = tf.as_dtype(c.get_attr("out_type"))
            self.edits.identities[c.name] = nodes.add_const(shape, out_type)
        elif initialization_guard(c) is not None:
            pass   # replaced by the initial value it guards (rewrite._unguarded_initial_values)
        elif c.type == "AssignVariableOp":   # the initializer (or a restore)
            value = c.inputs[1]
            assigns = []
            for p, h in enumerate(names):
                device = self.devices_of(p)
                bounds = [self.constants.get([b], device=device) for b in layout.slice_of(p)]
                piece = nodes.add("StridedSlice", [value, *bounds], device,
                                  T=value.dtype.base_dtype, Index=tf.int32)
                assigns.append(nodes.add("AssignVariableOp", [h, piece], device, dtype=dtype))
            self.edits.noop_deps[c.name] = assigns
        else:
            log.warning("partitioned variable %s: %s '%s' still reads the whole, unpartitioned "
                        "variable (only reads, row gathers, initialisation and shape queries are "
                        "redirected to the partitions); Config(partitions={%r: 1}) keeps it whole",
                        var, c.type, c.name, var)

    def _row_gather(self, gather: tf.Operation, controls, handles, layout, dtype) -> None:
        """`gather` (ids its second input) becomes the rows _gather reads from
        the partitions, after `controls`."""
        with tf.control_dependencies(controls):
            rows = self._gather(gather.inputs[1], handles, layout, dtype)
        self.edits.identities[gather.name] = rows.name
        self.lookups[gather.name] = rows

    def _whole(self, reads: list[str], layout: RowLayout, dtype, shape) -> str:
        """RowLayout.whole as NodeDefs: the whole value from the partitions' reads."""
        nodes, n, rows = self.nodes, len(reads), shape[0]
        if not layout.dealt:
            return nodes.add("ConcatV2", [*reads, nodes.add_const(0, tf.int32)], N=n, T=dtype,
                             Tidx=tf.int32)
        longest = -(-rows // n)
        rank = len(shape)
        pad = nodes.add_const([[0, 1]] + [[0, 0]] * (rank - 1), tf.int32)
        padded = [r if size == longest else nodes.add("Pad", [r, pad], T=dtype, Tpaddings=tf.int32)
                  for r, size in zip(reads, dealt_sizes(rows, n))]
        stacked = nodes.add("Pack", padded, N=n, T=dtype, axis=1)
        whole = nodes.add("Reshape", [stacked, nodes.add_const([longest * n, *shape[1:]], tf.int32)],
                          T=dtype, Tshape=tf.int32)
        if longest * n == rows:
            return whole
        bounds = [self.constants.get([b]) for b in (0, rows, 1)]
        return nodes.add("StridedSlice", [whole, *bounds], T=dtype, Index=tf.int32)

    def _gather(self, ids: tf.Tensor, handles, layout, dtype) -> tf.Tensor:
        """Rows `ids` of the whole variable, each distinct id's row read once on
        its partition's server (a lookup repeats ids: a Zipf-skewed batch has
        about half as many distinct ones)."""
        flat = tf.reshape(ids, [-1])
        distinct, expand = tf.unique(flat, out_idx=tf.int32)
        if self.pull_group is None:
            rows = self._pull(distinct, handles, layout, dtype)
        else:
            rows = self._group_pull(distinct, handles, layout, dtype)
        stitched = tf.gather(rows, expand)
        return tf.reshape(stitched, tf.concat([tf.shape(ids), tf.shape(stitched)[1:]], axis=0))

    def _group_pull(self, distinct: tf.Tensor, handles, layout, dtype) -> tf.Tensor:
        """The rows of this worker's `distinct` ids, pulled once for its group:
        every member's ids gathered (in the members' ranks, each tagged with
        its member's rank), their union pulled by the source member, which
        sends each member its own ids' rows (comm.scatter_rows). Every member
        computes the same union in the same order (tf.unique of the same
        gathered ids), so positions in it agree. (Neither a gather of the
        source's rows, which pads every member's block to the largest, nor a
        broadcast of the union, which TensorFlow sends down a tree, each
        member forwarding the whole union to up to two others: both put
        several unions on one link.)"""
        group = self.pull_group
        ids = tf.cast(distinct, tf.int64)
        rank = tf.fill(tf.stack([tf.size(ids), 1]), tf.constant(group.rank, tf.int64))
        ranks, all_ids = group.backend.allgather_rows(rank, ids, group.keys[0])
        union, position = tf.unique(all_ids, out_idx=tf.int32)
        counts = tf.math.unsorted_segment_sum(tf.ones_like(position), tf.cast(ranks[:, 0], tf.int32),
                                              group.backend.group_size)
        row = self._row_shape(handles[0])
        rows = None
        if group.rank == group.source:
            union_rows = self._pull(tf.cast(union, distinct.dtype), handles, layout, dtype)
            rows = tf.gather(union_rows, position)     # every member's, in the ranks' order
        return group.backend.scatter_rows(rows, counts, group.rank, group.source, row, dtype,
                                          group.keys[1])

    def _row_shape(self, handle) -> list[int]:
        """The static shape of one row of the partition behind `handle`."""
        op = handle.op if hasattr(handle, "op") else self.g.get_operation_by_name(handle)
        return tf.TensorShape(op.get_attr("shape")).as_list()[1:]

    def _pull(self, distinct: tf.Tensor, handles, layout: RowLayout, dtype) -> tf.Tensor:
        """The rows of `distinct` ids, each read on its partition's server."""
        which, local = layout.locate(distinct)
        positions = tf.dynamic_partition(tf.range(tf.size(distinct)), which, layout.n)
        pieces = tf.dynamic_partition(local, which, layout.n)
        rows = []
        for p, h in enumerate(handles):
            with tf.device(self.devices_of(p)):
                rows.append(tf.raw_ops.ResourceGather(resource=h, indices=pieces[p], dtype=dtype))
        return tf.dynamic_stitch(positions, rows)


def copy_region(by_name: dict, region: set[str], p: int, remap: dict[str, str], device_of) -> list:
    """NodeDefs of `region` copied for partition p: names prefixed, inputs from
    inside the region renamed, inputs in `remap` (node-input spelling) replaced.
    `by_name` indexes the GraphDef's nodes (built once for all copies)."""
    prefix = copy_prefix(p)
    out = []
    for name in sorted(region):
        node = tf1.NodeDef()
        node.CopyFrom(by_name[name])
        node.name = prefix + name
        node.attr.pop("_class", None)
        node.device = device_of(name)
        for i, inp in enumerate(node.input):
            control = inp.startswith("^")
            base = inp[1:] if control else inp
            op = op_name_of(base)
            if op in region:
                node.input[i] = ("^" if control else "") + prefix + base
            elif not control and base in remap:
                node.input[i] = remap[base]
            elif control and base in remap:
                node.input[i] = "^" + remap[base]
        out.append(node)
    return out

