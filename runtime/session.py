"""A worker's TensorFlow server and session, set up for cross-process collectives."""
from __future__ import annotations

import logging
import socket
import time

import tensorflow as tf

from autopar.common.errors import LaunchError
from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.runtime.firewall import guard_this_process
from autopar.common.addresses import is_loopback_address

tf1 = tf.compat.v1
log = logging.getLogger("autopar.session")

# Collective groups are formed by asking one leader: worker 0 by convention
# (servers are told too, since they share the cluster).
COLLECTIVE_GROUP_LEADER = f"/job:{WORKER_JOB}/replica:0/task:0"


def session_config(cluster: dict[str, list[str]], worker_index: int,
                   all_workers: bool = False, gpus: tuple[int, ...] | None = None
                   ) -> tf1.ConfigProto:
    """`gpus`: a worker whose replica is placed on its GPU
    (transforms.accelerator): the ids (as this process sees them) of the
    GPUs it owns and sees, its replica on the first. Only those are made
    devices, their memory grows as used instead of being taken whole, and
    an op with no GPU kernel (or every op, when `gpus` is empty: the process
    sees none) runs on the CPU: soft placement."""
    config = tf1.ConfigProto()
    if gpus is not None:
        config.allow_soft_placement = True
    if gpus:
        config.gpu_options.visible_device_list = ",".join(map(str, gpus))
        config.gpu_options.allow_growth = True
    config.experimental.collective_group_leader = COLLECTIVE_GROUP_LEADER
    share_cores(config, cluster, WORKER_JOB, worker_index)
    # This worker's session only places ops on itself; peers are reached by the
    # collective ops, not by the session, so it need not wait for servers.
    # With weight-update sharding, optimizer slots live on their owners:
    # the chief initialises, saves and restores them there.
    config.device_filters.append(f"/job:{WORKER_JOB}" if all_workers
                                 else f"/job:{WORKER_JOB}/task:{worker_index}")
    if SERVER_JOB in cluster:
        config.device_filters.append(f"/job:{SERVER_JOB}")   # variables placed on servers
    return config


def local_processes(cluster: dict[str, list[str]], job: str, task_index: int) -> int:
    """How many of the cluster's processes run on the machine of task
    `task_index` of `job` (itself included): those on its host, and every
    loopback address counts as one machine."""
    me = cluster[job][task_index].rpartition(":")[0]
    return sum(1 for addresses in cluster.values() for address in addresses
               if (host := address.rpartition(":")[0]) == me
               or (is_loopback_address(host) and is_loopback_address(me)))


def share_cores(config: tf1.ConfigProto, cluster: dict[str, list[str]], job: str,
                task_index: int) -> None:
    """Give this process its share of the machine's cores for intra-op
    parallelism when several of the job's processes run on it.

    TensorFlow sizes every process's intra-op thread pool to all the
    machine's cores. With P processes on C cores that is P x C threads
    splitting matrix products into pieces for cores that are busy, and each
    pool spins waiting for work: 4 workers and 2 servers on a 2-core
    machine spent 7 % of their CPU spinning there, and the LM example's
    step took 7-22 % less CPU with one intra-op thread per process (see
    docs/benchmarks.md). One process per machine keeps TensorFlow's default."""
    import os
    processes = local_processes(cluster, job, task_index)
    cores = os.cpu_count() or 1
    if processes > 1:
        config.intra_op_parallelism_threads = max(1, cores // processes)
        log.debug("%d of the job's processes on this machine's %d cores: %d intra-op threads",
                  processes, cores, config.intra_op_parallelism_threads)


def start_worker_server(cluster: dict[str, list[str]], worker_index: int,
                        all_workers: bool = False,
                        gpus: tuple[int, ...] | None = None) -> tf.distribute.Server:
    guard_this_process(cluster)   # before the port opens (runtime/firewall.py)
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=WORKER_JOB,
                                    task_index=worker_index, protocol="grpc",
                                    config=session_config(cluster, worker_index, all_workers, gpus),
                                    start=True)
    except (tf.errors.UnknownError, tf.errors.InternalError, tf.errors.AlreadyExistsError) as e:
        address = cluster[WORKER_JOB][worker_index]
        raise LaunchError(f"worker {worker_index} could not start its server on {address}: "
                          f"{e.message}. Is the port taken? Pick another port range in the spec.") from e


def wait_for_peers(addresses: list[str], timeout_s: float) -> None:
    """Block until every address accepts TCP connections, so the first
    collective does not fail on a peer that is still importing TensorFlow."""
    deadline = time.monotonic() + timeout_s
    pending = list(addresses)
    while pending:
        host, _, port = pending[0].rpartition(":")
        try:
            # "[::1]:P" in a cluster: the socket API wants the bare literal.
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise LaunchError(f"peers {', '.join(pending)} did not come up within {timeout_s:.0f} s; "
                              "check that every worker started (see its log) and that the "
                              "addresses in the spec are reachable from this host")
        time.sleep(0.1)
    log.debug("all %d peers are listening", len(addresses))
