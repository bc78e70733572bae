"""Where a job's processes are: the worker hosts, in task order, and how
many servers and summation servers it has."""
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
    # Whether herring's summation servers can serve this job: the launcher
    # starts them when the plan uses herring; a job joined through TF_CONFIG
    # has them only if AUTOPAR_SUMSERVERS names them (runtime.membership.cluster_topology).
    summation_servers: bool = True
    # Why there are none when summation_servers is False and it is not
    # that case (no compiler for the native transport: runtime/native.py).
    summation_servers_why: str = ""
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
