"""Row partitions of a server variable (Parallax §5.1; AutoDist-style greedy
placement is in plan.py).

A variable of V rows becomes P variables of contiguous row ranges, each on its
server, and so do its optimizer slots. What used the whole variable keeps its
name but now reads the partitions:
  a read           -> Identity(concat of the partitions' reads)
  a row gather     -> Identity(gathers on each partition, stitched back in order)
  its initializer  -> NoOp depending on each partition's slice of the initial value
  "is initialized" -> all partitions initialized
Its update (and the ops only it uses between gradient and update) is copied
once per partition, reading that partition's aggregated rows with indices
made local to it. The user's graph, fetches and checkpoint names are unchanged.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.sync_method import new_op

tf1 = tf.compat.v1

# Ops on a variable handle this module knows how to redirect to partitions.
_READS = {"ReadVariableOp"}
_GATHERS = {"ResourceGather"}


def part_name(var: str, p: int) -> str:
    return f"{var}/part_{p}"


def copy_prefix(p: int) -> str:
    return f"autopar/part_{p}/"


class Partitioner:
    """Builds the partition variables and the ops replacing whole-variable uses
    in `graph` (the scratch graph), recording node edits in `edits`."""

    def __init__(self, graph: tf.Graph, edits, devices_of, constants=None):
        self.g = graph
        self.edits = edits
        self.devices_of = devices_of   # partition index -> device
        self.constants = constants     # a sync_method.ConstantPool (None: a constant per use)

    def split(self, var: str, parts: list[list[int]], region: set[str]) -> list[tf.Tensor]:
        op = self.g.get_operation_by_name(var)
        if op.type != "VarHandleOp":
            raise ValueError(f"only resource variables can be partitioned, '{var}' is {op.type}")
        dtype = tf.as_dtype(op.get_attr("dtype"))
        shape = tf.TensorShape(op.get_attr("shape")).as_list()
        handles = []
        for p, (start, end) in enumerate(parts):
            with tf.device(self.devices_of(p)):
                handles.append(tf.raw_ops.VarHandleOp(
                    dtype=dtype, shape=[end - start, *shape[1:]], shared_name=part_name(var, p),
                    name=part_name(var, p)))
        for c in op.outputs[0].consumers():
            if c.name in region:
                continue
            self._redirect(c, handles, parts, dtype, shape)
        return handles

    def _redirect(self, c: tf.Operation, handles, parts, dtype, shape) -> None:
        if c.type in _READS:
            reads = []
            for p, h in enumerate(handles):
                with tf.device(self.devices_of(p)):
                    reads.append(new_op("ReadVariableOp", [h], dtype=dtype).outputs[0])
            self.edits.identities[c.name] = tf.concat(reads, axis=0).name
        elif c.type in _GATHERS:
            self.edits.identities[c.name] = self._gather(c.inputs[1], handles, parts, dtype).name
        elif c.type == "VarIsInitializedOp":
            flags = [new_op("VarIsInitializedOp", [h]).outputs[0] for h in handles]
            self.edits.identities[c.name] = tf.reduce_all(tf.stack(flags)).name
        elif c.type == "VariableShape":
            out_type = tf.as_dtype(c.get_attr("out_type"))
            self.edits.identities[c.name] = tf.constant(shape, out_type).name
        elif c.type == "AssignVariableOp":   # the initializer (or a restore)
            value = c.inputs[1]
            assigns = []
            for p, ((start, end), h) in enumerate(zip(parts, handles)):
                with tf.device(self.devices_of(p)):
                    piece = (value[start:end] if self.constants is None
                             else self.constants.rows(value, start, end, self.devices_of(p)))
                    assigns.append(new_op("AssignVariableOp", [h, piece], dtype=dtype))
            self.edits.noop_deps[c.name] = [a.name for a in assigns]

    def _gather(self, ids: tf.Tensor, handles, parts, dtype) -> tf.Tensor:
        """Rows `ids` of the whole variable, each read on its partition's server."""
        flat = tf.reshape(ids, [-1])
        starts = tf.constant([s for s, _ in parts], dtype=flat.dtype)
        which = tf.searchsorted(starts[1:], flat, side="right", out_type=tf.int32)
        local = flat - tf.gather(starts, which)
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), which, len(parts))
        pieces = tf.dynamic_partition(local, which, len(parts))
        rows = []
        for p, h in enumerate(handles):
            with tf.device(self.devices_of(p)):
                rows.append(tf.raw_ops.ResourceGather(resource=h, indices=pieces[p], dtype=dtype))
        stitched = tf.dynamic_stitch(positions, rows)
        return tf.reshape(stitched, tf.concat([tf.shape(ids), tf.shape(stitched)[1:]], axis=0))


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
            op = base.split(":")[0]
            if op in region:
                node.input[i] = ("^" if control else "") + prefix + base
            elif not control and base in remap:
                node.input[i] = remap[base]
            elif control and base in remap:
                node.input[i] = "^" + remap[base]
        out.append(node)
    return out

