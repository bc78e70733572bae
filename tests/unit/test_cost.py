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
    # 64 workers on dedicated cores at 1 Gbit/s: another structure is a little faster
    cl = cost.Cluster(64, 1, 64, False, 1.0, None)
    times = _every_candidate(LM, cl, K)
    assert 1.0 < times[(1, 64)] / min(times.values()) < cost.MIN_GAIN
    best = cost.best_structure(LM, cl, K)
    assert (best.group, best.servers) == (1, 64) and best.flat and best.gain == 1.0


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
    for name in ("kappa", "message_s", "rpc_s", "wire_factor", "overhead_s"):
        assert getattr(mine.peer(cost.PLANNER_PEER), name) == pytest.approx(peer[name], rel=1e-9,
                                                                            abs=1e-15), name
