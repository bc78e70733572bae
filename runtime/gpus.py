"""Which GPUs each worker owns (docs/gpus.md), however the job was
described or started:

- a spec's hosts: `gpus: [0, 1]` dealt out to the host's workers, or one
  list per worker (runtime/spec.py HostSpec.worker_gpus); the Parallax form
  `host: 0,1`, one worker per id; `-H host:slots` and hostfiles with
  `--gpus-per-worker K`, slot k of a host taking ids kK .. kK+K-1 (the local
  rank's GPUs, as Horovod and mpirun users assign them);
- `--spec slurm`: the GPUs the allocation has on each node;
- a rank mpirun started: its worker's ids in the spec, its local rank
  checked against its place on the host;
- a task srun started: the GPUs Slurm gives the task, shared out by
  SLURM_LOCALID over the node's tasks;
- a process joined through TF_CONFIG: AUTOPAR_GPUS, if its launcher sets it.

A worker the launcher starts sees exactly its GPUs (CUDA_VISIBLE_DEVICES)
with memory growth on, and is told their ids as it sees them
(AUTOPAR_GPUS); a process started by another launcher keeps its devices
and uses the ids through its session's visible_device_list
(runtime/session.py). A worker without GPUs runs as it always did.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from autopar.common import env
from autopar.common.errors import SpecError, shown
from autopar.runtime.spec import ResourceSpec

# The local rank of an MPI launcher's process, first found wins.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")


def spec_worker_gpus(spec: ResourceSpec) -> list[tuple[int, ...]]:
    """The GPU ids of worker i (() for none), numbered as the spec's workers are."""
    return [ids for host in spec.hosts for ids in host.worker_gpus()]


def launched_worker_env(ids: tuple[int, ...]) -> dict[str, str]:
    """The environment of a worker the launcher starts owning GPU `ids` of
    its host: exactly those visible, memory growth on, and their ids as the
    process then sees them. Nothing for a CPU worker."""
    if not ids:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids)), "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            env.GPUS: ",".join(str(i) for i in range(len(ids)))}


def report_lines(spec: ResourceSpec) -> list[str]:
    """One line per worker naming its device, for a spec that gives GPUs."""
    owned = spec_worker_gpus(spec)
    if not any(owned):
        return []
    hosts = spec.worker_hosts()
    return [f"worker {i} on {host.address}: GPU {','.join(map(str, ids))} "
            f"(CUDA_VISIBLE_DEVICES={','.join(map(str, ids))}), its replica on the first"
            for i, (host, ids) in enumerate(zip(hosts, owned))]


def from_environment(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """AUTOPAR_GPUS: the ids (as this process sees them) its launcher gave it."""
    text = environ.get(env.GPUS, "").strip()
    if not text:
        return ()
    return _ids(text, env.GPUS)


def mpi_rank_gpus(spec: ResourceSpec, rank: int,
                  environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """Worker `rank`'s ids in the spec, for a rank mpirun started; its local
    rank must be its place among its host's workers (the hosts in the same
    order, with as many slots as workers, for mpirun and in the spec)."""
    owned = spec_worker_gpus(spec)
    if not owned[rank]:
        return ()
    hosts = spec.worker_hosts()
    place = sum(1 for h in hosts[:rank] if h is hosts[rank])
    for variable in LOCAL_RANK_VARIABLES:
        local = environ.get(variable)
        if local is not None and local.isdigit() and int(local) != place:
            raise SpecError(f"MPI rank {rank} is worker {rank} of the spec, the worker {place} of "
                            f"{hosts[rank].address}, but mpirun made it local rank {local} "
                            f"({variable}): list the hosts in the same order, with as many slots "
                            "as workers, for mpirun and in the spec, so it takes its own GPUs")
    return owned[rank]


def slurm_task_gpus(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The GPUs Slurm gave a task srun started (CUDA_VISIBLE_DEVICES, as
    this process sees them: 0 .. n-1), shared out over the node's tasks by
    SLURM_LOCALID: n GPUs over t tasks give each n/t, or let t/n tasks share
    one. () when Slurm gave none."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible or visible in ("-1", "NoDevFiles"):
        return ()
    count = len(visible.split(","))
    local = environ.get("SLURM_LOCALID", "0")
    if not local.isdigit():
        raise SpecError(f"SLURM_LOCALID={shown(local)} is not a task number: is this process "
                        "started by srun?")
    here = _tasks_on_this_node(environ)
    local_id = int(local)
    if here <= 1:
        return tuple(range(count))
    if count % here == 0:
        per = count // here
        return tuple(range(local_id * per, (local_id + 1) * per))
    if here % count == 0:
        return (local_id * count // here,)
    raise SpecError(f"Slurm gave this node's {here} tasks {count} GPUs "
                    f"(CUDA_VISIBLE_DEVICES={visible}), which they cannot share out evenly: "
                    "ask for a multiple or a divisor of the tasks (--gpus-per-task, --gres)")


def _tasks_on_this_node(environ: Mapping[str, str]) -> int:
    """How many of the step's tasks run on this node (1 when Slurm's step
    variables do not say)."""
    from autopar.runtime.slurm import expand_nodelist, tasks_per_node
    name = environ.get("SLURMD_NODENAME")
    if not name or not environ.get("SLURM_STEP_NODELIST") or not environ.get(
            "SLURM_STEP_TASKS_PER_NODE"):
        return 1
    nodes = expand_nodelist(environ["SLURM_STEP_NODELIST"], "SLURM_STEP_NODELIST")
    counts = tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"], "SLURM_STEP_TASKS_PER_NODE")
    return counts[nodes.index(name)] if name in nodes and len(counts) == len(nodes) else 1


def _ids(text: str, where: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise SpecError(f"{where}={shown(text)}: expected GPU ids such as 0,1")
    return tuple(int(p) for p in parts)
