"""Where a process stands in its job when something other than autopar's
launcher started it: TF_CONFIG (Kubeflow's TFJob, your own scripts), an MPI
launcher (`mpirun -np N`, OpenMPI's OMPI_COMM_WORLD_* or MPICH/Slurm PMI's
PMI_RANK/PMI_SIZE) or Slurm's `srun` (runtime/slurm.py). Such a process
joins the cluster and spawns nothing.

Under MPI every rank is a worker: rank r is worker r, the ranks' count must be
the spec's worker count, and the spec (passed to get_runner as usual) names
every host's ports, explicitly (`worker_ports`) or as a range (`ports`,
taken from its start in order), so every rank derives the same cluster with
no exchange. Servers are not started by MPI ranks: a spec with servers is
refused (use `autopar launch` or TF_CONFIG for parameter servers).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from autopar.common.errors import SpecError, shown
from autopar.common.roles import WORKER_JOB
from autopar.runtime import slurm
from autopar.runtime.ports import explicit_cluster, is_local_address
from autopar.runtime.spec import ResourceSpec

# (rank, size) variables of the MPI launchers, first found wins.
MPI_VARIABLES = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),   # OpenMPI
                 ("PMI_RANK", "PMI_SIZE"))                           # MPICH, Intel MPI, Slurm PMI


def mpi_rank(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(rank, size) of a process an MPI launcher started, else None."""
    for rank_var, size_var in MPI_VARIABLES:
        if rank_var in environ:
            rank, size = environ.get(rank_var, ""), environ.get(size_var, "")
            if not (rank.isdigit() and size.isdigit() and int(rank) < int(size)):
                raise SpecError(f"{rank_var}={shown(rank)} and {size_var}={shown(size)} are not a "
                                "rank below a size: is this process started by mpirun?")
            return int(rank), int(size)
    return None


def external_rank(environ: Mapping[str, str] = os.environ) -> tuple[str, int, int] | None:
    """("mpi" or "slurm", rank, size) of a process an MPI launcher or srun
    started, else None. An MPI launcher inside a Slurm allocation starts its
    daemons with srun, so their step's variables describe the daemons, not
    the ranks: MPI's own variables win, unless they are srun's PMI ones
    saying the same (srun --mpi=pmi2), where no spec is needed."""
    mpi = mpi_rank(environ)
    step = slurm.step_position(environ)
    if step is not None and (mpi is None or (mpi == step
                                             and "OMPI_COMM_WORLD_RANK" not in environ)):
        return ("slurm", *step)
    return None if mpi is None else ("mpi", *mpi)


def mpi_cluster(spec: ResourceSpec, rank: int, size: int) -> dict[str, list[str]]:
    """The cluster every rank of an MPI-started job derives from `spec`
    (module docstring); this rank must run on its worker's host."""
    if spec.num_servers:
        raise SpecError(f"a job started by an MPI launcher runs only workers, but the spec lists "
                        f"{spec.num_servers} server(s): remove them (sparse variables then use "
                        "all-gather), or start the job with `autopar launch` or TF_CONFIG")
    if size != spec.num_workers:
        raise SpecError(f"the MPI launcher started {size} process(es), but the spec lists "
                        f"{spec.num_workers} worker(s): start as many ranks as workers "
                        f"(mpirun -np {spec.num_workers})")
    hosts = []
    for i, host in enumerate(spec.hosts):
        if host.worker_ports is None and host.ports is None:
            raise SpecError(f"resource spec: hosts[{i}] ({host.address}) gives no ports: every "
                            "rank must derive the same addresses, so give 'worker_ports' or a "
                            "'ports' range for each host of a job started by an MPI launcher")
        ports = host.worker_ports or tuple(range(host.ports[0], host.ports[0] + host.workers))
        hosts.append(replace(host, worker_ports=ports))
    cluster = explicit_cluster(replace(spec, hosts=tuple(hosts)))
    host = cluster[WORKER_JOB][rank].rsplit(":", 1)[0].strip("[]")
    if not is_local_address(host):
        raise SpecError(f"MPI rank {rank} is worker {rank} of the spec, on {host}, but runs on "
                        "another machine: list the hosts in the same order, with as many slots "
                        "as workers, for the MPI launcher and in the spec")
    return cluster
