"""The alpha-beta-gamma simulator: its arithmetic on hand-computed cases, the
non-negative least-squares fit, and that fitting recovers known constants."""
import json
from pathlib import Path

import numpy as np
import pytest

from autopar.transforms import cost
from bench import simulate as sim

MB = 1e6
BETA_1G = 8e-9          # seconds per byte at 1 Gbit/s


def dense(m: float, examples: float = 1.0) -> sim.Workload:
    return sim.Workload("d", m, examples=examples)


def sparse_only(rows: int, width_bytes: float, touched: float) -> sim.Workload:
    return sim.Workload("s", 0.0, rows, width_bytes, touched)


def test_ring_allreduce_is_2_n_minus_1_over_n_m_beta_plus_2_n_minus_1_alpha():
    k = sim.Constants(alpha=1e-3)
    r = sim.step_time("allreduce", dense(100 * MB), sim.Cluster(4, link_gbit=1.0), k)
    assert r["step_s"] == pytest.approx(2 * 3 / 4 * 100 * MB * BETA_1G + 2 * 3 * 1e-3)
    assert r["parts"]["wire"] == pytest.approx(1.2)
    assert r["parts"]["latency"] == pytest.approx(6e-3)


def test_ring_allreduce_gamma_sums_n_minus_1_over_n_and_applies_m():
    k = sim.Constants(gamma=1e-9)
    r = sim.step_time("allreduce", dense(100 * MB), sim.Cluster(4, link_gbit=1.0), k)
    assert r["parts"]["reduce"] == pytest.approx((3 / 4 * 100 * MB + 100 * MB) * 1e-9)


def test_allgather_of_rows_is_n_minus_1_rows_per_worker():
    k = sim.Constants(alpha=2e-3)
    wl = sparse_only(1000, 1000.0, 100)           # 100 kB of rows per worker
    r = sim.step_time("allreduce", wl, sim.Cluster(8, link_gbit=1.0), k)
    assert r["step_s"] == pytest.approx(7 * 100e3 * BETA_1G + 7 * 2e-3)


def test_ps_without_local_aggregation_every_worker_pushes_and_pulls():
    # 4 workers on 2 hosts (2 per host), 2 server hosts: a host's NIC carries 2 pushes of g,
    # a server receives 4 g / 2 = 2 g; push then pull: 2 * 2 g * beta + 2 hops
    g = 10 * MB
    cl = sim.Cluster(4, workers_per_host=2, servers=2, link_gbit=1.0)
    r = sim.step_time("ps", dense(g), cl, sim.Constants(alpha=1e-3))
    assert r["step_s"] == pytest.approx(2 * 2 * g * BETA_1G + 2e-3)


def test_ps_with_local_aggregation_sends_one_push_per_host():
    g = 10 * MB
    cl = sim.Cluster(4, workers_per_host=2, servers=2, link_gbit=1.0)
    r = sim.step_time("ps_la", dense(g), cl, sim.Constants())
    # one push of g per host; each server receives 2 hosts * g / 2 servers
    assert r["step_s"] == pytest.approx(2 * g * BETA_1G)


def test_server_imbalance_scales_the_most_loaded_server():
    g = 10 * MB
    cl = sim.Cluster(4, servers=4, link_gbit=1.0, server_imbalance=3.0)
    r = sim.step_time("ps", dense(g), cl, sim.Constants())
    # even spread: each server gets 4 g / 4 = g (= a worker's push); the hot one 3 g
    assert r["step_s"] == pytest.approx(2 * 3 * g * BETA_1G)


def test_colocated_servers_keep_their_own_hosts_share_off_the_wire():
    g = 10 * MB
    cl = sim.Cluster(4, workers_per_host=1, colocated_servers=True, link_gbit=1.0)   # 4 hosts, 4 servers
    r = sim.step_time("ps", dense(g), cl, sim.Constants())
    assert r["step_s"] == pytest.approx(2 * g * 3 / 4 * BETA_1G)


def test_hybrid_is_the_sum_of_the_dense_ring_and_the_sparse_ps():
    wl = sim.Workload("h", 20 * MB, 100_000, 1024.0, 1000.0)
    cl = sim.Cluster(8, servers=8, link_gbit=1.0)
    k = sim.Constants(alpha=1e-4, gamma=1e-9)
    hyb = sim.step_time("hybrid", wl, cl, k)["step_s"]
    ring = sim.step_time("allreduce", dense(20 * MB), cl, k)["step_s"]
    ps = sim.step_time("ps", sparse_only(100_000, 1024.0, 1000.0), cl, k)["step_s"]
    assert hyb == pytest.approx(ring + ps)
    # by hand: ring 2*7/8*20 MB, PS push and pull of 1.024 MB (servers get 8*1.024/8)
    wire = (2 * 7 / 8 * 20 * MB + 2 * 1.024 * MB) * BETA_1G
    assert sim.step_time("hybrid", wl, cl, sim.Constants())["step_s"] == pytest.approx(wire)


def test_union_of_uniform_rows():
    # k workers each touching t of R rows uniformly: R (1 - (1 - t/R)^k)
    assert cost.union_rows(10_000, 500.0, 4) == pytest.approx(10_000 * (1 - (1 - 0.05) ** 4), rel=1e-6)
    assert cost.union_rows(10_000, 500.0, 1) == 500.0
    # skewed ids overlap more than uniform ones
    assert cost.union_rows(10_000, 500.0, 4, 1.0) < cost.union_rows(10_000, 500.0, 4)


def test_shared_cores_divide_every_process_cpu_by_the_cores():
    k = sim.Constants(compute_per_example={"d": 0.01},
                      peers={"p": sim.PeerConstants(overhead_s=0.005)})
    cl = sim.Cluster(4, link_gbit=1.0, cores=2)
    r = sim.step_time("allreduce", dense(0.0, examples=10), cl, k, "p")
    assert r["parts"]["compute"] == pytest.approx(4 * 10 * 0.01 / 2)
    assert r["parts"]["overhead"] == pytest.approx(4 * 0.005 / 2)
    ded = sim.step_time("allreduce", dense(0.0, examples=10), sim.Cluster(4, link_gbit=1.0), k, "p")
    assert ded["parts"]["compute"] == pytest.approx(0.1)
    # a hop waits for its receiver to be scheduled: (processes / cores) times alpha
    ka = sim.Constants(alpha=1e-3)
    r = sim.step_time("allreduce", dense(MB), sim.Cluster(4, link_gbit=1.0, cores=2), ka)
    assert r["parts"]["latency"] == pytest.approx(2 * 3 * 1e-3 * 4 / 2)
    r = sim.step_time("ps", dense(MB), sim.Cluster(4, servers=4, link_gbit=1.0, cores=2), ka)
    assert r["parts"]["latency"] == pytest.approx(2 * 1e-3 * 8 / 2)


def test_nnls_matches_a_hand_solved_problem():
    # unconstrained least squares would make x1 negative; with x >= 0 it is 0
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([2.0, -1.0, 1.0])
    x = sim.nnls(a, y)
    # with x1 = 0: minimise (x0-2)^2 + (x0-1)^2 -> x0 = 1.5
    assert x == pytest.approx([1.5, 0.0])


def _synthetic_points(truth: sim.Constants, methods: dict) -> list:
    wls = [sim.Workload("sparse", 1.3 * MB, 102_400, 1024.0, 1024.0, 128.0),
           sim.Workload("dense", 26 * MB, examples=32.0)]
    points = []
    for wl in wls:
        for peer, method in methods.items():
            for n in (2, 4, 8):
                servers = n if method in ("ps", "hybrid") else 0
                cl = sim.Cluster(n, servers=servers, link_gbit=1.0, cores=2, server_imbalance=1.0 + 0.2 * n)
                t = sim.step_time(method, wl, cl, truth, peer)["step_s"]
                points.append(sim.Point("synthetic", wl, cl, peer, method, t))
    return points


def test_fit_recovers_known_constants_from_synthetic_points():
    # each transport reaches its own fraction of the link rate (per-peer wire factor) and
    # pays its own CPU per message and per byte (a hybrid step's ring and RPCs each
    # their own); the floor's points pin compute, so every peer's
    # overhead is recovered, not just the differences between them
    truth = sim.Constants(gamma=1.5e-9, wire_factor=1.0,
                          compute_per_example={"sparse": 6e-5, "dense": 6e-4},
                          peers={"a": sim.PeerConstants(overhead_s=2e-3, kappa=1.7e-9, wire_factor=1.2,
                                                        message_s=0.7e-3),
                                 "b": sim.PeerConstants(overhead_s=1e-3, rpc_kappa=0.3e-9, wire_factor=1.9,
                                                        rpc_s=1.3e-3),
                                 "c": sim.PeerConstants(overhead_s=5e-3, kappa=0.8e-9, rpc_kappa=0.2e-9,
                                                        wire_factor=1.05, message_s=0.2e-3, rpc_s=0.9e-3)})
    points = _synthetic_points(truth, {"a": "allreduce", "b": "ps", "c": "hybrid", "floor": "none"})
    got = sim.fit(points)
    assert got.alpha == 0.0
    assert got.gamma == pytest.approx(truth.gamma, rel=1e-6)
    assert got.wire_factor == 1.0
    for w, v in truth.compute_per_example.items():
        assert got.compute_per_example[w] == pytest.approx(v, rel=1e-6)
    assert "floor" not in got.peers
    for p, c in truth.peers.items():
        assert got.peers[p].overhead_s == pytest.approx(c.overhead_s, rel=1e-6)
        assert got.peers[p].kappa == pytest.approx(c.kappa, rel=1e-6, abs=1e-18)
        assert got.peers[p].rpc_kappa == pytest.approx(c.rpc_kappa, rel=1e-6, abs=1e-18)
        assert got.peers[p].wire_factor == pytest.approx(c.wire_factor, rel=1e-6)
        assert got.peers[p].message_s == pytest.approx(c.message_s, rel=1e-6)
        assert got.peers[p].rpc_s == pytest.approx(c.rpc_s, rel=1e-6)
    assert max(abs(r["error"]) for r in sim.errors(points, got)) < 1e-6


def test_fit_recovers_a_slower_session_and_the_constants():
    # a second run of the same configurations (fewer points, link-rate-bound ones too) on a
    # session whose cores are 1.4x slower: its CPU terms scale, its wire time does not
    truth = sim.Constants(compute_per_example={"sparse": 6e-5, "dense": 6e-4},
                          peers={"a": sim.PeerConstants(overhead_s=2e-3, kappa=1.7e-9, wire_factor=1.2,
                                                        message_s=0.7e-3),
                                 "b": sim.PeerConstants(overhead_s=1e-3, kappa=0.3e-9, wire_factor=1.9,
                                                        rpc_s=1.3e-3)})
    methods = {"a": "allreduce", "b": "ps", "floor": "none"}
    ref = _synthetic_points(truth, methods)
    slow = [sim.Point("slow", p.workload, sim.replace(p.cluster, cpu_speed=1.4), p.peer, p.method,
                      sim.step_time(p.method, p.workload, sim.replace(p.cluster, cpu_speed=1.4), truth,
                                    p.peer)["step_s"])
            for p in ref if p.workload.name == "sparse"]
    slow = [sim.replace(p, cluster=sim.replace(p.cluster, cpu_speed=1.0)) for p in slow]   # as measured
    got = sim.fit(ref + slow)
    assert got.run_cpu_speed == pytest.approx({"synthetic": 1.0, "slow": 1.4}, rel=1e-4)
    assert got.compute_per_example["dense"] == pytest.approx(6e-4, rel=1e-4)
    assert got.peers["b"].rpc_s == pytest.approx(1.3e-3, rel=1e-4)
    assert max(abs(r["error"]) for r in sim.errors(ref + slow, got)) < 1e-4
    # one speed for every run would leave the slow run's CPU-heavy points off
    assert max(abs(r["error"]) for r in sim.errors(ref + slow, sim._fit_constants(ref + slow))) > 0.02


def test_fit_recovers_the_share_of_measured_timeouts_on_the_critical_path():
    truth = sim.Constants(compute_per_example={"sparse": 6e-5, "dense": 6e-4}, timeout_share=0.3,
                          peers={"a": sim.PeerConstants(overhead_s=2e-3, kappa=1.7e-9, wire_factor=1.2,
                                                        message_s=0.7e-3),
                                 "b": sim.PeerConstants(overhead_s=1e-3, kappa=0.3e-9, wire_factor=1.9,
                                                        rpc_s=1.3e-3)})
    points = []
    for p in _synthetic_points(truth, {"a": "allreduce", "b": "ps", "floor": "none"}):
        if p.method == "ps" and p.cluster.workers == 8:     # the emulator's queues overflow at N = 8
            cl = sim.replace(p.cluster, timeouts_per_step=4.0 if p.workload.name == "dense" else 1.5)
            p = sim.replace(p, cluster=cl, step_s=sim.step_time(p.method, p.workload, cl, truth, p.peer)["step_s"])
        points.append(p)
    got = sim.fit(points)
    assert got.timeout_share == pytest.approx(0.3, rel=1e-6)
    assert got.peers["b"].wire_factor == pytest.approx(1.9, rel=1e-6)
    assert max(abs(r["error"]) for r in sim.errors(points, got)) < 1e-6
    # a projection has no timeouts: the term is 0 there
    assert sim.step_time("ps", points[0].workload, sim.Cluster(16, servers=16), got, "b")["parts"]["timeouts"] == 0


def test_a_two_rank_allgather_paid_twice_only_at_n_2_and_only_for_the_peers_that_do():
    # Horovod/Gloo's all-gather of rows runs its two directions one after the other in some
    # steps at N = 2 (bench/README.md, "Horovod at N = 2"): the share is fitted for it alone
    k = sim.Constants(peers={"horovod": sim.PeerConstants(wire_factor=1.2, pair_serialised=0.5),
                             "a": sim.PeerConstants(wire_factor=1.2)})
    wl = sparse_only(102_400, 1024.0, 1000.0)
    two = sim.step_time("allreduce", wl, sim.Cluster(2, link_gbit=1.0), k, "horovod")["parts"]
    # one worker's 1000 rows of 1 KiB cross the link once, and half of the time once more
    assert two["wire"] == pytest.approx(1000 * 1024.0 * BETA_1G * 1.2)
    assert two["serialised"] == pytest.approx(0.5 * two["wire"])
    assert sim.step_time("allreduce", wl, sim.Cluster(4, link_gbit=1.0), k, "horovod")["parts"]["serialised"] == 0
    assert sim.step_time("allreduce", wl, sim.Cluster(2, link_gbit=1.0), k, "a")["parts"]["serialised"] == 0
    assert sim.step_time("allreduce", dense(MB), sim.Cluster(2, link_gbit=1.0), k, "horovod")["parts"][
        "serialised"] == 0          # a ring all-reduce's buffers are not affected

    truth = sim.Constants(compute_per_example={"sparse": 6e-5, "dense": 6e-4},
                          peers={"horovod": sim.PeerConstants(overhead_s=2e-3, kappa=0.4e-9, wire_factor=1.1,
                                                              message_s=0.3e-3, pair_serialised=0.6),
                                 "a": sim.PeerConstants(overhead_s=1e-3, kappa=1.7e-9, wire_factor=1.2,
                                                        message_s=0.7e-3)})
    points = _synthetic_points(truth, {"horovod": "allreduce", "a": "allreduce", "floor": "none"})
    got = sim.fit(points)
    assert got.peers["horovod"].pair_serialised == pytest.approx(0.6, rel=1e-6)
    assert got.peers["horovod"].wire_factor == pytest.approx(1.1, rel=1e-6)
    assert got.peers["a"].pair_serialised == 0.0
    assert max(abs(r["error"]) for r in sim.errors(points, got)) < 1e-6


def test_fit_without_floor_points_puts_the_common_overhead_into_compute():
    # a per-step overhead every peer shares is indistinguishable from compute per
    # example: without a floor, the leanest peer's overhead is 0 and the predictions hold
    truth = sim.Constants(compute_per_example={"sparse": 6e-5, "dense": 6e-4},
                          peers={"a": sim.PeerConstants(overhead_s=2e-3, kappa=1.7e-9, wire_factor=1.2),
                                 "b": sim.PeerConstants(overhead_s=3e-3, kappa=0.3e-9, wire_factor=1.9)})
    points = _synthetic_points(truth, {"a": "allreduce", "b": "ps"})
    got = sim.fit(points)
    assert got.peers["a"].overhead_s == pytest.approx(0.0, abs=1e-9)
    assert got.peers["b"].overhead_s == pytest.approx(1e-3, rel=1e-6)
    assert got.compute_per_example["dense"] == pytest.approx(6e-4 + 2e-3 / 32, rel=1e-6)
    assert max(abs(r["error"]) for r in sim.errors(points, got)) < 1e-6


def test_messages_per_step_a_ring_step_or_an_rpc_each():
    cl = sim.Cluster(8, servers=4, link_gbit=1.0)
    ring = cost.ring_allreduce(MB, 8, 8)
    assert (ring.proc_msgs, ring.total_msgs) == (14, 8 * 14)
    gather = cost.ring_allgather(MB, 8, 8)
    assert (gather.proc_msgs, gather.total_msgs) == (7, 8 * 7)
    push, pull = cost.parameter_server(MB, MB, cl, local_aggregation=False)
    # a push and a pull RPC from each of 8 workers to each of 4 servers; a server serves 16
    assert (push.proc_msgs, push.total_msgs) == (16, 2 * 8 * 4)
    assert pull.total_msgs == 0 and push.rpc and pull.rpc and not ring.rpc and not gather.rpc
    # dense and sparse variables of a PS step share its RPCs
    wl = sim.Workload("h", 20 * MB, 100_000, 1024.0, 1000.0)
    assert sum(p["total_msgs"] for p in sim.step_time("ps", wl, cl, sim.Constants())["phases"]) == 64
    k = sim.Constants(peers={"p": sim.PeerConstants(message_s=5.0, rpc_s=1e-3)})
    r = sim.step_time("ps", wl, sim.Cluster(8, servers=4, link_gbit=1.0, cores=2), k, "p")
    assert r["parts"]["messages"] == pytest.approx(64 * 1e-3 / 2)
    # a hybrid step pays its ring steps at the ring's cost and its RPCs at theirs
    k = sim.Constants(peers={"p": sim.PeerConstants(message_s=2e-3, rpc_s=1e-3)})
    r = sim.step_time("hybrid", wl, sim.Cluster(8, servers=4, link_gbit=1.0, cores=2), k, "p")
    assert r["parts"]["messages"] == pytest.approx((8 * 14 * 2e-3 + 2 * 8 * 4 * 1e-3) / 2)


def test_aggregation_groups_cut_the_servers_rpcs_and_pay_the_groups_gathers():
    """Config(aggregation_group=g): a server serves a push and a pull of each
    of N/g groups; the first worker of a group pulls and pushes the union of
    its rows (a server per partition: it sends to S servers) and sends each
    member its own rows in one all-to-all (g - 1 blocks of a member's rows,
    padded to the ladder, each way on every member's link); every member
    takes part in two variable-size gathers (three ring all-gathers of g - 1
    steps) over links."""
    rows, width, touched = 1_000_000, 1024.0, 1000.0    # the union is ~g times the rows
    wl = sparse_only(rows, width, touched)
    n, g, s = 16, 4, 2
    cl = sim.Cluster(n, servers=s, link_gbit=1.0, aggregation_group=g)
    ph = {p["name"]: p for p in sim.step_time("hybrid", wl, cl, sim.Constants())["phases"]}
    assert set(ph) == {"ps-sparse-push", "ps-sparse-pull", "group-ids", "group-rows",
                       "group-push"}
    assert ph["ps-sparse-push"]["proc_msgs"] == 2 * n // g            # 4 groups > 2 servers
    assert ph["ps-sparse-push"]["total_msgs"] == 2 * (n // g) * s
    union = cost.union_rows(rows, touched, g) * width
    assert union == pytest.approx(g * touched * width, rel=0.01)
    # the group's first worker's link carries its union each way; each server
    # receives (n / g) unions / s
    assert ph["ps-sparse-push"]["link_bytes"] == pytest.approx((n // g) * union / s)
    # the scatter: g - 1 blocks of one member's rows, not the union, on each link
    blocks = (g - 1) * touched * width * cost.LADDER_PADDING
    assert ph["group-rows"]["link_bytes"] == pytest.approx(blocks) and blocks < union
    assert (ph["group-rows"]["hops"], ph["group-rows"]["proc_msgs"],
            ph["group-rows"]["total_msgs"]) == (1, g - 1, n * (g - 1))
    assert ph["group-rows"]["total_bytes"] == pytest.approx(n * blocks)
    assert ph["group-push"]["link_bytes"] == pytest.approx((g - 1) * touched * width)
    assert ph["group-ids"]["link_bytes"] == pytest.approx((g - 1) * 16 * touched)
    for name in ("group-ids", "group-push"):    # the counts' gather, then values and indices
        assert (ph[name]["hops"], ph[name]["proc_msgs"]) == (2 * (g - 1), 3 * (g - 1))
        assert ph[name]["total_msgs"] == 3 * n * (g - 1) and not ph[name]["rpc"]
    # groups of one are no groups
    assert (sim.step_time("hybrid", wl, sim.Cluster(n, servers=s, aggregation_group=1),
                          sim.Constants())["phases"]
            == sim.step_time("hybrid", wl, sim.Cluster(n, servers=s), sim.Constants())["phases"])


def test_the_projected_hybrid_runs_its_planners_structure_and_flat_beside_it():
    wl = sim.Workload("s", 1e6, 200_000, 1024.0, 1000.0, examples=100, compute_s=0.01)
    k = sim.Constants(peers={cost.PLANNER_PEER: sim.PeerConstants(message_s=2e-4, rpc_s=1e-3)})
    rows = sim.project_bench({"s": wl}, k, 1.0, ns=(64,), peers=(cost.PLANNER_PEER,))
    by_peer = {r["peer"]: r for r in rows}
    chosen, flat = by_peer[cost.PLANNER_PEER], by_peer[sim.FLAT_LABEL]
    cl = sim.Cluster(64, 1, 64, False, 1.0, None)
    assert flat["step_s"] == sim.step_time("hybrid", wl, cl, k, cost.PLANNER_PEER)["step_s"]
    structure = cost.best_structure(wl, cl, k)
    assert (chosen["aggregation_group"], chosen["servers"]) == (structure.group, structure.servers)
    assert chosen["aggregation_group"] > 1 and chosen["servers"] < 64
    assert chosen["throughput"] >= cost.MIN_GAIN * flat["throughput"] * 0.99


def test_points_from_the_committed_full_run():
    path = Path(sim.RESULTS) / "full.json"
    res = json.loads(path.read_text())
    pts = sim.points_from_results(res, "full")
    timed = [p for p in res["points"] if p["status"] in ("ok", "wrong-loss")]
    # autopar-ps's points of this run measured a server path since changed
    modelled = [p for p in timed if p["peer"] not in ("autopar-herring", "autopar-ps")]
    assert len(pts) == len(modelled)
    assert {p.cluster.workers for p in pts} == {2, 4, 8}
    assert all(p.cluster.server_imbalance >= 1.0 for p in pts)
    # the most loaded server over the mean, from the run's byte counts
    for rec, pt in zip(modelled, pts):
        srv = rec["bytes_per_step"].get("server") or {}
        if pt.method in ("ps", "hybrid") and srv.get("recv"):
            assert pt.cluster.server_imbalance == pytest.approx(max(1.0, srv["recv_max"] / srv["recv"]))
    # the floor's step is the slowest worker's mean (its workers do not wait for each other)
    floors = [(rec, pt) for rec, pt in zip(modelled, pts) if pt.method == "none"]
    assert floors and all(pt.step_s == rec["compute_floor_s"] for rec, pt in floors)


def test_points_of_a_server_path_since_changed_are_left_out():
    """A run of a commit before SUPERSEDED_BEFORE's for a peer measured what
    that commit changed: the fit leaves the peer's points out, and only
    those."""
    res = json.loads((Path(sim.RESULTS) / "full.json").read_text())
    since = sim.SUPERSEDED_BEFORE["autopar-ps"]
    peers = {p["peer"] for p in res["points"] if p["status"] in ("ok", "wrong-loss")}
    old = {p.peer for p in sim.points_from_results(res, "full")}
    new = {p.peer for p in sim.points_from_results(
        dict(res, git=dict(res["git"], commit=since)), "full")}
    assert "autopar-ps" in peers and "autopar-ps" not in old
    assert new - old == {"autopar-ps"}


def test_unmodelled_peers_are_left_out_of_fits_and_projections():
    # Herring has no phases here: its points in a results file are skipped. The floor's
    # are fitted (they pin compute) but, aggregating nothing, it is not projected.
    res = json.loads((Path(sim.RESULTS) / "full.json").read_text())
    timed = [p for p in res["points"] if p["status"] in ("ok", "wrong-loss")
             and p["peer"] not in ("autopar-herring", "autopar-ps")]   # autopar-ps: superseded
    # The timeline variant is autopar-hybrid measured with tracing on: not a system of its own.
    hybrid = next(p for p in timed if p["peer"] == "autopar-hybrid")
    extra = [dict(timed[0], peer="autopar-herring"), dict(hybrid, peer="autopar-hybrid-timeline")]
    pts = sim.points_from_results(dict(res, points=timed + extra), "full")
    assert len(pts) == len(timed)
    assert "autopar-herring" not in sim.MODELLED_PEERS and "floor" not in sim.MODELLED_PEERS
    assert "autopar-hybrid-timeline" not in sim.MODELLED_PEERS
    assert "autopar-hybrid" in sim.MODELLED_PEERS
    wls = {"d": dense(100 * MB)}
    rows = sim.project_bench(wls, sim.Constants(alpha=1e-4), 1.0, ns=(16,))
    assert {r["peer"] for r in rows} == set(sim.MODELLED_PEERS)
    assert all(r["step_s"] > 0 for r in rows)


def test_parallax_transport_calibration_reproduces_table1_lm():
    kp, cal = sim.parallax_variant("slow-rows")
    wl, cl = sim.parallax_workload("LM"), sim.parallax_cluster(48)
    assert sim.step_time("ps", wl, cl, kp)["throughput"] == pytest.approx(101.2e3, rel=1e-6)
    assert sim.step_time("allreduce", wl, cl, kp)["throughput"] == pytest.approx(39.0e3, rel=1e-6)
    assert cal["grpc_factor"] > 1 and cal["allgather_factor"] > 1


def test_the_projected_default_is_what_the_planner_chooses_for_the_bench_graph():
    """The committed projection's autopar-hybrid row (the sparse LM) runs,
    at every N, the structure make_plan chooses for the bench's own graph on
    N hosts of one worker and one server each at the projection's link
    speed: a user's default, not a hand-set one."""
    from bench import models
    from bench.peers import graph_model
    from autopar.transforms.analysis import analyze_graph
    from autopar.transforms.plan import PlanOptions, make_plan
    from autopar.transforms.topology import Topology
    out = json.loads((Path(sim.RESULTS) / "simulate.json").read_text())
    rows = [r for r in out["bench_projection"]
            if r["peer"] == cost.PLANNER_PEER and r["workload"] == "sparse"]
    assert [r["N"] for r in rows] == [16, 32, 64, 128, 256, 512]
    analysis = analyze_graph(graph_model.build(models.get("sparse")).graph)
    chosen = []
    for r in rows:
        n = r["N"]
        topology = Topology(tuple(f"10.{i // 250}.{i % 250}.1" for i in range(n)), n,
                            link_gbps=out["bench_projection_link_gbit"])
        plan = make_plan(analysis, topology, options=PlanOptions(run_option="hybrid"))
        assert (plan.aggregation_group or 1, plan.sparse_servers or n) == (
            r["aggregation_group"], r["servers"]), n
        chosen.append(plan.aggregation_group)
    assert chosen[0] == 0 and chosen[-1] > 1    # flat at 16, groups at 512
