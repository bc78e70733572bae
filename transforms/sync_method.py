"""The interface of a synchronisation method (how one variable's gradient
travels between workers). One subclass per method, each in its own module,
registered in transforms.methods.METHODS: the planner, the report and the
rewrite only ever call these hooks, so a new method is its own module plus
one line in that table.

Hooks (every one has a working default except `choose`-time policy, which
stays in transforms.plan, and `rewrite`):
  prepare       plan-wide layout of the method's variables (fusion buckets,
                server partitions) and the collective instance keys it owns
  variable_plan the VariablePlan of one variable (placement, keys)
  wire_bytes    bytes one worker sends/receives per step for one variable
  server_bytes  bytes each server sends/receives per step for one variable
  rewrite       the method's ops in the worker's scratch graph, returned as
                Edits the GraphDef pass applies to the original nodes
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # annotations only: plan.py imports this module
    import tensorflow as tf

    from autopar.transforms.analysis import Analysis, VariableInfo
    from autopar.transforms.placement import Move
    from autopar.transforms.plan import Plan, PlanOptions, Topology, VariablePlan


@dataclass
class Edits:
    """What the GraphDef pass must do to the original nodes (transforms.rewrite)."""
    replaced: dict[str, str] = field(default_factory=dict)     # tensor -> tensor
    noops: set[str] = field(default_factory=set)                # nodes to turn into NoOps
    noop_control: str | None = None                             # ...depending on this op
    extra_control: dict[str, list[str]] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)       # node -> device
    server_variables: set[str] = field(default_factory=set)     # variables (with slots) on servers
    step_barrier: str | None = None                             # op every step run must include
    identities: dict[str, str] = field(default_factory=dict)    # node -> Identity(tensor)
    noop_deps: dict[str, list[str]] = field(default_factory=dict)  # node -> NoOp(^deps)
    copies: list[tuple] = field(default_factory=list)           # (region, p, remap, device_of)
    partitions: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)

    def merge(self, other: "Edits") -> None:
        self.replaced.update(other.replaced)
        self.noops |= other.noops
        self.noop_control = other.noop_control or self.noop_control
        for name, controls in other.extra_control.items():
            self.extra_control.setdefault(name, []).extend(controls)
        self.devices.update(other.devices)
        self.server_variables |= other.server_variables
        self.step_barrier = other.step_barrier or self.step_barrier
        self.identities.update(other.identities)
        self.noop_deps.update(other.noop_deps)
        self.copies += other.copies
        self.partitions.update(other.partitions)


def new_op(op_type: str, inputs: list, **attrs) -> "tf.Operation":
    """A `op_type` op in the default graph, as tf.raw_ops builds it, minus
    raw_ops' inference of attributes from the inputs (two thirds of its ~0.4
    ms per op; the rewrite builds thousands of ops per large model). `attrs`
    are given in full: a tf.DType, bool, int, float, str, or for "shape" a
    list of dims; the op's other attributes take their defaults. Private API
    (the graph's op constructor raw_ops ends in), used here only."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    protos = {}
    for key, value in attrs.items():
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
        elif key == "shape":
            a.shape.CopyFrom(tf.TensorShape(value).as_proto())
        else:
            raise TypeError(f"attribute {key}={value!r}")
        protos[key] = a
    graph = tf.compat.v1.get_default_graph()
    return graph._create_op_internal(op_type, inputs, attrs=protos)  # pylint: disable=protected-access


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
        import tensorflow as tf
        device = device or self.default_device
        key = (repr(value), dtype, device)
        if key not in self._pool:
            with tf.control_dependencies(None), tf.device(device), tf.name_scope(self.scope):
                self._pool[key] = tf.constant(value, dtype)
        return self._pool[key]

    def shape_of(self, tensor: "tf.Tensor", device: str | None = None):
        """tf.shape(tensor): a constant from the pool when the static shape is
        fully known (what tf.shape builds then, one per use), else the op."""
        import tensorflow as tf
        if tensor.shape.is_fully_defined():
            return self.get(tensor.shape.as_list(), tf.int32, device)
        return tf.shape(tensor)

    def rows(self, tensor: "tf.Tensor", start: int, end: int, device: str | None = None):
        """tensor[start:end], the StridedSlice Python slicing builds, with its
        bounds from the pool instead of three new constants per slice."""
        import tensorflow as tf
        return new_op("StridedSlice", [tensor, self.get([start], device=device),
                                       self.get([end], device=device),
                                       self.get([1], device=device)],
                      T=tensor.dtype.base_dtype, Index=tf.int32).outputs[0]


@dataclass
class RewriteContext:
    """What a method's rewrite hook builds in: the scratch graph (a copy of the
    user's), and the communication backend that builds every collective."""
    graph: "tf.Graph"
    analysis: "Analysis"
    plan: "Plan"
    worker_index: int
    backend: Any
    worker_device: str
    moves: "list[Move] | None" = None    # OPAU/OPSW placement, if computed beforehand
    constants: ConstantPool | None = None

    def __post_init__(self) -> None:
        if self.constants is None:
            self.constants = ConstantPool(self.worker_device)


class SyncMethod:
    name: str = ""
    replicated: bool = True   # every worker holds the variable

    def prepare(self, analysis: "Analysis", names: set[str], topology: "Topology",
                options: "PlanOptions", fusion_bytes: int, key: int) -> tuple[Any, int]:
        """(plan-wide state for this method's variables `names`, next free key)."""
        return None, key

    def plan_fields(self, state: Any) -> dict:
        """Fields of the Plan this method's state fills (e.g. buckets)."""
        return {}

    def variable_plan(self, v: "VariableInfo", reason: str, state: Any,
                      key: int) -> tuple["VariablePlan", int]:
        raise NotImplementedError

    def wire_bytes(self, v: "VariableInfo", vp: "VariablePlan", num_workers: int,
                   alpha: float) -> tuple[float, float]:
        raise NotImplementedError

    def server_bytes(self, v: "VariableInfo", vp: "VariablePlan", num_workers: int,
                     contributors: int, alpha: float) -> list[tuple[int, float, float]]:
        """[(server, sent, received)] per step; none for replicated methods."""
        return []

    def rewrite(self, ctx: RewriteContext) -> Edits:
        raise NotImplementedError
