"""Builders of graph ops for the rewrite: ops through the graph's own op
constructor with explicit attributes (new_op, constant), NodeDefs written
straight into a GraphDef (NodeWriter), and one constant per value shared by
every op (ConstantPool). Building thousands of ops through TensorFlow's
Python API is what made large rewrites slow (docs/architecture.md)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf


def attr_value(key: str, value):
    """The AttrValue of an op attribute given as a tf.DType, bool, int, float,
    str, for "shape" a list of dims, a list of ints or of tf.DTypes, or a
    TensorProto (a constant's value)."""
    from tensorflow.core.framework import attr_value_pb2, tensor_pb2
    a = attr_value_pb2.AttrValue()
    if isinstance(value, tf.DType):
        a.type = value.as_datatype_enum
    elif isinstance(value, bool):
        a.b = value
    elif isinstance(value, int):
        a.i = value
    elif isinstance(value, float):
        a.f = value
    elif isinstance(value, str):
        a.s = value.encode()
    elif isinstance(value, tensor_pb2.TensorProto):
        a.tensor.CopyFrom(value)
    elif key == "shape":
        a.shape.CopyFrom(tf.TensorShape(value).as_proto())
    elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        a.list.i.extend(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, tf.DType) for v in value):
        a.list.type.extend(v.as_datatype_enum for v in value)
    else:
        raise TypeError(f"attribute {key}={value!r}")
    return a


def new_op(op_type: str, inputs: list, **attrs) -> "tf.Operation":
    """A `op_type` op in the default graph, as tf.raw_ops builds it, minus
    raw_ops' inference of attributes from the inputs (two thirds of its ~0.4
    ms per op; the rewrite builds thousands of ops per large model). `attrs`
    are given in full (see attr_value); the op's other attributes take their
    defaults. Private API (the graph's op constructor raw_ops ends in), used
    here only."""
    protos = {key: attr_value(key, value) for key, value in attrs.items()}
    graph = tf.compat.v1.get_default_graph()
    return graph._create_op_internal(op_type, inputs, attrs=protos)  # pylint: disable=protected-access


def copy_op(op: "tf.Operation", inputs: list) -> "tf.Operation":
    """An op of `op`'s type and attributes (a random op's seeds, a
    generator's algorithm) reading `inputs`, in the default graph."""
    graph = tf.compat.v1.get_default_graph()
    return graph._create_op_internal(  # pylint: disable=protected-access
        op.type, inputs, attrs=dict(op.node_def.attr.items()))


def constant(value, dtype=None, name: str = "Const") -> "tf.Tensor":
    """tf.constant(value, dtype) in the default graph, built as new_op builds
    (tf.constant's conversion layers cost about as much as the op itself)."""
    proto = tf.make_tensor_proto(value, dtype)
    graph = tf.compat.v1.get_default_graph()
    return graph._create_op_internal(  # pylint: disable=protected-access
        "Const", [], name=name, attrs={"value": attr_value("value", proto),
                                       "dtype": attr_value("dtype", tf.as_dtype(proto.dtype))}
    ).outputs[0]


def _input_name(x) -> str:
    """How a NodeDef input names `x`: a node input string as is, a tf.Tensor
    ("op" or "op:k"), a tf.Operation (as a control input)."""
    if isinstance(x, str):
        return x
    if hasattr(x, "value_index"):   # a tf.Tensor
        return x.op.name if x.value_index == 0 else f"{x.op.name}:{x.value_index}"
    return "^" + x.name


class NodeWriter:
    """Appends NodeDefs to a GraphDef under unique names in `scope`: for ops
    built by the thousand (per variable, per partition), what TensorFlow's
    Python op API costs ~0.15-1 ms each for. Inputs are node input strings,
    tf.Tensors or (as control inputs) tf.Operations of the graph the GraphDef
    is (or will be) exported from.

    `graph_def` None: the nodes wait in a GraphDef of their own until
    `flush(graph_def)` (the export of `graph`, which meanwhile may keep
    building ops through the API: nothing of it reads these nodes; a name
    given to `add` must be one `graph` does not use). `patch` records control inputs or a device to
    give a node of the export when flushing."""

    def __init__(self, graph_def, device: str, scope: str, graph=None,
                 by_name: dict | None = None):
        self.pending = graph_def is None
        self.graph_def = tf.compat.v1.GraphDef() if graph_def is None else graph_def
        self.device = device
        if graph is not None:
            # The scope, reserved in `graph` (an op built there later under
            # the same name scope gets another one): the writer's names then
            # never collide with the graph's.
            scope = graph.unique_name(scope.rstrip("/"), mark_as_used=True) + "/"
        self.scope = scope
        # name -> node of graph_def, kept up to date (`by_name`: the
        # caller's index, when it has one: the first pass over a large
        # GraphDef's nodes costs ~15 us each)
        self.by_name = {n.name: n for n in self.graph_def.node} if by_name is None else by_name
        self.added: list[str] = []
        self._count: dict[str, int] = {}
        self._shapes: dict[tuple, str] = {}
        self._patches: dict[str, tuple[list[str], str | None]] = {}

    def _name(self, base: str) -> str:
        while True:
            k = self._count.get(base, 0)
            self._count[base] = k + 1
            name = f"{self.scope}{base}" + (f"_{k}" if k else "")
            if name not in self.by_name:
                return name

    def add(self, op: str, inputs: list, device: str | None = None, name: str | None = None,
            **attrs) -> str:
        """A node computing `op` (attributes in full, see attr_value); its name."""
        node = self.graph_def.node.add(name=name or self._name(op), op=op,
                                       device=self.device if device is None else device)
        node.input.extend(_input_name(x) for x in inputs)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(attr_value(key, value))
        self.by_name[node.name] = node
        self.added.append(node.name)
        return node.name

    def add_const(self, value, dtype: "tf.DType", inputs: list = (), device: str | None = None) -> str:
        return self.add("Const", list(inputs), device, dtype=dtype,
                        value=tf.make_tensor_proto(value, dtype))

    def shape_const(self, shape: list[int]) -> str:
        """One constant per shape (as the receivers' shape pool had)."""
        return self.pooled_const(list(shape), tf.int32)

    def pooled_const(self, value, dtype: "tf.DType", device: str | None = None) -> str:
        """One constant per value, dtype and device, shared by its users (as
        ConstantPool shares the API-built ones), without control inputs."""
        key = (repr(value), dtype, device)
        if key not in self._shapes:
            self._shapes[key] = self.add_const(value, dtype, device=device)
        return self._shapes[key]

    def remove(self, name: str) -> None:
        node = self.by_name.pop(name)
        self.graph_def.node.remove(node)

    def group(self, ops: list[tuple[str, str]], name: str | None = None,
              into: str | None = None) -> str:
        """tf.group of (node, device) pairs: one NoOp per device when they
        are on several (each on its device, the last on none), else one on
        theirs. Its name. `into`: the last NoOp is that (empty) node of the
        export, patched at the flush."""
        by_device: dict[str, list[str]] = {}
        for op, device in ops:
            by_device.setdefault(device, []).append("^" + op.lstrip("^"))
        if len(by_device) == 1:
            (device, deps), = by_device.items()
        else:
            deps = ["^" + self.add("NoOp", by_device[d], d) for d in sorted(by_device)]
            device = None if into else ""
        if into:
            self.patch(into, deps, device)
            return into
        return self.add("NoOp", deps, device, name=name)

    def patch(self, node: str, controls: list[str] = (), device: str | None = None) -> None:
        """At flush: add control inputs to node `node` of the export (and set its device)."""
        old, old_device = self._patches.get(node, ([], None))
        self._patches[node] = (old + ["^" + c.lstrip("^") for c in controls],
                               device if device is not None else old_device)

    def flush(self, graph_def) -> list[str]:
        """Append the pending nodes to `graph_def`, apply the patches; the
        names of the nodes added."""
        if self.pending:
            graph_def.node.extend(self.graph_def.node)
        if self._patches:
            for node in graph_def.node:
                patch = self._patches.get(node.name)
                if patch is not None:
                    node.input.extend(patch[0])
                    if patch[1] is not None:
                        node.device = patch[1]
        return list(self.added)


def rows_where(mask: "tf.Tensor", tensors: list, axis: "tf.Tensor") -> list:
    """tf.boolean_mask(t, mask) of each of `tensors` for a 1-D `mask` over
    their first dimension (`axis`: an int32 constant 0), the positions
    computed once, built through new_op: boolean_mask builds ~10 ops through
    the API, ~15 ms, for every partition of every sparse gradient."""
    rows = new_op("Squeeze", [new_op("Where", [mask], T=tf.bool).outputs[0]], T=tf.int64,
                  squeeze_dims=[1]).outputs[0]
    return [new_op("GatherV2", [t, rows, axis], Tparams=t.dtype.base_dtype, Tindices=tf.int64,
                   Taxis=tf.int32, batch_dims=0).outputs[0] for t in tensors]


def reshape(tensor: "tf.Tensor", shape: "tf.Tensor") -> "tf.Tensor":
    """tf.reshape(tensor, shape) through new_op."""
    return new_op("Reshape", [tensor, shape], T=tensor.dtype.base_dtype,
                  Tshape=shape.dtype.base_dtype).outputs[0]


class ConstantPool:
    """One constant per value, dtype and device in a graph, shared by every op
    that needs it: a constant per use (a reshape's [-1], a gradient scale, an
    accumulator's step) made up a third of a rewritten graph's nodes. Created
    outside any control dependency, so sharing adds no ordering."""

    def __init__(self, default_device: str, scope: str = "autopar/const/"):
        self.default_device = default_device
        self.scope = scope
        self._pool: dict[tuple, Any] = {}

    def get(self, value, dtype=None, device: str | None = None) -> "tf.Tensor":
        device = device or self.default_device
        key = (repr(value), dtype, device)
        if key not in self._pool:
            with tf.control_dependencies(None), tf.device(device), tf.name_scope(self.scope):
                self._pool[key] = constant(value, dtype)
        return self._pool[key]

    def shape_of(self, tensor: "tf.Tensor", device: str | None = None):
        """tf.shape(tensor): a constant from the pool when the static shape is
        fully known (what tf.shape builds then, one per use), else the op."""
        if tensor.shape.is_fully_defined():
            return self.get(tensor.shape.as_list(), tf.int32, device)
        return tf.shape(tensor)

    def rows(self, tensor: "tf.Tensor", start: int, end: int, device: str | None = None):
        """tensor[start:end], the StridedSlice Python slicing builds, with its
        bounds from the pool instead of three new constants per slice."""
        return new_op("StridedSlice", [tensor, self.get([start], device=device),
                                       self.get([end], device=device),
                                       self.get([1], device=device)],
                      T=tensor.dtype.base_dtype, Index=tf.int32).outputs[0]
