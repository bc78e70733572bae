"""A fork server: import TensorFlow once per job, fork every local process.

Importing TensorFlow and autopar costs 5-6 CPU-seconds per process on this
project's reference machine; a local job of 3 workers and 2 servers paid it
five times before its first step, and the launcher itself once more. The
launcher therefore starts one fork server per job (as early as it can, so the
import overlaps its own compile step) that imports the heavy modules and then,
per request, forks a child that becomes the requested Python command exactly
as ``python script.py args`` / ``python -m module args`` would run it: its own
session, working directory, environment, argv and ``sys.path[0]``, stdin from
/dev/null, stdout and stderr on the pipe the launcher passed with the request.
The child leaves through the interpreter's normal exit (non-daemon threads
joined, exit handlers run, buffers flushed), so its exit status is what the
plain process's would have been.

Only module imports are shared. No TensorFlow context, session, server or
socket exists before the fork; the only threads in the server are OpenBLAS's
idle thread pools, which re-create themselves in a child (pthread_atfork).
The server checks that it holds no Python thread before each fork. NumPy's
global random state is re-seeded in each child, as a fresh process would be
(Python's ``random`` re-seeds itself after fork).

Processes die with their parent: the server with the launcher (it is started
like any child, PR_SET_PDEATHSIG), its children with the server. The server
ignores SIGTERM (runtime/stopping.py: a cluster's stop must not kill the
job's processes through it). Commands that
are not a Python script or module run by the launcher's own interpreter (the
summation server, a different Python, remote hosts) are started directly.
Set AUTOPAR_FORK_SERVER=0 to start every process directly.

Protocol, one message per SOCK_SEQPACKET packet on the socket the launcher
passes as ``--fd``:

    request  {"id": N, "argv": [...], "env": {...}, "cwd": path, "netns": path?}
             with one file descriptor attached (the child's stdout and
             stderr) or two (stdout, stderr); with "netns" the child first
             enters that network namespace (/var/run/netns/NAME)
    replies  READY <pid>              once, after the imports
             FORKED <id> <pid>        the child's pid (it leads its own session)
             FAILED <id> <message>    the fork itself failed
             EXITED <pid> <status>    a child ended (negative: killed by that signal)

The server leaves when the launcher closes its end, killing what is left.

A request may also say ``"spare": true``: the child then first forks a
*spare*, a copy of the server as it was before the child became anything
(its modules imported, nothing run), which waits on a socket of its own. If
the child launches a job, the launcher adopts the spare as that job's fork
server (``ForkServer.adopt_spare``) instead of starting one that imports
everything anew (seconds of CPU on the path to the first step). Adoption is
one request, with the spare's new output descriptor and the job's namespace
descriptors attached:

    adopt    {"env": {...}, "join": [CLONE_NEW* type, ...]}
    replies  ADOPTED <pid>            then READY <pid> after the extra imports
             REFUSED <reason>         started with another LD_PRELOAD than
                                      the job's processes need: not adoptable

Every child of an adopted spare joins those namespaces right after its fork
(a server started for a job was started inside them). A spare nobody adopts
dies with the process it was made for (PR_SET_PDEATHSIG, and the hang-up).

The benchmark harness (bench/run.py) runs its peers from this fork server
too: one per interpreter (its own `python`, its own `--preload` list: the
Horovod peer's virtualenv has TensorFlow 2.12 and no autopar to import),
each child entering its emulated host's namespace, stdout and stderr to
separate files.
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO

# What a fork saves: everything a worker or a server imports (and the
# coordinator's gRPC client, through runtime.worker).
PRELOAD = ("numpy", "tensorflow", "autopar", "autopar.api", "autopar.runtime.worker",
           "autopar.runtime.server_main", "autopar.runtime.runner", "autopar.runtime.session",
           "autopar.transforms.rewrite", "autopar.transforms.compile")

_MAX_PACKET = 1 << 20   # a request carries a child's whole environment

# In the server: the LD_PRELOAD it was started with (the libraries every
# child it forks has loaded), and the namespaces each child joins right
# after its fork as (descriptor, CLONE_NEW* type) once adopted as a spare.
_started_preload = ""
_join_after_fork: list[tuple[int, int]] = []
# In a child forked with "spare": (socket to the spare, its pid, this pid).
_spare: tuple[socket.socket, int, int] | None = None


def forkable(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is what a fork server can become: this interpreter
    running a script file or a module (``-m``), without interpreter options."""
    if len(argv) < 2 or not same_interpreter(argv[0], sys.executable):
        return False
    if argv[1] == "-m":
        return len(argv) >= 3
    return not argv[1].startswith("-") and os.path.isfile(argv[1])



def same_interpreter(command: str, executable: str) -> bool:
    """Whether running ``command`` (a path, or a name looked up on PATH) starts
    the interpreter ``executable`` is, with the same installation: a
    virtualenv's ``python``, ``python3`` and ``python3.11`` are symlinks to
    one binary and are the same interpreter there. Symlinks alone do not
    decide it: a virtualenv's ``python`` resolves to the base installation's
    binary, which run by that path is another environment (no virtualenv's
    packages), so the virtualenv each path belongs to is compared too."""
    found = command if os.sep in command else shutil.which(command)
    return found is not None and _interpreter_identity(found) == _interpreter_identity(executable)


def _interpreter_identity(path: str) -> tuple[str, str | None]:
    """(the binary ``path`` resolves to, the virtualenv it starts or None). As
    Python finds its virtualenv: a pyvenv.cfg beside the path as it was
    named (not resolved) or in the directory above."""
    named = os.path.abspath(path)
    here = os.path.dirname(named)
    venv = next((d for d in (here, os.path.dirname(here))
                 if os.path.isfile(os.path.join(d, "pyvenv.cfg"))), None)
    return os.path.realpath(named), None if venv is None else os.path.realpath(venv)

# ---------------------------------------------------------------------------
# The server (its own process: python -m autopar.runtime.forkserver --fd N)
# ---------------------------------------------------------------------------

# Libraries a training script may import that cost seconds of CPU each
# (Keras 3: ~2.5 s) and start no thread or TensorFlow runtime on import
# (checked: a fork after `import keras` runs TensorFlow normally): preloaded
# when the launching script imported them (env.FORK_PRELOAD).
PRELOAD_IF_IMPORTED = ("keras", "sklearn")


def preload_extras(modules: Mapping[str, object]) -> str:
    """The env.FORK_PRELOAD value for a launcher whose sys.modules is `modules`."""
    return ",".join(name for name in PRELOAD_IF_IMPORTED if name in modules)


def _preload(modules: Sequence[str] | None) -> None:
    """Import `modules` (default: PRELOAD and the extras the launcher asks
    for, env.FORK_PRELOAD)."""
    import importlib
    from autopar.common import env
    if modules is None:
        extras = [m for m in os.environ.get(env.FORK_PRELOAD, "").split(",")
                  if m in PRELOAD_IF_IMPORTED]
        modules = (*PRELOAD, *extras)
    for name in modules:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:   # noqa: BLE001 - whatever its import does
            # A child then imports it itself, as a new process would (and
            # meets the same error there, where it is reported as the child's).
            print(f"fork server: not preloading {name}: {exc!r}", file=sys.stderr, flush=True)
    # Moved out of the collector's generations: the children's collections
    # then do not touch (and copy) the server's pages.
    gc.freeze()


def _serve(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """Fork a child per request until the launcher hangs up. Returns only in
    a child: its request and the descriptors for its output."""
    from autopar.common import procs

    def reply(text: str) -> None:
        try:
            sock.send(text.encode())
        except OSError:
            pass   # the launcher went away; its hang-up ends the loop

    # A cluster stopping the job sends SIGTERM to every process at once; dying
    # of it, this server would take every process it forked along
    # (PR_SET_PDEATHSIG: SIGKILL), the chief's final save with them. It
    # leaves when the launcher hangs up, or dies with the launcher. Each
    # child gets SIGTERM back as a new process has it (die_with_server).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reply(f"READY {os.getpid()}")
    children: set[int] = set()
    # run in each child, right after its fork: SIGINT and SIGTERM as a new
    # process has them, dying with us
    die_with_server = procs.make_preexec()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MAX_PACKET, 2)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            request = json.loads(data)
            if len(fds) not in (1, 2) or threading.active_count() != 1:
                for fd in fds:
                    os.close(fd)
                reply(f"FAILED {request['id']} "
                      + ("no output descriptor" if len(fds) not in (1, 2)
                         else "the server has threads"))
                continue
            # The child says it is set up (own session, dying with us) by
            # closing its end of this pipe: only then is its pid, which the
            # launcher signals as a process group, worth reporting.
            set_up_r, set_up_w = os.pipe()
            try:
                pid = os.fork()
            except OSError as exc:
                for fd in (fds[0], set_up_r, set_up_w):
                    os.close(fd)
                reply(f"FAILED {request['id']} {exc}")
                continue
            if pid == 0:
                sock.close()
                os.close(set_up_r)
                os.setsid()
                die_with_server()
                _join_namespaces()
                os.close(set_up_w)
                return request, fds
            os.close(set_up_w)
            os.read(set_up_r, 1)        # EOF once the child closed its end (or died)
            os.close(set_up_r)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            reply(f"FORKED {request['id']} {pid}")
        reap_exited(children, reply)
    procs.stop_processes([_Reaped(pid) for pid in children], grace_seconds=1.0)
    return None


def _join_namespaces() -> None:
    """In a child just forked by an adopted spare: join the job's
    namespaces (a single-threaded process can join a user namespace)."""
    if not _join_after_fork:
        return
    from autopar.runtime.netns import join
    if not join(_join_after_fork):
        os._exit(126)
    for fd, _ in _join_after_fork:
        os.close(fd)


class _Waitable:
    """``wait`` over a subclass's non-blocking ``poll``, as subprocess.Popen's."""
    pid: int
    returncode: int | None

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status once it ended; subprocess.TimeoutExpired after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


class _Reaped(_Waitable):
    """A child of this process, as procs.stop_processes wants it (and, with
    ``stdout``, as ForkServer keeps its server process)."""

    def __init__(self, pid: int, stdout: IO[bytes] | None = None):
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_spare(request: dict, out_fds: list[int]) -> tuple[dict, list[int]] | None:
    """In a child whose request asked for a spare (module docstring): fork
    it. Returns what this process does next: in the child, its request; in
    the spare, what its own serving returned (a request of its own child,
    or None: leave)."""
    global _spare
    from autopar.common import procs
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    die_with_child = procs.make_preexec()
    pid = os.fork()
    if pid:
        theirs.close()
        _spare = (ours, pid, os.getpid())
        return {**request, "spare": False}, out_fds
    ours.close()
    for fd in set(out_fds):
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):    # none of the child's streams held until adopted
        os.dup2(devnull, fd)
    os.close(devnull)
    os.setsid()
    die_with_child()
    return _wait_adoption(theirs)


def _wait_adoption(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """The spare: wait for the adopt request, then serve like a server
    started for the job. None when it is not adopted (hang-up) or refuses."""
    from autopar.common import procs
    try:
        data, fds, _, _ = socket.recv_fds(sock, _MAX_PACKET, 8)
    except OSError:
        data, fds = b"", []
    if not data or not fds:
        return None
    adopt = json.loads(data)
    output, namespaces = fds[0], fds[1:]
    if adopt["env"].get("LD_PRELOAD", "") != _started_preload:
        sock.send(f"REFUSED started with LD_PRELOAD={_started_preload!r}".encode())
        return None
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    _join_after_fork[:] = list(zip(namespaces, adopt["join"]))
    os.environ.clear()
    os.environ.update(adopt["env"])
    procs.set_title("fork server")
    sock.send(f"ADOPTED {os.getpid()}".encode())
    _preload(None)      # the extras the job's launcher imported (env.FORK_PRELOAD)
    return _serve(sock)


def reap_exited(children: set[int], reply: Callable[[str], None]) -> None:
    """Reap every child that has exited, without waiting: drop it from
    ``children`` and reply "EXITED <pid> <status>" (negative: the signal that
    killed it)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        reply(f"EXITED {pid} {os.waitstatus_to_exitcode(status)}")


def _become(request: dict, out_fds: list[int]) -> None:
    """In the forked child: set up the process the request describes and run
    its command as __main__; the interpreter's normal exit follows."""
    if request.get("netns"):
        from autopar.runtime.netns import enter_named
        enter_named(request["netns"])
    os.dup2(out_fds[0], 1)
    os.dup2(out_fds[-1], 2)
    for fd in set(out_fds):
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # Standard streams as the interpreter makes them for a pipe (PYTHONUNBUFFERED
    # as it would have read it at start-up).
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  line_buffering=unbuffered, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  errors="backslashreplace", line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    import numpy
    numpy.random.seed()     # a fresh process's state, not the server's
    argv = list(request["argv"])
    from autopar.common import procs, script
    script.note(argv, request["cwd"])   # (sys.orig_argv is the fork server's)
    title = procs.role_title(request["env"], argv)
    if title is not None:
        procs.set_title(title, request["env"])
    # `import autopar` ran in the server: apply the child's own settings;
    # a process of a job starts here (autopar/__init__.py).
    from autopar.common import env, quiet
    quiet.quiet_repeats(request["env"])
    if request["env"].get(env.ROLE):
        from autopar.runtime.console import install_excepthook
        install_excepthook()
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]     # runpy sets argv[0] to the module's file
        sys.path[0] = request["cwd"]
        # A preloaded module runs anew as __main__, as in a new process; left in
        # sys.modules, runpy would warn that it "may result in unpredictable
        # behaviour" (a RuntimeWarning at every server start).
        sys.modules.pop(argv[2], None)
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))
        runpy.run_path(argv[1], run_name="__main__")


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the launcher's control socket")
    parser.add_argument("--preload", help="modules to import, comma-separated (default: "
                                          "what a job's processes import)")
    options = parser.parse_args(args)
    from autopar.common import procs
    global _started_preload
    _started_preload = os.environ.get("LD_PRELOAD", "")
    procs.set_title("fork server")
    sock = socket.socket(fileno=options.fd)
    _preload(None if options.preload is None else
             [m for m in options.preload.split(",") if m])
    forked = _serve(sock)
    while forked is not None and forked[0].get("spare"):
        forked = _fork_spare(*forked)
    if forked is None:
        sys.exit(0)
    _become(*forked)


# ---------------------------------------------------------------------------
# The launcher's side
# ---------------------------------------------------------------------------

class ForkedProcess(_Waitable):
    """A child of the fork server, as the launcher uses a subprocess.Popen:
    its pid (also its process group), its output, and poll()."""

    def __init__(self, server: "ForkServer", pid: int, stdout: IO[bytes]):
        self._server = server
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.stdin = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid)
        return self.returncode


class ForkServerError(Exception):
    """The fork server could not start a process (it died, or refused)."""


class ForkServer:
    """The launcher's handle on one fork server process."""

    def __init__(self, env: Mapping[str, str], cwd: str | None = None,
                 ready_timeout_s: float = 300.0, enter: Callable[[], None] | None = None,
                 python: str = sys.executable, preload: Sequence[str] | None = None):
        """``enter``: run in the server between fork and exec (joining the
        job's network namespace: what it forks inherits it). ``python``: the
        interpreter it runs in; ``preload``: the modules it imports (default:
        what a job's processes import)."""
        from autopar.common import procs
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            popen = procs.start_process(
                [python, "-m", "autopar.runtime.forkserver", "--fd", str(theirs.fileno())]
                + ([] if preload is None else ["--preload", ",".join(preload)]),
                env, cwd=cwd, pass_fds=(theirs.fileno(),), enter=enter)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._attach(ours, popen, ready_timeout_s)

    def _attach(self, sock: socket.socket, process: "subprocess.Popen[bytes] | _Reaped",
                ready_timeout_s: float) -> None:
        """Start serving as the handle of the server ``process``, whose
        control socket is ``sock`` and whose output is ``process.stdout``."""
        self.ready_timeout_s = ready_timeout_s
        self._cond = threading.Condition()
        self._forked: dict[int, int | str] = {}
        self._exited: dict[int, int] = {}
        self._ready = False
        self._closed = False
        self._stopping = False
        self._forked_any = False
        self._next_id = 0
        self._tail: deque[str] = deque(maxlen=20)
        self._sock = sock
        self.popen = process
        self.pid = process.pid
        threading.Thread(target=self._read_replies, name="autopar-forkserver", daemon=True).start()
        threading.Thread(target=self._drain_output, name="autopar-forkserver-log",
                         daemon=True).start()

    @classmethod
    def adopt_spare(cls, env: Mapping[str, str], join: Sequence[tuple[int, int]] = (),
                    ready_timeout_s: float = 300.0) -> "ForkServer | None":
        """The spare this process was forked with (module docstring), as a
        job's fork server whose children join the namespaces ``join``
        ((descriptor, CLONE_NEW* type), e.g. PrivateNetwork.descriptors());
        ``env`` is what a server started for the job would get. None when
        there is no spare or it refuses (then start one: ``ForkServer(env)``).
        A spare is adopted once."""
        global _spare
        spare, _spare = _spare, None
        if spare is None or spare[2] != os.getpid():
            return None     # none, or inherited from the process that made it
        sock, pid, _ = spare
        process = _Reaped(pid)
        read_fd, write_fd = os.pipe()
        try:
            socket.send_fds(sock, [json.dumps({"env": dict(env),
                                               "join": [kind for _, kind in join]}).encode()],
                            [write_fd, *(fd for fd, _ in join)])
            ready, _, _ = select.select([sock], [], [], 30.0)
            answer = sock.recv(4096).decode(errors="replace") if ready else "no answer in 30 s"
        except OSError as exc:
            answer = str(exc)
        finally:
            os.close(write_fd)
        if not answer.startswith("ADOPTED"):
            logging.getLogger("autopar.launcher").debug(
                "not adopting the spare fork server (pid %d): %s", pid, answer or "it exited")
            os.close(read_fd)
            sock.close()
            from autopar.common import procs
            procs.stop_processes([process], grace_seconds=1.0)
            return None
        process.stdout = os.fdopen(read_fd, "rb")
        server = cls.__new__(cls)
        server._attach(sock, process, ready_timeout_s)
        return server

    # -- replies -----------------------------------------------------------
    def _read_replies(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            parts = data.decode(errors="replace").split()
            with self._cond:
                if parts[0] == "READY":
                    self._ready = True
                elif parts[0] == "FORKED":
                    pid = int(parts[2])
                    self._forked_any = True
                    self._exited.pop(pid, None)   # a recycled pid: forget the old one
                    self._forked[int(parts[1])] = pid
                elif parts[0] == "FAILED":
                    self._forked[int(parts[1])] = " ".join(parts[2:]) or "fork failed"
                elif parts[0] == "EXITED":
                    self._exited[int(parts[1])] = int(parts[2])
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if not self._stopping and self._forked_any:
            # Its children died with it (PR_SET_PDEATHSIG): say why they did.
            logging.getLogger("autopar.launcher").error(
                "the fork server (pid %d) exited unexpectedly; the processes forked from it "
                "were killed with it. Its last output:\n%s", self.pid,
                self.output_tail() or "(none)")

    def _drain_output(self) -> None:
        stream = self.popen.stdout
        assert stream is not None
        for raw in iter(stream.readline, b""):
            self._tail.append(raw.decode("utf-8", errors="replace").rstrip())
        stream.close()

    def output_tail(self) -> str:
        return "\n".join(self._tail)

    # -- children ----------------------------------------------------------
    def wait_ready(self, timeout_s: float) -> None:
        """Return once the server has imported its modules; ForkServerError
        if it exits or takes longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._ready:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise ForkServerError(
                        "the fork server " + ("exited" if self._closed else
                                              f"is not ready after {timeout_s:.0f} s")
                        + (f"; its output:\n{self.output_tail()}" if self.output_tail() else ""))
                self._cond.wait(min(left, 0.5))

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, *,
              outputs: Sequence[int] | None = None, netns: str | None = None,
              spare: bool = False) -> ForkedProcess:
        """Fork a child that runs ``argv`` (see ``forkable``); raises
        ForkServerError if the server cannot. Its stdout and stderr go to a
        pipe (the returned process's ``stdout``), or to ``outputs`` (one
        descriptor for both, or stdout's and stderr's; the caller keeps and
        closes them). ``netns``: a network namespace it enters first.
        ``spare``: the child gets a spare fork server for a job it launches
        (module docstring)."""
        read_fd, write_fd = os.pipe() if outputs is None else (None, None)
        try:
            with self._cond:
                request_id = self._next_id
                self._next_id += 1
            request = {"id": request_id, "argv": list(argv), "env": dict(env), "cwd": cwd}
            if netns:
                request["netns"] = netns
            if spare:
                request["spare"] = True
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()],
                                [write_fd] if outputs is None else list(outputs))
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone ({exc})") from exc
        except BaseException:
            if read_fd is not None:
                os.close(read_fd)
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)
        deadline = time.monotonic() + self.ready_timeout_s
        with self._cond:
            while request_id not in self._forked and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            answer = self._forked.pop(request_id, None)
        if not isinstance(answer, int):
            if read_fd is not None:
                os.close(read_fd)
            why = answer or ("it exited" if self._closed else
                             f"no answer within {self.ready_timeout_s:.0f} s")
            tail = self.output_tail()
            raise ForkServerError(f"the fork server could not start {argv[1:]}: {why}"
                                  + (f"; its output:\n{tail}" if tail else ""))
        return ForkedProcess(self, answer, None if read_fd is None else os.fdopen(read_fd, "rb"))

    def exit_status(self, pid: int) -> int | None:
        """A child's exit status once it ended. Once the server itself is gone
        its children are dead too (they die with it): an unreported one counts
        as killed."""
        with self._cond:
            if pid in self._exited:
                return self._exited[pid]
            if not self._closed:
                return None
        from autopar.common import procs
        return None if procs.group_exists(pid) and procs.pid_alive(pid) else -9

    def stop(self, grace_seconds: float = 3.0) -> None:
        """Hang up (the server then stops what is left of its children and
        exits) and reap it."""
        from autopar.common import procs
        self._stopping = True
        with self._cond:
            idle = not self._ready and not self._forked_any
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if idle:
            # Still importing (a job stopped at its start): it hears nothing
            # before its imports are done, and has forked nothing to stop.
            procs.stop_processes([self.popen], 0.0)
            return
        try:
            self.popen.wait(timeout=grace_seconds + 2.0)
        except Exception:   # noqa: BLE001 - subprocess.TimeoutExpired: stop it the hard way
            procs.stop_processes([self.popen], grace_seconds)


if __name__ == "__main__":
    # Served by the importable module, not this __main__ copy: a spare's
    # child that launches a job reads its spare from the module's state.
    from autopar.runtime.forkserver import main as serve
    serve()
