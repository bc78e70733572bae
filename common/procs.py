"""Starting and stopping child processes so that none outlives the launcher
(the benchmark harness tears its processes down with the same code).

Every child runs in its own session (hence its own process group), so that

- a Ctrl-C typed at the terminal reaches only the launcher, which then stops
  the children in order instead of every process dying at once, and
- stopping a child also stops whatever it started (a shell, ssh, a helper),
  by signalling the whole group.

On Linux each child also asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), which covers the one path no ``finally`` can: the
launcher itself being SIGKILLed. And it gets SIGINT and SIGTERM as a new
process has them, whatever the launcher (or the fork server, which ignores
SIGTERM) had.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

logger = logging.getLogger("autopar.procs")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def libc_function(name: str) -> Callable[..., int] | None:
    """A function of the C library, looked up now (in the parent), or None
    off Linux or where it is missing.

    Preexec functions run between fork and exec, where loading a library
    (dlopen takes locks another thread of the parent may have held at fork
    time) is not safe; calling an already resolved function is.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols, the C library's among them. (Not
        # ctypes.util.find_library("c"): it runs /sbin/ldconfig, a fork at
        # import time, where a Ctrl-C became a traceback.)
        libc = ctypes.CDLL(None, use_errno=True)
        return getattr(libc, name)
    except (OSError, AttributeError):
        logger.debug("%s unavailable in the C library", name)
        return None


_PRCTL = libc_function("prctl")   # None: children will not die with the launcher


def make_preexec(death_signal: int = signal.SIGKILL,
                 then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A preexec_fn that gives the child SIGINT and SIGTERM as a new
    process has them, makes it receive ``death_signal`` when the launcher
    dies, then calls
    ``then`` (e.g. entering the job's network namespace, runtime/netns.py).
    The fork server runs it in each child right after its fork.

    SIGINT: a process started with it ignored (``nohup ... &`` from a script)
    passes the ignore on through fork and exec, and a chief that ignores
    SIGINT never hears the launcher's request to stop after its step and
    save (runtime/step/stop.py). The launcher handles its own SIGINT either way.

    The death signal is tied to the *thread* that forked the child, so
    processes must be started from a thread that lives as long as they do
    (the launcher starts them from its calling thread and stops them before
    returning).
    """
    prctl = _PRCTL
    parent_pid = os.getpid()

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
            # The parent may have died between fork and prctl, in which case
            # the signal will never come: we have been re-parented already.
            if os.getppid() != parent_pid:
                os._exit(1)
        if then is not None:
            then()

    return preexec


def start_process(command: Sequence[str], env: Mapping[str, str],
                  cwd: str | None = None, *, stdin_pipe: bool = False,
                  pass_fds: Sequence[int] = (),
                  enter: Callable[[], None] | None = None,
                  argv0: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` in a new session with stdin closed (a pipe from us
    with ``stdin_pipe``) and stdout+stderr merged into one pipe, dying with
    its parent on Linux. ``pass_fds``: descriptors the child inherits.
    ``enter``: called in the child before exec (make_preexec). ``argv0``:
    what the child's command line starts with instead of the program's
    path (its title in ps, for programs that cannot set one)."""
    return subprocess.Popen(
        [argv0, *command[1:]] if argv0 else list(command),
        executable=command[0] if argv0 else None,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=make_preexec(then=enter),
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def exit_status(returncode: int) -> int:
    """Map a Popen return code to a shell-style exit status (signal N → 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: int) -> str:
    """``status 3`` or ``status 137 (killed by SIGKILL)``, for log messages."""
    if returncode >= 0:
        return f"status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"status {exit_status(returncode)} (killed by {name})"


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        # Only happens if the id was reused by someone else's group: not ours.
        return False


def group_exists(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs. A zombie counts as gone: it has exited, and in a
    container without an init reaper it may stay unreaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class Stoppable(Protocol):
    """What stop_processes needs of a process: its pid, which is also its
    process group id (it leads its own group), and a non-blocking poll that
    returns its exit status once it has exited (subprocess.Popen is one)."""
    pid: int

    def poll(self) -> int | None: ...


def _wait_all(procs: Sequence[Stoppable], seconds: float) -> None:
    """Poll until every process has exited or ``seconds`` have passed."""
    deadline = time.monotonic() + max(0.0, seconds)
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


# A job's workers and servers take a first SIGTERM as a request to stop once
# the chief has saved (runtime/stopping.py): a cluster sends it to every
# process of a job at once. The second, this long after the first, ends them.
SECOND_SIGTERM_S = 0.2


def stop_processes(procs: Sequence[Stoppable], grace_seconds: float,
                   reap_timeout: float = 5.0) -> None:
    """Stop every process (and its process group): SIGTERM, a second
    SIGTERM to those still running SECOND_SIGTERM_S later, up to
    ``grace_seconds`` in all to exit, then SIGKILL; wait up to
    ``reap_timeout`` for them all (a Popen is reaped by its poll).

    Groups whose leader has already exited are signalled too, since something
    the leader started may still be in them; a caller that keeps processes
    long after they exited (their pids may have been reused) passes only the
    running ones.
    """
    for proc in procs:
        _signal_group(proc.pid, signal.SIGTERM)
    first = min(grace_seconds, SECOND_SIGTERM_S)
    _wait_all(procs, first)
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)

    _wait_all(procs, grace_seconds - first)

    for proc in procs:
        if proc.poll() is None or group_exists(proc.pid):
            # (no grace: the caller meant to kill it, which is not news to
            # the user; a warning there came before a refused job's reason)
            if proc.poll() is None and grace_seconds > 0:
                logger.warning("pid %d did not stop within %.1f s of SIGTERM; killing it",
                               proc.pid, grace_seconds)
            _signal_group(proc.pid, signal.SIGKILL)

    _wait_all(procs, reap_timeout)
    for proc in procs:
        if proc.poll() is None:
            # SIGKILL cannot be ignored; this means the process is stuck in
            # the kernel (e.g. uninterruptible I/O). Nothing more we can do.
            logger.error("pid %d survived SIGKILL for %.1f s", proc.pid, reap_timeout)


_fast_exit_registered = False


def skip_final_gc_at_exit() -> None:
    """At interpreter exit, skip the garbage-collection passes over every
    object still alive.

    A process that imported TensorFlow holds a few hundred thousand objects,
    and collecting them at shutdown takes about a second (measured here with
    nothing but ``import tensorflow``: 0.9-1.5 s from the last line to the
    process's end, 0.13 s with this). A job ends only when all its workers
    have exited, and then the launcher exits too, so every job paid it twice.
    gc.freeze() in an exit handler moves the objects to the permanent
    generation, which the collections at shutdown leave alone; the memory goes
    back to the OS with the process. Objects kept alive only by reference
    cycles are then not finalised at exit, which CPython does not promise
    anyway. Exit handlers registered later run before this one (atexit is
    last-in, first-out). Registered once per process."""
    global _fast_exit_registered
    if not _fast_exit_registered:
        atexit.register(gc.freeze)
        _fast_exit_registered = True


# ---------------------------------------------------------------------------
# Process titles: what `ps` and `top` show for each process of a job
# ---------------------------------------------------------------------------

def set_title(what: str, environ: Mapping[str, str] | None = None) -> None:
    """Show this process as ``autopar[JOB] what`` (JOB: AUTOPAR_JOB_ID).

    setproctitle rewrites the argv area. With SPT_NOENV it leaves the
    environment block alone, so /proc/PID/environ still shows what the
    process started with; a title longer than the original command line is
    cut to its length. Without the package the title stays as it was."""
    environ = os.environ if environ is None else environ
    os.environ.setdefault("SPT_NOENV", "1")   # read when setproctitle is imported
    try:
        import setproctitle
    except ImportError:
        logger.debug("setproctitle is not installed: process titles unchanged")
        return
    from autopar.common import env as envvars
    setproctitle.setproctitle(f"autopar[{environ.get(envvars.JOB_ID, '?')}] {what}")


def role_title(environ: Mapping[str, str], argv: Sequence[str]) -> str | None:
    """The title of a process the launcher started in a role
    (``worker 1/3 train.py``, ``server 0/2``), from its environment; None
    outside a launched job."""
    from autopar.common import env as envvars
    from autopar.common.roles import SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE
    role, index = environ.get(envvars.ROLE), environ.get(envvars.TASK_INDEX, "0")
    if role not in (WORKER_ROLE, SERVER_ROLE):
        return None
    try:
        cluster = json.loads(environ.get(envvars.CLUSTER, "{}"))
    except ValueError:
        cluster = {}
    count = len(cluster.get(WORKER_JOB if role == WORKER_ROLE else SERVER_JOB, []))
    title = f"{role} {index}/{count}"
    script = next((os.path.basename(a) for a in argv if a.endswith(".py")), "")
    return f"{title} {script}" if role == WORKER_ROLE and script else title
