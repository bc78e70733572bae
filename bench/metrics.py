"""The arithmetic of the harness, free of processes (unit-tested).

The bytes of each method are its package's byte model
(transforms/methods/*/method.py: bytes_per_worker, bytes_at_servers, hops),
the one the plan report uses; `required_traffic` adds up the methods each
benchmarked configuration (CARRIERS) puts the dense and the sparse
gradients on. The table below is what they give.

Bytes each system must move per step (Parallax Table 3, counted per direction
for one worker, b = bytes of the dense variables, ab = bytes of the embedding
rows one worker's step touches; one row per looked-up id, or per distinct
id for the peers that send each row once, DISTINCT_ROW_PEERS):

    method      worker sends = receives             each of S servers sends = receives
    allreduce   2(N-1)/N * b  +  (N-1) * ab         -
    ps          b + ab                              N * (b + ab) / S
    hybrid      2(N-1)/N * b  +  ab                 N * ab / S
    herring     b  +  ab                            (C * b + N * ab) / S

(herring, Herring Table III: every contributor pushes its b bytes once,
sharded over the S summation servers, and pulls the sum once; a server
receives its b/S shard from each of C contributors and sends the sum back
to each. C = workers, or hosts when a host's workers sum among themselves
first; one worker per host here, so C = N. Sparse gradients go to the
parameter servers as with hybrid.)

(Table 3 gives the sum of both directions for PS, 2b and 2ab: the worker pulls
b and pushes b. For the all-gather of sparse rows it gives 2(N-1)ab counting
both directions of a ring all-gather, (N-1)ab each way.)

The physical limit of a step (Herring §IV-A) is the time the most loaded
link direction needs for those bytes at the link rate (links are full duplex:
each direction has the whole rate), plus the latency of the algorithm's
sequential hops:

    ring all-reduce (reduce-scatter + all-gather): 2(N-1) hops, 2(N-1)/N * n bytes * beta
    ring all-gather:                                (N-1) hops,  (N-1) * n bytes * beta
    parameter server (push, then pull):              2 hops,      n bytes * beta each way
    herring (push to the summation servers, pull):   2 hops,      the busier of a worker's
                                                                  b and a server's C*b/S

with beta = 8 / rate seconds per byte and alpha = the one-way link latency. A
result is reported as the fraction of that limit it reaches:
limit_time / measured_step_time (1.0 = the wire is the only cost).

The wire is not the only cost: every process of the emulated cluster shares
the machine's cores. The compute floor of a point is the step time of the
same N worker processes, co-located as in the real run, each training the
model on its own batch with the aggregation removed (the `floor` peer). A
step can be no faster than either, so the limit a system is held to is

    limit = max(compute floor, communication limit)

and "of limit" = limit / measured step time. `binding` says which term is the
larger ("compute" or "comm"): a benchmark whose points are all compute-bound
says nothing about communication.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Which communication pattern each peer's gradients follow.
PEER_METHODS = {
    "tf_mwms": "allreduce",
    "horovod": "allreduce",
    "autopar-allreduce": "allreduce",
    "tf_ps": "ps",
    "autopar-ps": "ps",
    "autopar-hybrid": "hybrid",
    "autopar-hybrid-timeline": "hybrid",   # the same with Config(timeline=...) on
    "autopar-herring": "herring",
    "floor": "none",          # no aggregation: the compute-only floor
}

# Peers whose parameter-server paths move each touched embedding row once per
# worker and step (autopar sums a worker's duplicate rows before the push and
# pulls each distinct id's row once): their Table 3 ab is the distinct rows'
# bytes. The others' sparse gradients carry one row per looked-up id.
DISTINCT_ROW_PEERS = frozenset({"autopar-ps", "autopar-hybrid", "autopar-hybrid-timeline",
                                "autopar-herring"})


def sparse_bytes_moved(peer: str, touched_bytes: float, alpha: dict | None) -> float:
    """ab of Table 3 for `peer`: `touched_bytes` (one row per looked-up id,
    bench.models.Workload.sparse_touched_bytes) scaled to the distinct rows
    (sparse_alpha's worker_unique / sent) for DISTINCT_ROW_PEERS."""
    if peer not in DISTINCT_ROW_PEERS or not alpha or not alpha.get("sent"):
        return float(touched_bytes)
    return touched_bytes * alpha["worker_unique"] / alpha["sent"]


# Losses after the measured steps must agree with the single-device reference
# to this tolerance: float32 summation order differs between frameworks
# (observed: at most 2.3e-7 relative, every peer, workload and N of the 1 Gbit/s
# runs), while a worker that never communicates can be as close as 3e-5
# relative on the sparse LM (its few measured steps move the embedding little;
# the reference run reports that loss for every N, and the harness notes any
# point where the tolerance could not tell the two apart).
LOSS_RTOL = 1e-5
LOSS_ATOL = 1e-6


def ring_allreduce_bytes(b: float, n: int) -> float:
    """Bytes one worker sends (and receives) to all-reduce b bytes over n workers."""
    from autopar.transforms.methods.registry import METHODS
    return METHODS["allreduce"].bytes_per_worker(b, n)


def allgather_bytes(ab: float, n: int) -> float:
    """Bytes one worker sends (and receives) to all-gather its ab bytes with n-1 others."""
    from autopar.transforms.methods.registry import METHODS
    return METHODS["allgather"].bytes_per_worker(ab, n)


@dataclass
class Traffic:
    """Bytes per step one worker / one server must send and receive, and the
    number of sequential network hops of the algorithm. `worker_pull` /
    `server_pull`: the part of worker_recv / server_send that is variables
    living on servers, read before the forward pass can use them (so before
    any gradient exists to send)."""
    method: str
    worker_send: float
    worker_recv: float
    server_send: float = 0.0
    server_recv: float = 0.0
    hops: int = 0
    worker_pull: float = 0.0
    server_pull: float = 0.0

    def max_link_bytes(self) -> float:
        return max(self.worker_send, self.worker_recv, self.server_send, self.server_recv)

    def to_dict(self) -> dict:
        return asdict(self)


# The methods that carry the dense and the sparse gradients in each
# benchmarked configuration: autopar's run options as the benchmark runs them
# (hybrid with dense gradients on the ring), and the peers modelled as one.
CARRIERS = {"allreduce": ("allreduce", "allgather"), "ps": ("ps", "ps"),
            "hybrid": ("allreduce", "ps"), "herring": ("herring", "ps")}


def required_traffic(method: str, dense_bytes: float, sparse_touched_bytes: float,
                     num_workers: int, num_servers: int = 0, contributors: int | None = None) -> Traffic:
    """Parallax Table 3 (Herring Table III for "herring") for one worker (and
    one of S servers, load spread evenly), from the methods' byte model.
    `contributors`: pushes per buffer of the dense gradient's method
    (default: every worker, one worker per host)."""
    n, s = num_workers, num_servers
    if method == "none":
        return Traffic(method, 0.0, 0.0)
    if method not in CARRIERS:
        raise ValueError(f"unknown method {method!r}")
    # TensorFlow comes with the methods: imported when first needed.
    from autopar.transforms.methods.registry import METHODS
    dense, sparse = (METHODS[name] for name in CARRIERS[method])
    carried = [(dense, float(dense_bytes), n if contributors is None else contributors),
               (sparse, float(sparse_touched_bytes), n)]
    if s < 1 and (dense.on_servers or sparse.on_servers):
        raise ValueError(f"method {method!r} needs at least one server")
    worker = sum(m.bytes_per_worker(nbytes, n) for m, nbytes, _ in carried)
    at_servers = [m.bytes_at_servers(nbytes, n, c) for m, nbytes, c in carried]
    # Server methods share their push and pull rounds; the others' hops add up.
    moving = [m for m, nbytes, _ in carried if nbytes]
    hops = (sum(m.hops(n) for m in moving if not m.on_servers)
            + max((m.hops(n) for m in moving if m.on_servers), default=0))
    # A variable that lives on servers is read before the step computes
    # with it: a server method's pull is its bytes_per_worker (received; what
    # it pushes is sent), which its servers send.
    pulled = [(m, nbytes, c) for m, nbytes, c in carried if not m.replicated]
    worker_pull = sum(m.bytes_per_worker(nbytes, n) for m, nbytes, _ in pulled)
    server_pull = sum(m.bytes_at_servers(nbytes, n, c)[0] for m, nbytes, c in pulled)
    return Traffic(method, worker, worker, sum(a for a, _ in at_servers) / s if s else 0.0,
                   sum(b for _, b in at_servers) / s if s else 0.0, hops=hops,
                   worker_pull=worker_pull, server_pull=server_pull / s if s else 0.0)


def limit_seconds(traffic: Traffic, rate_mbit: float, latency_s: float = 0.0) -> float:
    """Herring §IV-A lower bound of one step's communication: the most loaded
    link direction at the link rate, plus one latency per sequential hop."""
    beta = 8.0 / (rate_mbit * 1e6)     # seconds per byte
    return traffic.max_link_bytes() * beta + traffic.hops * latency_s


def order_limit_seconds(traffic: Traffic, rate_mbit: float, floor_s: float | None = None) -> float:
    """The shortest step the order of a synchronous step allows: first the
    pull of what lives on servers (the forward pass needs it, and nothing is
    sent meanwhile: no gradient exists yet), then the compute floor, then
    everything sent (and the rest received) on the most loaded link
    direction. limit_seconds counts both directions busy all the step; a
    method that pulls before it computes cannot reach that (ps: all its
    bytes are pulled, so at most half). The backward pass could overlap the
    first sends by at most its part of the floor."""
    beta = 8.0 / (rate_mbit * 1e6)
    t = traffic
    before = max(t.worker_pull, t.server_pull)
    after = max(t.worker_send, t.worker_recv - t.worker_pull, t.server_recv,
                t.server_send - t.server_pull)
    return (before + after) * beta + (floor_s or 0.0)


def fraction_of_limit(limit_s: float, step_s: float | None) -> float | None:
    """limit / measured step time: 1.0 means the step took exactly as long as
    its bytes need on the wire."""
    if not step_s or step_s <= 0 or limit_s is None:
        return None
    return limit_s / step_s


def limit_with_floor(comm_limit_s: float | None, floor_s: float | None) -> tuple[float | None, str | None]:
    """(max(compute floor, communication limit), which of the two binds:
    "compute" or "comm"). Without a floor, the communication limit alone."""
    if comm_limit_s is None:
        return None, None
    if floor_s is None or not floor_s > 0:
        return comm_limit_s, "comm"
    return (floor_s, "compute") if floor_s >= comm_limit_s else (comm_limit_s, "comm")


def floor_step_seconds(worker_step_s: list[float]) -> float | None:
    """Compute floor of one step from the floor peer's workers' mean step
    times: the slowest worker's (a synchronous step waits for the slowest)."""
    times = [t for t in worker_step_s if t and t > 0]
    return max(times) if times else None


def apply_floor(point: dict, floor_s: float | None) -> dict:
    """Fill a point's limit figures from its communication limit
    (`comm_limit_s`) and the compute floor of its workload and N:
    compute_floor_s, limit_s = max of the two, binding, fraction_of_limit
    (limit / measured step time) and comm_to_compute; and, from its Table 3
    bytes, order_limit_s (order_limit_seconds) and order_allows (limit /
    order_limit_s: the share of its limit the step's order leaves reachable).
    Returns the point."""
    comm = point.get("comm_limit_s")
    limit, binding = limit_with_floor(comm, floor_s)
    point.update(compute_floor_s=floor_s, limit_s=limit, binding=binding,
                 fraction_of_limit=fraction_of_limit(limit, point.get("step_s")),
                 comm_to_compute=comm_to_compute_ratio(comm, floor_s))
    table3 = point.get("table3")
    if limit and table3 and "worker_pull" in table3 and point.get("link_mbit"):
        order = order_limit_seconds(Traffic(**table3), point["link_mbit"], floor_s)
        point.update(order_limit_s=order, order_allows=min(1.0, limit / order))
    return point


def comm_to_compute_ratio(comm_limit_s: float | None, floor_s: float | None) -> float | None:
    """How many times longer the bytes need on the wire than the step's
    compute: > 1 means communication dominates the step."""
    if comm_limit_s is None or not floor_s:
        return None
    return comm_limit_s / floor_s


def touched_fraction(ids, vocab: int) -> dict:
    """Per-step sparsity of an embedding lookup: `unique` = distinct rows the
    ids touch / vocab (Parallax's alpha: the share of the table a step
    updates), `sent` = ids / vocab (the rows a gradient carries, duplicates
    included: what tf.gather's gradient sends)."""
    import numpy as np
    flat = np.asarray(ids).reshape(-1)
    if vocab <= 0:
        raise ValueError("vocab must be positive")
    return {"unique": len(np.unique(flat)) / vocab, "sent": flat.size / vocab}


def sparse_alpha(workload, first_step: int, steps: int, num_workers: int) -> dict | None:
    """The touched fraction of the embedding in the measured steps
    [first_step, first_step + steps) of `workload` (a bench.models.Workload)
    with `num_workers` workers: per step, the mean over workers of one
    worker's alpha, and the alpha of the N workers' batches together (what
    the servers update); `sent` is ids per worker / vocab. None for a model
    without an embedding."""
    if workload.name != "sparse" or steps <= 0:
        return None
    vocab = workload.params["vocab"]
    per_step = []
    for k in range(first_step, first_step + steps):
        ids = [workload.batch_for(k, w)["context"] for w in range(num_workers)]
        worker = [touched_fraction(x, vocab) for x in ids]
        per_step.append({"step": k,
                         "worker_unique": sum(f["unique"] for f in worker) / len(worker),
                         "global_unique": touched_fraction(ids, vocab)["unique"],
                         "sent": worker[0]["sent"]})
    mean = {key: sum(p[key] for p in per_step) / len(per_step)
            for key in ("worker_unique", "global_unique", "sent")}
    return {"vocab": vocab, "per_step": per_step, **mean}


def bus_bandwidth(g_bytes: float, num_workers: int, seconds: float) -> float:
    """Achieved bus bandwidth of averaging g_bytes over N workers in `seconds`,
    bytes/s: 2(N-1)/N * G / t (NCCL's convention; equals the link rate when a
    ring all-reduce runs at the link rate)."""
    if seconds <= 0:
        return math.nan
    return ring_allreduce_bytes(g_bytes, num_workers) / seconds


# --------------------------------------------------------------------------- counters

def counter_delta(before: dict, after: dict) -> dict[int, tuple[int, int]]:
    """host -> (rx, tx) bytes between two cluster.counters() snapshots."""
    out = {}
    for host, (rx0, tx0) in before.items():
        rx1, tx1 = after[host]
        if rx1 < rx0 or tx1 < tx0:
            raise ValueError(f"host {host}: byte counters went backwards ({before[host]} -> {after[host]})")
        out[int(host)] = (rx1 - rx0, tx1 - tx0)
    return out


def cpu_probe_ms(repeats: int = 5, n: int = 200_000) -> float:
    """Median milliseconds of a fixed single-threaded loop: how fast one core
    of this machine is right now. On the virtual machine the benchmarks run
    on, the same loop has taken from 1x to 1.7x its fastest time for seconds
    at a stretch, and a whole session ran CPU-heavy points 20-50 % slower
    than another; each point records this probe so a result says which."""
    times = []
    for _ in range(repeats):
        t, x = time.perf_counter(), 0
        for i in range(n):
            x += i * i
        times.append((time.perf_counter() - t) * 1e3)
    return median(times)


def _tick_ms() -> float:
    """Milliseconds of one clock tick, the unit of /proc's CPU times."""
    return 1e3 / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int, int]:
    """(busy, total, user) clock ticks of every core of this machine since
    boot, from /proc/stat (idle and iowait are not busy; user is the
    processes' own code, the rest of busy the kernel's: system calls,
    interrupts, the emulated links' TCP and queues). Every emulated host's
    processes run on these cores, so two snapshots say how much of the
    machine a window kept busy."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])                # user nice system idle iowait irq softirq steal
    return total - fields[3] - fields[4], total, fields[0] + fields[1]


def machine_busy(before: tuple[int, int, int], after: tuple[int, int, int], seconds: float,
                 steps: int) -> dict:
    """What the machine's cores did between two machine_cpu() snapshots
    taken `seconds` apart around `steps` steps: the busy share of all cores,
    and the CPU milliseconds per step of all processes and of the kernel's
    part of them (a step whose busy share is near 1 is bound by the cores,
    whatever its links allow)."""
    busy, total, user = (a - b for a, b in zip(after, before))
    tick_ms = _tick_ms()
    return {"busy_fraction": busy / total if total else math.nan,
            "cpu_ms_per_step": busy * tick_ms / steps if steps else math.nan,
            "kernel_ms_per_step": (busy - user) * tick_ms / steps if steps else math.nan,
            "window_s": seconds}


def process_cpu(pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """label -> (user, system) clock ticks a running process (all its
    threads) has used, from /proc/<pid>/stat; processes gone are left out."""
    out = {}
    for label, pid in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()   # after "pid (comm)": state is fields[0]
        out[label] = (int(fields[11]), int(fields[12]))
    return out


def cpu_by_role(before: dict, after: dict, steps: int) -> dict[str, dict[str, float]]:
    """CPU ms per step of each kind of process between two process_cpu()
    snapshots, summed over its processes ("worker0", "worker1" -> "worker"):
    user and system time in the processes' own context (the kernel's work
    for the links done in interrupts is not charged to any of them)."""
    tick_ms = _tick_ms()
    out: dict[str, dict[str, float]] = {}
    for label, (user1, sys1) in after.items():
        if label not in before or not steps:
            continue
        user0, sys0 = before[label]
        role = label.rstrip("0123456789")
        entry = out.setdefault(role, {"processes": 0, "user_ms_per_step": 0.0,
                                      "system_ms_per_step": 0.0})
        entry["processes"] += 1
        entry["user_ms_per_step"] += (user1 - user0) * tick_ms / steps
        entry["system_ms_per_step"] += (sys1 - sys0) * tick_ms / steps
    return out


def loss_delta(before: dict, after: dict) -> dict:
    """Totals over the hosts of each loss counter between two
    cluster.losses() snapshots (drops, retransmissions, timeouts in the
    measured window), and the host with the most timeouts."""
    totals: dict = {}
    worst = (None, 0)
    for host, counts in before.items():
        for name, value in counts.items():
            d = after[host][name] - value
            totals[name] = totals.get(name, 0) + d
            if name == "timeouts" and d > worst[1]:
                worst = (int(host), d)
    totals["most_timeouts_host"] = worst[0]
    return totals


# A link direction counts as busy in a sampling interval when it carried at
# least this share of its rate (TCP goodput on a saturated link is ~95 %).
BUSY_SHARE = 0.5


def link_occupancy(samples: list[tuple[float, int, int]], rate_mbit: float) -> dict | None:
    """How a host's link was used over `samples` ([(seconds, bytes received,
    bytes sent)], cumulative, in time order): the share of the time each
    direction was busy (carried >= BUSY_SHARE of `rate_mbit`), both at once,
    and each direction's mean utilisation. A step that keeps both directions
    of its links busy at once runs at the Table 3 limit; one direction busy
    while the other idles is the time a schedule loses."""
    total = busy_rx = busy_tx = both = 0.0
    carried_rx = carried_tx = 0
    for (t0, rx0, tx0), (t1, rx1, tx1) in zip(samples, samples[1:]):
        dt = t1 - t0
        if dt <= 0:
            continue
        full = rate_mbit * 1e6 / 8 * dt
        rx_busy, tx_busy = rx1 - rx0 >= BUSY_SHARE * full, tx1 - tx0 >= BUSY_SHARE * full
        total += dt
        busy_rx += dt * rx_busy
        busy_tx += dt * tx_busy
        both += dt * (rx_busy and tx_busy)
        carried_rx += rx1 - rx0
        carried_tx += tx1 - tx0
    if total <= 0:
        return None
    full = rate_mbit * 1e6 / 8 * total
    return {"seconds": total, "receive_busy": busy_rx / total, "send_busy": busy_tx / total,
            "both_busy": both / total, "receive_utilisation": carried_rx / full,
            "send_utilisation": carried_tx / full}


def bytes_per_step(delta: dict, hosts: list[int], steps: int) -> dict:
    """Mean, min and max received/sent bytes per step over `hosts`."""
    if steps <= 0:
        raise ValueError("steps must be positive")
    if not hosts:
        return {"recv": 0.0, "send": 0.0, "recv_max": 0.0, "send_max": 0.0, "recv_min": 0.0,
                "send_min": 0.0, "per_host": {}}
    rx = [delta[h][0] / steps for h in hosts]
    tx = [delta[h][1] / steps for h in hosts]
    return {"recv": sum(rx) / len(rx), "send": sum(tx) / len(tx),
            "recv_max": max(rx), "send_max": max(tx), "recv_min": min(rx), "send_min": min(tx),
            "per_host": {str(h): {"recv": r, "send": t} for h, r, t in zip(hosts, rx, tx)}}


def idle_rate(delta: dict, hosts: list[int], seconds: float) -> float:
    """Mean bytes/s (rx + tx) per host while nothing was being trained."""
    if seconds <= 0 or not hosts:
        return 0.0
    return sum(delta[h][0] + delta[h][1] for h in hosts) / len(hosts) / seconds


def relative_difference(measured: float, predicted: float) -> float | None:
    if not predicted:
        return None
    return (measured - predicted) / predicted


# --------------------------------------------------------------------------- losses

@dataclass
class LossCheck:
    ok: bool
    loss: float | None
    reference: float | None
    abs_error: float | None
    rel_error: float | None
    tolerance: float | None
    reason: str = ""


def check_loss(loss: float | None, reference: float | None, rtol: float = LOSS_RTOL,
               atol: float = LOSS_ATOL) -> LossCheck:
    """|loss - reference| <= atol + rtol * |reference|, and both finite."""
    if reference is None or not math.isfinite(reference):
        return LossCheck(False, loss, reference, None, None, None, "no reference loss")
    tol = atol + rtol * abs(reference)
    if loss is None or not math.isfinite(loss):
        return LossCheck(False, loss, reference, None, None, tol, "no finite loss")
    err = abs(loss - reference)
    rel = err / abs(reference) if reference else None
    ok = err <= tol
    return LossCheck(ok, loss, reference, err, rel, tol,
                     "" if ok else f"loss {loss:.6g} differs from the reference {reference:.6g} by "
                                   f"{err:.3g} > tolerance {tol:.3g}")


def loss_check_margin(reference: float | None, other: float | None, rtol: float = LOSS_RTOL,
                      atol: float = LOSS_ATOL) -> float | None:
    """|other - reference| in units of the loss check's tolerance: > 1 means
    the check tells `other` (e.g. a worker that never communicates) from the
    reference."""
    if reference is None or other is None or not (math.isfinite(reference) and math.isfinite(other)):
        return None
    return abs(other - reference) / (atol + rtol * abs(reference))


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
