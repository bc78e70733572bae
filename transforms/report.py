"""The Report: what a user inspects before training — where every variable
lives, how its gradient travels and what that costs on the wire.

Bytes per step follow Parallax Table 3, counted per direction for one worker:
ring all-reduce of b bytes sends and receives 2(N-1)b/N each; a ring
all-gather of αb bytes of touched rows sends and receives (N-1)αb each;
herring pushes and pulls its b bytes once per contributor (in the wire
dtype), and each server receives and sends its shards' bytes once per
contributor.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from autopar.common.text import human_bytes, plural  # noqa: F401 - human_bytes: the report's
from autopar.transforms.analysis import Analysis
from autopar.transforms.features.registry import FEATURES
from autopar.transforms.methods.registry import METHODS, processes
from autopar.transforms.plan import Plan, wants_servers
from autopar.transforms.random_draws import UNSEEDED_GRAPH_SEED


@dataclass
class VariableReport:
    name: str
    kind: str                 # "dense" / "sparse"
    shape: list[int]
    dtype: str
    bytes: int
    method: str
    placement: str
    reason: str
    alpha: float | None
    sent_per_worker: float    # bytes per step
    received_per_worker: float
    bucket: int | None = None
    dedup: bool = False       # sparse rows are one per distinct id of the batch
    shared_rows: int = 0      # sparse: last rows for ids every worker looks up alike
    owner: int | None = None  # weight-update sharding: the worker applying the update
    on_servers: bool = False  # it lives on servers (parameter servers), not on every worker
    # sparse: its bytes are an upper bound (one row per looked-up id, the
    # rows the graph shows per step) or, rows unknown before running, an
    # estimate at a = 1
    bytes_bound: bool = True
    # How the analysis recognised its update and slots (data flow or a
    # tf.compat.v1 optimizer's update scope)
    recognised: str = ""
    slots: list[str] = field(default_factory=list)


@dataclass
class Report:
    num_workers: int
    num_servers: int
    variables: list[VariableReport]
    buckets: list[dict]
    state: list[dict]
    untrained: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    servers: list[dict] = field(default_factory=list)   # per server: bytes sent/received per step
    moved_ops: list[dict] = field(default_factory=list)  # OPAU/OPSW placements
    run_option: str = "allreduce"
    loss_reduction: str = "mean"      # how workers' gradients combine: "mean", "sum", "parallax"
    loss_reduction_why: str = ""
    sync_local_state: str = "none"
    # Training-mode batch-norm layers: name, kind, group size (0: per worker), moving statistics.
    batch_norms: list[dict] = field(default_factory=list)
    loss_counts: list[str] = field(default_factory=list)   # transforms.loss_counts
    batch_tensors: list[str] = field(default_factory=list)  # transforms.batch_weights
    weighed_state: list[str] = field(default_factory=list)  # its batch means added to state
    weighed_totals: list[str] = field(default_factory=list)  # ... to a total with no count
    summed_state: list[str] = field(default_factory=list)  # batch sums added to means' totals
    batch_draws: list[str] = field(default_factory=list)   # transforms.random_draws: their ops
    # and the draws every worker makes alike: {op: [seed, seed2]}
    shared_draws: dict[str, list[int]] = field(default_factory=dict)
    # transforms.padded_lengths: inputs of lengths the graph leaves unknown
    padded_inputs: list[str] = field(default_factory=list)
    # and the conds deciding by a boolean of the whole batch it checks alike
    checked_predicates: list[str] = field(default_factory=list)
    # and the statistics of the batch's values it makes the global batch's
    batch_statistics: list[str] = field(default_factory=list)
    # transforms.worker_counters: local variables each worker adds its own batches to
    worker_counters: list[str] = field(default_factory=list)
    # Weight-update sharding: optimizer-slot bytes each worker holds (with
    # and without sharding), per worker.
    shard_weight_update: bool = False
    slot_bytes: list[int] = field(default_factory=list)
    slot_bytes_unsharded: list[int] = field(default_factory=list)
    # Bytes each host sends over its link per step for the all-reduce
    # buckets: {"ring": {host: bytes}, "2d": {host: bytes}} (2-D summation's
    # figure for comparison; transforms.methods.allreduce.method.host_link_bytes).
    host_link_bytes: dict = field(default_factory=dict)
    hierarchical_why: str = ""   # why the buckets use 2-D summation or the flat ring
    allreduce_group: int = 0     # 2-D summation over groups of this many workers (0: by hosts)
    # herring: its balanced fusion buffers (variables, offsets, shards per
    # server) and why hybrid chose it or not
    herring_buffers: list[dict] = field(default_factory=list)
    herring_why: str = ""
    # How workers meet the servers (Plan.aggregation_group, sparse_servers,
    # structure_why): workers per aggregation group (0: the hosts), servers
    # holding the sparse variables split over them (0: every server)
    aggregation_group: int = 0
    sparse_servers: int = 0
    structure_why: str = ""

    @property
    def sent_per_worker(self) -> float:
        return sum(v.sent_per_worker for v in self.variables)

    @property
    def held_per_worker(self) -> int:
        """Bytes of the variables every worker holds (not those on servers)."""
        return sum(v.bytes for v in self.variables if not v.on_servers)

    @property
    def held_on_servers(self) -> int:
        """Bytes of the variables the parameter servers hold, all together."""
        return sum(v.bytes for v in self.variables if v.on_servers)

    @property
    def received_per_worker(self) -> float:
        return sum(v.received_per_worker for v in self.variables)

    def bytes_per_method(self) -> dict[str, tuple[float, float]]:
        """{method: (sent, received) per worker per step}."""
        totals: dict[str, tuple[float, float]] = {}
        for v in self.variables:
            sent, received = totals.get(v.method, (0.0, 0.0))
            totals[v.method] = (sent + v.sent_per_worker, received + v.received_per_worker)
        return totals

    @property
    def job_sent(self) -> float:
        """Bytes every process of the job sends per step together: each
        worker's and each server's."""
        return self.num_workers * self.sent_per_worker + sum(s["sent"] for s in self.servers)

    def to_json(self) -> str:
        d = asdict(self)
        d["totals"] = {"sent_per_worker": self.sent_per_worker,
                       "received_per_worker": self.received_per_worker,
                       "held_per_worker": self.held_per_worker,
                       "held_on_servers": self.held_on_servers}
        return json.dumps(d, indent=1)

    def table(self) -> str:
        head = ("variable", "kind", "shape", "size", "method", "placement", "sent/step", "recv/step")
        rows = [(v.name, v.kind + (f" a={v.alpha:.3f}" if v.alpha is not None else ""),
                 "x".join(map(str, v.shape)) or "scalar", human_bytes(v.bytes),
                 v.method + (f" #{v.bucket}" if v.bucket is not None else ""), v.placement,
                 human_bytes(v.sent_per_worker), human_bytes(v.received_per_worker)) for v in self.variables]
        rows.append(("TOTAL per worker", "", "", human_bytes(self.held_per_worker),
                     "", "", human_bytes(self.sent_per_worker), human_bytes(self.received_per_worker)))
        if self.held_on_servers:
            rows.append(("TOTAL on servers", "", "", human_bytes(self.held_on_servers), "", "",
                         "", ""))
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [f"autopar plan: {plural(self.num_workers, 'worker')}, "
                 f"{plural(self.num_servers, 'server')}, run_option={self.run_option}",
                 fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*r) for r in rows]
        for s in self.servers:
            lines.append(f"server {s['server']}: sends {human_bytes(s['sent'])}, receives "
                         f"{human_bytes(s['received'])} per step")
        several = len({b.get("method") for b in self.buckets}) > 1
        for b in self.buckets:
            label = f"{b['method']} bucket" if several else "bucket"
            lines.append(f"{label} #{b['index']}: {b['dtype']}, {human_bytes(b['bytes'])}, "
                         f"{plural(len(b['variables']), 'gradient')} fused into one all-reduce"
                         + (" (2-D summation)" if b.get("host_key") else "")
                         + (f", sent and summed as {b['wire_dtype']}" if b.get("wire_dtype")
                            else ""))
        two_d_buckets = [b["index"] for b in self.buckets if b.get("host_key")]
        if two_d_buckets and self.allreduce_group:
            d = self.allreduce_group
            lines.append(f"2-D summation over groups of {d} workers (each group exchanges the "
                         f"{d} pieces of its sums, the workers at one place of every group "
                         f"all-reduce that piece across the {self.num_workers // d} groups, "
                         f"each group gathers its pieces) for bucket(s) "
                         f"{', '.join(f'#{i}' for i in two_d_buckets)}: {self.hierarchical_why}")
        elif two_d_buckets:
            lines.append(f"2-D summation (sum within each host, all-reduce among one worker per "
                         f"host, broadcast within the host) for bucket(s) "
                         f"{', '.join(f'#{i}' for i in two_d_buckets)}: {self.hierarchical_why}")
        elif (self.buckets and self.hierarchical_why
              and len(self.host_link_bytes.get("ring", {})) > 1):
            lines.append(f"flat ring all-reduce for every bucket: {self.hierarchical_why}")
        if self.buckets and len(self.host_link_bytes.get("ring", {})) > 1:
            ring, two_d = self.host_link_bytes["ring"], self.host_link_bytes["2d"]
            used, other = ((two_d, ring), (ring, two_d))[not two_d_buckets]
            lines.append("host links: all-reduce bytes each host sends per step: "
                         + ", ".join(f"{h} {human_bytes(b)}" for h, b in used.items())
                         + (" (2-D summation); the flat ring in worker order would send "
                            if two_d_buckets else
                            " (ring in worker order); 2-D summation would send ")
                         + ", ".join(f"{h} {human_bytes(b)}" for h, b in other.items()))
        if self.herring_why:
            lines.append(f"herring: {self.herring_why}")
        for b in self.herring_buffers:
            pieces = ", ".join(f"{v}[{start}:{start + n}]@{offset}"
                               for v, start, offset, n in b["segments"])
            shards = ", ".join(f"server {srv} [{offset}:{offset + n}]"
                               for srv, offset, n in b["shards"])
            lines.append(f"herring buffer #{b['index']}: {b['elements']} elements "
                         f"({human_bytes(b['wire_bytes'])} on the wire as {b['wire_dtype']}): "
                         f"{pieces}; shards: {shards}")
        combine = {"mean": "averaged", "sum": "summed",
                   "parallax": "dense-averaged, sparse-summed"}[self.loss_reduction]
        how = {"mean": "averaged over workers, dense and sparse",
               "sum": "summed over workers, dense and sparse",
               "parallax": "dense averaged and sparse summed over workers"}[self.loss_reduction]
        lines.append(f"gradients: {how} "
                     f"(loss_reduction={self.loss_reduction}: {self.loss_reduction_why})")
        for count in self.loss_counts:
            lines.append(f"loss count '{count}' (from the batch's values, e.g. a mask's sum): "
                         "every worker divides by its sum over workers"
                         + (" / N" if self.loss_reduction == "mean" else "")
                         + ", as one device divides by the global batch's")
        if self.batch_tensors and self.num_workers > 1 and self.loss_reduction == "mean" \
                and not self.loss_counts:
            lines.append(f"batch sizes: the loss averages {_quoted(self.batch_tensors)} over "
                         "the batch, whose size the graph leaves unknown, so the workers' "
                         "batches of a step may differ in size (a dataset's last batch): each "
                         "worker weighs its gradients by "
                         "N * b / B, its batch size b over their sum B over the workers (one "
                         "scalar all-reduce per step), so the step is one device's mean (not "
                         "with micro_batches > 1)")
        if self.weighed_state and self.num_workers > 1 and not self.loss_counts:
            lines.append("batch sizes: what a step adds of a mean over its batch to "
                         + _quoted(self.weighed_state)
                         + " (a Mean metric fed the batch's loss) is weighed by N * b / B, "
                         "its batch size b over their sum B over the workers: summed over "
                         "workers (the metrics' logs) it is N times one device's, as their "
                         "counts are (not with micro_batches > 1)")
        if self.weighed_totals and self.num_workers > 1 and not self.loss_counts:
            lines.append("batch sizes: what a step adds of a mean over its batch to "
                         + _quoted(self.weighed_totals)
                         + " (a total no count divides, a Sum metric fed the batch's loss) is "
                         "weighed by b / B, its batch size b over their sum B over the workers: "
                         "summed over workers (the metrics' logs) it is one device's (not with "
                         "micro_batches > 1)")
        if self.summed_state and self.num_workers > 1:
            lines.append("metrics: what a step adds of a sum over its batch to "
                         + _quoted(self.summed_state) + " (a Mean metric fed a loss summed "
                         "over the batch, its count growing by one per step) is weighed by N: "
                         "summed over workers (the metrics' logs) it is N times one device's, "
                         "as their counts are (not with micro_batches > 1)")
        if self.batch_draws and self.num_workers > 1:
            lines.append(f"random draws per example ({_quoted(self.batch_draws)}): "
                         "each worker draws the global batch's and keeps the rows of examples "
                         "w, w+N, ...: one device's for its examples when it holds examples "
                         "w, w+N, ... (autopar.shard, autopar.fit), in equal shares or not")
        if self.shared_draws and self.num_workers > 1:
            seeded = ", ".join(f"'{op}' (seeds {seed}, {seed2})"
                               for op, (seed, seed2) in self.shared_draws.items())
            lines.append(f"random draws every worker makes alike ({seeded}): draws of the step "
                         "that are not per example (a sampled softmax's candidates, noise on "
                         "a weight) are one device's drawn with these seeds on every worker "
                         "(an op given no seed, which would draw differently in each process, "
                         f"gets {UNSEEDED_GRAPH_SEED} and a number from its name)")
        if self.padded_inputs and self.num_workers > 1:
            lines.append(f"inputs of unknown lengths ({_quoted(self.padded_inputs)}): each "
                         "training step checks that every worker padded its batch to the same "
                         "length, one device's (one small all-reduce per input), and fails "
                         "naming the input if not")
        if self.checked_predicates and self.num_workers > 1:
            lines.append(f"conds deciding by whether every example, or any, of the batch "
                         f"passes a test ({_quoted(self.checked_predicates)}): each training "
                         "step checks that every worker's share decides alike, as one device "
                         "decides for the global batch (one small all-reduce per cond), and "
                         "fails naming the cond if not")
        if self.batch_statistics and self.num_workers > 1:
            lines.append(f"statistics of the batch's values ({_quoted(self.batch_statistics)}: "
                         "the largest or smallest of its examples' integers, a longest "
                         "sequence's length, a loop's bound): each training step takes the "
                         "global batch's, as one device does (the extreme over every worker's, "
                         "one small all-gather each)")
        if self.worker_counters and self.num_workers > 1:
            lines.append(f"running totals in local variables ({_quoted(self.worker_counters)}; "
                         "tf.compat.v1.metrics' totals): each worker adds its own batches' "
                         "figures, so a value read from them is that worker's share's, not the "
                         "global batches'; "
                         "runner.sum_over_workers sums them, runner.evaluate evaluates from "
                         "(sum, count) pairs")
        for v in self.variables:
            if v.dedup:
                lines.append(f"{v.name}: deduplicated lookup (one row per distinct id): rows of "
                             "ids several workers touched are combined before clipping and the "
                             "update")
            if v.shared_rows:
                lines.append(f"{v.name}: its gradient's last {v.shared_rows} rows are for ids "
                             "every worker looks up alike (a sampler's candidates): added over "
                             "workers row by row before clipping and the update, as one device "
                             "has them once")
        grouped = {}
        for b in self.batch_norms:
            lines.append(f"batch norm {b['name']} ({b['kind']}): {_batch_norm_line(b, self.num_workers)}")
            grouped.update({m: b["group"] for m in b["moving"] if b["group"]})
        for s in self.state:
            line = (_grouped_state_line(grouped[s["name"]], self.num_workers)
                    if s["name"] in grouped else _state_line(s, combine, self.sync_local_state))
            lines.append(f"state {s['name']} ({s['kind']}): {line}")
        if self.shard_weight_update:
            lines.append("weight-update sharding: gradients all-reduced in full (global norms "
                         "exact), each variable updated by its owner only, new values "
                         "all-gathered from the owners")
            for w, (b, full) in enumerate(zip(self.slot_bytes, self.slot_bytes_unsharded)):
                lines.append(f"worker {w}: updates "
                             f"{sum(1 for v in self.variables if v.owner == w)} variable(s), "
                             f"holds {human_bytes(b)} of optimizer slots ({human_bytes(full)} unsharded)")
        for m in self.moved_ops:
            lines.append(f"{m['rule']}: {m['op']} -> {m['place']} ({m['why']}; "
                         f"saves ~{human_bytes(m['bytes_saved'])}/step)")
        for name in self.untrained:
            lines.append(f"trainable but never updated by the optimizer: {name}")
        lines += self.notes
        return "\n".join(lines)


def build_report(analysis: Analysis, plan: Plan, num_workers: int | None = None,
                 num_servers: int | None = None, moves: list | None = None,
                 alphas: dict[str, float] | None = None) -> Report:
    """``alphas``: the share of each sparse variable's rows a step carries,
    where known better than the analysis's estimate (measured:
    runtime/measured.py)."""
    n = plan.num_workers if num_workers is None else num_workers
    num_servers = plan.num_servers if num_servers is None else num_servers
    notes = []
    variables = []
    server_bytes = [[0.0, 0.0] for _ in range(num_servers)]   # [sent, received] per step
    contributors = plan.contributions_per_step()
    for v in analysis.variables:
        vp = plan.variable(v.name)
        method = METHODS[vp.method]
        alpha = 1.0 if v.gradient == "dense" else (v.alpha if v.alpha is not None else 1.0)
        measured = v.gradient == "sparse" and bool(alphas) and v.name in alphas
        if measured:
            alpha = alphas[v.name]
        elif v.gradient == "sparse":
            alpha = method.sparse_share(alpha)
            if v.alpha is None and method.pushes_every_row(v) and _bytes_follow_rows(v, plan, n):
                notes.append(f"{v.name}: its rows per step are unknown before running (the "
                             "graph does not fix the batch size), so its bytes are an estimate "
                             "at a=1 (as many rows as the table), not a bound: a batch looking "
                             "up more ids carries more; the chief logs the measured rows beside "
                             "it (Config.measure_steps)")
        sent, recv = method.wire_bytes(v, vp, n, alpha)
        if vp.owner is not None:
            # the all-gather of the new values: ring, (N-1)/N of the bytes each way
            sent, recv = sent + (n - 1) * v.bytes / n, recv + (n - 1) * v.bytes / n
        for server, s_sent, s_received in method.server_bytes(v, vp, n, contributors, alpha):
            server_bytes[server][0] += s_sent
            server_bytes[server][1] += s_received
        variables.append(VariableReport(
            name=v.name, kind=v.gradient, shape=list(v.shape), dtype=v.dtype, bytes=v.bytes,
            method=vp.method, placement=vp.placement, reason=vp.reason, alpha=v.alpha,
            sent_per_worker=sent, received_per_worker=recv, bucket=vp.bucket, dedup=v.dedup,
            shared_rows=v.shared_rows,
            owner=vp.owner, recognised=v.recognised, slots=list(v.slots),
            on_servers=not vp.replicated,
            # One row per distinct id: at most the table, unknown rows or not.
            bytes_bound=(measured or v.gradient == "dense" or v.alpha is not None
                         or not method.pushes_every_row(v))))
        if v.recognised.startswith("writes"):
            notes.append(f"{v.name}: update recognised from {v.recognised}; slots "
                         f"{', '.join(v.slots) or 'none'} (the variables only its update writes)")
        if vp.replicated and v.ps_blocker and plan.num_servers and \
                wants_servers(v.gradient, plan.run_option):
            notes.append(f"{v.name}: kept off the servers: {v.ps_blocker}")
    if any(v.gradient == "sparse" and v.alpha is not None and _bytes_follow_rows(v, plan, n)
           for v in analysis.variables):
        notes.append("sparse gradients: bytes counted at one row per looked-up id of the batch "
                     "(a: those rows / the table's rows; at most the table's for a method moving "
                     "one row per distinct id), an upper bound where ids repeat; the chief logs "
                     "the rows its first steps measured (Config.measure_steps)")
    for feature in FEATURES.values():
        notes += feature.notes(analysis, plan, n)
    if len(analysis.train_groups) > 1:
        notes.append(f"{len(analysis.train_groups)} train ops update different variables; each "
                     "step aggregates, buckets and waits for exactly the variables its fetch "
                     "updates: " + "; ".join(
                         f"group {i}: {', '.join(g.variables[:3])}"
                         f"{f' (+{len(g.variables) - 3} more)' if len(g.variables) > 3 else ''}"
                         f" (loss {g.loss})" for i, g in enumerate(analysis.train_groups)))
    servers_used = bool(processes(plan))   # parameter or summation servers
    if num_servers and not servers_used:
        notes.append(f"the spec's {plural(num_servers, 'server')} get nothing to do in this plan "
                     "(every gradient is all-reduced): autopar's launcher does not start them")
    if servers_used:
        how = ("one per worker" if not plan.local_aggregation else
               f"one per group of {plan.aggregation_group} workers" if plan.aggregation_group
               else "one per host: local aggregation")
        notes.append(f"server accumulators receive {plural(contributors, 'contribution')} per "
                     f"step ({how})")
        if plan.structure_why:
            notes.append(f"aggregation structure: {plan.structure_why}")
        if plan.grouped_lookups():
            notes.append(f"lookups of {', '.join(plan.grouped_lookups())} are pulled once per "
                         f"group of {plan.aggregation_group} workers, by its first worker: every "
                         "worker of a group must run each of them (a fetch by one worker alone "
                         "waits for its group; Runner.evaluate is refused)"
                         + ("" if plan.structure_why.startswith("Config(") else
                            ": the planner's choice, Config(aggregation_group=0) keeps the hosts"))
    return Report(num_workers=n, num_servers=num_servers, variables=variables,
                  servers=[{"server": i, "sent": s, "received": r}
                           for i, (s, r) in enumerate(server_bytes)], run_option=plan.run_option,
                  moved_ops=[m.as_dict() for m in moves or []],
                  loss_reduction=plan.loss_reduction, loss_reduction_why=plan.loss_reduction_why,
                  state=[asdict(s) for s in analysis.state], untrained=analysis.untrained,
                  aggregation_group=plan.aggregation_group, sparse_servers=plan.sparse_servers,
                  structure_why=plan.structure_why, notes=notes, **method_report_fields(plan),
                  **feature_report_fields(analysis, plan))


def feature_report_fields(analysis: Analysis, plan: Plan) -> dict:
    """The report fields the graph features fill (transforms.features)."""
    out: dict = {}
    for feature in FEATURES.values():
        out.update(feature.report_fields(analysis, plan))
    return out


def method_report_fields(plan: Plan) -> dict:
    """The report fields the methods' plan-wide states fill, joined over the
    methods filling one (lists joined, numbers added, dicts merged key by key,
    the first non-empty text kept)."""
    out: dict = {"buckets": []}
    for method in METHODS.values():
        out = _joined(out, method.report_fields(plan))
    return out


def _joined(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b, **{k: _joined(a[k], b[k]) for k in a.keys() & b.keys()}}
    if isinstance(a, list):
        return a + b
    if isinstance(a, str):
        return a or b
    return a + b


def _quoted(names) -> str:
    """'a', 'b', 'c': names as the report lists them."""
    return ", ".join(repr(name) for name in names)


def _batch_norm_line(layer: dict, num_workers: int) -> str:
    if not layer["group"]:
        return ("statistics of each worker's own batch, not one device's (Config("
                "batch_norm_group='all') takes them over the global batch)")
    if layer["group"] == num_workers:
        return (f"statistics over all {num_workers} workers (sums, squared deviations and "
                "counts all-reduced, forward and backward) in training steps: one device's on "
                "the global batch; a run that is not a step (the chief's forward pass alone) "
                "normalises by the batch it is given")
    return (f"statistics over groups of {layer['group']} workers (sums, squared deviations and "
            "counts all-reduced within the group, forward and backward)")


def _grouped_state_line(group: int, num_workers: int) -> str:
    if group == num_workers:
        return ("batch-norm moving statistic from the statistics of all workers: equal on every "
                "worker and to one device's on the global batch")
    return (f"batch-norm moving statistic from the statistics of groups of {group} workers: "
            "equal within a group")


def _state_line(state: dict, combine: str, sync: str) -> str:
    if not state["update_ops"]:
        # (a batch norm's moving statistics where the step runs it in
        # inference mode, a learning rate the program sets from Python)
        return "replicated, written by no training step (only by what the program runs besides)"
    if state["kind"] != "local":
        return f"replicated, updated once per step on every worker from the {combine} gradients"
    if sync == "average":
        return ("per worker (from the local batch), then averaged over workers after every step "
                "(sync_local_state='average'): replicas equal, not one device's statistics")
    return ("per worker (from the local batch): replicas hold different values "
            "(sync_local_state='none'; 'average' makes them equal)")


def _bytes_follow_rows(v, plan: Plan, num_workers: int) -> bool:
    """Whether the bytes of sparse variable `v` depend on its rows per step
    (not when its method sends the whole table: an all-reduce)."""
    method, vp = METHODS[plan.variable(v.name).method], plan.variable(v.name)
    return method.wire_bytes(v, vp, num_workers, 0.5) != method.wire_bytes(v, vp, num_workers, 1.0)
