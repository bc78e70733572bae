"""Running children: start one (forked by the job's fork server, or a new
process), forward its output line by line with its name, keep its tail for
the failure report, and notice what its lines say (a port it could not
bind, training started, the chief stopped on request)."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from autopar.common.quiet import NOISE, verbose as keep_noise
from autopar.runtime.console import write_line
from autopar.common import env as envvars
from autopar.common import procs
from autopar.common.errors import LaunchError
from autopar.common.roles import WORKER_ROLE
from autopar.runtime.commands import SSH, TOKEN_PROMPT, ChildPlan
from autopar.runtime.forkserver import ForkedProcess, ForkServer, ForkServerError, forkable
from autopar.runtime.netns import PrivateNetwork
from autopar.runtime.ports import is_bind_failure

logger = logging.getLogger("autopar.launcher")


# How long to wait for a dead process's last output to arrive before
# reporting its log tail (the pipe normally reaches EOF at once).
DRAIN_SECONDS = 1.0

# Logged by each worker once the chief's initial state reached it
# (runtime/worker.py): from then on training may run, and nothing restarts.
_TRAINING_STARTED = re.compile(r"initial state received from the chief")

# The chief's progress bar (runtime/progress.py, on a terminal with a known
# total): redrawn in place, one line (runtime/console.py write_line).
BAR = re.compile(r"\[[#.]+\] +\d+%  step ")

# TensorFlow's start-up lines (printed at import whatever TF_CPP_MIN_LOG_LEVEL
# says) and C++ INFO/WARNING lines say nothing about the job: kept in the
# failure tail, not streamed, unless AUTOPAR_VERBOSE=1 (common/quiet.py).
_TF_NOISE = NOISE

@dataclass
class Child:
    plan: ChildPlan
    popen: subprocess.Popen[bytes] | ForkedProcess
    tail: deque[str]
    tail_lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    bind_failed: bool = False      # said its server could not bind its port
    past_startup: bool = False     # said it received the initial state
    ended_at: float | None = None  # monotonic time its output ended (it exited)
    lines_read: int = 0            # lines of its output so far
    lines_streamed_upto: int = 0   # lines_read when the last line was streamed to stdout

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

def _write_line(text: str, bar: bool = False) -> None:
    try:
        write_line(text, bar)
    except BrokenPipeError:
        # Our reader closed its end: stop writing to it, and keep draining
        # the children anyway so they never block on a full pipe.
        discard_stdout()
    except (OSError, ValueError):
        pass  # stdout closed under us: as above, keep draining

def pump(child: Child, chief_stopped: threading.Event | None = None,
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
    verbose = keep_noise()
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
                child.lines_read += 1
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
            if verbose or not _TF_NOISE.search(line):
                _write_line(prefix + line + "\n", bar=is_chief and bool(BAR.match(line)))
                child.lines_streamed_upto = child.lines_read
    except (OSError, ValueError):
        pass  # pipe closed under us during teardown
    finally:
        child.ended_at = time.monotonic()
        stream.close()

def start_child(plan: ChildPlan, log_tail_lines: int, fork_server: ForkServer | None,
           network: PrivateNetwork | None = None) -> Child:
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
            return Child(plan, forked, deque(maxlen=max(1, log_tail_lines)))
    try:
        local = not plan.remote
        popen = procs.start_process(plan.command, plan.env, cwd=plan.cwd,
                                    stdin_pipe=plan.stdin_secret is not None,
                                    enter=network.enter if network and local else None,
                                    # a native helper sets no title of its own
                                    argv0=(f"autopar[{plan.env.get(envvars.JOB_ID, '?')}] "
                                           f"{plan.name}"
                                           if local and not plan.titled else None))
    except OSError as exc:
        what = plan.command[0]
        raise LaunchError(
            f"could not start {plan.name} on {plan.host.address}: {what}: {exc}. "
            f"Check that {what!r} exists and is executable"
            + (" and that ssh to the host works without a password." if plan.via == SSH else ".")
        ) from exc
    logger.info("started %s at %s, pid %d%s", plan.name, plan.address, popen.pid,
                f" (via {plan.via})" if plan.remote else "")
    return Child(plan, popen, deque(maxlen=max(1, log_tail_lines)))

def report_tail(child: Child, returncode: int | None, pid: int) -> None:
    """Log the end of a failed process's output (its error, in context)."""
    if child.reader is not None:
        # Let the reader catch the last lines the process wrote before it died.
        child.reader.join(timeout=DRAIN_SECONDS)
    with child.tail_lock:
        # Lines streamed already are not printed again (a traceback once).
        unseen = child.lines_read - child.lines_streamed_upto
        tail = "\n".join(list(child.tail)[-unseen:]) if unseen else ""
        said = child.lines_streamed_upto > 0
    hint = ""
    if child.plan.via == SSH and returncode == 255:
        hint = " (255 is also how ssh reports a connection failure)"
    status = ("has not exited" if returncode is None
              else f"exited with {procs.describe_returncode(returncode)}")
    if tail:
        logger.error("%s (pid %d) %s%s; %s lines of its output:\n%s", child.name, pid, status,
                     hint, "the last" if said else "the", tail)
    else:
        logger.error("%s (pid %d) %s%s%s", child.name, pid, status, hint,
                     " (its output is above)" if said else "; it printed nothing")
