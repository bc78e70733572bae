"""A fork server per interpreter: import TensorFlow once, fork every peer.

Importing TensorFlow (plus autopar or Horovod) costs about 5 CPU-seconds per
process; a quick benchmark starts ~110 processes on a 2-core machine, which
alone would take over four minutes. The harness therefore starts one fork
server per interpreter (the project's venv, the Horovod venv) that imports
the heavy modules once and then, per request, forks a child that enters the
requested host's network namespace (setns, what `ip netns exec` does) and
runs a peer script exactly as `python <script> <args>` would (runpy,
__main__), with its own session, environment and stdout/stderr files. Only
module imports are shared: no TensorFlow context, session, server or socket
exists before the fork, so every child starts as a fresh process of that host
that happens to have its modules loaded. The server itself opens no socket.

Protocol (one JSON object per line on stdin, replies on stdout):

    request  {"id": ..., "script": path, "args": [...], "env": {...},
              "stdout": path, "stderr": path, "netns": "/var/run/netns/<name>"}
    replies  READY <pid>                 (once, after the imports)
             FORKED <id> <pid>           (the child's pid; it leads its own session)
             FAILED <id> <message>       (the fork itself failed)
             EXITED <pid> <status>       (a child ended; negative = killed by that signal)

The server dies with the harness (PR_SET_PDEATHSIG) and its children die with it.
"""
from __future__ import annotations

import json
import os
import runpy
import select
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autopar.runtime.forkserver import reap_exited  # noqa: E402 - stdlib only, any venv
from bench.peers import common  # noqa: E402


def preload(kind: str) -> None:
    common.quiet_tensorflow()
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401
    from bench.peers import graph_model  # noqa: F401
    if kind == "main":
        import autopar  # noqa: F401
        from autopar import api  # noqa: F401
        from autopar.runtime import launcher, server_main, session, spec, worker  # noqa: F401
        from autopar.transforms import analysis, plan, report, rewrite  # noqa: F401
    elif kind == "horovod":
        import horovod.tensorflow  # noqa: F401
        from horovod.runner.http import http_server  # noqa: F401
    else:
        raise ValueError(f"unknown preload {kind!r}")


def enter_netns(path: str) -> None:
    """Move this (single-threaded, just forked) process into a network namespace."""
    import ctypes
    clone_newnet = 0x40000000
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}) failed")
    finally:
        os.close(fd)


def child(req: dict) -> None:
    """In the forked child: become the peer script. Never returns."""
    code = 1
    try:
        if req.get("netns"):
            enter_netns(req["netns"])
        os.setsid()
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["script"], *req["args"]]
        sys.path[0] = str(Path(req["script"]).parent)
        runpy.run_path(req["script"], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:   # noqa: BLE001 - report and exit non-zero
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        common.exit_now(code)


def serve(kind: str) -> None:
    common.start_watchdog(float(os.environ.get("BENCH_FORKSERVER_DEADLINE_S", "7200")))
    preload(kind)
    out = sys.stdout
    lock = threading.Lock()

    def reply(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    reply(f"READY {os.getpid()}")
    children: set[int] = set()
    buf = b""
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05)
        if ready:
            chunk = os.read(stdin.fileno(), 65536)
            if not chunk:
                break          # the harness closed our stdin: stop serving
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                req = json.loads(line)
                # Python's own threads (the watchdog) are all we may have: a
                # TensorFlow thread here would make the fork unsafe.
                try:
                    pid = os.fork()
                except OSError as exc:
                    reply(f"FAILED {req['id']} {exc}")
                    continue
                if pid == 0:
                    child(req)
                children.add(pid)
                reply(f"FORKED {req['id']} {pid}")
        reap_exited(children, reply)
    # stdin closed: kill what is left and leave
    for pid in list(children):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.05)
    common.exit_now(0)


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "main")
