"""A worker's TensorFlow server and session, set up for cross-process collectives."""
from __future__ import annotations

import logging
import socket
import time

import tensorflow as tf

from autopar.common.errors import LaunchError
from autopar.common.roles import SERVER_JOB, WORKER_JOB

tf1 = tf.compat.v1
log = logging.getLogger("autopar.session")

# Collective groups are formed by asking one leader: worker 0 by convention
# (servers are told too, since they share the cluster).
COLLECTIVE_GROUP_LEADER = f"/job:{WORKER_JOB}/replica:0/task:0"


def session_config(worker_index: int, with_servers: bool = False,
                   all_workers: bool = False) -> tf1.ConfigProto:
    config = tf1.ConfigProto()
    config.experimental.collective_group_leader = COLLECTIVE_GROUP_LEADER
    # This worker's session only places ops on itself; peers are reached by the
    # collective ops, not by the session, so it need not wait for servers.
    # With weight-update sharding, optimizer slots live on their owners:
    # the chief initialises, saves and restores them there.
    config.device_filters.append(f"/job:{WORKER_JOB}" if all_workers
                                 else f"/job:{WORKER_JOB}/task:{worker_index}")
    if with_servers:
        config.device_filters.append(f"/job:{SERVER_JOB}")   # variables placed on servers
    return config


def start_worker_server(cluster: dict[str, list[str]], worker_index: int,
                        all_workers: bool = False) -> tf.distribute.Server:
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=WORKER_JOB,
                                    task_index=worker_index, protocol="grpc",
                                    config=session_config(worker_index, SERVER_JOB in cluster,
                                                          all_workers),
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
            with socket.create_connection((host, int(port)), timeout=1.0):
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
