"""The launcher: start servers and workers, stream their logs, stop them all.

``launch`` is what a user's script becomes when run directly (see
``autopar.get_runner``) and what ``autopar launch`` runs: it allocates ports,
starts one ``runtime.server_main`` per server and re-executes the user's
command once per worker (locally, or over ssh on remote hosts), prefixes and
forwards every line they print, and waits. The job ends when every worker
exited 0; the first failure (a worker exiting non-zero, a server exiting at
all) stops everything and becomes the launcher's exit status.
"""
from __future__ import annotations

import json
import re
import logging
import secrets
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable

import autopar
from autopar.common.addresses import host_address, launcher_host
from autopar.common.errors import LaunchError
from autopar.common import env as envvars
from autopar.common import procs
from autopar.common.roles import SERVER_JOB, SERVER_ROLE, SUMSERVER_ROLE, WORKER_JOB, WORKER_ROLE
from autopar.console import cause_in_output
from autopar.runtime.coordinator import (PHASE_INIT, PHASE_STEP, Coordinator, ProcessState,
                                         failed_phase)
from autopar.runtime.coordinator_client import DEFAULT_LINK_TIMEOUT_S, LINK_TIMEOUT
from autopar.runtime.health import JobMonitor
from autopar.runtime.forkserver import (ForkedProcess, ForkServer, ForkServerError, forkable,
                                        preload_extras)
from autopar.runtime import firewall
from autopar.runtime.netns import (NamespaceUnavailable, PrivateNetwork, answers,
                                   private_network_or_none)
from autopar.runtime.ports import is_bind_failure, is_local_address, reserve_cluster
from autopar.runtime.spec import HostSpec, ResourceSpec, is_loopback_job

logger = logging.getLogger("autopar.launcher")

# The directory holding the autopar package (a source checkout's root, or
# site-packages): put first on every child's PYTHONPATH.
REPO_ROOT = str(Path(autopar.__file__).resolve().parent.parent)

_POLL_SECONDS = 0.1
# How long to wait for a dead process's last output to arrive before
# reporting its log tail (the pipe normally reaches EOF at once).
_DRAIN_SECONDS = 1.0

# A process that could not bind its port before training started makes the
# launcher restart the job on fresh ports, this many attempts in all.
PORT_ATTEMPTS = 4
# Logged by each worker once the chief's initial state reached it
# (runtime/worker.py): from then on training may run, and nothing restarts.
_TRAINING_STARTED = re.compile(r"initial state received from the chief")

# One lock for everything written to sys.stdout, so lines from different
# children never interleave.
_OUTPUT_LOCK = threading.Lock()


# ---------------------------------------------------------------------------
# Commands and environments (pure: unit-testable without starting anything)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ChildPlan:
    """Everything needed to start one server or worker process."""
    role: str                 # WORKER_ROLE, SERVER_ROLE or SUMSERVER_ROLE
    index: int                # task index within the role's job
    address: str              # "host:port" from the cluster
    host: HostSpec
    remote: bool
    command: list[str]        # final argv run locally (ssh ... for remote)
    env: dict[str, str]       # environment of the local process
    cwd: str | None
    # Written to a remote child's ssh stdin once it asks for it (see
    # build_ssh_command): the coordinator token. Never printed.
    stdin_secret: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"


def autopar_env(role: str, index: int, cluster: Mapping[str, list[str]],
                spec: ResourceSpec, *, tty: bool) -> dict[str, str]:
    """The variables telling a child which role it plays (common/env.py)."""
    return {
        envvars.ROLE: role,
        envvars.TASK_INDEX: str(index),
        envvars.CLUSTER: json.dumps(dict(cluster), sort_keys=True),
        envvars.SPEC: json.dumps(spec.to_dict(), sort_keys=True),
        envvars.TTY: "1" if tty else "0",
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ INFO/WARNING chatter, unless the user asked for it.
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }


# Lines TensorFlow prints at import whatever TF_CPP_MIN_LOG_LEVEL says. They say
# nothing about the job, so they are kept in the failure tail but not streamed.
_TF_NOISE = re.compile(r"All log messages before absl::InitializeLog|oneDNN custom operations are on"
                       r"|cpu_feature_guard|rebuild TensorFlow with the appropriate compiler flags")


def new_job() -> dict[str, str]:
    """A new job's id, as the variable every child gets (AUTOPAR_JOB_ID): six
    hex digits in the title of each of its processes (``autopar[id] ...``),
    this launcher's included."""
    job = {envvars.JOB_ID: secrets.token_hex(3)}
    procs.set_title(f"launcher {os.path.basename(sys.argv[0]) if sys.argv else ''}", job)
    logger.info("job %s: its processes show as autopar[%s] in ps", job[envvars.JOB_ID],
                job[envvars.JOB_ID])
    return job


def _prepend_path(entry: str, existing: str | None) -> str:
    parts = [p for p in (existing or "").split(os.pathsep) if p]
    return os.pathsep.join([entry] + [p for p in parts if p != entry])


def local_env(role_env: Mapping[str, str], extra_env: Mapping[str, str] | None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a local child: the launcher's own, then ``extra_env``,
    then the role variables, with the repo root first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env.update(extra_env or {})
    env.update(role_env)
    env["PYTHONPATH"] = _prepend_path(REPO_ROOT, env.get("PYTHONPATH"))
    return env


def remote_env(role_env: Mapping[str, str], extra_env: Mapping[str, str] | None) -> dict[str, str]:
    """Environment set on a remote host's command line.

    Unlike a local child, a remote one does not inherit the launcher's whole
    environment (PATH, HOME, DISPLAY... describe this machine, not that one):
    only ``extra_env``, the role variables and PYTHONPATH, which assumes the
    repository sits at the same path on every host (as Parallax does).
    """
    env = dict(extra_env or {})
    env.update(role_env)
    env["PYTHONPATH"] = _prepend_path(REPO_ROOT, env.get("PYTHONPATH"))
    # Cut off from the launcher, it stops itself (runtime/coordinator_client.py LINK_TIMEOUT).
    env[LINK_TIMEOUT] = os.environ.get(LINK_TIMEOUT, f"{DEFAULT_LINK_TIMEOUT_S:g}")
    return env


# A remote child prints this line when it is ready to read the coordinator
# token from its stdin (terminal echo off); the launcher then writes it.
TOKEN_PROMPT = "autopar: ready for the job token"


def build_ssh_command(host: HostSpec, command: Sequence[str], env: Mapping[str, str], *,
                      default_workdir: str) -> list[str]:
    """The local argv that runs ``command`` with ``env`` on ``host`` over ssh.

    ``-tt`` gives the remote command a terminal, so that when the local ssh
    process is stopped (or killed with the launcher) the remote side gets
    SIGHUP instead of running on orphaned. BatchMode makes a missing key fail
    at once instead of prompting; the keep-alive options turn a dead host into
    an ssh exit (255) within half a minute. If ``ssh.python`` is set it
    replaces a leading ``sys.executable``.

    The coordinator token is secret, so it is not in ``env`` (that is on the
    command line, visible in ``ps`` on both hosts): a POSIX ``sh`` on the
    remote host turns terminal echo off (the token must not come back through
    the terminal into the log), prints TOKEN_PROMPT, reads one line from its
    stdin into AUTOPAR_COORD_TOKEN and then runs ``command`` with stdin from
    /dev/null, as a local child has. The launcher answers the prompt on ssh's
    stdin and closes it. Without a token line (stdin closed) nothing runs.
    """
    ssh = host.ssh
    user = getattr(ssh, "user", None)
    port = getattr(ssh, "port", 22) or 22
    key_file = getattr(ssh, "key_file", None)
    python = getattr(ssh, "python", None)
    workdir = getattr(ssh, "workdir", None) or default_workdir

    remote_argv = list(command)
    if python and remote_argv and remote_argv[0] == sys.executable:
        remote_argv[0] = python
    assignments = [f"{key}={value}" for key, value in env.items()]
    token = envvars.COORD_TOKEN
    script = "; ".join([
        f"cd {shlex.quote(workdir)} || exit 1",
        "stty -echo 2>/dev/null",
        f"echo {shlex.quote(TOKEN_PROMPT)}",
        f"IFS= read -r {token} || exit 1",
        f"export {token}",
        # `exec` so the shell is replaced and signals reach the process.
        f"exec env {shlex.join(assignments)} {shlex.join(remote_argv)} </dev/null",
    ])
    # `sh` whatever the user's login shell is (read/export are POSIX sh).
    remote_cmd = f"exec sh -c {shlex.quote(script)}"

    argv = ["ssh", "-tt",
            "-o", "BatchMode=yes",
            "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3",
            "-p", str(port)]
    if key_file:
        # Passed as written: OpenSSH expands "~" in identity files itself.
        argv += ["-i", key_file]
    destination = f"{user}@{host.address}" if user else host.address
    # "--" ends ssh's options: even a destination that slipped past spec
    # validation cannot be read as one ("-oProxyCommand=...").
    argv += ["--", destination, remote_cmd]
    return argv


def plan_children(spec: ResourceSpec, cluster: Mapping[str, list[str]], argv: Sequence[str],
                  *, extra_env: Mapping[str, str] | None = None, tty: bool = False,
                  cwd: str | None = None, sumservers: Sequence[str] = ()) -> list[ChildPlan]:
    """One ChildPlan per server, then per summation server (``sumservers``,
    one per server, or none), then per worker, in task-index order. With
    summation servers every child gets AUTOPAR_SUMSERVERS."""
    cwd = cwd or os.getcwd()
    server_cmd = [sys.executable, "-m", "autopar.runtime.server_main"]
    jobs: list[tuple[str, list[str], list[HostSpec], list[str]]] = [
        (SERVER_ROLE, list(cluster.get(SERVER_JOB, [])), spec.server_hosts(), server_cmd),
        (SUMSERVER_ROLE, list(sumservers), spec.server_hosts() if sumservers else [], []),
        (WORKER_ROLE, list(cluster[WORKER_JOB]), spec.worker_hosts(), list(argv)),
    ]
    if sumservers:
        extra_env = {**(extra_env or {}), envvars.SUMSERVERS: ",".join(sumservers)}
    plans: list[ChildPlan] = []
    for role, addresses, hosts, command in jobs:
        if len(addresses) != len(hosts):
            raise LaunchError(
                f"the cluster has {len(addresses)} {role} addresses but the spec places "
                f"{len(hosts)} {role}s; this is a bug in port allocation, please report it")
        for index, (address, host) in enumerate(zip(addresses, hosts)):
            if role == SUMSERVER_ROLE:
                # Bound to the spec's address, like the other servers (bind shim).
                command = [sumserver_path(), "--host", host_address(host.address),
                           "--port", address.rpartition(":")[2]]
            role_env = autopar_env(role, index, cluster, spec, tty=tty)
            if is_local_address(host.address):
                plans.append(ChildPlan(role, index, address, host, False, list(command),
                                       local_env(role_env, extra_env), cwd))
            else:
                ssh_cmd = build_ssh_command(host, command, remote_env(role_env, extra_env),
                                            default_workdir=cwd)
                plans.append(ChildPlan(role, index, address, host, True, ssh_cmd,
                                       dict(os.environ), cwd))
    return plans


# ---------------------------------------------------------------------------
# Running children
# ---------------------------------------------------------------------------

@dataclass
class _Child:
    plan: ChildPlan
    popen: subprocess.Popen[bytes] | ForkedProcess
    tail: deque[str]
    tail_lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    bind_failed: bool = False      # said its server could not bind its port
    past_startup: bool = False     # said it received the initial state
    ended_at: float | None = None  # monotonic time its output ended (it exited)

    @property
    def name(self) -> str:
        return self.plan.name

    def answer_token_prompt(self) -> None:
        """Write the secret to the child's stdin and close it (once)."""
        stdin, self.popen.stdin = self.popen.stdin, None
        if stdin is None or self.plan.stdin_secret is None:
            return
        try:
            stdin.write(self.plan.stdin_secret.encode() + b"\n")
            stdin.flush()
        except (OSError, ValueError):
            pass   # it died, or teardown closed the pipe: its exit is reported as usual
        finally:
            try:
                stdin.close()
            except (OSError, ValueError):
                pass

    def tail_text(self) -> str:
        with self.tail_lock:
            return "\n".join(self.tail)


def discard_stdout() -> None:
    """Point this process's stdout at /dev/null, after its reader went away
    (`... | head`). As the Python docs recommend for BrokenPipeError: every
    later write, and the flush at exit of what is still buffered, then
    succeeds silently instead of raising (or printing "Exception ignored ...
    BrokenPipeError" at exit). The job itself goes on and ends normally."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return                      # not a real file (replaced in tests): nothing to redirect
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _write_line(text: str) -> None:
    with _OUTPUT_LOCK:
        out: IO[str] | None = sys.stdout
        if out is None:
            return
        try:
            out.write(text)
            out.flush()
        except BrokenPipeError:
            # Our reader closed its end: stop writing to it, and keep draining
            # the children anyway so they never block on a full pipe.
            discard_stdout()
        except (OSError, ValueError):
            pass  # stdout closed under us: as above, keep draining


def _pump(child: _Child, chief_stopped: threading.Event | None = None,
          quiet: threading.Event | None = None) -> None:
    """Forward a child's output line by line, prefixed with its name.

    Once the chief has said it stopped on request (``chief_stopped``), the
    others' lines only go to their tail: they are the errors of peers whose
    chief went away (a collective aborted), not news for the user. So are
    every process's lines once the launcher has found why the job ends
    (``quiet``): the verdict names them in one line each."""
    prefix = f"[{child.name}] "
    is_chief = child.plan.role == WORKER_ROLE and child.plan.index == 0
    stream = child.popen.stdout
    assert stream is not None
    secret = child.plan.stdin_secret
    try:
        for raw in iter(stream.readline, b""):
            # rstrip "\r" too: remote children write through a pty (ssh -tt).
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if secret is not None:
                if line.strip() == TOKEN_PROMPT:
                    child.answer_token_prompt()
                    continue
                # Should a remote terminal echo it after all, it still goes nowhere.
                line = line.replace(secret, "<token>")
            with child.tail_lock:
                child.tail.append(line)
            if is_bind_failure(line):
                child.bind_failed = True
            elif _TRAINING_STARTED.search(line):
                child.past_startup = True
            if chief_stopped is not None:
                if is_chief and envvars.STOPPED_LINE in line:
                    chief_stopped.set()
                elif not is_chief and chief_stopped.is_set():
                    continue
            if quiet is not None and quiet.is_set():
                continue
            if not _TF_NOISE.search(line):
                _write_line(prefix + line + "\n")
    except (OSError, ValueError):
        pass  # pipe closed under us during teardown
    finally:
        child.ended_at = time.monotonic()
        stream.close()


def _start(plan: ChildPlan, log_tail_lines: int, fork_server: ForkServer | None,
           network: PrivateNetwork | None = None) -> _Child:
    """Start one child: forked by the job's fork server when it can run the
    command (a local Python script or module), else as a new process (in
    the job's private ``network`` when it is local)."""
    if fork_server is not None and not plan.remote and forkable(plan.command):
        try:
            forked = fork_server.start(plan.command, plan.env, plan.cwd)
        except ForkServerError as exc:
            logger.warning("%s; starting %s as a new process instead", exc, plan.name)
        else:
            logger.info("started %s at %s, pid %d (forked)", plan.name, plan.address, forked.pid)
            return _Child(plan, forked, deque(maxlen=max(1, log_tail_lines)))
    try:
        local = not plan.remote
        popen = procs.start_process(plan.command, plan.env, cwd=plan.cwd,
                                    stdin_pipe=plan.stdin_secret is not None,
                                    enter=network.enter if network and local else None,
                                    # the summation server sets no title of its own
                                    argv0=(f"autopar[{plan.env.get(envvars.JOB_ID, '?')}] "
                                           f"{plan.name}"
                                           if local and plan.role == SUMSERVER_ROLE else None))
    except OSError as exc:
        what = "ssh" if plan.remote else plan.command[0]
        raise LaunchError(
            f"could not start {plan.name} on {plan.host.address}: {what}: {exc}. "
            f"Check that {what!r} exists and is executable"
            + (" and that ssh to the host works without a password." if plan.remote else ".")
        ) from exc
    logger.info("started %s at %s, pid %d%s", plan.name, plan.address, popen.pid,
                " (via ssh)" if plan.remote else "")
    return _Child(plan, popen, deque(maxlen=max(1, log_tail_lines)))


def start_fork_server(spec: ResourceSpec, argv: Sequence[str],
                      extra_env: Mapping[str, str] | None = None,
                      network: PrivateNetwork | None = None) -> ForkServer | None:
    """The job's fork server (runtime/forkserver.py), or None when it would
    fork nothing: AUTOPAR_FORK_SERVER=0, no worker or server on this machine,
    or a worker command it cannot run. Start it before compiling, so its
    imports overlap the compile step; the caller stops it after the job."""
    if os.environ.get(envvars.FORK_SERVER, "1") == "0":
        return None
    local = [h for h in spec.hosts if is_local_address(h.address) and (h.workers or h.servers)]
    if not local or not (forkable(argv) or any(h.servers for h in local)):
        return None
    # Each child gets its whole environment with its request; the server's own
    # is what is read at import and at load (LD_PRELOAD), and what a child's
    # /proc/PID/environ shows (the block a process starts with, copied by fork).
    env = local_env({"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")},
                    {**(extra_env or {}), "LD_PRELOAD": _preload_value(),
                     envvars.FORK_PRELOAD: preload_extras(sys.modules)})
    try:
        server = ForkServer(env, enter=network.enter if network else None)
    except OSError as exc:
        logger.warning("could not start the fork server (%s); starting every process anew", exc)
        return None
    logger.debug("fork server started, pid %d", server.pid)
    return server


@dataclass
class _SignalState:
    signum: int | None = None
    count: int = 0

    def handler(self, signum: int, frame: FrameType | None) -> None:
        # Only record: teardown happens in the main loop, and a second Ctrl-C
        # must not interrupt it half-way.
        if self.signum is None:
            self.signum = signum
        self.count += 1


_Handler = Callable[[int, FrameType | None], Any] | int | None


def _current_handlers() -> dict[int, _Handler]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _install_handlers(state: _SignalState) -> dict[int, _Handler]:
    # signal.signal only works in the main thread; elsewhere the caller's
    # own handling (KeyboardInterrupt in the main thread) applies.
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, state.handler)
    return previous


def _restore_handlers(previous: Mapping[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _report_tail(child: _Child, returncode: int | None, pid: int) -> None:
    """Log the end of a failed process's output (its error, in context)."""
    if child.reader is not None:
        # Let the reader catch the last lines the process wrote before it died.
        child.reader.join(timeout=_DRAIN_SECONDS)
    tail = child.tail_text()
    hint = ""
    if child.plan.remote and returncode == 255:
        hint = " (255 is also how ssh reports a connection failure)"
    status = ("has not exited" if returncode is None
              else f"exited with {procs.describe_returncode(returncode)}")
    logger.error("%s (pid %d) %s%s; last lines of its output:\n%s",
                 child.name, pid, status, hint, tail or "(no output)")


def _stop_with_checkpoint(chief: _Child, state: _SignalState, timeout: float,
                          coordinator: Coordinator) -> int:
    """After the launcher's first SIGINT/SIGTERM: ask the chief to finish its
    step, save a checkpoint and exit, while every other process stays up (a
    ps-mode save reads the servers); give up after ``timeout`` s or a second
    signal. The caller then stops everything.

    A local chief gets SIGINT (runtime/runner.py). A signal cannot be sent
    through ssh, so a remote chief is asked through the job coordinator: the
    reply to its next report or heartbeat makes it send itself that SIGINT.
    Children run in their own sessions, so a Ctrl-C typed at the terminal
    reaches only the launcher and the chief is asked exactly once."""
    assert state.signum is not None
    status = 128 + state.signum
    name = signal.Signals(state.signum).name
    if chief.popen.poll() is not None:
        logger.warning("received %s; stopping all processes", name)
        return status
    logger.warning("received %s: the chief stops after its current step, saving a checkpoint if "
                   "checkpoint_dir is set (at most %.0f s; interrupt again to stop at once)",
                   name, timeout)
    if chief.plan.remote:
        coordinator.request_stop(WORKER_ROLE, chief.plan.index)
    else:
        os.kill(chief.popen.pid, signal.SIGINT)
    deadline, said_stopped = time.monotonic() + timeout, None
    while chief.popen.poll() is None and state.count == 1 and time.monotonic() < deadline:
        # Once it said it stopped, its exit is only teardown: do not wait long.
        if said_stopped is None and envvars.STOPPED_LINE in chief.tail_text():
            said_stopped = time.monotonic()
        if said_stopped is not None and time.monotonic() - said_stopped > _DRAIN_SECONDS * 5:
            break
        time.sleep(_POLL_SECONDS)
    if chief.reader is not None and chief.popen.poll() is not None:
        chief.reader.join(timeout=_DRAIN_SECONDS)
    lines = [line for line in chief.tail_text().splitlines() if envvars.STOPPED_LINE in line]
    if lines:
        logger.warning("job stopped on %s: the chief %s", name,
                       lines[-1][lines[-1].index(envvars.STOPPED_LINE):])
    elif state.count > 1:
        logger.warning("interrupted again: stopping all processes now, without a final checkpoint")
    else:
        logger.warning("job stopped on %s; the chief did not save a final checkpoint (%s)", name,
                       "it did not stop within %.0f s" % timeout if chief.popen.poll() is None
                       else f"it exited with {procs.describe_returncode(chief.popen.returncode)}")
    return status


@dataclass
class _Outcome:
    """How the job ended: the launcher's exit status and the verdict, logged
    once every process is stopped, so that it is the launcher's last word."""
    status: int
    verdict: list[str] = field(default_factory=list)
    # A process died, failed or stalled (not a stop asked for, not a usage
    # error): starting the job again may get past it (Config.max_restarts).
    restartable: bool = False


@dataclass
class _Ended:
    """One start of the job, ended: its status; the processes whose port was
    taken (it may start again on fresh ports); whether a restart may get past
    its failure, and the highest global step a worker reported."""
    status: int
    clash: list[ChildPlan] = field(default_factory=list)
    restartable: bool = False
    reached: int = -1


# A failed process that reported its failure gets this long to exit (its
# output ends with the error the verdict names).
_FAILING_EXIT_SECONDS = 5.0
# Failures of peers are collected until none is new for this long (at most _DRAIN_SECONDS).
_SETTLE_SECONDS = 0.3


def _supervise(children: list[_Child], state: _SignalState, stop_timeout: float,
               monitor: JobMonitor, quiet: threading.Event) -> _Outcome:
    """Wait until the job ends; how it ended."""
    workers = [c for c in children if c.plan.role == WORKER_ROLE]
    while True:
        exited = {c.name: rc for c in children if (rc := c.popen.poll()) is not None}
        # First, so a worker that died of a step-count mismatch is reported as one.
        if (verdict := monitor.check(exited)) is not None:
            quiet.set()
            return _Outcome(1, [verdict.message], restartable=True)
        if state.signum is not None:
            return _Outcome(_stop_with_checkpoint(workers[0], state, stop_timeout,
                                                  monitor.coordinator))
        if any(exited.get(c.name, 0) != 0 for c in workers):
            quiet.set()
            return _failure(children, monitor)
        if all(c.name in exited for c in workers):
            return _Outcome(0)
        # A server never exits on its own while workers need it, so even status 0 is a failure.
        if any(c.name in exited for c in children if c.plan.role != WORKER_ROLE):
            quiet.set()
            return _failure(children, monitor)
        time.sleep(_POLL_SECONDS)


def _failure(children: list[_Child], monitor: JobMonitor) -> _Outcome:
    """A process failed: find the first failure (the cause) among every
    failure seen by now, the others being its effects (peers whose
    collectives aborted), and say which process, which error, at which step.

    A worker reports its failure to the coordinator before it exits (an
    uncaught exception, an error closing its Runner: autopar/console.py,
    runtime/coordinator_client.py report_failure), so its peers' failures, which
    it causes only by exiting, come later; a process killed without a word
    failed when its output ended."""
    deadline = time.monotonic() + _DRAIN_SECONDS
    # Processes whose output just ended: wait for their exit status.
    while (any(c.ended_at is not None and c.popen.poll() is None for c in children)
           and time.monotonic() < deadline):
        time.sleep(0.02)
    states = monitor.coordinator.snapshot()

    def failed_at(child: _Child) -> float | None:
        state = states.get(child.name)
        times = [state.failed_at] if state is not None and state.failed_at else []
        rc = child.popen.poll()
        if rc is not None and (rc != 0 or child.plan.role != WORKER_ROLE):
            times.append(child.ended_at or time.monotonic())
        return min(times) if times else None

    failures = sorted(((t, c) for c in children if (t := failed_at(c)) is not None),
                      key=lambda tc: tc[0])
    first = failures[0][1]
    deadline = time.monotonic() + _FAILING_EXIT_SECONDS
    while first.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)   # reported its failure; its error is still to come
    rc = first.popen.poll()
    _report_tail(first, rc, _pid(first, states))
    # Peers failing because of it (a collective aborted) say so within moments.
    seen, deadline = len(failures), time.monotonic() + _DRAIN_SECONDS
    while time.monotonic() < deadline:
        time.sleep(_SETTLE_SECONDS)
        states = monitor.coordinator.snapshot()
        failures = sorted(((t, c) for c in children if (t := failed_at(c)) is not None),
                          key=lambda tc: tc[0])
        if len(failures) == seen:
            break
        seen = len(failures)
    lines = [f"  then {_failure_text(c, states, limit=160)}"
             for _, c in failures if c is not first]
    lines.append(f"job failed: {_failure_text(first, states)}")
    status = procs.exit_status(rc) if rc else 1
    # Status 2 is a usage error (autopar: ...): it would fail again.
    return _Outcome(status, lines, restartable=status != 2)


def _pid(child: _Child, states: Mapping[str, ProcessState]) -> int:
    """The process's own pid (a remote one's as it registered), else the local one."""
    state = states.get(child.name)
    return state.pid if state is not None and state.pid else child.popen.pid


def _failure_text(child: _Child, states: Mapping[str, ProcessState], limit: int = 400) -> str:
    """"worker 1 (pid 42) failed after global step 5: ValueError: boom (status 1)",
    the error cut to ``limit`` characters."""
    rc = child.popen.poll()
    state = states.get(child.name)
    status = "still running" if rc is None else procs.describe_returncode(rc)
    cause = cause_in_output(child.tail_text().splitlines())
    if cause is not None and len(cause) > limit:
        cause = cause[:limit - 3] + "..."
    if cause is None:
        cause = f"{status}, no error in its output" if rc is not None and rc >= 0 else status
    else:
        cause = f"{cause} ({status})"
    return f"{child.name} (pid {_pid(child, states)}) {_when(child, state)}: {cause}"


def _when(child: _Child, state: ProcessState | None) -> str:
    """When a process failed, in training steps (global steps where known)."""
    if child.plan.role != WORKER_ROLE:
        return "failed"
    if state is None or not state.registered:
        return "failed while starting, before training"
    phase = failed_phase(state.phase) or state.phase
    known = state.global_step >= 0 and state.steps_done > 0
    if phase == PHASE_INIT:
        return "failed while starting, before training"
    if phase == PHASE_STEP:
        return (f"failed in global step {state.global_step + 1}" if known
                else f"failed in training step {state.steps_done + 1}")
    if state.steps_done == 0:
        return "failed before its first training step"
    return (f"failed after global step {state.global_step}" if known
            else f"failed after {state.steps_done} training steps")


def _stdout_is_tty() -> bool:
    try:
        return bool(sys.stdout is not None and sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def launch(spec: ResourceSpec, argv: list[str], *, extra_env: dict[str, str] | None = None,
           grace_seconds: float = 3.0, log_tail_lines: int = 30,
           stall_timeout_s: float = 60.0, stop_timeout_s: float = 60.0,
           published: Mapping[str, bytes] | None = None, sumservers: bool = False,
           fork_server: ForkServer | None = None, network: PrivateNetwork | None = None,
           max_restarts: int = 0) -> int:
    """Run ``argv`` once per worker of ``spec`` (plus one server process per
    server) and wait for the job to end. ``published``: values the job
    coordinator serves to every process (Coordinator.publish), e.g. the
    compiled plan. ``sumservers``: also one summation server
    (runtime/autopar_sumserver, the Herring transport) per server, on that
    server's host, and AUTOPAR_SUMSERVERS for every process; like a server,
    one that exits fails the job. ``fork_server``: the one to fork local
    Python processes from (``start_fork_server``; the caller stops it);
    without one ``launch`` starts its own. ``network``: the job's private
    network namespace (``isolate``; the caller closes it), which the fork
    server must have been started in; without one ``launch`` makes its own
    when the spec asks for it. ``max_restarts``: start the job again (every
    process, fresh ports; the chief restores its last checkpoint) after a
    process died, failed or stalled once training had begun, at most this
    many times (Config.max_restarts).

    Returns 0 when every worker exited 0; otherwise the exit status of the
    first process that failed (a signal death N becomes 128+N), 130 after
    Ctrl-C, 143 after SIGTERM (the chief first gets up to ``stop_timeout_s``
    to save a final checkpoint; a second signal stops everything at once).
    Every child is stopped and reaped before this
    returns, whatever the path. Raises LaunchError if a process cannot be
    started (after stopping those that were). A job in which some workers
    wait in a step for ``stall_timeout_s`` for others (0: never), or whose
    workers run different numbers of steps, is ended with status 1.

    Ports stay reserved against other autopar launchers until the job ends
    (runtime/ports.py). If a process reports that its port was taken anyway
    (by another program, after allocation) before any worker received the
    initial state, every process is stopped and the job starts again on
    fresh ports, at most PORT_ATTEMPTS times in all.
    """
    if not argv:
        raise LaunchError("nothing to launch: the worker command is empty")
    if sumservers and envvars.HERRING_TIMEOUT not in os.environ:
        # A push/pull waiting for a slow peer is the coordinator's stall to
        # report (it names the worker); the transport's own timeout is the
        # backstop behind it, for a stalled server.
        timeout = max(60.0, 2 * stall_timeout_s)
        extra_env = {**(extra_env or {}), envvars.HERRING_TIMEOUT: f"{timeout:g}"}
    # The job's own handlers (_launch_plans) stay installed after it ends, so
    # a Ctrl-C during the teardown that follows (coordinator, ports, fork
    # server, namespace) is held, not a KeyboardInterrupt half-way through;
    # the caller's come back last.
    callers_handlers = _current_handlers()
    if envvars.JOB_ID not in (extra_env or {}):
        extra_env = {**(extra_env or {}), **new_job()}
    own_network = network is None and fork_server is None
    own_fork_server = fork_server is None
    try:
        if own_network:
            network = isolate(spec, extra_env)
        extra_env = {**extra_env, **isolation_env(spec, network)}
        if own_fork_server:
            fork_server = start_fork_server(spec, argv, extra_env, network)
        return _launch_restarts(spec, argv, extra_env, fork_server, max_restarts=max_restarts,
                                grace_seconds=grace_seconds, log_tail_lines=log_tail_lines,
                                stall_timeout_s=stall_timeout_s, stop_timeout_s=stop_timeout_s,
                                published=published, sumservers=sumservers, network=network)
    finally:
        _stop_local(fork_server if own_fork_server else None, network if own_network else None)
        _restore_handlers(callers_handlers)


def stop_quietly(fork_server: ForkServer | None, network: PrivateNetwork | None = None) -> None:
    """Stop the fork server and close the private network at the end of a
    job, with Ctrl-C and SIGTERM held back meanwhile: the job is over, and an
    interrupt here would only leave a KeyboardInterrupt traceback (and the
    processes to PR_SET_PDEATHSIG)."""
    previous = _install_handlers(_SignalState())
    try:
        _stop_local(fork_server, network)
    finally:
        _restore_handlers(previous)


def _stop_local(fork_server: ForkServer | None, network: PrivateNetwork | None) -> None:
    try:
        if fork_server is not None:
            fork_server.stop()
    finally:
        if network is not None:
            network.close()


def _launch_restarts(spec: ResourceSpec, argv: list[str], extra_env: dict[str, str],
                     fork_server: ForkServer | None, *, max_restarts: int, **options) -> int:
    """``launch``, started again after a process died, failed or stalled
    once training had begun, at most ``max_restarts`` times: every process
    anew on fresh ports, the chief restoring its last checkpoint."""
    restart = 0
    while True:
        ended = _launch_attempts(spec, argv, extra_env, fork_server, **options)
        if ended.status == 0 or not ended.restartable or restart >= max_restarts:
            if ended.restartable and max_restarts:
                logger.error("no restart left (max_restarts=%d)", max_restarts)
            return ended.status
        restart += 1
        after = f" after global step {ended.reached}" if ended.reached >= 0 else ""
        logger.warning("restart %d of %d%s: every process starts again on fresh ports, and the "
                       "chief resumes from its last checkpoint", restart, max_restarts, after)
        extra_env = {**extra_env, envvars.RESTART: f"{restart}/{max_restarts}/{ended.reached}"}


def _launch_attempts(spec: ResourceSpec, argv: list[str], extra_env: dict[str, str] | None,
                     fork_server: ForkServer | None, *, sumservers: bool, **options) -> _Ended:
    """``launch`` on fresh ports until no process finds its port taken."""
    taken: set[str] = set()   # endpoints that failed to bind, avoided from then on
    for attempt in range(1, PORT_ATTEMPTS + 1):
        with reserve_cluster(spec, avoid=taken, sumservers=sumservers) as reservation:
            ended = _launch_once(spec, reservation.cluster, argv, extra_env=extra_env,
                                 sumservers=reservation.sumservers,
                                 fork_server=fork_server, **options)
        clash = ended.clash
        if not clash:
            return ended
        taken.update(plan.address for plan in clash)
        if attempt < PORT_ATTEMPTS:
            logger.warning("attempt %d of %d: %s could not bind its port (another program took it "
                           "after allocation); restarting every process on fresh ports",
                           attempt, PORT_ATTEMPTS, ", ".join(f"{p.name} ({p.address})" for p in clash))
    logger.error("%d attempts in a row failed because ports were taken during startup; give the "
                 "hosts a 'ports' range that other programs do not use", PORT_ATTEMPTS)
    return ended


def _launch_once(spec: ResourceSpec, cluster: Mapping[str, list[str]], argv: list[str], *,
                 extra_env: dict[str, str] | None, grace_seconds: float,
                 log_tail_lines: int, stall_timeout_s: float,
                 stop_timeout_s: float,
                 published: Mapping[str, bytes] | None = None,
                 sumservers: Sequence[str] = (),
                 fork_server: ForkServer | None = None,
                 network: PrivateNetwork | None = None) -> _Ended:
    """One start of the job on ``cluster``, with its own coordinator."""
    coordinator = _start_coordinator(spec, cluster, len(sumservers), network)
    for key, value in (published or {}).items():
        coordinator.publish(key, value)
    try:
        plans = plan_children(spec, cluster, argv, tty=_stdout_is_tty(), sumservers=sumservers,
                              extra_env={**(extra_env or {}), **_job_env(coordinator, cluster)})
        plans = _give_token(plans, coordinator)
        ended = _launch_plans(plans, grace_seconds, log_tail_lines,
                              JobMonitor(coordinator, stall_timeout_s), stop_timeout_s,
                              fork_server, network)
        ended.reached = max((s.global_step for s in coordinator.snapshot().values()
                             if s.role == WORKER_ROLE), default=-1)
        return ended
    finally:
        coordinator.stop()


def _launch_plans(plans: list[ChildPlan], grace_seconds: float, log_tail_lines: int,
                  monitor: JobMonitor, stop_timeout_s: float,
                  fork_server: ForkServer | None = None,
                  network: PrivateNetwork | None = None) -> _Ended:
    interrupted = False
    state = _SignalState()
    _install_handlers(state)   # left installed for the teardown; ``launch`` restores the caller's
    children: list[_Child] = []
    outcome = _Outcome(1)
    quiet = threading.Event()        # set once the job's end is decided
    try:
        try:
            for plan in plans:
                children.append(_start(plan, log_tail_lines, fork_server, network))
            # Readers start only once every process is forked: preexec_fn runs
            # between fork and exec, best done while this is the only thread.
            chief_stopped = threading.Event()
            for child in children:
                child.reader = threading.Thread(target=_pump, args=(child, chief_stopped, quiet),
                                                name=f"autopar-log-{child.name}", daemon=True)
                child.reader.start()
            probe = _SumserverProbe(children, monitor, network.answers if network else answers)
            try:
                outcome = _supervise(children, state, stop_timeout_s, monitor, quiet)
            finally:
                probe.stop()
        except KeyboardInterrupt:
            # Defensive: our SIGINT handler normally prevents this, but a
            # KeyboardInterrupt from anywhere must still tear the job down.
            logger.warning("interrupted; stopping all processes")
            outcome = _Outcome(128 + signal.SIGINT)
            interrupted = True
    finally:
        if children:
            logger.debug("stopping %d processes", len(children))
            procs.stop_processes([c.popen for c in children], grace_seconds)
            for child in children:
                if child.popen.stdin is not None:   # a token prompt never came
                    child.popen.stdin.close()
                if child.reader is not None:
                    child.reader.join(timeout=_DRAIN_SECONDS)
                elif child.popen.stdout is not None:
                    child.popen.stdout.close()
    status = outcome.status
    if status == 0:
        logger.info("all %d workers finished", sum(c.plan.role == WORKER_ROLE for c in children))
    asked_to_stop = interrupted or state.signum is not None
    started = any(c.past_startup for c in children)
    if status == 0 or asked_to_stop or started:
        clash = []
    else:
        clash = [c.plan for c in children if c.bind_failed]
    if not clash:
        # Last, after every process stopped: the launcher's final lines say why the job ended.
        for line in outcome.verdict:
            logger.error("%s", line)
    return _Ended(status, clash, restartable=outcome.restartable and started and not asked_to_stop)


class _SumserverProbe:
    """Checks every second that each summation server answers (it has no
    coordinator client to send heartbeats): a connection it accepts and
    closes when this side closes. A stopped or hung one still completes the
    connection in the kernel, but never closes it; the coordinator then
    stops hearing from it and the job monitor names it (diagnose)."""

    INTERVAL_S = 1.0
    TIMEOUT_S = 2.0

    def __init__(self, children: Sequence[_Child], monitor: JobMonitor,
                 probe: Callable[[str, float], bool]) -> None:
        self._answers = probe
        self._targets = [c for c in children if c.plan.role == SUMSERVER_ROLE]
        self._coordinator = monitor.coordinator
        self._stop = threading.Event()
        self._thread = None
        for child in self._targets:
            # Its start counts as a sign of life: one stopped before its first
            # probe is named too (it starts in milliseconds; workers take seconds).
            self._heard(child)
        if self._targets:
            self._thread = threading.Thread(target=self._run, name="autopar-sumserver-probe",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            for child in self._targets:
                if child.popen.poll() is None and self._answers(child.plan.address, self.TIMEOUT_S):
                    self._heard(child)

    def _heard(self, child: _Child) -> None:
        pid = 0 if child.plan.remote else child.popen.pid
        self._coordinator.heard_from(SUMSERVER_ROLE, child.plan.index, pid, child.plan.address)


# ---------------------------------------------------------------------------
# Keeping other users off the job's ports (runtime/netns.py, runtime/firewall.py)
# ---------------------------------------------------------------------------

def isolate(spec: ResourceSpec, job_env: Mapping[str, str] | None = None) -> PrivateNetwork | None:
    """The job's private network namespace when the spec's isolation asks for
    one (``auto``: every host on loopback), else None. Start it before the
    fork server, which must live in it; the caller closes it after the job.
    ``job_env``: the job's variables (new_job) its anchor process gets."""
    wanted = spec.isolation == "namespace" or (spec.isolation == "auto" and is_loopback_job(spec))
    if not wanted:
        return None
    if spec.isolation == "namespace":
        try:
            network = PrivateNetwork(job_env)
        except (NamespaceUnavailable, OSError) as exc:
            raise LaunchError(f"the spec asks for network isolation 'namespace', but {exc}; "
                              "use 'firewall' or 'none'") from exc
    else:
        network = private_network_or_none("falling back to firewall rules", job_env)
    if network is not None:
        logger.info("the job runs in a private network namespace: only its own processes reach "
                    "its ports, and they reach no other machine (spec network.isolation: "
                    "'firewall' or 'none' to change that)")
    return network


def isolation_env(spec: ResourceSpec, network: PrivateNetwork | None) -> dict[str, str]:
    """What children need to guard the job's ports outside a private
    namespace: the request for firewall rules (runtime/firewall.py)."""
    if network is not None or spec.isolation == "none":
        return {}
    return {firewall.ENABLE: "1"}


# ---------------------------------------------------------------------------
# Job coordinator and bind shim (runtime/coordinator.py, cpp_ops/bind_shim.c)
# ---------------------------------------------------------------------------

def _start_coordinator(spec: ResourceSpec, cluster: Mapping[str, list[str]],
                       num_sumservers: int = 0, network: PrivateNetwork | None = None) -> Coordinator:
    """The job's coordinator, listening on this machine's address in the spec
    (loopback for a local job), or on a Unix socket for a job in a private
    network namespace (which no TCP port of this side reaches)."""
    host = (network.coordinator_address if network is not None
            else launcher_host([h.address for h in spec.hosts], is_local_address))
    coordinator = Coordinator(host, len(cluster[WORKER_JOB]),
                              len(cluster.get(SERVER_JOB, [])), num_sumservers=num_sumservers)
    coordinator.start()
    return coordinator


def bind_env_value(cluster: Mapping[str, list[str]]) -> str:
    """AUTOPAR_BIND for the shim: "ADDR/PORT" for every endpoint of the job."""
    entries = []
    for addresses in cluster.values():
        for endpoint in addresses:
            host, _, port = endpoint.rpartition(":")
            entries.append(f"{host_address(host)}/{port}")
    return ",".join(dict.fromkeys(entries))


def bind_shim_path() -> str:
    """runtime/libautopar_bind.so, built at install time (built now if missing)."""
    from autopar.runtime import native
    return _built(native.SHIM_NAME, native.build_shim)


def sumserver_path() -> str:
    """runtime/autopar_sumserver, built at install time (built now if missing)."""
    from autopar.runtime import native
    return _built(native.SUMSERVER_NAME, native.build_sumserver)


def _built(name: str, build) -> str:
    """runtime/<name>, building it with ``build`` first if it is missing (a
    checkout used without `make install`); a build failure is a LaunchError."""
    from autopar.runtime import native
    path = native.RUNTIME_DIR / name
    if not path.exists():
        try:
            build()
        except native.BuildError as exc:
            raise LaunchError(str(exc)) from exc
    return str(path)


def _job_env(coordinator: Coordinator, cluster: Mapping[str, list[str]]) -> dict[str, str]:
    """Variables every child gets, the token excepted (see _give_token): where
    the coordinator is, and the bind shim that keeps TensorFlow's servers off
    the wildcard address."""
    return {envvars.COORDINATOR: coordinator.address, envvars.BIND: bind_env_value(cluster),
            "LD_PRELOAD": _preload_value()}


def _preload_value() -> str:
    """LD_PRELOAD of every local child (and the fork server): the bind shim,
    then whatever the launcher's environment preloads."""
    return " ".join(p for p in (bind_shim_path(), os.environ.get("LD_PRELOAD", "")) if p)


def _give_token(plans: list[ChildPlan], coordinator: Coordinator) -> list[ChildPlan]:
    """The plans with the coordinator token: in a local child's environment,
    on a remote child's ssh stdin (its environment is part of the ssh command
    line, see build_ssh_command)."""
    given = []
    for plan in plans:
        if plan.remote:
            plan = replace(plan, stdin_secret=coordinator.token)
        else:
            plan.env[envvars.COORD_TOKEN] = coordinator.token
        given.append(plan)
    return given
