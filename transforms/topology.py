"""Where a job's processes are: the worker hosts, in task order, how many
servers it has, and which helper processes it cannot have."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from autopar.common.addresses import is_loopback_address
from autopar.common.roles import SERVER_JOB, WORKER_JOB

# The cost models' assumption where the spec gives no link speed
# (Topology.link_gbps): a fast link, where herring's byte savings weigh least.
DEFAULT_LINK_GBPS = 10.0


@dataclass(frozen=True)
class Topology:
    worker_hosts: tuple[str, ...]   # host address of worker i
    num_servers: int = 0
    # The helper-process kinds (transforms/methods/process_registry.py:
    # herring's summation servers) this job cannot have, as (role, why): the
    # launcher starts every other kind a plan needs, but not one whose native
    # program cannot be built here (why: runtime/native.py's error); a job
    # joined through TF_CONFIG has a kind only if the variable it publishes
    # names its processes (why: "", runtime.membership.cluster_topology).
    missing_processes: tuple[tuple[str, str], ...] = ()
    # The speed of each host's network link (the spec's network.bandwidth_gbps),
    # None where the spec does not say: hybrid's cost model for herring.
    link_gbps: float | None = None
    # The cores every process of the job shares, when its hosts are emulated
    # on one machine (the spec's network.shared_cores; None: each host has
    # cores of its own): the planner's cost model (transforms.cost).
    shared_cores: float | None = None

    @classmethod
    def local(cls, num_workers: int, num_servers: int = 0) -> "Topology":
        return cls(("127.0.0.1",) * num_workers, num_servers)

    @classmethod
    def from_cluster(cls, cluster: dict[str, list[str]]) -> "Topology":
        """From {WORKER_JOB: ["host:port", ...], SERVER_JOB: [...]}."""
        return cls(tuple(a.rsplit(":", 1)[0] for a in cluster[WORKER_JOB]), len(cluster.get(SERVER_JOB, [])))

    def missing(self, role: str) -> str | None:
        """Why this job cannot have the helper processes of ``role`` ("": it
        was started without them), or None when it can."""
        return dict(self.missing_processes).get(role)

    @property
    def num_workers(self) -> int:
        return len(self.worker_hosts)

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(self.worker_hosts))

    def workers_on(self, host: str) -> list[int]:
        return list(self._workers_by_host.get(host, ()))

    @functools.cached_property
    def _workers_by_host(self) -> dict[str, list[int]]:
        # Once: a question per host over every worker was quadratic in the
        # job's size (minutes at thousands of workers).
        hosts: dict[str, list[int]] = {}
        for i, h in enumerate(self.worker_hosts):
            hosts.setdefault(h, []).append(i)
        return hosts

    @property
    def on_loopback(self) -> bool:
        """Every worker host is a loopback address: one machine, no network link."""
        return all(is_loopback_address(h) for h in self.hosts)
