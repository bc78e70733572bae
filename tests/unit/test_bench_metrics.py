"""The benchmark harness's arithmetic: Parallax Table 3 bytes, Herring's
communication lower bound, counter deltas, the loss-tolerance check."""
import math
import os
import time
from pathlib import Path

import pytest

from bench import metrics, models


def test_ring_allreduce_moves_2_n_minus_1_over_n():
    assert metrics.ring_allreduce_bytes(100.0, 1) == 0.0
    assert metrics.ring_allreduce_bytes(100.0, 2) == pytest.approx(100.0)
    assert metrics.ring_allreduce_bytes(100.0, 4) == pytest.approx(150.0)
    # Herring §IV-A's example: 100 MB over 64 nodes moves 196.875 MB per node
    assert metrics.ring_allreduce_bytes(100.0, 64) == pytest.approx(196.875)


def test_allgather_moves_n_minus_1_times_the_rows():
    assert metrics.allgather_bytes(10.0, 1) == 0.0
    assert metrics.allgather_bytes(10.0, 4) == pytest.approx(30.0)


def test_required_traffic_allreduce_dense_and_sparse():
    t = metrics.required_traffic("allreduce", dense_bytes=1000, sparse_touched_bytes=10, num_workers=4)
    assert t.worker_send == t.worker_recv == pytest.approx(2 * 3 / 4 * 1000 + 3 * 10)
    assert t.server_send == t.server_recv == 0
    assert t.hops == 2 * 3 + 3


def test_required_traffic_ps_is_table3_2b_split_by_direction():
    t = metrics.required_traffic("ps", dense_bytes=1000, sparse_touched_bytes=10, num_workers=4, num_servers=2)
    # Table 3: 2b + 2ab per worker in total, half each way
    assert t.worker_send + t.worker_recv == pytest.approx(2 * 1000 + 2 * 10)
    assert t.worker_send == pytest.approx(1010)
    # every worker's push lands on the servers, spread evenly
    assert t.server_recv == pytest.approx(4 * 1010 / 2)
    assert t.server_send == pytest.approx(4 * 1010 / 2)
    assert t.hops == 2


def test_required_traffic_hybrid_splits_dense_and_sparse():
    t = metrics.required_traffic("hybrid", dense_bytes=1000, sparse_touched_bytes=10, num_workers=4, num_servers=4)
    assert t.worker_send == pytest.approx(1500 + 10)
    assert t.server_send == pytest.approx(4 * 10 / 4)


def test_required_traffic_rejects_ps_without_servers_and_unknown_methods():
    with pytest.raises(ValueError):
        metrics.required_traffic("ps", 1, 1, 2, 0)
    with pytest.raises(ValueError):
        metrics.required_traffic("gossip", 1, 1, 2, 1)


def test_the_step_order_puts_the_pull_from_servers_before_every_send():
    # 100 Mbit/s: 12.5 bytes per microsecond, so 1.25 MB take 100 ms
    mb = 1.25e6
    # ps: every byte is pulled before the forward pass and pushed after it, so
    # the order needs twice the limit (both directions busy all the step)
    ps = metrics.required_traffic("ps", dense_bytes=0.8 * mb, sparse_touched_bytes=0.2 * mb,
                                  num_workers=4, num_servers=4)
    assert ps.worker_pull == pytest.approx(mb) and ps.server_pull == pytest.approx(mb)
    assert metrics.limit_seconds(ps, 100.0) == pytest.approx(0.1)
    assert metrics.order_limit_seconds(ps, 100.0) == pytest.approx(0.2)
    assert metrics.order_limit_seconds(ps, 100.0, floor_s=0.01) == pytest.approx(0.21)
    # hybrid: only the rows (20 ms) are pulled; the ring's 1.5 MB (N = 4: 150
    # ms) and the rows' push follow the compute, the ring's receives beside them
    hybrid = metrics.required_traffic("hybrid", dense_bytes=mb, sparse_touched_bytes=0.2 * mb,
                                      num_workers=4, num_servers=4)
    assert hybrid.worker_pull == pytest.approx(0.2 * mb)
    assert metrics.limit_seconds(hybrid, 100.0) == pytest.approx(0.17)
    assert metrics.order_limit_seconds(hybrid, 100.0) == pytest.approx(0.02 + 0.17)
    # herring: the dense buffers (100 ms each way) go out and come back after
    # the backward pass, with the rows' push
    herring = metrics.required_traffic("herring", dense_bytes=mb, sparse_touched_bytes=0.2 * mb,
                                       num_workers=4, num_servers=4)
    assert herring.worker_pull == pytest.approx(0.2 * mb)
    assert metrics.limit_seconds(herring, 100.0) == pytest.approx(0.12)
    assert metrics.order_limit_seconds(herring, 100.0) == pytest.approx(0.02 + 0.12)
    # nothing on servers: the order costs nothing beyond the limit
    ring = metrics.required_traffic("allreduce", mb, 0.0, 4)
    assert ring.worker_pull == 0.0
    assert metrics.order_limit_seconds(ring, 100.0) == pytest.approx(metrics.limit_seconds(ring, 100.0))


def test_apply_floor_gives_the_share_of_the_limit_the_order_allows():
    t = metrics.required_traffic("ps", 0.8e6, 0.2e6, 2, 2)       # 80 ms a direction at 100 Mbit/s
    point = metrics.apply_floor({"comm_limit_s": metrics.limit_seconds(t, 100.0), "step_s": 0.4,
                                 "table3": t.to_dict(), "link_mbit": 100.0}, 0.04)
    assert point["order_limit_s"] == pytest.approx(0.2)
    assert point["order_allows"] == pytest.approx(0.4)
    assert point["fraction_of_limit"] == pytest.approx(0.2)
    # older results carry no pull figures: no order figures either
    old = {k: v for k, v in t.to_dict().items() if not k.endswith("_pull")}
    point = metrics.apply_floor({"comm_limit_s": 0.08, "step_s": 0.4, "table3": old,
                                 "link_mbit": 100.0}, 0.04)
    assert "order_allows" not in point


def test_limit_is_most_loaded_link_direction_at_link_rate_plus_hops():
    t = metrics.Traffic("ps", worker_send=125e6, worker_recv=125e6, server_send=250e6, server_recv=10, hops=2)
    # 250 MB at 1 Gbit/s = 2 s; plus two hops of 1 ms
    assert metrics.limit_seconds(t, rate_mbit=1000.0) == pytest.approx(2.0)
    assert metrics.limit_seconds(t, rate_mbit=1000.0, latency_s=1e-3) == pytest.approx(2.002)
    assert metrics.limit_seconds(t, rate_mbit=100.0) == pytest.approx(20.0)


def test_herring_allreduce_limit_for_100mb():
    # 100 MB ring all-reduce on 4 workers at 1 Gbit/s: 150 MB each way -> 1.2 s
    t = metrics.required_traffic("allreduce", 100e6, 0, 4)
    assert metrics.limit_seconds(t, 1000.0) == pytest.approx(1.2)


def test_required_traffic_herring_is_table_iii():
    # Herring Table III: a worker pushes b and pulls b; each of S servers
    # receives a b/S shard from each of C contributors and returns the sum to each.
    t = metrics.required_traffic("herring", dense_bytes=1000, sparse_touched_bytes=0, num_workers=4,
                                 num_servers=4)
    assert (t.worker_send, t.worker_recv) == (1000, 1000)
    assert (t.server_send, t.server_recv) == (1000, 1000)
    assert t.hops == 2
    # Fewer servers than contributors: the servers' links carry more than a worker's.
    t = metrics.required_traffic("herring", 1000, 0, num_workers=8, num_servers=2)
    assert (t.worker_send, t.server_recv, t.server_send) == (1000, 4000, 4000)
    # Contributors are hosts when a host's workers sum first.
    t = metrics.required_traffic("herring", 1000, 0, num_workers=8, num_servers=2, contributors=4)
    assert (t.worker_send, t.server_recv) == (1000, 2000)
    # Sparse rows go to the parameter servers as with hybrid: ab per worker, N*ab/S per server.
    t = metrics.required_traffic("herring", 1000, 10, num_workers=4, num_servers=2)
    assert (t.worker_send, t.server_send) == (1010, (4 * 1000 + 4 * 10) / 2)
    with pytest.raises(ValueError):
        metrics.required_traffic("herring", 1000, 0, 4, 0)


def test_herring_bytes_per_server_do_not_grow_with_n_at_servers_equal_hosts():
    # Issue 10's acceptance: fixed servers per worker (S = N) keeps a server's bytes constant.
    g = 100 * 2**20
    per_server = [metrics.required_traffic("herring", g, 0, n, n).server_recv for n in (2, 4, 8)]
    assert per_server == [g, g, g]


def test_herring_limit_is_half_the_ring_limit_for_large_n():
    # 100 MB at 1 Gbit/s: the ring's busiest link carries 2(N-1)/N * b, herring's b (S = N).
    for n, ring_s in ((2, 0.8), (4, 1.2), (8, 1.4)):
        ring = metrics.limit_seconds(metrics.required_traffic("allreduce", 100e6, 0, n), 1000.0)
        herring = metrics.limit_seconds(metrics.required_traffic("herring", 100e6, 0, n, n), 1000.0)
        assert ring == pytest.approx(ring_s)
        assert herring == pytest.approx(0.8)
    # S < N: the server links bind (8 contributors on 2 servers: 4b each).
    t = metrics.required_traffic("herring", 100e6, 0, 8, 2)
    assert metrics.limit_seconds(t, 1000.0, latency_s=1e-3) == pytest.approx(3.2 + 2e-3)


def test_fraction_of_limit():
    assert metrics.fraction_of_limit(0.5, 1.0) == pytest.approx(0.5)
    assert metrics.fraction_of_limit(0.5, 0) is None
    assert metrics.fraction_of_limit(0.5, None) is None


def test_bus_bandwidth_equals_link_rate_when_ring_runs_at_rate():
    g, n = 100e6, 4
    t = metrics.limit_seconds(metrics.required_traffic("allreduce", g, 0, n), 1000.0)
    assert metrics.bus_bandwidth(g, n, t) * 8 == pytest.approx(1e9)
    assert math.isnan(metrics.bus_bandwidth(g, n, 0))


def test_counter_delta_and_bytes_per_step():
    before = {0: (100, 200), 1: (1000, 2000), 2: (0, 0)}
    after = {0: (1100, 2200), 1: (3000, 6000), 2: (500, 50)}
    delta = metrics.counter_delta(before, after)
    assert delta == {0: (1000, 2000), 1: (2000, 4000), 2: (500, 50)}
    per = metrics.bytes_per_step(delta, [0, 1], steps=10)
    assert per["recv"] == pytest.approx(150.0)
    assert per["send"] == pytest.approx(300.0)
    assert per["send_max"] == pytest.approx(400.0) and per["send_min"] == pytest.approx(200.0)
    assert per["per_host"]["1"] == {"recv": 200.0, "send": 400.0}
    assert metrics.bytes_per_step(delta, [], 10)["send"] == 0.0
    with pytest.raises(ValueError):
        metrics.bytes_per_step(delta, [0], 0)


def test_counter_delta_rejects_counters_going_backwards():
    with pytest.raises(ValueError):
        metrics.counter_delta({0: (10, 10)}, {0: (5, 20)})


def test_idle_rate():
    delta = {0: (100, 100), 1: (300, 100)}
    assert metrics.idle_rate(delta, [0, 1], 2.0) == pytest.approx(150.0)
    assert metrics.idle_rate(delta, [0, 1], 0) == 0.0


def test_loss_check_tolerance():
    ref = 5.0
    tol = metrics.LOSS_ATOL + metrics.LOSS_RTOL * ref
    assert metrics.check_loss(ref, ref).ok
    assert metrics.check_loss(ref + 0.9 * tol, ref).ok
    bad = metrics.check_loss(ref + 1.1 * tol, ref)
    assert not bad.ok and "differs from the reference" in bad.reason
    assert bad.tolerance == pytest.approx(tol)
    assert not metrics.check_loss(float("nan"), ref).ok
    assert not metrics.check_loss(None, ref).ok
    assert not metrics.check_loss(ref, None).ok


def test_tolerance_catches_a_worker_that_never_communicates():
    # Losses the sparse workload reaches after 13 steps on 2 workers: the
    # single-device reference and a worker that trains on its own data only.
    reference, local_only = 5.322913, 5.359263
    assert not metrics.check_loss(local_only, reference).ok
    # The 204800-word LM after the quick run's 7 steps on 4 workers: the
    # closest pair seen (3e-5 relative); still outside the tolerance.
    reference, local_only = 6.221354, 6.221543
    assert not metrics.check_loss(local_only, reference).ok
    assert metrics.loss_check_margin(reference, local_only) > 2


def test_tolerance_accepts_framework_summation_differences():
    # the largest difference between a framework and the reference seen in
    # the 1 Gbit/s runs (every peer, workload and N): 2.3e-7 relative
    reference = 0.031910
    assert metrics.check_loss(reference * (1 + 2.3e-7), reference).ok
    assert metrics.check_loss(6.2 * (1 + 2.3e-7), 6.2).ok
    assert metrics.loss_check_margin(6.2, 6.2 * (1 + 2.3e-7)) < 0.05


def test_loss_check_margin():
    tol = metrics.LOSS_ATOL + metrics.LOSS_RTOL * 5.0
    assert metrics.loss_check_margin(5.0, 5.0 + 3 * tol) == pytest.approx(3.0)
    assert metrics.loss_check_margin(5.0, None) is None
    assert metrics.loss_check_margin(float("nan"), 5.0) is None


def test_relative_difference_and_median():
    assert metrics.relative_difference(110, 100) == pytest.approx(0.1)
    assert metrics.relative_difference(1, 0) is None
    assert metrics.median([3, 1, 2]) == 2
    assert metrics.median([4, 1, 2, 3]) == 2.5
    assert metrics.median([]) is None


def test_every_peer_has_a_method():
    from bench import run
    for peer in run.PEERS:
        assert peer.method in ("allreduce", "ps", "hybrid", "herring", "none")
    floor = next(p for p in run.PEERS if p.name == "floor")
    assert floor.method == "none" and not floor.servers


def test_the_floor_moves_no_bytes():
    t = metrics.required_traffic("none", dense_bytes=1000, sparse_touched_bytes=10, num_workers=8)
    assert t.max_link_bytes() == 0 and t.hops == 0
    assert metrics.limit_seconds(t, 100.0, latency_s=1e-3) == 0.0


def test_limit_is_the_larger_of_compute_floor_and_communication():
    assert metrics.limit_with_floor(0.2, 0.05) == (0.2, "comm")
    assert metrics.limit_with_floor(0.02, 0.05) == (0.05, "compute")
    assert metrics.limit_with_floor(0.02, None) == (0.02, "comm")     # no floor measured
    assert metrics.limit_with_floor(0.02, 0.0) == (0.02, "comm")
    assert metrics.limit_with_floor(None, 0.05) == (None, None)


def test_apply_floor_fills_limit_binding_and_fraction():
    p = metrics.apply_floor({"comm_limit_s": 0.1, "step_s": 0.4}, 0.3)
    assert p["limit_s"] == pytest.approx(0.3) and p["binding"] == "compute"
    assert p["compute_floor_s"] == 0.3
    assert p["fraction_of_limit"] == pytest.approx(0.75)
    assert p["comm_to_compute"] == pytest.approx(1 / 3)
    q = metrics.apply_floor({"comm_limit_s": 0.5, "step_s": 1.0}, 0.1)
    assert q["limit_s"] == pytest.approx(0.5) and q["binding"] == "comm"
    assert q["fraction_of_limit"] == pytest.approx(0.5) and q["comm_to_compute"] == pytest.approx(5.0)
    r = metrics.apply_floor({"comm_limit_s": 0.5, "step_s": 1.0}, None)
    assert r["limit_s"] == pytest.approx(0.5) and r["comm_to_compute"] is None


def test_floor_step_is_the_slowest_worker():
    assert metrics.floor_step_seconds([0.04, 0.05, 0.045]) == pytest.approx(0.05)
    assert metrics.floor_step_seconds([]) is None
    assert metrics.floor_step_seconds([0.0]) is None


def test_touched_fraction_counts_distinct_rows_and_sent_rows():
    import numpy as np
    f = metrics.touched_fraction(np.array([[1, 2, 2], [3, 1, 7]]), vocab=100)
    assert f["unique"] == pytest.approx(4 / 100)     # rows 1, 2, 3, 7
    assert f["sent"] == pytest.approx(6 / 100)       # every id's row is in the gradient
    with pytest.raises(ValueError):
        metrics.touched_fraction(np.array([1]), 0)


def test_sparse_alpha_per_step_and_over_workers():
    import numpy as np
    w = models.get("sparse", vocab=5000)
    a = metrics.sparse_alpha(w, first_step=2, steps=3, num_workers=4)
    assert [p["step"] for p in a["per_step"]] == [2, 3, 4]
    step = a["per_step"][1]
    ids = [w.batch_for(3, k)["context"] for k in range(4)]
    assert step["worker_unique"] == pytest.approx(np.mean([len(np.unique(x)) / 5000 for x in ids]))
    assert step["global_unique"] == pytest.approx(len(np.unique(np.concatenate(ids))) / 5000)
    # the union of 4 workers' rows is more than one worker's, less than 4x (Zipf: shared hot rows)
    assert step["worker_unique"] < step["global_unique"] < 4 * step["worker_unique"]
    assert a["sent"] == pytest.approx(w.sparse_rows_per_step() / 5000)
    assert metrics.sparse_alpha(models.get("dense"), 0, 3, 2) is None


def test_sparse_lm_is_sized_like_parallax():
    """Parallax §7's LM: an 800K x 512 embedding of which a step touches a small
    fraction; ours keeps >= 200k words, >= 256 wide, Zipf ids, alpha < 1 %."""
    s = models.SPARSE
    assert s.params["vocab"] >= 200_000 and s.params["dim"] >= 256 and s.params["zipf_a"] > 1.0
    a = metrics.sparse_alpha(s, 0, 2, 8)
    assert 0 < a["worker_unique"] < a["sent"] < 0.01
    assert a["global_unique"] < 0.05


def test_at_the_quick_rate_communication_dominates_the_sparse_lm():
    """The quick benchmark's rate (bench/README.md, "Why 100 Mbit/s"): at N >= 4
    every method's bytes need >= 150 ms per step on the wire, several times
    the sparse LM's compute floor (tens of ms); at 1 Gbit/s they need < 80 ms."""
    from bench import run
    quick = run.parse_args(["--quick"])
    s = models.SPARSE
    for n in (4, 8):
        for method in ("allreduce", "ps", "hybrid"):
            t = metrics.required_traffic(method, s.dense_bytes, s.sparse_touched_bytes(), n,
                                         0 if method == "allreduce" else n)
            assert metrics.limit_seconds(t, quick.link_mbit[0]) >= 0.150, (method, n)
            assert metrics.limit_seconds(t, 1000.0) < 0.080, (method, n)


def test_workload_sizes_meet_the_spec():
    assert models.DENSE.dense_bytes >= 25 * models.MiB
    assert models.SPARSE.sparse_bytes >= 200 * models.MiB
    assert models.AVG.dense_bytes == 100 * models.MiB
    s = models.SPARSE
    assert s.sparse_touched_bytes() == s.batch * s.params["context"] * s.params["dim"] * 4


def test_workload_data_is_deterministic_and_global_batch_concatenates_workers():
    s = models.get("sparse", vocab=1000)
    a, b = s.batch_for(3, 1), s.batch_for(3, 1)
    assert all((a[k] == b[k]).all() for k in a)
    g = s.global_batch(3, 2)
    assert (g["context"][: s.batch] == s.batch_for(3, 0)["context"]).all()
    assert (g["context"][s.batch:] == s.batch_for(3, 1)["context"]).all()
    assert g["context"].max() < 1000 and g["context"].min() >= 0


def test_zipf_ids_are_skewed():
    import numpy as np
    ids = models.zipf_ids(np.random.default_rng(0), (20000,), 1000, 1.1)
    counts = np.bincount(ids, minlength=1000)
    assert counts[0] > counts[10] > counts[500]


def test_workload_round_trips_through_dict():
    w = models.get("avg", floats=1024)
    assert models.from_dict(models.to_dict(w)) == w
    with pytest.raises(ValueError):
        models.get("avg", bogus=1)


def test_sparse_bytes_moved_counts_distinct_rows_for_autopar_server_paths():
    alpha = {"worker_unique": 0.0025, "sent": 0.005}      # half the ids repeat
    assert metrics.sparse_bytes_moved("autopar-hybrid", 1000, alpha) == 500
    assert metrics.sparse_bytes_moved("autopar-ps", 1000, alpha) == 500
    assert metrics.sparse_bytes_moved("tf_ps", 1000, alpha) == 1000          # one row per id
    assert metrics.sparse_bytes_moved("autopar-allreduce", 1000, alpha) == 1000
    assert metrics.sparse_bytes_moved("autopar-hybrid", 1000, None) == 1000  # no embedding


def test_floor_runs_at_least_its_minimum_steps():
    from bench import run
    lo_warm, lo_steps = run.FLOOR_MIN_STEPS
    assert run.floor_steps(2, 5) == (lo_warm, lo_steps)
    assert run.floor_steps(lo_warm + 3, lo_steps + 40) == (lo_warm + 3, lo_steps + 40)


@pytest.mark.slow
def test_reference_gives_the_floor_its_own_step_count(tmp_path):
    """The floor trains floor_steps(...) steps, more than the other peers: the
    reference run's floor_local_only_loss must be the local-only loss after
    exactly that many steps (what a run with those counts calls local_only_loss)."""
    import sys
    from bench import run
    short = run.Settings(name="t", host_counts=[2], workloads=["avg"], peers=["floor"],
                         steps={"avg": (1, 2)}, avg_mib=0.25)
    as_floor = run.Settings(name="t", host_counts=[2], workloads=["avg"], peers=["floor"],
                            steps={"avg": run.floor_steps(1, 2)}, avg_mib=0.25)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = run.run_references(short, sys.executable, tmp_path / "a", timeout_s=120)["avg"][2]
    b = run.run_references(as_floor, sys.executable, tmp_path / "b", timeout_s=120)["avg"][2]
    assert a["floor_steps_trained"] == sum(run.floor_steps(1, 2)) == b["steps_trained"]
    assert a["floor_local_only_loss"] == b["local_only_loss"]
    assert a["floor_local_only_loss"] != a["local_only_loss"]      # more steps, another loss
    assert "floor_local_only_loss" not in b                        # same count: nothing extra


def test_loss_delta_sums_the_measured_window_over_hosts():
    before = {0: {"egress_drops": 5, "ingress_drops": 0, "retransmitted_segments": 10, "timeouts": 1},
              1: {"egress_drops": 0, "ingress_drops": 2, "retransmitted_segments": 0, "timeouts": 0}}
    after = {0: {"egress_drops": 7, "ingress_drops": 0, "retransmitted_segments": 14, "timeouts": 1},
             1: {"egress_drops": 0, "ingress_drops": 9, "retransmitted_segments": 6, "timeouts": 3}}
    d = metrics.loss_delta(before, after)
    assert d == {"egress_drops": 2, "ingress_drops": 7, "retransmitted_segments": 10, "timeouts": 3,
                 "most_timeouts_host": 1}


def test_proc_net_counters_reads_snmp_sections():
    from bench.cluster import _proc_net_counters
    text = Path("/proc/net/snmp").read_text() + Path("/proc/net/netstat").read_text()
    c = _proc_net_counters(text)
    assert ("Tcp", "RetransSegs") in c and ("TcpExt", "TCPTimeouts") in c
    assert all(isinstance(v, int) for v in c.values())


def test_cpu_probe_times_its_loop_and_scales_with_its_size():
    small = metrics.cpu_probe_ms(repeats=3, n=20_000)
    large = metrics.cpu_probe_ms(repeats=3, n=400_000)
    assert 0 < small < large       # 20x the work: longer on any machine, however loaded


def test_machine_busy_counts_the_cores_a_window_kept_busy():
    # the arithmetic: 150 of 200 ticks busy over 3 steps, 60 of them in user code
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    m = metrics.machine_busy((1000, 4000, 500), (1150, 4200, 560), 2.0, 3)
    assert m["busy_fraction"] == pytest.approx(0.75)
    assert m["cpu_ms_per_step"] == pytest.approx(150 * tick_ms / 3)
    assert m["kernel_ms_per_step"] == pytest.approx(90 * tick_ms / 3)
    # and the real counters: a thread spinning for 0.3 s adds at least some
    # busy ticks, never more than the ticks that passed
    before = metrics.machine_cpu()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    after = metrics.machine_cpu()
    assert 0 < after[0] - before[0] <= after[1] - before[1]
    assert 0 < after[2] - before[2] <= after[0] - before[0]   # the spin is user code


def test_cpu_by_role_sums_each_kind_of_process():
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    before = {"worker0": (10, 5), "worker1": (20, 5), "ps0": (7, 1), "gone0": (1, 1)}
    after = {"worker0": (40, 11), "worker1": (50, 5), "ps0": (10, 4), "late0": (3, 3)}
    roles = metrics.cpu_by_role(before, after, 3)
    assert set(roles) == {"worker", "ps"}           # a process in one snapshot only is left out
    assert roles["worker"]["processes"] == 2
    assert roles["worker"]["user_ms_per_step"] == pytest.approx(60 * tick_ms / 3)
    assert roles["worker"]["system_ms_per_step"] == pytest.approx(6 * tick_ms / 3)
    assert roles["ps"]["user_ms_per_step"] == pytest.approx(3 * tick_ms / 3)
    # and the real counters of this process: a spin adds user time
    mine = {"me0": os.getpid()}
    start = metrics.process_cpu(mine)
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    assert metrics.cpu_by_role(start, metrics.process_cpu(mine), 1)["me"]["user_ms_per_step"] > 0
    assert metrics.process_cpu({"nobody0": 2 ** 22 + 12345}) == {}


def test_link_occupancy_tells_one_direction_busy_from_both():
    rate = 8.0                      # Mbit/s: 1 MB/s, 100 kB per 0.1 s
    full, idle = 100_000, 1_000
    # (receive, send) per 0.1 s interval: 2 intervals sending only, 1 both,
    # 1 receiving only.
    steps = [(idle, full), (idle, full), (full, full), (full, idle)]
    samples, rx, tx = [(0.0, 0, 0)], 0, 0
    for i, (r, t) in enumerate(steps, start=1):
        rx, tx = rx + r, tx + t
        samples.append((0.1 * i, rx, tx))
    got = metrics.link_occupancy(samples, rate)
    assert got["seconds"] == pytest.approx(0.4)
    assert got["send_busy"] == pytest.approx(0.75)
    assert got["receive_busy"] == pytest.approx(0.5)
    assert got["both_busy"] == pytest.approx(0.25)
    assert got["send_utilisation"] == pytest.approx((3 * full + idle) / (4 * full))
    # Half the rate is still busy; less is not.
    half = [(0.0, 0, 0), (0.1, 0, full // 2), (0.2, 0, full // 2 + full // 2 - 1)]
    assert metrics.link_occupancy(half, rate)["send_busy"] == pytest.approx(0.5)
    assert metrics.link_occupancy([(0.0, 0, 0)], rate) is None


def test_autopar_config_reaches_the_autopar_peers_only(capsys):
    """--autopar-config: Config fields for every autopar peer (the partition
    sweep of bench/README.md), checked against autopar.Config's fields."""
    from bench import run
    s = run.parse_args(["--autopar-config", '{"partitions": {"embedding": 4}}'])
    assert s.autopar_config == {"partitions": {"embedding": 4}}
    for bad, said in (('{"partitionz": 1}', "not autopar.Config fields: ['partitionz']"),
                      ("[1]", "expected a JSON object"), ("{", "not JSON")):
        with pytest.raises(SystemExit):
            run.parse_args(["--autopar-config", bad])
        assert said in capsys.readouterr().err
    peers = {p.name: p for p in run.PEERS}
    assert {n for n, p in peers.items() if p.is_autopar} == {n for n in peers
                                                             if n.startswith("autopar-")}
    from bench.peers.autopar_peer import config_kwargs
    options = run.peer_options(peers["autopar-hybrid"], s, [], None)
    assert options["run_option"] == "hybrid"
    assert config_kwargs(options)["partitions"] == {"embedding": 4}
    assert "config" not in run.peer_options(peers["tf_ps"], s, [], None)
    assert "config" not in run.peer_options(peers["autopar-hybrid"], run.parse_args([]), [], None)
