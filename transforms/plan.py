"""The Plan: how each variable's gradient travels, decided once, identically
everywhere.

Methods, partitions, server placement, bucket layout and collective instance
keys depend only on the Analysis order, the topology and the options. A job
computes it once (transforms/compile.py) and ships it as JSON to every
process; a process joined through TF_CONFIG derives the same Plan itself.

Which method each variable uses is the run option's policy
(transforms/methods/policy.py); the methods, one package each, are in
transforms/methods/ (Parallax §5: all-reduce and all-gather keep variables
replicated, parameter servers hold them; herring sums on summation servers).

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

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from autopar.common.errors import AutoparError, UnsupportedGraphError, shown
from autopar.common.text import human_bytes
from autopar.transforms import cost, keys, serial
from autopar.transforms.analysis import Analysis
from autopar.transforms.features.registry import FEATURES
from autopar.transforms.keys import GROUP_KEY
from autopar.transforms.methods.base import VariablePlan
from autopar.transforms.methods.policy import policy
from autopar.transforms.methods.registry import METHODS
from autopar.transforms.methods.wire import wire_fraction
from autopar.transforms.options import PlanOptions
from autopar.transforms.topology import DEFAULT_LINK_GBPS, Topology


@dataclass(frozen=True)
class ResolvedOptions(PlanOptions):
    """The options a plan is laid out with (what the methods' prepare
    reads): the aggregation structure resolved (aggregation_group 0 for the
    hosts or a group size; sparse_servers: the servers holding the
    partitions of the sparse variables split one per server, 0 for every
    server; allreduce_group: workers per group of the dense all-reduce's 2-D
    summation, 0 for the flat ring), and a Config's micro-batches and
    collective bound carried over."""
    sparse_servers: int = 0
    micro_batches: int = 1
    collective_timeout_s: float = 0.0
    # why allreduce_group (resolved: 0 for the flat ring) is what it is
    allreduce_why: str = ""

    @classmethod
    def of(cls, options: PlanOptions, group: int, sparse_servers: int,
           allreduce_group: int = 0, allreduce_why: str = "") -> "ResolvedOptions":
        given = {f.name: getattr(options, f.name) for f in fields(PlanOptions)}
        return cls(**{**given, "aggregation_group": group, "allreduce_group": allreduce_group},
                   sparse_servers=sparse_servers, micro_batches=options.micro_batches,
                   collective_timeout_s=options.collective_timeout_s,
                   allreduce_why=allreduce_why)


@dataclass
class StepBarrier:
    """The end-of-step barrier of a step that updates the train groups
    `groups` (when variables live on servers: transforms.methods.ps.rewrite)."""
    groups: list[int]
    key: int


@dataclass
class Plan:
    # Where the job's processes are: the one Topology every decision of the
    # plan was made for (summation servers included).
    topology: Topology
    fusion_bytes: int
    communication_hint: str
    variables: list[VariablePlan]
    broadcast_key_base: int   # initial-state broadcast: one key per dtype from here
    # One per set of train groups a fetch can update (Analysis.step_sets).
    barriers: list[StepBarrier] = field(default_factory=list)
    group_key: int = GROUP_KEY
    run_option: str = "hybrid"
    # One decision for every gradient, dense and sparse: "mean" averages the
    # workers' gradients, "sum" adds them (see resolve_loss_reduction);
    # "parallax" (asked for, never inferred) averages dense ones and adds
    # sparse ones, as Parallax did.
    loss_reduction: str = "mean"
    loss_reduction_why: str = ""
    sync_local_state: str = "none"
    local_state_key: int = keys.LOCAL_STATE.first
    local_aggregation: bool = True
    # Workers per aggregation group (Config.aggregation_group, or the cost
    # model's choice; 0: the hosts, pushes only): the groups' keys are
    # keys.AGGREGATION_GROUPS.
    aggregation_group: int = 0
    # Servers holding the partitions of the sparse variables split one per
    # server: servers [0, sparse_servers) (0: every server)
    sparse_servers: int = 0
    # What the cost model chose for the two above, and why ("" when it had
    # nothing to choose: no variable on servers)
    structure_why: str = ""
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
    # Each method's plan-wide state (SyncMethod.plan_state: fusion buckets,
    # herring's buffers), as JSON: SyncMethod.state(plan) reads it back.
    method_states: dict[str, Any] = field(default_factory=dict)
    # 2-D summation's collectives fail (DeadlineExceeded) after waiting this
    # long for their peers (Config.peer_timeout_s; 0: no bound), so a
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

    def method_counts(self) -> str:
        """How many variables each method carries, in words ("3 allreduce, 1 ps")."""
        counts: dict[str, int] = {}
        for v in self.variables:
            counts[v.method] = counts.get(v.method, 0) + 1
        return ", ".join(f"{n} {m}" for m, n in counts.items())

    def variable(self, name: str) -> VariablePlan:
        # An index, not a scan: callers look up every variable (linear, not quadratic).
        index = self.__dict__.get("_by_name")
        if index is None or len(index) != len(self.variables):
            index = self.__dict__["_by_name"] = {v.name: v for v in self.variables}
        return index[name]

    @property
    def server_variables(self) -> list[VariablePlan]:
        """The variables that live on servers (not replicated on workers)."""
        return [v for v in self.variables if not v.replicated]

    @property
    def num_workers(self) -> int:
        return self.topology.num_workers

    @property
    def worker_hosts(self) -> list[str]:
        """The host of worker i, in task order."""
        return list(self.topology.worker_hosts)

    @property
    def num_servers(self) -> int:
        return self.topology.num_servers

    def host_group(self, worker_index: int) -> tuple[int, list[int]]:
        """(group key, members) of the workers sharing worker_index's host."""
        hosts = self.topology.hosts
        host = self.worker_hosts[worker_index]
        return keys.HOST_GROUPS.key(hosts.index(host)), self.topology.workers_on(host)

    def push_group(self, worker_index: int) -> tuple[int, list[int]]:
        """(group key, members) of the workers whose contributions to the
        servers worker_index's is combined with (local aggregation): its
        host's, or its aggregation group's (Config.aggregation_group)."""
        k = self.aggregation_group
        if not k:
            return self.host_group(worker_index)
        g = worker_index // k
        return (keys.AGGREGATION_GROUPS.key(g),
                list(range(g * k, min((g + 1) * k, self.num_workers))))

    def contributions_per_step(self) -> int:
        """Gradients each server accumulator receives per step: one per host
        (or aggregation group) with local aggregation, one per worker without."""
        if not self.local_aggregation:
            return self.num_workers
        if self.aggregation_group:
            return -(-self.num_workers // self.aggregation_group)
        return len(self.topology.hosts)

    @property
    def grouped_pulls(self) -> bool:
        """Whether groups of workers pull sparse server rows together
        (Config.aggregation_group of more than one worker)."""
        return self.aggregation_group > 1

    def grouped_lookups(self) -> list[str]:
        """The variables whose lookups are collectives of an aggregation
        group (SyncMethod.grouped_lookup), which every member must
        run in the same steps."""
        return [v.name for v in self.server_variables if METHODS[v.method].grouped_lookup(v)]

    def to_json(self) -> str:
        return serial.dumps(self, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        """The Plan `to_json` wrote (equal to it, field types included)."""
        return serial.loads(cls, text)


def make_plan(analysis: Analysis, topology: Topology | int,
              options: PlanOptions | None = None) -> Plan:
    """The plan for `analysis` on `topology` with `options` (a Config, or
    plain PlanOptions; their values were checked when they were made: what
    needs the graph or the topology is checked here)."""
    if isinstance(topology, int):
        topology = Topology.local(topology)
    options = options or PlanOptions()
    fusion_bytes = options.fusion_bytes
    _check_partition_names(analysis, options.partitions)
    methods, job_whys = choose_methods(analysis, topology, options)
    group, sparse_servers, structure_why = aggregation_structure(analysis, methods, topology,
                                                                 options)
    ring_group, ring_why = allreduce_structure(analysis, methods, topology, options, group,
                                               sparse_servers)
    options = ResolvedOptions.of(options, group, sparse_servers, ring_group, ring_why)
    reduction, why = resolve_loss_reduction(analysis, options.loss_reduction)
    # Each method lays out its variables and takes its instance keys, in table order.
    key = keys.PLAN.first
    states, kept = {}, {}
    for name, sync in METHODS.items():
        mine = {v for v, (m, _) in methods.items() if m == name}
        states[name], key = sync.prepare(analysis, mine, topology, options, fusion_bytes, key,
                                         job_why=job_whys.get(name, ""))
        plan_state = sync.plan_state(states[name])
        if plan_state is not None:
            kept[name] = serial.encode(plan_state)
    plans = []
    for v in analysis.variables:
        method, reason = methods[v.name]
        vp, key = METHODS[method].variable_plan(v, reason, states[method], key)
        vp.replicated = METHODS[method].replicated
        plans.append(vp)
    barriers = [StepBarrier(list(groups), key + i) for i, groups in enumerate(analysis.step_sets)]
    key += max(1, len(barriers))
    keys.PLAN.check_end(key + len(_dtypes(analysis)))   # the broadcast's, from key on
    feature_fields: dict = {}
    for feature in FEATURES.values():
        feature_fields.update(feature.plan_fields(analysis, options, topology, plans))
    return Plan(topology=topology, fusion_bytes=fusion_bytes,
                communication_hint=options.communication_hint, variables=plans,
                method_states=kept,
                barriers=barriers, broadcast_key_base=key, run_option=options.run_option,
                loss_reduction=reduction, loss_reduction_why=why,
                local_aggregation=options.local_aggregation,
                aggregation_group=group, sparse_servers=sparse_servers,
                structure_why=structure_why, opau=options.opau, opsw=options.opsw,
                collective_timeout_s=options.collective_timeout_s, **feature_fields)


def _check_partition_names(analysis: Analysis, partitions) -> None:
    """AutoparError for a Config.partitions entry naming no variable of the
    graph (a misspelled name would leave the variable it meant unsplit)."""
    names = [v.name for v in analysis.variables]
    for name in partitions:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AutoparError(f"Config.partitions names {shown(name, 120)}, which is not a "
                               f"trainable variable of the graph{hint}; the report lists them")


def choose_methods(analysis: Analysis, topology: Topology, options: PlanOptions
                   ) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """({variable: (method, reason)}, {method the policy lists: why it serves
    the job or not}) by the run option's policy: a variable gets the first
    method of its list that serves the job and does not decline the variable
    (the reason then says why an earlier one declined it)."""
    rule = policy(options.run_option)
    verdicts = {name: METHODS[name].job_choice(topology, options, name == rule.required,
                                               analysis)
                for name in dict.fromkeys(rule.dense + rule.sparse)}
    serving = {name: serves for name, (serves, _) in verdicts.items()}
    out = {}
    for v in analysis.variables:
        declined = ""
        for name in rule.methods(v.gradient):
            method = METHODS[name]
            if not serving[name]:
                continue
            declined_here = method.declines(v, topology, options)
            if declined_here:
                declined = declined_here
                continue
            reason = method.reason(v, options) + (f" ({declined})" if declined else "")
            out[v.name] = (name, reason)
            break
        else:
            raise AssertionError(f"run option {options.run_option!r} has no method for {v.name}")
    return out, {name: why for name, (_, why) in verdicts.items()}


def wants_servers(gradient: str, run_option: str) -> bool:
    """Whether `run_option`'s first choice for this kind of gradient keeps the
    variable on servers (what a spec without servers or a
    VariableInfo.ps_blocker can keep it from)."""
    return not METHODS[policy(run_option).methods(gradient)[0]].replicated


def _dtypes(analysis: Analysis) -> set[str]:
    """Dtypes of the trainable variables: a lower bound of the broadcast's keys."""
    return {v.dtype for v in analysis.variables}


# Why the cost model chooses nothing for a job on one machine
ON_LOOPBACK = "every worker host is a loopback address (one machine, no network link for the cost model)"


def aggregation_group_size(options: PlanOptions, num_workers: int) -> int:
    """Workers per aggregation group of a hand-set Config.aggregation_group,
    0 for the hosts."""
    k = options.aggregation_group
    if k is None or k == 0:
        return 0
    if not isinstance(k, int) or not 1 <= k <= num_workers:
        raise AutoparError(f"Config.aggregation_group={k!r} must be a group size from 1 to the "
                           f"job's {num_workers} workers (or 0: the hosts)")
    keys.AGGREGATION_GROUPS.key(-(-num_workers // k) - 1)   # refused past the range
    return k


def aggregation_structure(analysis: Analysis, methods: dict[str, tuple[str, str]],
                          topology: Topology, options: PlanOptions) -> tuple[int, int, str]:
    """(workers per aggregation group, 0 for the hosts; servers holding the
    partitions of the sparse server variables split one per server, 0 for
    every server; why). A hand-set Config.aggregation_group wins; else the
    cost model (transforms.cost.best_structure, the model bench/simulate.py
    fits) chooses both for a hybrid job whose sparse variables are split over
    the servers, from the topology: the link speed, the processes' cores,
    and the rows the analysis expects per step (ids taken as uniform: the
    union of several workers' rows is then its largest)."""
    if options.aggregation_group is not None:
        k = aggregation_group_size(options, topology.num_workers)
        return k, 0, f"Config(aggregation_group={options.aggregation_group})"
    on_servers = [v for v in analysis.variables if not METHODS[methods[v.name][0]].replicated]
    if not on_servers:
        return 0, 0, ""
    keep = "the hosts and every server are kept"
    if not options.local_aggregation:
        return 0, 0, f"Config(local_aggregation=False): every worker meets the servers; {keep}"
    if topology.on_loopback:
        return 0, 0, f"{ON_LOOPBACK}: {keep}"
    dense_on_servers = [v.name for v in on_servers if v.gradient == "dense"]
    if dense_on_servers:
        return 0, 0, (f"dense variables live on the servers ({', '.join(dense_on_servers[:3])}), "
                      f"which the cost model of aggregation groups does not cover: {keep}")
    split = _split_sparse_server_variables(analysis, methods, topology, options)
    if not split:
        return 0, 0, ""
    # Herring's summation servers have no fitted costs: the same for every
    # choice, they are left out of the prediction.
    herring = any(METHODS[m].on_servers and METHODS[m].replicated for m, _ in methods.values())
    per_host = max(len(topology.workers_on(h)) for h in topology.hosts)
    # Groups: of workers on hosts of their own (the case the model and the
    # measurements cover), and only where a lookup can be a collective of
    # its group (not in every micro-batch)
    groups = cost.GROUP_SIZES if per_host == 1 and options.micro_batches == 1 else (1,)
    wl = _planner_workload(analysis, methods, options, split)
    cl = _planner_cluster(topology)
    best = cost.best_structure(wl, cl, groups=groups)
    inputs = (_cost_model_inputs(topology, split)
              + ("dense gradients through herring (not predicted: the same for every "
                 "choice), " if herring else f"{human_bytes(wl.dense_bytes)} of dense gradients, ")
              + f"{wl.touched_rows:.0f} distinct rows "
              f"of {wl.sparse_rows} per worker and step ({', '.join(v.name for v in split[:3])})")
    flat_ms = 1e3 * best.flat_step_s
    if best.flat:
        return 0, 0, (f"{inputs}: the hosts and every server ({flat_ms:.1f} ms per step of "
                      f"communication and CPU; no other structure predicted "
                      f"{cost.MIN_GAIN:g}x faster)")
    what = ([f"groups of {best.group} workers"] if best.group > 1 else []) + \
        ([f"{best.servers} of the {topology.num_servers} servers for the sparse rows"]
         if best.servers < topology.num_servers else [])
    return ((best.group if best.group > 1 else 0),
            (best.servers if best.servers < topology.num_servers else 0),
            f"{inputs}: {' and '.join(what)}, predicted {1e3 * best.step_s:.1f} ms per step of "
            f"communication and CPU against {flat_ms:.1f} ms with the hosts and every server "
            f"({best.gain:.2f}x faster)")


def _split_sparse_server_variables(analysis: Analysis, methods: dict[str, tuple[str, str]],
                                   topology: Topology, options: PlanOptions) -> list:
    """The sparse variables on servers whose rows are split over every server
    (what aggregation_structure chooses a structure for)."""
    overrides = dict(options.partitions)
    return [v for v in analysis.variables
            if not METHODS[methods[v.name][0]].replicated and v.gradient != "dense"
            and v.name not in overrides
            and METHODS[methods[v.name][0]].default_partitions(v, topology) > 1]


def _planner_workload(analysis: Analysis, methods: dict[str, tuple[str, str]],
                      options: PlanOptions, split: list) -> "cost.Workload":
    """One worker's step for the cost model: the ring's bytes (the dense
    gradients not on servers, in their wire dtype) and the rows of the split
    sparse server variables `split` (ids taken as uniform)."""
    dense = sum(v.bytes * wire_fraction(v.dtype, METHODS[methods[v.name][0]].wire_dtype(
                    v.dtype, options))
                for v in analysis.variables
                if v.gradient == "dense" and not METHODS[methods[v.name][0]].on_servers)
    rows = sum(v.shape[0] for v in split)
    if not rows:
        return cost.Workload("job", dense, compute_s=0.0)
    draws = sum((v.alpha if v.alpha is not None else 1.0) * v.shape[0] for v in split)
    return cost.Workload("job", dense, rows, sum(v.bytes for v in split) / rows,
                         cost.expected_distinct(rows, draws, None), compute_s=0.0)


def _planner_cluster(topology: Topology) -> "cost.Cluster":
    return cost.Cluster(topology.num_workers, max(len(topology.workers_on(h))
                                                  for h in topology.hosts),
                        topology.num_servers, False, topology.link_gbps or DEFAULT_LINK_GBPS,
                        topology.shared_cores)


def _cost_model_inputs(topology: Topology, split: list) -> str:
    """What the cost model was given, for a choice's why."""
    link = topology.link_gbps or DEFAULT_LINK_GBPS
    cores = (f"every process on {topology.shared_cores:g} shared cores" if topology.shared_cores
             else "every process on cores of its own")
    assumed = [] if topology.link_gbps else ["the link speed (the spec gives none)"]
    if any(v.alpha is None for v in split):
        assumed.append("every row touched (rows per step unknown)")
    assumed = f" (assumed: {'; '.join(assumed)})" if assumed else ""
    return (f"cost model for {topology.num_workers} workers on {len(topology.hosts)} hosts, "
            f"{topology.num_servers} servers, {link:g} Gbit/s per link, {cores}{assumed}; ")


def allreduce_group_size(options: PlanOptions, num_workers: int) -> int:
    """Workers per 2-D summation group of a hand-set Config.allreduce_group,
    0 for the flat ring."""
    d = options.allreduce_group
    if d is None or d <= 1:
        return 0
    if d > num_workers or num_workers % d:
        raise AutoparError(f"Config.allreduce_group={d!r} must divide the job's {num_workers} "
                           f"workers into groups of equal size (or be 0: the flat ring)")
    _check_group_keys(num_workers, d)
    return d


def _check_group_keys(num_workers: int, d: int) -> None:
    """Refuse groups of d workers whose group or column keys would run past
    their ranges (keys.ALLREDUCE_GROUPS, keys.ALLREDUCE_COLUMNS)."""
    keys.ALLREDUCE_GROUPS.key(num_workers // d - 1)
    keys.ALLREDUCE_COLUMNS.key(d - 1)


def allreduce_structure(analysis: Analysis, methods: dict[str, tuple[str, str]],
                        topology: Topology, options: PlanOptions, group: int,
                        sparse_servers: int) -> tuple[int, str]:
    """(workers per group of the dense all-reduce's 2-D summation, 0 for the
    flat ring; why). A hand-set Config.allreduce_group wins; else the cost
    model (transforms.cost.best_allreduce_group) chooses for a job whose
    hosts each hold one worker, on a network, comparing the step's
    communication with the aggregation structure already chosen (`group`,
    `sparse_servers`)."""
    if options.allreduce_group is not None:
        d = allreduce_group_size(options, topology.num_workers)
        return d, f"Config(allreduce_group={options.allreduce_group})"
    if not any(methods[v.name][0] == "allreduce" for v in analysis.variables) \
            or options.hierarchical_allreduce is not None:
        return 0, ""   # Config.hierarchical_allreduce: the hosts' 2-D summation, or the flat ring
    keep = "the flat ring is kept"
    if topology.on_loopback:
        return 0, f"{ON_LOOPBACK}: {keep}"
    if max(len(topology.workers_on(h)) for h in topology.hosts) > 1:
        return 0, (f"hosts of several workers (Config.hierarchical_allreduce sums within each "
                   f"host): {keep}")
    if not cost.allreduce_group_sizes(topology.num_workers):
        return 0, f"no group of a power of 2 divides the {topology.num_workers} workers: {keep}"
    split = _split_sparse_server_variables(analysis, methods, topology, options)
    wl = _planner_workload(analysis, methods, options, split)
    cl = replace(_planner_cluster(topology), aggregation_group=group,
                 servers=sparse_servers or topology.num_servers)
    method = "hybrid" if split else "allreduce"
    best = cost.best_allreduce_group(method, wl, cl)
    inputs = (_cost_model_inputs(topology, split) + f"{human_bytes(wl.dense_bytes)} of dense "
              f"gradients" + (f", {wl.touched_rows:.0f} distinct rows of {wl.sparse_rows} per "
                              f"worker and step" if split else ""))
    flat_ms = 1e3 * best.flat_step_s
    if best.group > 1:
        _check_group_keys(topology.num_workers, best.group)
    else:
        return 0, (f"{inputs}: the flat ring ({flat_ms:.1f} ms per step of communication and "
                   f"CPU; no 2-D summation predicted {cost.MIN_GAIN:g}x faster)")
    return best.group, (f"{inputs}: groups of {best.group} workers, predicted "
                        f"{1e3 * best.step_s:.1f} ms per step of communication and CPU against "
                        f"{flat_ms:.1f} ms with the flat ring ({best.gain:.2f}x faster)")


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
            f"{analysis.loss_reduction_why}. Choose how workers' gradients combine: "
            "Config(loss_reduction='sum') adds them, 'mean' averages them (for the graph as it "
            "is, either differs from one device); or make every loss a mean over the batch")
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
