"""Where this process stands in a job, one resolver per way of joining one
(in the manner of TensorFlow's cluster resolvers). Each gives the same
`Membership` record: the cluster, this process's role and index, the
Topology the job's plan is made for, where that plan comes from, the GPUs
the process owns and what it shows.

- `LaunchedResolver`: a worker autopar's launcher started (AUTOPAR_ROLE,
  AUTOPAR_CLUSTER, AUTOPAR_TASK_INDEX); its plan comes through the job
  coordinator, compiled by the launcher or, when none gave it, by the chief.
- `TFConfigResolver`: TF_CONFIG (Kubeflow's TFJob, your own scripts): a
  worker, or a server that serves the cluster and exits.
- `SlurmResolver`: a task srun started (runtime/slurm.py): worker `task` of
  the step's nodes.
- `MPIResolver`: a rank an MPI launcher started (runtime/join.py): worker
  `rank` of the spec's cluster.

The last three have no coordinator: each process compiles the plan itself,
by the same deterministic function. The first that applies resolves
(`resolve`); none applies outside a job (the launcher, one device).

A topology is derived here only: from a resource spec (`spec_topology`:
the launcher and `autopar launch`'s report), or from a cluster and what
whoever started the processes put in their environment
(`cluster_topology`: every process that joins)."""
from __future__ import annotations

import enum
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from autopar.common import env
from autopar.common.errors import SpecError
from autopar.common.roles import SERVER_ROLE, WORKER_JOB, WORKER_ROLE
from autopar.runtime import gpus, join, ports, slurm
from autopar.runtime.spec import ResourceSpec, load_spec, spec_from_tf_config
from autopar.transforms.methods.process_registry import PROCESS_KINDS
from autopar.transforms.topology import Topology

log = logging.getLogger("autopar")


class PlanSource(enum.Enum):
    """Where a process's plan (of the script's first job) comes from."""
    LAUNCHER = "the launcher"          # compiled once, served by the job coordinator
    CHIEF = "the chief (worker 0)"     # compiled and published by the chief
    OWN = "this process"               # compiled by every process itself


@dataclass(frozen=True)
class Membership:
    """`how`: the resolver's name; `role`: WORKER_ROLE or SERVER_ROLE;
    `topology`: a worker's (None for a server, which plans nothing);
    `plan_source`: where the plan of the script's first job comes from;
    `gpus`: the ids (as this process sees them) a worker owns;
    `print_report`: log the plan's Report (the chief, when no launcher
    printed it); `tty`: the launcher's output is a terminal."""
    how: str
    role: str
    index: int
    cluster: dict[str, list[str]]
    topology: Topology | None
    plan_source: PlanSource
    plan_key: str = ""               # where the launcher published it (LAUNCHER)
    gpus: tuple[int, ...] = ()
    print_report: bool = False
    tty: bool = False

    @property
    def num_workers(self) -> int:
        return len(self.cluster[WORKER_JOB])


class LaunchedResolver:
    name = "launcher"

    def applies(self, environ: Mapping[str, str]) -> bool:
        return environ.get(env.ROLE) == WORKER_ROLE

    def position(self, environ: Mapping[str, str]) -> tuple[int, int]:
        return len(_launched_cluster(environ)[WORKER_JOB]), _launched_index(environ)

    def resolve(self, resource_info, environ: Mapping[str, str]) -> Membership:
        cluster, index = _launched_cluster(environ), _launched_index(environ)
        return Membership(
            self.name, WORKER_ROLE, index, cluster, cluster_topology(cluster, environ),
            PlanSource.LAUNCHER if environ.get(env.PLAN) else PlanSource.CHIEF,
            plan_key=environ.get(env.PLAN, ""),
            gpus=gpus.from_environment(environ),
            print_report=index == 0 and not environ.get(env.REPORT_PRINTED),
            tty=environ.get(env.TTY) == "1")


class TFConfigResolver:
    name = "TF_CONFIG"

    def applies(self, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("TF_CONFIG"))

    def position(self, environ: Mapping[str, str]) -> tuple[int, int] | None:
        spec, role, index = spec_from_tf_config(environ["TF_CONFIG"])
        return (spec.num_workers, index) if role == WORKER_ROLE else None

    def resolve(self, resource_info, environ: Mapping[str, str]) -> Membership:
        spec, role, index = spec_from_tf_config(environ["TF_CONFIG"])
        cluster = ports.explicit_cluster(spec)
        if role == SERVER_ROLE:
            return Membership(self.name, role, index, cluster, None, PlanSource.OWN)
        return Membership(self.name, role, index, cluster, cluster_topology(cluster, environ),
                          PlanSource.OWN, gpus=gpus.from_environment(environ))


class _ExternalRankResolver:
    """A process srun or an MPI launcher started (join.external_rank says
    which, `kind`): worker `rank` of `size`."""
    kind = ""

    def applies(self, environ: Mapping[str, str]) -> bool:
        joined = join.external_rank(environ)
        return joined is not None and joined[0] == self.kind

    def position(self, environ: Mapping[str, str]) -> tuple[int, int]:
        _, rank, size = join.external_rank(environ)
        return size, rank


class SlurmResolver(_ExternalRankResolver):
    name, kind = "srun", "slurm"

    def resolve(self, resource_info, environ: Mapping[str, str]) -> Membership:
        _, rank, size = join.external_rank(environ)
        cluster = slurm.step_cluster(environ, rank, size)
        if resource_info is not None and rank == 0:
            log.info("started by srun: the job runs on the step's nodes and tasks; the resource "
                     "spec passed to get_runner is not used")
        log.info("Slurm task %d of %d: worker %d of %s", rank, size, rank, cluster[WORKER_JOB])
        return Membership(self.name, WORKER_ROLE, rank, cluster, cluster_topology(cluster, environ),
                          PlanSource.OWN, gpus=gpus.slurm_task_gpus(environ))


class MPIResolver(_ExternalRankResolver):
    name, kind = "mpirun", "mpi"

    def resolve(self, resource_info, environ: Mapping[str, str]) -> Membership:
        if resource_info is None:
            raise SpecError("this process was started by an MPI launcher (mpirun): pass the "
                            "resource spec to get_runner so every rank derives the same cluster "
                            "from it")
        _, rank, size = join.external_rank(environ)
        spec = load_spec(resource_info)
        cluster = join.mpi_cluster(spec, rank, size)
        log.info("MPI rank %d of %d: worker %d of %s", rank, size, rank, cluster[WORKER_JOB])
        return Membership(self.name, WORKER_ROLE, rank, cluster, cluster_topology(cluster, environ),
                          PlanSource.OWN, gpus=gpus.mpi_rank_gpus(spec, rank, environ))


# In this order: a launched process may inherit an outer job's variables.
RESOLVERS = (LaunchedResolver(), TFConfigResolver(), SlurmResolver(), MPIResolver())


def _resolver(environ: Mapping[str, str]):
    return next((r for r in RESOLVERS if r.applies(environ)), None)


def resolve(resource_info, environ: Mapping[str, str] = os.environ) -> Membership | None:
    """This process's place in the job it joins, or None outside one."""
    resolver = _resolver(environ)
    return None if resolver is None else resolver.resolve(resource_info, environ)


def worker_position(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(number of workers, this worker's index) when this process is a worker
    of a job (launched by autopar, joined through TF_CONFIG or started by
    srun or an MPI launcher), known before get_runner; None in any other
    process."""
    if environ.get(env.ROLE) and environ.get(env.ROLE) != WORKER_ROLE:
        return None          # a process of a launched job, not a worker
    resolver = _resolver(environ)
    return None if resolver is None else resolver.position(environ)


def _launched_cluster(environ: Mapping[str, str]) -> dict[str, list[str]]:
    return json.loads(environ[env.CLUSTER])


def _launched_index(environ: Mapping[str, str]) -> int:
    return int(environ.get(env.TASK_INDEX, "0"))


# -- topologies ------------------------------------------------------------------

def spec_topology(spec: ResourceSpec) -> Topology:
    """The Topology the launcher plans a job of `spec` for. Helper processes
    (herring's summation servers): the launcher starts them when the plan's
    methods need them (registry.processes), so the planner may count on
    them, unless their native program cannot be built here (no C++
    compiler: runtime/native.py)."""
    from autopar.runtime.native import program_unavailable
    missing = []
    for kind in PROCESS_KINDS.values():
        why = next(filter(None, map(program_unavailable, kind.native_programs)), None)
        if why:
            missing.append((kind.role, why))
    return Topology(tuple(h.address for h in spec.worker_hosts()), spec.num_servers,
                    missing_processes=tuple(missing),
                    link_gbps=spec.bandwidth_gbps, shared_cores=spec.shared_cores)


def cluster_topology(cluster: dict[str, list[str]],
                     environ: Mapping[str, str] = os.environ) -> Topology:
    """The Topology a plan for `cluster` is made for. A job with no server
    tasks but helper processes placed one per server (the variable each
    kind publishes, set by whoever started them: AUTOPAR_SUMSERVERS, a
    TF_CONFIG job running herring on dense variables needs no TensorFlow
    server process) has one server per such process. Without that variable
    the job has none of the kind: without summation servers hybrid keeps
    dense gradients on the ring and run_option='herring' is refused. The
    link speed and shared cores come from AUTOPAR_LINK_GBPS and
    AUTOPAR_SHARED_CORES (what a spec's network section tells the planner)."""
    topology = Topology.from_cluster(cluster)
    published = {kind.role: [a for a in environ.get(kind.publishes, "").split(",") if a.strip()]
                 for kind in PROCESS_KINDS.values()}     # each PER_SERVER
    servers = topology.num_servers or max(map(len, published.values()), default=0)
    return Topology(topology.worker_hosts, servers,
                    missing_processes=tuple((role, "") for role, addresses in published.items()
                                            if not addresses),
                    link_gbps=_positive(environ, env.LINK_GBPS),
                    shared_cores=_positive(environ, env.SHARED_CORES))


def _positive(environ: Mapping[str, str], name: str) -> float | None:
    """A positive number from environment variable `name` (None: unset)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise SpecError(f"{name}={raw!r} must be a positive number (or unset)")
    return value
