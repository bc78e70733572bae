"""The cost model of one synchronous data-parallel training step: an
alpha-beta-gamma model whose phases follow each synchronisation method's byte
model (transforms/methods: bytes_per_worker, bytes_at_servers, hops). The
planner predicts with it (transforms/plan.py: the aggregation structure of a
job's server path) and bench/simulate.py fits its constants to the emulated
cluster's measurements and projects past them.

The model
---------
Costs (per step):

- alpha: seconds per message on the critical path (one hop of an algorithm);
- beta:  seconds per byte on a link, 8 / rate (full-duplex links: each
  direction has the whole rate), times a `wire_factor` per implementation
  (1 / the fraction of the link rate its transport reaches);
- gamma: seconds per byte summed or applied (aggregation and update);
- kappa: CPU seconds per byte a process sends or receives (serialisation,
  copies, the kernel's TCP stack), per implementation, one for the bytes of
  ring steps and one for those of parameter-server RPCs: a hybrid step has
  both, over two transports (TensorFlow's collectives and its RPCs);
- message: CPU seconds per message (an RPC, a ring step), handled by its
  sender and its receiver, per implementation: a PS step with S servers is
  2 N S RPCs (N^2 with S = N) where a ring all-reduce is 2 N (N - 1) ring
  steps, and gRPC's cost per message is ~10x Gloo's;
- overhead: CPU seconds per worker and step that do not depend on bytes
  (session run, RPC set-up, Python), per implementation;
- compute: seconds per example of forward and backward pass.

Each method is a sequence of phases; each phase has the bytes on the most
loaded link direction, its hops, the bytes and messages one process handles
and the bytes it sums, and the same summed over every process:

    ring all-reduce of M bytes over N   link 2(N-1)/N*M   hops 2(N-1)   sums (N-1)/N*M per worker
    ring all-gather of m bytes each     link (N-1)*m      hops N-1      applies N*m rows per worker
    parameter server, g bytes pushed    push then pull (sequential: the pull waits for the
    and pulled per worker, S servers    aggregate): link = max(host NIC, server NIC) per phase,
                                        hops 2, servers sum N*g/S each
    ... with local aggregation          the h workers of a host sum first, one push per host
                                        of the union of their rows
    hybrid                              ring all-reduce of the dense bytes, then the PS phases of
                                        the sparse rows (with local aggregation): both use the
                                        same NIC, so the step pays the sum of the two

Messages: a ring step is one message per worker (2(N-1) per all-reduce, N-1
per all-gather); a PS step is one push and one pull RPC per sender and
server, so a server handles 2N (2 per host with local aggregation). A ring
step and an RPC have their own cost per peer (a hybrid step has both).

Methods: `allreduce` (ring for dense + all-gather of sparse rows: tf_mwms,
Horovod, autopar-allreduce), `ps` (TF-PS, autopar-ps), `ps_la` (PS with local
aggregation), `hybrid` (autopar-hybrid, Parallax) and `hybrid_nola` (Parallax
Table 4's "+HYB" before "+LA"); `none` is the compute-only floor.

Two ways to run the processes:

- shared cores (the emulated cluster: every process of every host on C cores):
  step = wire + hops*alpha + (sum over all processes of CPU seconds) / C;
- dedicated (a real cluster: every process has its own cores or GPU):
  step = wire + hops*alpha + the busiest process's CPU seconds.

Intra-host transfers (hosts = 1, or a server's own host's share when servers
are colocated) are free of link time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from autopar.transforms.methods.registry import METHODS as SYNC_METHODS

# Linux's minimum retransmission timeout (TCP_RTO_MIN): what one timeout stalls a connection for
RTO_MIN_S = 0.2
# Rows sent in blocks of a size every member derives alike are padded to the
# next rung of comm.ROW_LADDER, the rungs a quarter apart: about an eighth on average
LADDER_PADDING = 1.125
# "none": the compute-only floor (no aggregation), fitted so that it pins compute per example
METHODS = ("allreduce", "ps", "ps_la", "hybrid", "hybrid_nola", "none")

# --------------------------------------------------------------------------- inputs

@dataclass
class Workload:
    """What one worker's step computes and moves."""
    name: str
    dense_bytes: float                 # b: dense variables (= their gradients)
    sparse_rows: int = 0               # rows of the embedding variable(s)
    row_bytes: float = 0.0             # bytes of one row
    touched_rows: float = 0.0          # rows one worker's step touches (not deduplicated across workers)
    examples: float = 1.0              # examples per worker and step
    compute_s: float | None = None     # seconds of compute per worker step (None: from fitted constants)
    zipf_s: float | None = None        # id skew for the union of several workers' rows (None: uniform)

    @property
    def touched_bytes(self) -> float:
        """alpha*b of Parallax Table 3: bytes of the rows one worker touches."""
        return self.touched_rows * self.row_bytes

    @property
    def alpha_sparse(self) -> float:
        return self.touched_rows / self.sparse_rows if self.sparse_rows else 0.0


@dataclass
class Cluster:
    workers: int
    workers_per_host: int = 1
    servers: int = 0                   # 0 with servers needed: one per worker host
    colocated_servers: bool = False    # servers on the worker hosts (Parallax) or on extra hosts (the bench)
    link_gbit: float = 1.0
    cores: float | None = None         # shared cores for all processes (emulated cluster); None: dedicated
    server_imbalance: float = 1.0      # most loaded server / even spread (measured: how variables were placed)
    cpu_speed: float = 1.0             # CPU seconds relative to the reference run's cores (> 1: slower)
    timeouts_per_step: float = 0.0     # measured: the emulated links' TCP retransmission timeouts per step
    aggregation_group: int = 0         # Config.aggregation_group: workers per group (0: the hosts)
    allreduce_group: int = 0           # Config.allreduce_group: 2-D summation's group (0: flat ring)

    @property
    def hosts(self) -> int:
        return max(1, math.ceil(self.workers / self.workers_per_host))

    @property
    def num_servers(self) -> int:
        return self.servers or self.hosts

    @property
    def beta(self) -> float:
        """Seconds per byte at the link rate."""
        return 8.0 / (self.link_gbit * 1e9)


@dataclass
class PeerConstants:
    overhead_s: float = 0.0            # CPU s per worker step, independent of bytes
    kappa: float = 0.0                 # CPU s per byte a process sends/receives in ring steps
    rpc_kappa: float = 0.0             # CPU s per byte a process sends/receives in PS RPCs
    message_s: float = 0.0             # CPU s per ring step (a collective's message), both ends
    rpc_s: float = 0.0                 # CPU s per parameter-server RPC (a push or a pull), both ends
    # CPU s per worker for each collective an all-reduce launches beyond the
    # flat ring's one (2-D summation over groups: three in a row); measured on
    # the emulated cluster, not fitted (bench/simulate.py, allreduce_group_launches)
    launch_s: float = 0.0
    wire_factor: float = 1.0           # multiplies beta (1 / fraction of the link rate reached)
    pair_serialised: float = 0.0       # expected share of a 2-rank all-gather's link time paid twice


@dataclass
class Constants:
    alpha: float = 0.0                 # s per hop
    phase_wire_factor: dict = field(default_factory=dict)     # phase name -> factor on beta (transport)
    gamma: float = 0.0                 # s per byte summed / applied
    timeout_share: float = 0.0         # fraction of a timeout's RTO_MIN_S on the step's critical path
    wire_factor: float = 1.0           # global multiplier of beta (per-peer factors multiply it)
    compute_per_example: dict = field(default_factory=dict)   # workload name -> s
    peers: dict = field(default_factory=dict)                 # peer name -> PeerConstants
    run_cpu_speed: dict = field(default_factory=dict)         # run name -> Cluster.cpu_speed fitted for it

    def peer(self, name: str | None) -> PeerConstants:
        return self.peers.get(name or "", PeerConstants())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["peers"] = {k: asdict(v) for k, v in self.peers.items()}
        return d


# --------------------------------------------------------------------------- phases

@dataclass
class Phase:
    """One communication phase of a step."""
    name: str
    link_bytes: float        # on the most loaded link direction
    hops: int                # sequential messages on the critical path
    proc_bytes: float        # (sent + received) / 2 by the busiest process
    total_bytes: float       # (sent + received) / 2 summed over all processes
    proc_reduce: float       # bytes summed/applied by the busiest process
    total_reduce: float      # bytes summed/applied by all processes
    proc_msgs: float = 0.0   # messages the busiest process sends or serves
    total_msgs: float = 0.0  # messages sent by all processes (each also handled by its receiver)
    rpc: bool = False        # its messages are parameter-server RPCs, not ring steps
    # collectives each worker launches in this phase beyond the one a flat
    # ring launches per all-reduce (whose cost the fitted overheads hold)
    launches: int = 0


def _method(name: str):
    """A synchronisation method, whose byte model (bytes_per_worker,
    bytes_at_servers, hops) is the one the plan report uses."""
    return SYNC_METHODS[name]


def ring_allreduce(m: float, n: int, hosts: int) -> Phase:
    if n <= 1 or m <= 0:
        return Phase("allreduce", 0.0, 0, 0.0, 0.0, 0.0, 0.0)
    ring = _method("allreduce")
    per, hops = ring.bytes_per_worker(m, n), ring.hops(n)
    # each worker sums (N-1)/N of the bytes in the reduce-scatter and applies all M to its replica
    return Phase("allreduce", per if hosts > 1 else 0.0, hops, per, n * per,
                 (n - 1) / n * m + m, (n - 1) * m + n * m, hops, n * hops)


def grouped_allreduce(m: float, n: int, d: int, hosts: int) -> list[Phase]:
    """2-D summation of an all-reduce of m bytes over groups of d workers
    (Config.allreduce_group; transforms/methods/allreduce): within each group
    an all-to-all of the d pieces of the sum (one step: each worker sends
    d - 1 pieces of m/d at once), a ring all-reduce of each piece among the
    n/d workers holding it, and a ring all-gather of the pieces within the
    group. The flat ring's bytes, 2(n-1)/n m, in 2(n/d - 1) + d steps."""
    d = min(d, n)
    if d <= 1 or m <= 0:
        return [ring_allreduce(m, n, hosts)]
    groups, piece = n // d, m / d
    remote = 1.0 if hosts > 1 else 0.0
    exchange = (d - 1) * piece
    out = [Phase("group-exchange", remote * exchange, 1, exchange, n * exchange, exchange,
                 n * exchange, d - 1, n * (d - 1))]
    if groups > 1:
        across = ring_allreduce(piece, groups, hosts)
        across.name = "across-groups"
        across.launches = 1
        across.total_bytes *= d
        across.total_reduce *= d
        across.total_msgs *= d
        out.append(across)
    gather = ring_allgather(piece, d, hosts)
    gather.name = "group-gather"
    # concatenated, not summed; each worker applies the whole sum to its replica
    gather.proc_reduce, gather.total_reduce = m, n * m
    gather.total_bytes *= groups
    gather.total_msgs *= groups
    gather.launches = 1
    out.append(gather)
    return out


def dense_allreduce(m: float, cl: Cluster) -> list[Phase]:
    """The dense gradients' all-reduce: the flat ring, or 2-D summation over
    groups (Cluster.allreduce_group)."""
    phases_ = (grouped_allreduce(m, cl.workers, cl.allreduce_group, cl.hosts)
               if cl.allreduce_group > 1 else [ring_allreduce(m, cl.workers, cl.hosts)])
    return [p for p in phases_ if p.hops]


def ring_allgather(m: float, n: int, hosts: int) -> Phase:
    if n <= 1 or m <= 0:
        return Phase("allgather", 0.0, 0, 0.0, 0.0, 0.0, 0.0)
    gather = _method("allgather")
    per, hops = gather.bytes_per_worker(m, n), gather.hops(n)
    # every worker applies all N workers' rows to its replica
    return Phase("allgather", per if hosts > 1 else 0.0, hops, per, n * per, n * m, n * n * m,
                 hops, n * hops)


def expected_distinct(rows: int, draws: float, zipf_s: float | None) -> float:
    """Expected distinct rows among `draws` independent draws over `rows` rows
    (uniform, or Zipf with exponent zipf_s)."""
    if rows <= 0 or draws <= 0:
        return 0.0
    if zipf_s is None:
        return rows * (1.0 - (1.0 - 1.0 / rows) ** draws)
    return float(np.sum(-np.expm1(draws * _log1m_zipf(rows, zipf_s))))


@functools.lru_cache(maxsize=8)
def _log1m_zipf(rows: int, zipf_s: float) -> np.ndarray:
    p = np.arange(1, rows + 1, dtype=float) ** -zipf_s
    return np.log1p(-p / p.sum())


@functools.lru_cache(maxsize=4096)
def union_rows(rows: int, touched: float, k: int, zipf_s: float | None = None) -> float:
    """Distinct rows touched by k workers that each touch `touched` distinct
    rows (independent draws from the same distribution)."""
    if k <= 1 or touched <= 0:
        return touched * max(k, 0)
    touched = min(touched, rows)
    # find the number of draws that gives `touched` distinct rows (bisection), then k times as many
    lo, hi = touched, touched
    while expected_distinct(rows, hi, zipf_s) < touched * (1 - 1e-9) and hi < 1e15:
        hi *= 2
    for _ in range(24):            # bisection on log(draws): relative precision (hi/lo)^(2^-24)
        mid = math.sqrt(lo * hi)
        if expected_distinct(rows, mid, zipf_s) < touched:
            lo = mid
        else:
            hi = mid
    return min(float(rows), expected_distinct(rows, k * hi, zipf_s))


def parameter_server(push: float, pull: float, cl: Cluster, local_aggregation: bool,
                     host_push: float | None = None, tag: str = "ps") -> list[Phase]:
    """Push `push` bytes per worker (or, with local aggregation, `host_push`
    bytes per host: the union of its workers' rows), aggregate and update on
    the servers, then pull `pull` bytes per worker (one pull per host with local
    aggregation, shared in the host)."""
    n, h, hosts, s = cl.workers, min(cl.workers_per_host, cl.workers), cl.hosts, cl.num_servers
    if push <= 0 and pull <= 0:
        return []
    if local_aggregation:
        senders, per_sender_push = hosts, (host_push if host_push is not None else push)
        per_sender_pull = (host_push if host_push is not None else pull)
        pushers_per_host = 1
    else:
        senders, per_sender_push, per_sender_pull, pushers_per_host = n, push, pull, h
    # The servers' totals from the method's byte model, the senders being
    # its readers and contributors (hosts with local aggregation).
    ps = _method("ps")
    total_push = ps.bytes_at_servers(per_sender_push, senders, senders)[1]
    total_pull = ps.bytes_at_servers(per_sender_pull, senders, senders)[0]
    srv_push = total_push / s * cl.server_imbalance
    srv_pull = total_pull / s * cl.server_imbalance
    host_out_push = pushers_per_host * per_sender_push
    host_in_pull = pushers_per_host * per_sender_pull
    if cl.colocated_servers:
        # a host's share for its own server stays inside the host
        remote = (hosts - 1) / hosts if hosts > 1 else 0.0
        push_link = max(host_out_push * remote, srv_push * remote)
        pull_link = max(host_in_pull * remote, srv_pull * remote)
    else:
        push_link = max(host_out_push, srv_push)
        pull_link = max(host_in_pull, srv_pull)
    proc = max(per_sender_push + per_sender_pull, srv_push + srv_pull) / 2.0
    total = (total_push + total_pull)
    local_sum = (h - 1) * push if local_aggregation and h > 1 else 0.0
    # servers sum every push and apply the aggregate once (pull bytes = the variables' share)
    update = pull * cl.server_imbalance / s
    # one push and one pull RPC per sender and server, each served by the server
    phases = [Phase(f"{tag}-push", push_link, 1, proc, total, srv_push + update + local_sum,
                    total_push + pull + hosts * local_sum, 2 * max(s, senders), 2 * senders * s),
              Phase(f"{tag}-pull", pull_link, 1, 0.0, 0.0, 0.0, 0.0)]
    for p in phases:
        p.rpc = True
    return phases


def phases(method: str, wl: Workload, cl: Cluster) -> list[Phase]:
    """The communication phases of one step of `method`."""
    n, hosts = cl.workers, cl.hosts
    b, ab = wl.dense_bytes, wl.touched_bytes
    h = min(cl.workers_per_host, n)
    host_rows = union_rows(wl.sparse_rows, wl.touched_rows, h, wl.zipf_s) if ab else 0.0
    host_ab = host_rows * wl.row_bytes
    if n <= 1 or method == "none":
        return []
    if method == "allreduce":
        return dense_allreduce(b, cl) + [p for p in (ring_allgather(ab, n, hosts),) if p.hops]
    if method in ("ps", "ps_la"):
        # dense and sparse variables travel in the same push and pull; they are kept as
        # separate phases (same link time: bytes add) so that a transport can treat rows apart
        la = method == "ps_la"
        out = parameter_server(b, b, cl, la, tag="ps-dense") if b else []
        if ab:
            out += parameter_server(ab, ab, cl, la, host_push=host_ab if la else None, tag="ps-sparse")
        if b and ab:
            for p in out[2:]:
                p.hops = 0     # one push and one pull carry both
                p.proc_msgs = p.total_msgs = 0.0
        return out
    if method in ("hybrid", "hybrid_nola"):
        out = dense_allreduce(b, cl)
        if ab and method == "hybrid" and cl.aggregation_group > 1:
            return out + aggregation_groups(wl, cl)
        if ab:
            la = method == "hybrid"
            out += parameter_server(ab, ab, cl, la, host_push=host_ab if la else None, tag="ps-sparse")
        return out
    raise ValueError(f"unknown method {method!r} (one of {', '.join(METHODS)})")


def aggregation_groups(wl: Workload, cl: Cluster) -> list[Phase]:
    """The sparse rows' phases with Config.aggregation_group = g on hosts of
    one worker each: the g workers of a group gather their distinct ids
    (an id and a rank tag, 16 bytes each), the first pulls the union's rows
    from the servers and sends each member its own rows, each member's rows
    are gathered to the first, which pushes their sum (local aggregation
    over the group). The servers see N/g senders (parameter_server with a
    group as its "host"); the exchanges within a group cross links over g
    hosts: a variable-size gather is three ring all-gathers (the counts
    first, then values and indices together: 2 (g - 1) hops, 3 (g - 1) ring
    steps); the scatter is one all-to-all (comm.scatter_rows) of g - 1
    blocks each way on every member's link (the first's blocks the members'
    rows, the others' zeros), each a member's rows padded to the ladder."""
    n, g = cl.workers, min(cl.aggregation_group, cl.workers)
    groups = math.ceil(n / g)
    union = union_rows(wl.sparse_rows, wl.touched_rows, g, wl.zipf_s) * wl.row_bytes
    out = parameter_server(wl.touched_bytes, wl.touched_bytes, replace(cl, workers_per_host=g),
                           True, host_push=union, tag="ps-sparse")
    for name, contribution in (("group-ids", 16.0 * wl.touched_rows),
                               ("group-push", wl.touched_bytes)):
        ring = ring_allgather(contribution, g, 2)
        if not ring.hops:
            continue
        ring.name = name
        ring.proc_reduce = ring.total_reduce = 0.0   # concatenated, not applied
        ring.total_bytes *= groups
        ring.hops *= 2                                # the counts' gather, then the rows'
        ring.proc_msgs *= 3
        ring.total_msgs *= 3 * groups
        out.append(ring)
    if g > 1:
        blocks = (g - 1) * wl.touched_bytes * LADDER_PADDING
        out.append(Phase("group-rows", blocks, 1, blocks, groups * g * blocks, 0.0, 0.0,
                         g - 1, groups * g * (g - 1)))
    return out


# --------------------------------------------------------------------------- step time

def _servers_used(method: str, wl: Workload, cl: Cluster) -> int:
    uses = method in ("ps", "ps_la") or (method in ("hybrid", "hybrid_nola") and wl.touched_bytes > 0)
    return cl.num_servers if uses else 0


def terms(method: str, wl: Workload, cl: Cluster) -> dict:
    """The quantities each constant multiplies (the model is linear in them)."""
    ph = phases(method, wl, cl)
    # at N = 2 a ring's left and right neighbour are the same peer
    pair_allgather = sum(p.link_bytes for p in ph if p.name == "allgather") if cl.workers == 2 else 0.0
    shared = cl.cores is not None
    c = cl.cores or 1.0
    n = cl.workers

    def cpu(total: float, busiest: float) -> float:
        # CPU seconds, in the reference run's core speed; a slower session's cores take cpu_speed x
        return (total / c if shared else busiest) * cl.cpu_speed
    return {
        "wire": sum(p.link_bytes for p in ph) * cl.beta,
        "wire_by_phase": {p.name: p.link_bytes * cl.beta for p in ph},
        "pair_allgather": pair_allgather * cl.beta,
        # an RTO stalls its connection for >= RTO_MIN_S whatever the rate (an emulator's queue, not the system)
        "timeouts": cl.timeouts_per_step * RTO_MIN_S,
        # on oversubscribed shared cores a message waits for its receiver to be scheduled:
        # the wait per hop grows with the runnable processes per core
        "alpha": float(sum(p.hops for p in ph)) * (max(1.0, (n + _servers_used(method, wl, cl)) / c)
                                                  if shared else 1.0),
        "gamma": cpu(sum(p.total_reduce for p in ph), sum(p.proc_reduce for p in ph)),
        **{term: cpu(sum(p.total_bytes for p in ph if p.rpc == rpc),
                     sum(p.proc_bytes for p in ph if p.rpc == rpc))
           for term, rpc in (("kappa", False), ("kappa_rpc", True))},
        # ring steps and parameter-server RPCs
        **{term: cpu(sum(p.total_msgs for p in ph if p.rpc == rpc),
                     sum(p.proc_msgs for p in ph if p.rpc == rpc))
           for term, rpc in (("mu", False), ("mu_rpc", True))},
        "overhead": cpu(n, 1.0),
        "launch": cpu(n * sum(p.launches for p in ph), sum(p.launches for p in ph)),
        "compute": cpu(n * wl.examples, wl.examples),
        "phases": [asdict(p) for p in ph],
    }


def step_time(method: str, wl: Workload, cl: Cluster, k: Constants, peer: str | None = None) -> dict:
    """Predicted seconds of one step, by term, and throughput (examples/s)."""
    t = terms(method, wl, cl)
    pc = k.peer(peer)
    if wl.compute_s is not None:
        compute = wl.compute_s * (cl.workers / cl.cores if cl.cores else 1.0) * cl.cpu_speed
    else:
        compute = t["compute"] * k.compute_per_example.get(wl.name, 0.0)
    parts = {
        "compute": compute,
        "overhead": t["overhead"] * pc.overhead_s,
        "cpu_bytes": t["kappa"] * pc.kappa + t["kappa_rpc"] * pc.rpc_kappa,
        "messages": t["mu"] * pc.message_s + t["mu_rpc"] * pc.rpc_s,
        "launches": t["launch"] * pc.launch_s,
        "reduce": t["gamma"] * k.gamma,
        "wire": sum(w * k.phase_wire_factor.get(name, 1.0) for name, w in t["wire_by_phase"].items())
        * k.wire_factor * pc.wire_factor,
        "serialised": t["pair_allgather"] * pc.pair_serialised * k.wire_factor * pc.wire_factor,
        "latency": t["alpha"] * k.alpha,
        "timeouts": t["timeouts"] * k.timeout_share,
    }
    total = sum(parts.values())
    return {"step_s": total, "parts": parts,
            "throughput": cl.workers * wl.examples / total if total > 0 else math.inf,
            "phases": t["phases"]}


# --------------------------------------------------------------------------- the planner's choice

# The constants the planner predicts with: autopar-hybrid's, as `make simulate`
# last fitted them (bench/results/simulate.json; tests/unit/test_cost.py checks
# that these are the committed fit).
PLANNER_PEER = "autopar-hybrid"
PLANNER_CONSTANTS = Constants(
    gamma=5.408825610208983e-10,
    peers={PLANNER_PEER: PeerConstants(kappa=4.6368730915138537e-10,
                                       rpc_kappa=0.0,
                                       message_s=0.00018923918713846624,
                                       rpc_s=0.0011271360102118513,
                                       launch_s=0.0024340029481370786,
                                       wire_factor=1.1233712648200702)})

# Workers per aggregation group the choice considers (1: no groups): the sizes
# measured on the emulated cluster (make bench-groups, N = 8: every size
# predicted within 12 % of the measured at 100 Mbit/s; at 1000 Mbit/s g = 8
# within 4 %, g = 2 and 4 within 25 % of one run and equal to another);
# larger groups were never measured.
GROUP_SIZES = (1, 2, 4, 8)
# Another structure than the flat one (the hosts, every server) is chosen only
# when predicted at least this much faster: the model's median error on the
# measured points is ~5 %, up to 14 % on the grouped steps, and groups bind
# their workers' lookups together (Config.aggregation_group).
MIN_GAIN = 1.1


@dataclass(frozen=True)
class Structure:
    """How a hybrid job's sparse rows meet the servers: workers per
    aggregation group (1: none) and the servers holding the rows, with the
    predicted seconds per step of communication and CPU (compute left out:
    the same for every choice) of it and of the flat choice."""
    group: int
    servers: int
    step_s: float
    flat_step_s: float

    @property
    def gain(self) -> float:
        return self.flat_step_s / self.step_s if self.step_s > 0 else 1.0

    @property
    def flat(self) -> bool:
        return self.group <= 1 and self.step_s == self.flat_step_s


def allreduce_group_sizes(workers: int) -> list[int]:
    """The 2-D summation groups the choice considers: powers of 2 that divide
    the workers into at least two groups."""
    return [2 ** i for i in range(1, workers.bit_length())
            if workers % 2 ** i == 0 and 2 ** i < workers]


def best_allreduce_group(method: str, wl: Workload, cl: Cluster,
                         k: Constants = PLANNER_CONSTANTS, peer: str = PLANNER_PEER) -> Structure:
    """The fastest way for `method`'s step (its servers and aggregation
    groups as `cl` has them) to all-reduce its dense gradients: the flat ring
    or 2-D summation over groups of d workers (Structure.group = d, 1 for the
    flat ring), kept flat unless a group makes the step's communication
    predicted MIN_GAIN x faster."""
    flat = sync_seconds(method, wl, replace(cl, allreduce_group=0), k, peer)
    best = Structure(1, cl.num_servers, flat, flat)
    for d in allreduce_group_sizes(cl.workers):
        t = sync_seconds(method, wl, replace(cl, allreduce_group=d), k, peer)
        if t < best.step_s:
            best = Structure(d, cl.num_servers, t, flat)
    return best if best.gain >= MIN_GAIN else Structure(1, cl.num_servers, flat, flat)


def server_counts(num_servers: int) -> list[int]:
    """The numbers of servers the choice considers: powers of 2 below
    `num_servers`, and all of them."""
    return sorted({2 ** i for i in range(max(num_servers, 1).bit_length())
                   if 2 ** i < num_servers} | {max(num_servers, 1)})


def sync_seconds(method: str, wl: Workload, cl: Cluster, k: Constants, peer: str) -> float:
    """Predicted seconds of one step without its compute."""
    r = step_time(method, wl, cl, k, peer)
    return r["step_s"] - r["parts"]["compute"]


def best_structure(wl: Workload, cl: Cluster, k: Constants = PLANNER_CONSTANTS,
                   peer: str = PLANNER_PEER, groups=GROUP_SIZES) -> Structure:
    """The fastest hybrid structure for `wl` on `cl` (its servers: all there
    are; one worker per host where `groups` has sizes above 1): g in
    `groups` and S in server_counts, kept flat (no groups, every server)
    unless one is predicted MIN_GAIN x faster."""
    flat_cl = replace(cl, aggregation_group=0)
    flat = sync_seconds("hybrid", wl, flat_cl, k, peer)
    best = Structure(1, cl.num_servers, flat, flat)
    for g in (g for g in groups if g <= cl.workers):
        for s in server_counts(cl.num_servers):
            if g == 1 and s == cl.num_servers:
                continue
            t = sync_seconds("hybrid", wl, replace(cl, servers=s, aggregation_group=g), k, peer)
            if t < best.step_s:
                best = Structure(g, s, t, flat)
    return best if best.gain >= MIN_GAIN else Structure(1, cl.num_servers, flat, flat)
