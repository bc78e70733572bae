"""The receive window of TensorFlow's connections between a job's processes
(cpp_ops/bind_shim.c, set up by runtime.commands.tcp_window_env): real
TensorFlow workers and a ps in separate processes on 127.0.0.1, started with
the bind shim preloaded as the launcher starts them, move tensors over each
kind of connection; the windows are read back from the kernel (ss).
TensorFlow's gRPC moves a tensor on a connection its receiver opened, so
worker 0's connections to the ps (its pull) and to worker 1, and the ps's
connection to worker 0 (its take of the worker's tensor), must all be
bounded, and the connections the others opened to a process keep the
kernel's own buffers."""
from __future__ import annotations

import re
import subprocess
import sys

from autopar.common import env as envvars
from autopar.common.roles import SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE
from autopar.runtime.commands import bind_shim_path, tcp_window_env
from tests.integration.cluster import REPO, LineReader, child_env, free_ports, survivors

SCRIPT = REPO / "tests" / "integration" / "scripts" / "tcp_window_job.py"
WINDOW = 24 << 10


def _connections(pid: int) -> list[tuple[int, int, int]]:
    """(local port, peer port, receive buffer) of pid's established TCP
    connections; Linux reports twice what SO_RCVBUF set, as "rb"."""
    listed = subprocess.run(["ss", "-Htmnp", "state", "established"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    found = []
    for line, detail in zip(listed, listed[1:]):
        fields = line.split()
        if f"pid={pid}," not in line or len(fields) < 4:
            continue
        buffer = re.search(r"\brb(\d+)", detail)
        if buffer:
            found.append((int(fields[2].rsplit(":", 1)[1]), int(fields[3].rsplit(":", 1)[1]),
                          int(buffer.group(1))))
    return found


def test_connections_between_workers_and_servers_get_the_window(monkeypatch):
    monkeypatch.setenv(envvars.TCP_WINDOW, str(WINDOW))
    w0, w1, ps = ports = free_ports(3)
    cluster = {WORKER_JOB: [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"],
               SERVER_JOB: [f"127.0.0.1:{ps}"]}
    procs = {}
    try:
        for label, job, index, role in (("ps", SERVER_JOB, 0, SERVER_ROLE),
                                        ("w1", WORKER_JOB, 1, WORKER_ROLE),
                                        ("w0", WORKER_JOB, 0, WORKER_ROLE)):
            env = {**child_env(), "LD_PRELOAD": bind_shim_path(),
                   **tcp_window_env(role, cluster, bandwidth_gbps=None)}
            procs[label] = subprocess.Popen(
                [sys.executable, str(SCRIPT), job, str(index), *map(str, ports)], env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
        LineReader(procs["w0"]).wait_for("^MOVED", 180)
        seen = {label: _connections(p.pid) for label, p in procs.items()}
        opened = {(label, peer): rb for label, conns in seen.items()
                  for local, peer, rb in conns if local not in ports}
        assert opened.get(("w0", ps)) == 2 * WINDOW, seen        # the pull
        assert opened.get(("w0", w1)) == 2 * WINDOW, seen        # worker to worker
        assert opened.get(("ps", w0)) == 2 * WINDOW, seen        # the take of a push
        accepted = [rb for conns in seen.values() for local, peer, rb in conns if local in ports]
        assert accepted and 2 * WINDOW not in accepted, seen
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        assert not survivors([p.pid for p in procs.values()])
