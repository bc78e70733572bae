"""The Plan: how each variable's gradient travels, decided once, identically
everywhere.

Methods, partitions, server placement, bucket layout and collective instance
keys depend only on the Analysis order, the topology and the options. A job
computes it once (transforms/compile.py) and ships it as JSON to every
process; a process joined through TF_CONFIG derives the same Plan itself.

Methods (Parallax §5):
- "allreduce": dense gradient averaged by ring all-reduce in fused buckets;
  the variable is replicated on every worker.
- "allgather": sparse gradient; every worker gathers everyone's touched rows;
  replicated.
- "ps": the variable (split into row partitions) lives on server processes;
  workers read the rows they need, push their gradient, the chief applies
  the update once per step on the servers.

Collective instance keys: one per bucket (three with 2-D summation: the
leaders' all-reduce, the host sum and the broadcast); a sparse gather (all-gather of an
"allgather" variable's rows, local aggregation of a sparse "ps" variable's
rows) owns its count key plus two blocks of len(comm.ROW_LADDER) keys, from
keys["values"] and keys["indices"] on: the number of rows changes from step
to step, TensorFlow pins each instance key to one shape, and the gather uses
the block's key of the padded size it needs (transforms.comm.allgather_rows).
The blocks cover every row count up to comm.MAX_GATHERED_ROWS (2^40).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from autopar.common.errors import AutoparError, SpecError, UnsupportedGraphError
from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.transforms import keys, serial
from autopar.transforms.analysis import Analysis
from autopar.transforms.batchnorm import KEYS_PER_LAYER
from autopar.transforms.keys import GROUP_KEY
from autopar.transforms.bfb import FusionLayout

RUN_OPTIONS = ("hybrid", "ps", "allreduce", "herring")
WIRE_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Topology:
    worker_hosts: tuple[str, ...]   # host address of worker i
    num_servers: int = 0
    # Whether herring's summation servers can serve this job: the launcher
    # starts them when the plan uses herring; a job joined through TF_CONFIG
    # has them only if AUTOPAR_SUMSERVERS names them (runtime.worker.job_topology).
    summation_servers: bool = True

    @classmethod
    def local(cls, num_workers: int, num_servers: int = 0) -> "Topology":
        return cls(("127.0.0.1",) * num_workers, num_servers)

    @classmethod
    def from_cluster(cls, cluster: dict[str, list[str]]) -> "Topology":
        """From {WORKER_JOB: ["host:port", ...], SERVER_JOB: [...]}."""
        return cls(tuple(a.rsplit(":", 1)[0] for a in cluster[WORKER_JOB]), len(cluster.get(SERVER_JOB, [])))

    @property
    def num_workers(self) -> int:
        return len(self.worker_hosts)

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(self.worker_hosts))

    def workers_on(self, host: str) -> list[int]:
        return [i for i, h in enumerate(self.worker_hosts) if h == host]


@dataclass(frozen=True)
class PlanOptions:
    run_option: str = "hybrid"
    loss_reduction: str = "auto"       # "auto" (from the analysis), "mean", "sum" or "parallax"
    sync_local_state: str = "none"     # "none" or "average" (batch-local state)
    local_aggregation: bool = True     # LA: one contribution per host to the servers
    opau: bool = True                  # place post-aggregation ops by Parallax's rule
    opsw: bool = True                  # move light boundary ops across the worker/server line
    partitions: tuple[tuple[str, int], ...] = ()   # per-variable partition-count overrides
    # Distributed batch normalisation: "all", a group size, or None (off).
    batch_norm_group: str | int | None = None
    # Weight-update sharding of all-reduce variables (transforms.wus).
    shard_weight_update: bool = False
    # 2-D summation of all-reduce buckets: True, False or None (automatic).
    hierarchical_allreduce: bool | None = None
    # Seconds a 2-D summation collective may wait for its peers (0: no bound).
    collective_timeout_s: float = 0.0
    wire_dtype: str = "float32"        # dtype dense float gradients travel in (ring and herring)
    herring_buffer_bytes: int | None = None   # herring: fusion buffer size override

    @classmethod
    def from_config(cls, config) -> "PlanOptions":
        """From an autopar.Config (read by attribute: transforms do not import it)."""
        return cls(run_option=config.run_option, loss_reduction=config.loss_reduction,
                   sync_local_state=config.sync_local_state,
                   local_aggregation=config.local_aggregation, opau=config.opau,
                   opsw=config.opsw, partitions=tuple(sorted(config.partitions.items())),
                   batch_norm_group=config.batch_norm_group,
                   shard_weight_update=config.shard_weight_update,
                   hierarchical_allreduce=config.hierarchical_allreduce,
                   collective_timeout_s=float(config.stall_timeout_s),
                   wire_dtype=config.wire_dtype, herring_buffer_bytes=config.herring_buffer_bytes)


@dataclass
class VariablePlan:
    name: str
    method: str              # "allreduce", "allgather", "ps" or "herring"
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
    wire_dtype: str | None = None   # herring: the dtype the gradient travels in


@dataclass
class Bucket:
    index: int
    dtype: str
    variables: list[str]
    bytes: int
    instance_key: int   # the all-reduce (with 2-D summation: the leaders' all-reduce)
    # 2-D summation: the host sum takes host_key, the broadcast host_key + 1
    # (both in the host's group; 0 when the bucket uses the flat ring).
    host_key: int = 0
    group: int = 0      # the train group of its variables (Analysis.train_groups)
    # The dtype it travels and is summed in when narrower than its own
    # (Config.wire_dtype float16/bfloat16, as Horovod's fp16 compression);
    # "" when it travels as it is.
    wire_dtype: str = ""

    @property
    def hierarchical(self) -> bool:
        return self.host_key != 0


@dataclass
class StepBarrier:
    """The end-of-step barrier of a step that updates the train groups
    `groups` (when variables live on servers: transforms.ps_rewrite)."""
    groups: list[int]
    key: int


@dataclass
class Plan:
    num_workers: int
    fusion_bytes: int
    communication_hint: str
    variables: list[VariablePlan]
    buckets: list[Bucket]
    broadcast_key_base: int   # initial-state broadcast: one key per dtype from here
    # One per set of train groups a fetch can update (Analysis.step_sets).
    barriers: list[StepBarrier] = field(default_factory=list)
    group_key: int = GROUP_KEY
    run_option: str = "hybrid"
    worker_hosts: list[str] = field(default_factory=list)
    num_servers: int = 0
    # One decision for every gradient, dense and sparse: "mean" averages the
    # workers' gradients, "sum" adds them (see resolve_loss_reduction);
    # "parallax" (asked for, never inferred) averages dense ones and adds
    # sparse ones, as Parallax did.
    loss_reduction: str = "mean"
    loss_reduction_why: str = ""
    sync_local_state: str = "none"
    local_state_key: int = keys.LOCAL_STATE.first
    local_aggregation: bool = True
    opau: bool = True
    opsw: bool = True
    # Workers per batch-norm group (0: each worker normalises by its own
    # batch); batch-norm collectives use keys from batch_norm_key on.
    batch_norm_group: int = 0
    batch_norm_key: int = keys.BATCH_NORM.first
    # Weight-update sharding (owners in VariablePlan.owner): the owners' new
    # values are all-gathered with one key per dtype from this key on.
    shard_weight_update: bool = False
    wus_key: int = keys.WUS.first
    # herring: the balanced fusion buffers of its gradients (transforms.bfb),
    # and why hybrid chose (or did not choose) it for dense gradients
    herring: FusionLayout | None = None
    herring_why: str = ""
    # Why the all-reduce buckets use 2-D summation (Bucket.host_key) or not.
    hierarchical_why: str = ""
    # 2-D summation's collectives fail (DeadlineExceeded) after waiting this
    # long for their peers (Config.stall_timeout_s; 0: no bound), so a
    # worker that never arrives ends the job instead of hanging it.
    collective_timeout_s: float = 0.0

    def averages(self, gradient: str) -> bool:
        """Whether workers' gradients of this kind ("dense" or "sparse") are
        averaged (else added)."""
        return self.loss_reduction == "mean" or (self.loss_reduction == "parallax"
                                                 and gradient == "dense")

    def gradient_scale(self, gradient: str) -> float:
        """Factor on each worker's gradient of this kind so their sum is one
        device's (with "parallax": what Parallax's aggregation gave)."""
        return 1.0 / self.num_workers if self.averages(gradient) else 1.0

    def variable(self, name: str) -> VariablePlan:
        # An index, not a scan: callers look up every variable (linear, not quadratic).
        index = self.__dict__.get("_by_name")
        if index is None or len(index) != len(self.variables):
            index = self.__dict__["_by_name"] = {v.name: v for v in self.variables}
        return index[name]

    @property
    def ps_variables(self) -> list[VariablePlan]:
        return [v for v in self.variables if v.method == "ps"]

    @property
    def topology(self) -> Topology:
        return Topology(tuple(self.worker_hosts), self.num_servers)

    def host_group(self, worker_index: int) -> tuple[int, list[int]]:
        """(group key, members) of the workers sharing worker_index's host."""
        hosts = self.topology.hosts
        host = self.worker_hosts[worker_index]
        return keys.HOST_GROUPS.key(hosts.index(host)), self.topology.workers_on(host)

    def contributions_per_step(self) -> int:
        """Gradients each server accumulator receives per step: one per host with
        local aggregation, one per worker without."""
        return len(self.topology.hosts) if self.local_aggregation else self.num_workers

    def to_json(self) -> str:
        return serial.dumps(self, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        """The Plan `to_json` wrote (equal to it, field types included)."""
        return serial.loads(cls, text)


def make_plan(analysis: Analysis, topology: Topology | int, fusion_bytes: int = 64 << 20,
              communication_hint: str = "ring", options: PlanOptions | None = None) -> Plan:
    if isinstance(topology, int):
        topology = Topology.local(topology)
    options = options or PlanOptions()
    if options.run_option not in RUN_OPTIONS:
        raise ValueError(f"run_option must be one of {RUN_OPTIONS}, got {options.run_option!r}")
    from autopar.transforms.methods import METHODS   # its modules import this one
    herring, herring_why = _herring_choice(topology, options)
    methods = {v.name: _method(v, topology, options, herring) for v in analysis.variables}
    reduction, why = resolve_loss_reduction(analysis, options.loss_reduction)
    # Each method lays out its variables and takes its instance keys, in table order.
    key = keys.PLAN.first
    states, fields = {}, {"buckets": []}
    for name, sync in METHODS.items():
        mine = {v for v, (m, _) in methods.items() if m == name}
        states[name], key = sync.prepare(analysis, mine, topology, options, fusion_bytes, key)
        fields.update(sync.plan_fields(states[name]))
    plans = []
    for v in analysis.variables:
        method, reason = methods[v.name]
        vp, key = METHODS[method].variable_plan(v, reason, states[method], key)
        plans.append(vp)
    barriers = [StepBarrier(list(groups), key + i) for i, groups in enumerate(analysis.step_sets)]
    key += max(1, len(barriers))
    keys.PLAN.check_end(key + len(_dtypes(analysis)))   # the broadcast's, from key on
    keys.BATCH_NORM.check_end(keys.BATCH_NORM.first + KEYS_PER_LAYER * len(analysis.batch_norms))
    if options.shard_weight_update and len(analysis.train_groups) > 1:
        raise AutoparError(
            f"Config(shard_weight_update=True) with {len(analysis.train_groups)} train ops "
            "updating different variables is not supported (the owners' new values are "
            "gathered in one collective per dtype): turn weight-update sharding off")
    if options.shard_weight_update:
        on_servers = [vp.name for vp in plans if vp.method == "ps"]
        if on_servers:
            raise AutoparError(
                f"Config(shard_weight_update=True) with variables on parameter servers "
                f"({', '.join(on_servers[:3])}) is not supported: use run_option='allreduce' "
                "(sparse variables then use all-gather) or turn weight-update sharding off")
        assign_owners(analysis, plans, topology.num_workers)
    return Plan(num_workers=topology.num_workers, fusion_bytes=fusion_bytes,
                communication_hint=communication_hint, variables=plans, **fields,
                barriers=barriers, broadcast_key_base=key, run_option=options.run_option,
                worker_hosts=list(topology.worker_hosts), num_servers=topology.num_servers,
                loss_reduction=reduction, loss_reduction_why=why,
                sync_local_state=options.sync_local_state,
                local_aggregation=options.local_aggregation, opau=options.opau, opsw=options.opsw,
                batch_norm_group=batch_norm_group_size(options.batch_norm_group,
                                                       topology.num_workers),
                shard_weight_update=options.shard_weight_update,
                herring_why=herring_why, collective_timeout_s=options.collective_timeout_s)


def _dtypes(analysis: Analysis) -> set[str]:
    """Dtypes of the trainable variables: a lower bound of the broadcast's keys."""
    return {v.dtype for v in analysis.variables}


def assign_owners(analysis: Analysis, plans: list[VariablePlan], num_workers: int) -> None:
    """Weight-update sharding: each all-reduce variable gets one owner,
    whole variables balanced by bytes (largest first to the least loaded
    worker, ties to the lower index: the same on every process)."""
    load = [0] * num_workers
    sharded = [(analysis.variable(vp.name).bytes, i, vp) for i, vp in enumerate(plans)
               if vp.method == "allreduce"]
    for size, _, vp in sorted(sharded, key=lambda t: (-t[0], t[1])):
        owner = min(range(num_workers), key=lambda w: (load[w], w))
        vp.owner = owner
        load[owner] += size
        vp.placement = f"replicated; updated by worker {owner} (weight-update sharding)"


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


def resolve_loss_reduction(analysis: Analysis, option: str) -> tuple[str, str]:
    """The aggregation every gradient gets: what Config asks for, else what the
    analysis read from the graph, else "mean" (the common case: a loss
    averaged over the batch). A graph where neither can give one device's
    gradients is refused unless Config chooses."""
    if option == "parallax":
        return option, ("Config(loss_reduction='parallax'): Parallax's semantics, not one "
                        "device's: dense gradients averaged over workers, sparse (IndexedSlices) "
                        "gradients summed, as Parallax's average_sparse=False")
    if option == "auto" and analysis.loss_reduction == "neither":
        raise UnsupportedGraphError(
            f"{analysis.loss_reduction_why}. Choose how workers' gradients combine, knowing "
            "the result will differ from one device: Config(loss_reduction='sum') counts the "
            "batch-independent term once per worker, 'mean' divides the summed part by the "
            "worker count; or make the loss a mean over the batch (or add the term once per "
            "example)")
    if option in ("mean", "sum"):
        note = (f" (the graph shows {analysis.loss_reduction}: {analysis.loss_reduction_why})"
                if analysis.loss_reduction not in ("unknown", option) else "")
        if analysis.loss_reduction == "neither":
            note += "; no aggregation makes this graph's training equal one device's"
        return option, f"Config(loss_reduction={option!r}){note}"
    if analysis.loss_reduction in ("mean", "sum"):
        return analysis.loss_reduction, analysis.loss_reduction_why
    return "mean", (f"not determined from the graph ({analysis.loss_reduction_why}); assuming a "
                    "mean over the batch: set Config(loss_reduction='sum') if the loss is summed")


def _herring_choice(topology: Topology, options: PlanOptions) -> tuple[bool, str]:
    """Whether dense float32 gradients go through herring, and why."""
    if options.wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES}, got {options.wire_dtype!r}")
    if options.run_option == "herring":
        if topology.num_servers == 0:
            raise SpecError("run_option='herring' sums gradients on server processes, but the "
                            "resource spec has none: give some hosts `servers: 1` (one per host "
                            "is a good start), or use run_option='allreduce'")
        if not topology.summation_servers:
            raise SpecError("run_option='herring' needs summation servers, but this job was "
                            "started without them: a job joined through TF_CONFIG starts one "
                            "runtime/autopar_sumserver per server and names them in "
                            "AUTOPAR_SUMSERVERS=host:port,... for every worker (or launch the "
                            "job with `autopar launch`, which starts them)")
        return True, "run_option='herring'"
    if options.run_option != "hybrid" or topology.num_servers == 0:
        return False, ""
    if not topology.summation_servers:
        return False, ("no summation servers in this job (joined through TF_CONFIG without "
                       "AUTOPAR_SUMSERVERS), so dense gradients stay on ring all-reduce")
    if all(_is_loopback(h) for h in topology.hosts):
        # The cost model counts bytes on network links; here every byte stays
        # in one machine's memory, and herring's extra processes and packing
        # copies only cost (measured: bench/ps_profile.py). "herring" forces it.
        return False, ("every worker host is a loopback address: one machine, no network link "
                       "for herring to save bytes on, so dense gradients stay on ring all-reduce "
                       "(run_option='herring' forces herring)")
    from autopar.transforms.herring import predicted_faster   # it imports this module
    return predicted_faster(topology.num_workers, len(topology.hosts), topology.num_servers,
                            options.local_aggregation, options.wire_dtype)


def _is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False   # a host name: assume a real machine


def wants_servers(gradient: str, run_option: str) -> bool:
    """Whether `run_option` puts a variable with this kind of gradient on
    parameter servers when nothing keeps it off them (a spec without
    servers, a VariableInfo.ps_blocker)."""
    return run_option == "ps" or (run_option in ("hybrid", "herring") and gradient == "sparse")


def _method(v, topology: Topology, options: PlanOptions, herring: bool = False) -> tuple[str, str]:
    replicated = ("allreduce" if v.gradient == "dense" else "allgather")
    if herring and v.gradient == "dense":
        if v.dtype == "float32":
            return "herring", ("dense gradient: balanced fusion buffers sharded over the "
                               "summation servers, M bytes per contributor")
        replicated_why = (f"dense {v.dtype} gradient: kept on ring all-reduce (the summation "
                          "servers add float32, which would lose this gradient's precision)")
        return "allreduce", replicated_why
    default_reason = ("dense gradient: ring all-reduce moves 2(N-1)/N of its bytes per worker"
                      if v.gradient == "dense" else
                      "sparse gradient (IndexedSlices): all-gather of the touched rows")
    if not wants_servers(v.gradient, options.run_option):
        return replicated, default_reason
    if topology.num_servers == 0:
        return replicated, default_reason + " (the spec has no server processes for a PS path)"
    if v.ps_blocker:
        return replicated, default_reason + f" (kept off the servers: {v.ps_blocker})"
    if v.gradient == "sparse":
        return "ps", "sparse gradient: servers send/receive only touched rows, 2ab per worker"
    return "ps", "run_option='ps': dense variable on servers, 2b per worker"
