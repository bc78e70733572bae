"""The planner's choice of how a hybrid job's workers meet the servers
(transforms.cost.best_structure): aggregation group size and servers used,
from the step model bench/simulate.py fits, and the constants it uses."""
import json
from pathlib import Path

import pytest

from autopar.transforms import cost

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
K = cost.Constants(gamma=5e-10, peers={cost.PLANNER_PEER: cost.PeerConstants(
    kappa=5e-10, message_s=2e-4, rpc_s=1e-3, wire_factor=1.1)})
LM = cost.Workload("lm", 1.3e6, 200_000, 1024.0, 1000.0, compute_s=0.0)


def _every_candidate(wl, cl, k, groups=cost.GROUP_SIZES):
    return {(g, s): cost.sync_seconds("hybrid", wl, cost.replace(cl, servers=s, aggregation_group=g),
                                      k, cost.PLANNER_PEER)
            for g in groups if g <= cl.workers for s in cost.server_counts(cl.num_servers)}


def test_server_counts_are_powers_of_two_and_all_of_them():
    assert cost.server_counts(8) == [1, 2, 4, 8]
    assert cost.server_counts(6) == [1, 2, 4, 6]
    assert cost.server_counts(1) == [1]


def test_where_a_servers_rpcs_bind_the_fastest_groups_and_servers_are_chosen():
    cl = cost.Cluster(256, 1, 256, False, 1.0, None)
    times = _every_candidate(LM, cl, K)
    best = cost.best_structure(LM, cl, K)
    assert best.step_s == min(times.values())
    assert times[(best.group, best.servers)] == best.step_s
    assert best.flat_step_s == times[(1, 256)]
    assert best.group > 1 and best.servers < 256 and best.gain >= cost.MIN_GAIN
    assert not best.flat


def test_a_gain_under_min_gain_keeps_the_hosts_and_every_server():
    # 56 workers on dedicated cores at 1 Gbit/s: another structure is a little faster
    cl = cost.Cluster(56, 1, 56, False, 1.0, None)
    times = _every_candidate(LM, cl, K)
    assert 1.0 < times[(1, 56)] / min(times.values()) < cost.MIN_GAIN
    best = cost.best_structure(LM, cl, K)
    assert (best.group, best.servers) == (1, 56) and best.flat and best.gain == 1.0


def test_groups_only_of_the_sizes_given():
    cl = cost.Cluster(256, 1, 256, False, 1.0, None)
    assert cost.best_structure(LM, cl, K).group > 1
    # without groups each server still serves a push and a pull of every worker:
    # on cores of their own, fewer servers only concentrate the rows
    assert cost.best_structure(LM, cl, K, groups=(1,)).flat


def test_shared_cores_count_every_process_cpu():
    # on 2 shared cores every RPC any process handles is on the step: fewer servers,
    # fewer RPCs (the emulated cluster's partition sweep, bench/README.md)
    shared = cost.Cluster(8, 1, 8, False, 1.0, 2.0)
    best = cost.best_structure(LM, shared, K)
    assert best.servers < 8
    dedicated = cost.best_structure(LM, cost.replace(shared, cores=None), K)
    assert dedicated.flat


def test_the_planners_constants_are_the_committed_fit():
    fitted = json.loads((RESULTS / "simulate.json").read_text())["constants"]
    mine = cost.PLANNER_CONSTANTS
    assert mine.gamma == pytest.approx(fitted["gamma"], rel=1e-9)
    peer = fitted["peers"][cost.PLANNER_PEER]
    for name in ("kappa", "rpc_kappa", "message_s", "rpc_s", "wire_factor", "overhead_s", "launch_s"):
        assert getattr(mine.peer(cost.PLANNER_PEER), name) == pytest.approx(peer[name], rel=1e-9,
                                                                            abs=1e-15), name


# --- 2-D summation of the dense all-reduce over groups (Config.allreduce_group;
# transforms.plan.allreduce_structure)

def test_allreduce_group_sizes_are_powers_of_two_that_make_two_groups_or_more():
    assert cost.allreduce_group_sizes(8) == [2, 4]
    assert cost.allreduce_group_sizes(12) == [2, 4]
    assert cost.allreduce_group_sizes(6) == [2]
    assert cost.allreduce_group_sizes(3) == [] and cost.allreduce_group_sizes(2) == []


def test_groups_send_about_the_flat_rings_bytes_in_far_fewer_steps():
    m, n, d = 1.3e6, 256, 16
    flat = cost.ring_allreduce(m, n, n)
    grouped = cost.grouped_allreduce(m, n, d, n)
    assert [p.name for p in grouped] == ["group-exchange", "across-groups", "group-gather"]
    # 2(d-1)/d m + 2(G-1)/G m/d = 2(N-1)/N m: the flat ring's bytes exactly
    assert sum(p.link_bytes for p in grouped) == pytest.approx(flat.link_bytes, rel=1e-12)
    assert sum(p.hops for p in grouped) == 1 + 2 * (n // d - 1) + (d - 1)
    assert sum(p.proc_msgs for p in grouped) == (d - 1) + 2 * (n // d - 1) + (d - 1)
    assert flat.hops == flat.proc_msgs == 2 * (n - 1)
    assert sum(p.proc_bytes for p in grouped) == pytest.approx(flat.proc_bytes, rel=1e-12)


def test_the_choice_of_groups_where_the_rings_steps_bind_and_not_where_bytes_do():
    many = cost.Cluster(256, 1, 256, False, 1.0, None)
    best = cost.best_allreduce_group("hybrid", LM, many, K)
    times = {d: cost.sync_seconds("hybrid", LM, cost.replace(many, allreduce_group=d), K,
                                  cost.PLANNER_PEER)
             for d in [0] + cost.allreduce_group_sizes(256)}
    assert best.group > 1 and best.step_s == min(times.values()) == times[best.group]
    assert best.flat_step_s == times[0] and best.gain >= cost.MIN_GAIN
    # a 100 MB model on 8 workers: the bytes bind, the steps do not
    few = cost.Cluster(8, 1, 8, False, 0.1, None)
    large = cost.Workload("large", 100e6, compute_s=0.0)
    assert cost.best_allreduce_group("allreduce", large, few, K).flat


def test_the_groups_extra_collectives_cost_what_the_emulated_cluster_measured():
    # every worker launches the across-groups all-reduce and the gather besides
    # the exchange that replaces the flat ring's all-reduce
    cl = cost.Cluster(8, 1, 8, False, 1.0, None)
    k = cost.PLANNER_CONSTANTS
    launch = k.peer(cost.PLANNER_PEER).launch_s
    assert launch > 0
    parts = {d: cost.step_time("allreduce", LM, cost.replace(cl, allreduce_group=d), k,
                               cost.PLANNER_PEER)["parts"] for d in (0, 4)}
    assert parts[0]["launches"] == 0 and parts[4]["launches"] == pytest.approx(2 * launch)
    # a few workers: the launches outweigh the ring steps saved; hundreds: not
    assert cost.best_allreduce_group("hybrid", LM, cl).flat
    assert cost.best_allreduce_group("hybrid", LM, cost.replace(cl, workers=512,
                                                                 servers=512)).group > 1
