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

Collective instance keys: one per bucket; a sparse gather (all-gather of an
"allgather" variable's rows, local aggregation of a sparse "ps" variable's
rows) owns its count key plus two blocks of len(comm.ROW_LADDER) keys, from
keys["values"] and keys["indices"] on: the number of rows changes from step
to step, TensorFlow pins each instance key to one shape, and the gather uses
the block's key of the padded size it needs (transforms.comm.allgather_rows).
The blocks cover every row count up to comm.MAX_GATHERED_ROWS (2^40).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autopar.transforms import serial
from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.transforms.analysis import Analysis
from autopar.transforms.comm import ROW_LADDER

GROUP_KEY = 1              # all workers form one collective group
_HOST_GROUP_BASE = 1000    # host-local groups for local aggregation: base + host index
_FIRST_INSTANCE_KEY = 100  # keys below are left free for future groups/uses
RUN_OPTIONS = ("hybrid", "ps", "allreduce")
# Averaging of batch-local state after each step (sync_local_state="average"):
# one all-reduce per dtype from this key, far from the per-variable keys.
LOCAL_STATE_KEY_BASE = 1 << 20
# Parallax's cost model for a variable of b bytes in n partitions: b/n + a(n-1) + c.
# `a` is the fixed per-partition cost (one more RPC and update launch per step),
# written as the bytes the link could have moved meanwhile. Minimising gives
# n = sqrt(b/a).
PARTITION_OVERHEAD_BYTES = 4 << 20


@dataclass(frozen=True)
class Topology:
    worker_hosts: tuple[str, ...]   # host address of worker i
    num_servers: int = 0

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
    loss_reduction: str = "auto"       # "auto" (from the analysis), "mean" or "sum"
    sync_local_state: str = "none"     # "none" or "average" (batch-local state)
    local_aggregation: bool = True     # LA: one contribution per host to the servers
    opau: bool = True                  # place post-aggregation ops by Parallax's rule
    opsw: bool = True                  # move light boundary ops across the worker/server line
    partitions: tuple[tuple[str, int], ...] = ()   # per-variable partition-count overrides

    @classmethod
    def from_config(cls, config) -> "PlanOptions":
        """From an autopar.Config (read by attribute: transforms do not import it)."""
        return cls(run_option=config.run_option, loss_reduction=config.loss_reduction,
                   sync_local_state=config.sync_local_state,
                   local_aggregation=config.local_aggregation, opau=config.opau,
                   opsw=config.opsw, partitions=tuple(sorted(config.partitions.items())))


@dataclass
class VariablePlan:
    name: str
    method: str              # "allreduce", "allgather" or "ps"
    placement: str           # where the variable lives, in words
    reason: str
    bucket: int | None = None
    keys: dict[str, int] = field(default_factory=dict)   # collective instance keys
    # ps: row ranges [start, end) and the server holding each partition
    partitions: list[list[int]] = field(default_factory=list)
    servers: list[int] = field(default_factory=list)


@dataclass
class Bucket:
    index: int
    dtype: str
    variables: list[str]
    bytes: int
    instance_key: int


@dataclass
class Plan:
    num_workers: int
    fusion_bytes: int
    communication_hint: str
    variables: list[VariablePlan]
    buckets: list[Bucket]
    broadcast_key_base: int   # initial-state broadcast: one key per dtype from here
    barrier_key: int = 0      # end-of-step barrier when variables live on servers
    group_key: int = GROUP_KEY
    run_option: str = "hybrid"
    worker_hosts: list[str] = field(default_factory=list)
    num_servers: int = 0
    # One decision for every gradient, dense and sparse: "mean" averages the
    # workers' gradients, "sum" adds them (see resolve_loss_reduction).
    loss_reduction: str = "mean"
    loss_reduction_why: str = ""
    sync_local_state: str = "none"
    local_state_key: int = LOCAL_STATE_KEY_BASE
    local_aggregation: bool = True
    opau: bool = True
    opsw: bool = True

    @property
    def gradient_scale(self) -> float:
        """Factor on each worker's gradient so their sum is one device's."""
        return 1.0 / self.num_workers if self.loss_reduction == "mean" else 1.0

    def variable(self, name: str) -> VariablePlan:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(name)

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
        return _HOST_GROUP_BASE + hosts.index(host), self.topology.workers_on(host)

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
    methods = {v.name: _method(v, topology, options) for v in analysis.variables}
    reduction, why = resolve_loss_reduction(analysis, options.loss_reduction)
    key = _FIRST_INSTANCE_KEY
    buckets = _fusion_buckets(analysis, {n for n, (m, _) in methods.items() if m == "allreduce"},
                              fusion_bytes)
    bucket_of = {}
    for b in buckets:
        b.instance_key = key
        key += 1
        for name in b.variables:
            bucket_of[name] = b.index
    ps_layout = _place_partitions(analysis, methods, topology, options)
    plans = []
    for v in analysis.variables:
        method, reason = methods[v.name]
        if method == "allreduce":
            plans.append(VariablePlan(v.name, method, "replicated on every worker", reason,
                                      bucket=bucket_of[v.name]))
        elif method == "allgather":
            keys, key = _row_gather_keys(key, "")
            plans.append(VariablePlan(v.name, method, "replicated on every worker", reason,
                                      keys=keys))
        else:
            parts, servers = ps_layout[v.name]
            # norm: all-reduce of this gradient's L2 terms; la_*: host-local
            # aggregation (a reduce of a dense gradient, a row gather of a
            # sparse one)
            norm = key
            if v.gradient == "sparse":
                keys, key = _row_gather_keys(key + 1, "la_")
            else:
                keys, key = {"la_values": key + 1}, key + 2
            keys["norm"] = norm
            if v.dedup and v.norm_ops:
                # the global-norm term of deduplicated rows needs every worker's rows
                norm_keys, key = _row_gather_keys(key, "norm_")
                keys.update(norm_keys)
            where = ", ".join(f"server {s}" for s in sorted(set(servers)))
            placement = (f"{len(parts)} partitions on {where}" if len(parts) > 1 else where)
            plans.append(VariablePlan(v.name, method, placement, reason, keys=keys,
                                      partitions=parts, servers=servers))
    return Plan(num_workers=topology.num_workers, fusion_bytes=fusion_bytes,
                communication_hint=communication_hint, variables=plans, buckets=buckets,
                barrier_key=key, broadcast_key_base=key + 1, run_option=options.run_option,
                worker_hosts=list(topology.worker_hosts), num_servers=topology.num_servers,
                loss_reduction=reduction, loss_reduction_why=why,
                sync_local_state=options.sync_local_state,
                local_aggregation=options.local_aggregation, opau=options.opau, opsw=options.opsw)


def resolve_loss_reduction(analysis: Analysis, option: str) -> tuple[str, str]:
    """The aggregation every gradient gets: what Config asks for, else what the
    analysis read from the graph, else "mean" (the common case: a loss
    averaged over the batch)."""
    if option in ("mean", "sum"):
        note = (f" (the graph shows {analysis.loss_reduction}: {analysis.loss_reduction_why})"
                if analysis.loss_reduction not in ("unknown", option) else "")
        return option, f"Config(loss_reduction={option!r}){note}"
    if analysis.loss_reduction in ("mean", "sum"):
        return analysis.loss_reduction, analysis.loss_reduction_why
    return "mean", (f"not determined from the graph ({analysis.loss_reduction_why}); assuming a "
                    "mean over the batch: set Config(loss_reduction='sum') if the loss is summed")


def _row_gather_keys(first: int, prefix: str) -> tuple[dict[str, int], int]:
    """Keys of one variable-size row gather from `first` on, and the next free key."""
    rungs = len(ROW_LADDER)
    keys = {f"{prefix}count": first, f"{prefix}values": first + 1,
            f"{prefix}indices": first + 1 + rungs}
    return keys, first + 1 + 2 * rungs


def _method(v, topology: Topology, options: PlanOptions) -> tuple[str, str]:
    replicated = ("allreduce" if v.gradient == "dense" else "allgather")
    default_reason = ("dense gradient: ring all-reduce moves 2(N-1)/N of its bytes per worker"
                      if v.gradient == "dense" else
                      "sparse gradient (IndexedSlices): all-gather of the touched rows")
    wants_ps = options.run_option == "ps" or (options.run_option == "hybrid" and v.gradient == "sparse")
    if not wants_ps:
        return replicated, default_reason
    if topology.num_servers == 0:
        return replicated, default_reason + " (the spec has no server processes for a PS path)"
    if v.ps_blocker:
        return replicated, default_reason + f" (kept off the servers: {v.ps_blocker})"
    if v.gradient == "sparse":
        return "ps", "sparse gradient: servers send/receive only touched rows, 2ab per worker"
    return "ps", "run_option='ps': dense variable on servers, 2b per worker"


def partition_count(nbytes: int, rows: int, num_servers: int) -> int:
    """Parallax's b/n + a(n-1) + c minimised: n = sqrt(b/a), then rounded up to
    a multiple of the server count (so every server holds as many) when there
    is more than one, and never more partitions than rows."""
    n = max(1, round(math.sqrt(nbytes / PARTITION_OVERHEAD_BYTES)))
    if n > 1 and num_servers > 1:
        n = math.ceil(n / num_servers) * num_servers
    return max(1, min(n, rows))


def _place_partitions(analysis, methods, topology, options) -> dict[str, tuple[list, list]]:
    """Row partitions of every PS variable, spread over servers greedily by
    bytes (largest first onto the least-loaded server) so every server carries
    about the same load."""
    overrides = dict(options.partitions)
    pieces = []   # (bytes, var name, partition index)
    layout: dict[str, tuple[list, list]] = {}
    for v in analysis.variables:
        if methods[v.name][0] != "ps":
            continue
        rows = v.shape[0] if v.shape else 1
        n = overrides.get(v.name) or partition_count(v.bytes, rows, topology.num_servers)
        n = max(1, min(int(n), rows))
        bounds = [rows * p // n for p in range(n + 1)]
        parts = [[bounds[p], bounds[p + 1]] for p in range(n)]
        row_bytes = v.bytes // max(rows, 1)
        layout[v.name] = (parts, [0] * n)
        pieces += [(row_bytes * (e - s), v.name, p) for p, (s, e) in enumerate(parts)]
    load = [0] * max(topology.num_servers, 1)
    for nbytes, name, p in sorted(pieces, key=lambda x: (-x[0], x[1], x[2])):
        server = min(range(len(load)), key=lambda s: (load[s], s))
        load[server] += nbytes
        layout[name][1][p] = server
    return layout


def _fusion_buckets(analysis: Analysis, names: set[str], fusion_bytes: int) -> list[Bucket]:
    """Greedy buckets of one dtype, at most fusion_bytes each (a larger variable
    gets a bucket of its own). Variables are taken last-created first, the order
    in which backpropagation produces their gradients, so early buckets can be
    reduced while later layers are still being differentiated."""
    buckets: list[Bucket] = []
    open_by_dtype: dict[str, Bucket] = {}
    for v in reversed(analysis.variables):
        if v.name not in names:
            continue
        b = open_by_dtype.get(v.dtype)
        if b is None or (b.bytes + v.bytes > fusion_bytes and b.variables):
            b = Bucket(index=len(buckets), dtype=v.dtype, variables=[], bytes=0, instance_key=0)
            buckets.append(b)
            open_by_dtype[v.dtype] = b
        b.variables.append(v.name)
        b.bytes += v.bytes
    return buckets
