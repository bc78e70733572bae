"""GPU workers without a GPU (docs/gpus.md): which worker owns which GPU ids
for every way a job is described or started, what each process the
launcher starts is given, and where the rewrite places a GPU worker's ops
and what its collectives ask for."""
from __future__ import annotations

import sys

import pytest
import tensorflow as tf

from autopar import cli
from autopar.common import env
from autopar.common.errors import SpecError
from autopar.runtime import gpus, hostfile, session, slurm
from autopar.runtime.commands import plan_children
from autopar.runtime.spec import ResourceSpec, load_spec, parse_parallax_spec
from autopar.transforms.accelerator import Accelerator, COLLECTIVES, GPU_DTYPES
from autopar.transforms.compile import compile_plan
from autopar.transforms.keys import ACCELERATOR_GROUPS
from autopar.transforms.methods.registry import METHODS
from autopar.transforms.plan import PlanOptions
from autopar.transforms.rewrite import rewrite_for_worker, worker_device
from autopar.transforms.topology import Topology
from tests import models


def _spec(*hosts: dict):
    return load_spec({"hosts": list(hosts)})


# ------------------------------------------------------------------ assignment

def test_a_hosts_gpus_are_dealt_out_to_its_workers_in_order():
    one_each = _spec({"address": "a", "workers": 4, "gpus": [0, 1, 2, 3]})
    assert gpus.spec_worker_gpus(one_each) == [(0,), (1,), (2,), (3,)]
    two_each = _spec({"address": "a", "workers": 2, "gpus": [4, 5, 6, 7]})
    assert gpus.spec_worker_gpus(two_each) == [(4, 5), (6, 7)]
    shared = _spec({"address": "a", "workers": 4, "gpus": [0, 1]})   # two workers per GPU
    assert gpus.spec_worker_gpus(shared) == [(0,), (0,), (1,), (1,)]
    per_worker = _spec({"address": "a", "workers": 2, "gpus": [[1], [0, 2]]},
                       {"address": "b", "workers": 1, "servers": 1, "gpus": [3]})
    assert gpus.spec_worker_gpus(per_worker) == [(1,), (0, 2), (3,)]
    cpu = _spec({"address": "a", "workers": 2, "servers": 1})
    assert gpus.spec_worker_gpus(cpu) == [(), ()]
    # Round trip, as the launcher hands the spec to its children.
    assert ResourceSpec.from_dict(per_worker.to_dict()) == per_worker


@pytest.mark.parametrize("hosts, message", [
    ([{"address": "a", "workers": 2, "gpus": [0, 1, 2]}],
     r"hosts\[0\].gpus: has 3 ids for 2 workers, which share them out unevenly"),
    ([{"address": "a", "workers": 2, "gpus": [0, 0]}], r"hosts\[0\].gpus: lists an id twice"),
    ([{"address": "a", "workers": 1, "gpus": [-1]}], r"hosts\[0\].gpus: must hold GPU ids"),
    ([{"address": "a", "workers": 1, "gpus": "0"}], r"hosts\[0\].gpus: must be a non-empty list"),
    ([{"address": "a", "workers": 1, "gpus": []}], r"hosts\[0\].gpus: must be a non-empty list"),
    ([{"address": "a", "workers": 2, "gpus": [[0]]}], r"hosts\[0\].gpus: has 1 lists for 2 workers"),
    ([{"address": "a", "workers": 0, "servers": 1, "gpus": [0]}],
     r"hosts\[0\].gpus: is given for a host that runs no worker"),
    ([{"address": "a", "workers": 1, "gpus": [0]}, {"address": "b", "workers": 1}],
     r"hosts\[1\].gpus: is missing while hosts\[0\] gives GPUs"),
])
def test_gpus_a_spec_cannot_use_are_refused_naming_the_field(hosts, message):
    with pytest.raises(SpecError, match=message):
        _spec(*hosts)


def test_parallax_ids_are_the_gpus_of_one_worker_each():
    spec = parse_parallax_spec("10.0.0.1: 0,1\n10.0.0.2: 2,3\n", "p.txt")
    assert gpus.spec_worker_gpus(spec) == [(0,), (1,), (2,), (3,)]


def test_host_lists_and_hostfiles_give_slot_k_its_local_ranks_gpus(tmp_path):
    hosts = hostfile.parse_host_list("node1:2,node2:2")
    assert gpus.spec_worker_gpus(hostfile.spec_from_hosts(hosts, 0, 1)) == [(0,), (1,)] * 2
    assert gpus.spec_worker_gpus(hostfile.spec_from_hosts(hosts, 0, 2)) == [(0, 1), (2, 3)] * 2
    assert gpus.spec_worker_gpus(hostfile.spec_from_hosts(hosts)) == [()] * 4
    args = cli.argparse.Namespace(spec=None, hosts="node1:2", hostfile=None, servers_per_host=0,
                                  gpus_per_worker=1, num_proc=None)
    assert gpus.spec_worker_gpus(cli._spec(args)) == [(0,), (1,)]
    (tmp_path / "hosts").write_text("node1 slots=2\n")
    args = cli.argparse.Namespace(spec=None, hosts=None, hostfile=str(tmp_path / "hosts"),
                                  servers_per_host=0, gpus_per_worker=1, num_proc=None)
    assert gpus.spec_worker_gpus(cli._spec(args)) == [(0,), (1,)]
    with pytest.raises(cli.UsageError, match="--gpus-per-worker .* goes with -np, -H or --hostfile"):
        cli._spec(cli.argparse.Namespace(spec="s.yaml", hosts=None, hostfile=None,
                                         servers_per_host=0, gpus_per_worker=1, num_proc=None))


def test_a_slurm_allocation_shares_each_nodes_gpus_over_its_tasks():
    allocation = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-2]",
                  "SLURM_TASKS_PER_NODE": "2(x2)"}

    def addresses(nodes):
        return {"n1": "10.0.0.1", "n2": "10.0.0.2"}
    spec = slurm.spec_from_allocation({**allocation, "SLURM_GPUS_PER_NODE": "a100:4"}, 1,
                                      addresses=addresses)
    assert gpus.spec_worker_gpus(spec) == [(0, 1), (2, 3)] * 2
    spec = slurm.spec_from_allocation({**allocation, "SLURM_GPUS_ON_NODE": "2"}, addresses=addresses)
    assert gpus.spec_worker_gpus(spec) == [(0,), (1,)] * 2
    assert gpus.spec_worker_gpus(slurm.spec_from_allocation(allocation, addresses=addresses)) \
        == [()] * 4
    with pytest.raises(SpecError, match="SLURM_GPUS_PER_NODE='x' is not a GPU count"):
        slurm.spec_from_allocation({**allocation, "SLURM_GPUS_PER_NODE": "x"}, addresses=addresses)


@pytest.mark.parametrize("visible, local, tasks, expected", [
    ("0,1,2,3", "1", "4", (1,)),         # the node's GPUs shared by 4 tasks
    ("0,1,2,3", "1", "2", (2, 3)),       # two each
    ("5", "1", "2", (0,)),               # Slurm bound one GPU to each task (--gpus-per-task)
    ("0,1", "0", "1", (0, 1)),           # one task: all of them
    ("", "0", "2", ()),                  # none given: a CPU worker
])
def test_an_srun_task_takes_the_gpus_slurm_gave_it_by_its_local_id(visible, local, tasks,
                                                                   expected):
    environ = {"SLURM_LOCALID": local, "SLURMD_NODENAME": "n2", "SLURM_STEP_NODELIST": "n[1-2]",
               "SLURM_STEP_TASKS_PER_NODE": f"1,{tasks}"}
    if visible:
        environ["CUDA_VISIBLE_DEVICES"] = visible
    assert gpus.slurm_task_gpus(environ) == expected


def test_srun_gpus_that_do_not_share_out_are_refused():
    with pytest.raises(SpecError, match="this node's 2 tasks 3 GPUs"):
        gpus.slurm_task_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_LOCALID": "0",
                              "SLURMD_NODENAME": "n1", "SLURM_STEP_NODELIST": "n1",
                              "SLURM_STEP_TASKS_PER_NODE": "2"})


def test_an_mpi_rank_takes_its_workers_gpus_and_its_local_rank_must_agree():
    spec = _spec({"address": "a", "workers": 2, "gpus": [0, 1], "ports": [24000, 24010]},
                 {"address": "b", "workers": 2, "gpus": [0, 1], "ports": [24000, 24010]})
    assert gpus.mpi_rank_gpus(spec, 3, {"OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == (1,)
    assert gpus.mpi_rank_gpus(spec, 2, {}) == (0,)
    with pytest.raises(SpecError, match="worker 1 of a, but mpirun made it local rank 0"):
        gpus.mpi_rank_gpus(spec, 1, {"OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert gpus.mpi_rank_gpus(_spec({"address": "a", "workers": 2}), 1, {}) == ()


def test_each_launched_worker_sees_exactly_its_gpus_with_memory_growth():
    spec = _spec({"address": "127.0.0.1", "workers": 2, "servers": 1, "gpus": [[3], [1, 2]]})
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"], "ps": ["127.0.0.1:5002"]}
    plans = plan_children(spec, cluster, [sys.executable, "train.py"])
    workers = {p.index: p.env for p in plans if p.role == "worker"}
    assert workers[0]["CUDA_VISIBLE_DEVICES"] == "3" and workers[0][env.GPUS] == "0"
    assert workers[1]["CUDA_VISIBLE_DEVICES"] == "1,2" and workers[1][env.GPUS] == "0,1"
    assert all(e["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for e in workers.values())
    assert [gpus.from_environment(e) for e in workers.values()] == [(0,), (0, 1)]
    server, = (p.env for p in plans if p.role == "server")
    assert env.GPUS not in server and server.get("CUDA_VISIBLE_DEVICES") \
        == __import__("os").environ.get("CUDA_VISIBLE_DEVICES")
    assert gpus.report_lines(spec)[1] == ("worker 1 on 127.0.0.1: GPU 1,2 "
                                          "(CUDA_VISIBLE_DEVICES=1,2), its replica on the first")
    # A CPU spec's workers get nothing new.
    cpu = plan_children(_spec({"address": "127.0.0.1", "workers": 1}), {"worker": cluster["worker"][:1]},
                        [sys.executable, "train.py"])
    assert env.GPUS not in cpu[0].env and gpus.report_lines(_spec({"address": "a", "workers": 1})) == []


def test_a_gpu_workers_session_makes_only_its_gpus_devices_with_memory_growth():
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]}
    config = session.session_config(cluster, 1, gpus=(0, 1))
    assert config.gpu_options.visible_device_list == "0,1"
    assert config.gpu_options.allow_growth and config.allow_soft_placement
    seen_none = session.session_config(cluster, 1, gpus=())   # the process sees no GPU
    assert seen_none.allow_soft_placement and not seen_none.gpu_options.visible_device_list
    cpu = session.session_config(cluster, 1)
    assert not cpu.allow_soft_placement and not cpu.gpu_options.allow_growth \
        and not cpu.gpu_options.visible_device_list


# ------------------------------------------------------------------ placement

def _collectives(nodes):
    by_name = {n.name: n for n in nodes}

    def const(name):
        return int(tf.make_ndarray(by_name[name.split(":")[0]].attr["value"].tensor))
    out = []
    for n in nodes:
        if n.op in COLLECTIVES:
            group_at, key_at = COLLECTIVES[n.op]
            key = n.input[key_at].split(":")[0]
            out.append((n, const(n.input[group_at]),
                        const(key) if by_name[key].op == "Const" else None))
    return out


@pytest.mark.parametrize("model, option, worker", [
    ("emb_adam_clip", "hybrid", 1),        # servers, row gathers, counts, 2-D summation
    ("mlp_adam_clip", "allreduce", 0),     # the chief's broadcast
    ("cnn_momentum", "herring", 2),        # the native transport
])
def test_a_gpu_workers_replica_runs_on_its_gpu_and_asks_nccl_for_ordered_float_collectives(
        model, option, worker):
    m = models.build(model)
    topology = Topology(("127.0.0.1",) * 2 + ("127.0.0.2",), 2)
    c = compile_plan(m.graph, topology, PlanOptions(run_option=option))
    cpu_graph = rewrite_for_worker(m.graph, c.analysis, c.plan, worker, moves=c.moves)
    gpu_graph = rewrite_for_worker(m.graph, c.analysis, c.plan, worker, moves=c.moves,
                                   accelerator=Accelerator())
    cpu_nodes = {n.name: n for n in cpu_graph.meta_graph.graph_def.node}
    nodes = gpu_graph.meta_graph.graph_def.node
    gpu, cpu = f"/job:worker/task:{worker}/device:GPU:0", worker_device(worker)
    ordered = {k for method in METHODS.values() for k in method.ordered_collectives(c.plan)}
    assert bool(ordered) == (option != "herring")   # herring's dense gradients: no ring buckets
    for n in nodes:
        before = cpu_nodes.get(n.name)
        if before is None:                       # the GPU twins' group keys
            assert n.name.startswith("autopar/accelerator/group_key_") and n.device == gpu
            continue
        assert list(n.input) == list(before.input) or n.op in COLLECTIVES, n.name
        if before.device != cpu:                 # on a server: where it was
            assert n.device == before.device and n.device.startswith("/job:ps"), n.name
        elif n.op == "AutoparHerringPushPull":   # the native transport stays on the host
            assert n.device == cpu
        elif n.op not in COLLECTIVES:
            assert n.device == gpu, n.name
    assert option != "herring" or any(n.op == "AutoparHerringPushPull" for n in nodes)
    collectives = _collectives(nodes)
    before = {n.name: (group, key) for n, group, key in _collectives(list(cpu_nodes.values()))}
    assert collectives
    for n, group, key in collectives:
        original_group, original_key = before[n.name]
        assert key == original_key
        if n.attr["T"].type in GPU_DTYPES:      # on the GPU, in its group's GPU twin
            assert n.device == gpu and group == ACCELERATOR_GROUPS.first + original_group
            assert n.attr["communication_hint"].s == (b"nccl" if key in ordered else b"ring")
        else:                                   # counts, indices, the global step: the CPU
            assert n.device == cpu and group == original_group
            assert n.attr["communication_hint"].s == b"ring"
    assert (b"nccl" in {n.attr["communication_hint"].s for n, _, _ in collectives}) == bool(ordered)
    # Where the process sees no GPU: the same placement, no NCCL.
    ring = rewrite_for_worker(m.graph, c.analysis, c.plan, worker, moves=c.moves,
                              accelerator=Accelerator(hint="ring"))
    assert b"nccl" not in {n.attr["communication_hint"].s
                           for n, _, _ in _collectives(ring.meta_graph.graph_def.node)}
    # A CPU worker's graph names no GPU.
    assert not any("GPU" in n.device for n in cpu_nodes.values())
