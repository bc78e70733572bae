"""The interface of a synchronisation method: how one variable's gradient
travels between workers. A method is a package under transforms/methods/
holding one SyncMethod subclass, registered by one line in
transforms/methods/registry.py; run options are policies
(transforms/methods/policy.py) that say which methods a variable may use, in
order of preference. The planner, the report, the rewrite and the launcher
only ever call these hooks.

Hooks (all but variable_plan, wire_bytes and rewrite have working defaults):
  job_choice    whether the method serves this job at all (herring: servers,
                cost model), and why
  declines      why the method cannot take one variable ("" if it can)
  reason        why a variable it takes uses it (the report's column)
  wire_dtype    the dtype a gradient travels in under Config.wire_dtype,
                from the narrower dtypes it declares (`wire_dtypes`)
  prepare       plan-wide layout of its variables (fusion buckets, server
                partitions) and the collective instance keys it owns
  plan_state    what of that layout the compiled plan keeps (a dataclass of
                `State`, read back with state(plan))
  variable_plan the VariablePlan of one variable (placement, keys)
  wire_bytes    bytes one worker sends/receives per step for one variable
  server_bytes  bytes each server sends/receives per step for one variable
  report_fields fields of the report its plan-wide state fills
  default_partitions  into how many row partitions it splits a variable
  grouped_lookup      whether a variable's lookups are its aggregation
                group's collectives
  processes     the processes beyond the workers its plan needs, by role:
                parameter servers, or kinds it declares in `process_kinds`
  rewrite       its ops in the worker's scratch graph, returned as Edits the
                GraphDef pass applies to the original nodes
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from autopar.transforms import serial
from autopar.transforms.methods import wire
from autopar.transforms.methods.process_kind import ProcessKind
from autopar.transforms.ops import ConstantPool, NodeWriter

if TYPE_CHECKING:   # annotations only
    import tensorflow as tf

    from autopar.transforms.analysis import Analysis, VariableInfo
    from autopar.transforms.partition import PartitionedVariable
    from autopar.transforms.placement import Move
    from autopar.transforms.plan import Plan, PlanOptions
    from autopar.transforms.topology import Topology



@dataclass
class VariablePlan:
    name: str
    method: str              # the name of its method in the registry
    placement: str           # where the variable lives, in words
    reason: str
    bucket: int | None = None
    keys: dict[str, int] = field(default_factory=dict)   # collective instance keys
    # ps: row ranges [start, end) and the server holding each partition;
    # herring: element ranges of the flattened gradient and the server summing each
    partitions: list[list[int]] = field(default_factory=list)
    servers: list[int] = field(default_factory=list)
    # Weight-update sharding: the worker that applies the optimizer update
    # and holds the slots (None: every worker updates its replica).
    owner: int | None = None
    wire_dtype: str | None = None   # the dtype the gradient travels in, when narrower
    replicated: bool = True   # every worker holds it (else it lives on servers)


@dataclass
class Edits:
    """What the GraphDef pass must do to the original nodes (transforms.rewrite)."""
    replaced: dict[str, str] = field(default_factory=dict)     # tensor -> tensor
    extra_control: dict[str, list[str]] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)       # node -> device
    server_variables: set[str] = field(default_factory=set)     # variables (with slots) on servers
    # (train groups, op): the barrier a step updating those groups must include
    step_barriers: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    # (train groups, op): an op on a server such a step also runs, fetched with
    # it (no message: its server's RunGraph call ends with it) and not waited
    # for by the barrier, because the protocol already orders its work before
    # the barrier completes (a worker's pushes: the chief takes them before it
    # releases anyone)
    step_targets: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    identities: dict[str, str] = field(default_factory=dict)    # node -> Identity(tensor)
    # node -> {input it reads: input to read instead}, for that node only
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    noop_deps: dict[str, list[str]] = field(default_factory=dict)  # node -> NoOp(^deps)
    copies: list[tuple] = field(default_factory=list)           # (region, p, remap, device_of)
    # variable -> its partitions' handles and which rows each holds
    partitions: dict[str, PartitionedVariable] = field(default_factory=dict)
    # grouped lookup (an original gather op, Config.aggregation_group) -> the
    # barrier a run that is not a training step fetches with it
    lookup_barriers: dict[str, str] = field(default_factory=dict)
    # ops the chief runs once, with the variables' initialisation (ps: its
    # contribution counters, on the servers)
    chief_init: list[str] = field(default_factory=list)

    def merge(self, other: "Edits") -> None:
        self.replaced.update(other.replaced)
        for name, controls in other.extra_control.items():
            self.extra_control.setdefault(name, []).extend(controls)
        self.devices.update(other.devices)
        self.server_variables |= other.server_variables
        self.step_barriers += other.step_barriers
        self.step_targets += other.step_targets
        self.identities.update(other.identities)
        for name, renames in other.inputs.items():
            self.inputs.setdefault(name, {}).update(renames)
        self.noop_deps.update(other.noop_deps)
        self.copies += other.copies
        self.partitions.update(other.partitions)
        self.lookup_barriers.update(other.lookup_barriers)
        self.chief_init += other.chief_init


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
    # Ops written as NodeDefs, appended to the scratch graph's export
    nodes: NodeWriter | None = None
    # Per train group, the last collective launched of each kind (a
    # method's own name for the kind): a method launching collectives one
    # after another continues the chain of its kind, so every worker
    # launches a group's collectives in one order.
    chains: dict[int, dict[str, list]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.constants is None:
            self.constants = ConstantPool(self.worker_device)
        if self.nodes is None:
            self.nodes = NodeWriter(None, self.worker_device, "autopar/nodes/", self.graph)


class SyncMethod:
    name: ClassVar[str] = ""
    replicated: ClassVar[bool] = True   # every worker holds the variable
    # The dataclass of the plan-wide state the compiled plan keeps (None: none).
    State: ClassVar[type | None] = None
    # The narrower dtypes its transport carries a gradient in: {wire dtype:
    # the gradient dtypes it narrows to it} (transforms.methods.wire).
    wire_dtypes: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Every worker ends a step with the variable's whole aggregated
    # gradient, so one owner can apply its update (transforms.wus).
    shards_weight_update: ClassVar[bool] = False
    # The helper processes it may need besides the workers (herring's
    # summation servers), declared in its package and listed in
    # transforms/methods/process_registry.py: `processes` names them by role.
    process_kinds: ClassVar[tuple[ProcessKind, ...]] = ()

    def job_choice(self, topology: "Topology", options: "PlanOptions",
                   required: bool, analysis: "Analysis") -> tuple[bool, str]:
        """(whether it serves this job, why). `required`: the run option asks
        for this method by name; one that cannot serve the job then raises,
        saying what to change. `analysis`: the graph's (its variables' sizes
        for a cost model)."""
        return True, ""

    def declines(self, v: "VariableInfo", topology: "Topology", options: "PlanOptions") -> str:
        """Why this method cannot take `v` ("" if it can)."""
        return ""

    def reason(self, v: "VariableInfo", options: "PlanOptions") -> str:
        """Why `v`, which it takes, uses it (the report's column)."""
        return ""

    def wire_dtype(self, dtype: str, options: "PlanOptions") -> str:
        """The dtype a `dtype` gradient it carries travels in under
        Config.wire_dtype ("": its own), from `wire_dtypes`."""
        return wire.narrowed(dtype, options.wire_dtype, self.wire_dtypes)

    def prepare(self, analysis: "Analysis", names: set[str], topology: "Topology",
                options: "PlanOptions", fusion_bytes: int, key: int,
                job_why: str = "") -> tuple[Any, int]:
        """(plan-wide state for this method's variables `names`, next free key).
        `job_why`: its job_choice's reason, when the run option's policy
        considered it ("" when the policy does not list it)."""
        return None, key

    def plan_state(self, state: Any) -> Any:
        """What the compiled plan keeps of prepare's state: an instance of
        `State`, or None. By default prepare's state itself when it is one."""
        return state if self.State is not None and isinstance(state, self.State) else None

    def state(self, plan: "Plan") -> Any:
        """The plan_state this method left in `plan` (None if none), decoded
        once per plan."""
        cache = plan.__dict__.setdefault("_states", {})
        if self.name not in cache:
            raw = plan.method_states.get(self.name)
            cache[self.name] = None if raw is None else serial.decode(self.State, raw)
        return cache[self.name]

    def variable_plan(self, v: "VariableInfo", reason: str, state: Any,
                      key: int) -> tuple[VariablePlan, int]:
        raise NotImplementedError

    # The byte model, one per method: what one step moves to synchronise
    # `nbytes` of gradient (a sparse one's: the touched rows' bytes, in the
    # dtype it travels in) over `num_workers` workers. The report
    # (wire_bytes, server_bytes), the benchmark's limits (bench/metrics.py)
    # and the simulator (bench/simulate.py) all read it here.
    on_servers: ClassVar[bool] = False   # its hops are the servers' push and pull rounds
    # Which rows of a sparse gradient travel: "rows" (one per looked-up id,
    # repeats included: the analysis's alpha) or "distinct" (one per distinct
    # id). The chief measures both (runtime/measured.py).
    sparse_rows: ClassVar[str] = "rows"

    def sparse_share(self, alpha: float) -> float:
        """The share of a sparse variable's table its gradient moves per step
        at most, given ``alpha`` rows per table row (one per looked-up id,
        repeats included: it may exceed 1): all of them, or for a method
        moving one row per distinct id, at most the table's."""
        return min(alpha, 1.0) if self.sparse_rows == "distinct" else alpha

    def pushes_every_row(self, v) -> bool:
        """Whether a worker's share of sparse variable ``v`` carries every row
        it looked up, repeats included: its bytes follow the batch, not
        bounded by the table."""
        return self.sparse_rows == "rows"

    def bytes_per_worker(self, nbytes: float, num_workers: int) -> float:
        """Bytes one worker sends per step, and as many it receives."""
        raise NotImplementedError

    def bytes_at_servers(self, nbytes: float, num_workers: int,
                         contributors: int) -> tuple[float, float]:
        """(sent, received) per step by all servers together; `contributors`:
        the workers that push (fewer than all with local aggregation)."""
        return 0.0, 0.0

    def hops(self, num_workers: int) -> int:
        """Sequential network hops of one step. Methods `on_servers` share
        their rounds (every variable's push, then every pull); the others'
        follow one another."""
        raise NotImplementedError

    def wire_bytes(self, v: "VariableInfo", vp: VariablePlan, num_workers: int,
                   alpha: float) -> tuple[float, float]:
        """(sent, received) by one worker per step for variable `v`: the byte
        model on the bytes `v`'s gradient travels as (`alpha`: the share of
        its rows a sparse gradient touches)."""
        sent = self.bytes_per_worker(alpha * v.bytes, num_workers)
        return sent, sent

    def server_bytes(self, v: "VariableInfo", vp: VariablePlan, num_workers: int,
                     contributors: int, alpha: float) -> list[tuple[int, float, float]]:
        """[(server, sent, received)] per step; none for replicated methods."""
        return []

    def report_fields(self, plan: "Plan") -> dict:
        """Fields of transforms.report.Report its plan-wide state fills
        (lists are joined, numbers added, over the methods that fill one)."""
        return {}

    def default_partitions(self, v: "VariableInfo", topology: "Topology") -> int:
        """Into how many row partitions on servers the method splits `v`
        unless Config.partitions says otherwise (1: it keeps it whole; the
        planner's cost model of aggregation groups counts the split ones)."""
        return 1

    def grouped_lookup(self, vp: VariablePlan) -> bool:
        """Whether the lookups of the variable `vp` plans are collectives of
        its aggregation group (Config.aggregation_group), which every member
        must run in the same steps."""
        return False

    def processes(self, plan: "Plan") -> set[str]:
        """The processes besides the workers `plan` needs for this method, by
        role: SERVER_ROLE (common.roles: the spec's parameter servers) or the
        role of one of its `process_kinds`."""
        return set()

    def ordered_collectives(self, plan: "Plan") -> set[int]:
        """Instance keys of the collectives this method launches in one order
        on every worker (chained: RewriteContext.chains). On GPUs these ask
        for NCCL, which deadlocks when workers launch its collectives in
        different orders (transforms.accelerator)."""
        return set()

    def rewrite(self, ctx: RewriteContext) -> Edits:
        raise NotImplementedError
