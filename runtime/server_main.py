"""A parameter-server process: ``python -m autopar.runtime.server_main``.

Started by the launcher with AUTOPAR_CLUSTER and AUTOPAR_TASK_INDEX in its
environment; it hosts task ``ps:<index>`` of the cluster (the workers place
variables and run ops on it through TensorFlow's gRPC runtime) until stopped.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

from autopar.common import env as envvars
from autopar.common.roles import SERVER_JOB, SERVER_ROLE, process_name
from autopar.runtime import stopping

logger = logging.getLogger("autopar.server")


def _exit_now(code: int) -> None:
    """Leave without interpreter shutdown.

    TensorFlow gives no public way to stop a running tf.distribute.Server, and
    tearing the interpreter down while its gRPC threads are live can hang or
    crash in native destructors; the process has nothing to save, so exit
    directly.
    """
    stopping.exit_now(code)


_sigterm: stopping.SigtermWatch | None = None


def _install_stop_handlers(index: int) -> None:
    """SIGINT stops the server at once. SIGTERM, which a cluster sends to
    every process of a job at once, does at the second (the launcher's, once
    the chief has saved: a ps-mode save reads this server) or PEER_STOP_S
    after the first (runtime/stopping.py)."""
    global _sigterm

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("server %d stopping on %s", index, signal.Signals(signum).name)
        _exit_now(0)

    # signal.signal works only in the main thread; elsewhere the embedding
    # program owns signal handling.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        if _sigterm is None:
            _sigterm = stopping.SigtermWatch(
                f"server {index}", lambda: logger.info(
                    "server %d: SIGTERM: serving on while the chief finishes its step and "
                    "saves; stopping when the job stops, at the latest %.0f s from now", index,
                    stopping.PEER_STOP_S), stopping.PEER_STOP_S, status=0)
            _sigterm.install()


def serve(cluster: dict[str, list[str]], task_index: int) -> None:
    """Host task ``ps:<task_index>`` of ``cluster`` until SIGTERM/SIGINT, which
    end the process with status 0. Returns only if the server stops by itself.

    Used by ``main`` (launcher-started servers) and by processes that join a
    cluster described by TF_CONFIG.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from autopar.common import procs
    procs.set_title(procs.role_title(os.environ, sys.argv) or f"server {task_index}")
    _install_stop_handlers(task_index)
    servers = cluster.get(SERVER_JOB, [])
    if not 0 <= task_index < len(servers):
        raise ValueError(f"server task index {task_index} is out of range for the "
                         f"{len(servers)} servers of the cluster {cluster}")

    import tensorflow as tf  # late: heavy, and not needed for the checks above

    from autopar.runtime.session import COLLECTIVE_GROUP_LEADER, share_cores

    from autopar.runtime.firewall import guard_this_process
    guard_this_process(cluster)   # before the port opens

    config = tf.compat.v1.ConfigProto()
    config.experimental.collective_group_leader = COLLECTIVE_GROUP_LEADER
    share_cores(config, cluster, SERVER_JOB, task_index)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=SERVER_JOB, task_index=task_index,
        protocol="grpc", config=config, start=True)
    logger.info("server %d listening on %s", task_index, servers[task_index])
    _register(task_index, servers[task_index])

    # server.join() blocks in native code, where Python signal handlers cannot
    # run; join in a daemon thread and keep the main thread waiting in Python.
    finished = threading.Event()

    def join() -> None:
        server.join()
        finished.set()

    threading.Thread(target=join, name="autopar-server-join", daemon=True).start()
    while not finished.wait(timeout=1.0):
        pass
    logger.warning("server %d stopped on its own", task_index)


def _register(task_index: int, address: str) -> None:
    """Tell the launcher's job coordinator this server is up (nothing to do
    outside a launched job)."""
    from autopar.runtime.rpc import grpc

    from autopar.runtime.coordinator_client import CoordinatorClient
    client = CoordinatorClient.from_env(SERVER_ROLE, task_index)
    if client is None:
        return
    from autopar.runtime.timeline import clock_part, options_from_env
    if options_from_env() is not None:
        # Its ops' timings in the workers' traces are in its clock.
        from autopar.transforms.keys import TIMELINE_KEY_PREFIX
        lane = process_name(SERVER_ROLE, task_index)
        client.on_clock = lambda offset, rtt: client.publish(TIMELINE_KEY_PREFIX + lane,
                                                             clock_part(lane, offset, rtt))
    try:
        client.register(address)
    except grpc.RpcError as exc:   # the server works without it
        logger.warning("server %d could not register with the job coordinator: %s",
                       task_index, exc)


def main() -> int:
    """Entry point of ``python -m autopar.runtime.server_main``: role from the environment."""
    # The workers' format: the message alone, on stdout (the launcher
    # prefixes every line with the process's name).
    from autopar.runtime.console import setup_logging
    setup_logging()
    index = envvars.current_task_index()
    # Before anything slow (importing TensorFlow takes seconds), so a stop
    # that arrives early is clean too.
    _install_stop_handlers(index)
    try:
        cluster = envvars.current_cluster()
    except (KeyError, ValueError) as exc:
        logger.error("%s is missing or not JSON (%s): runtime.server_main is started by the "
                     "autopar launcher, not by hand", envvars.CLUSTER, exc)
        return 2
    try:
        serve(cluster, index)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    return 1  # a server that stops by itself is a failure of the job


if __name__ == "__main__":
    _exit_now(main())
