"""SIGTERM in a job's processes: a request to stop, not a kill.

Clusters stop a job by sending SIGTERM to every one of its processes at once
(Slurm at the time limit and on scancel, systemd stopping a unit, Kubernetes
deleting a pod), then SIGKILL after a grace period: 30 s by default
(Kubernetes' terminationGracePeriodSeconds, Slurm's KillWait). The chief
can save a checkpoint at the step it is in only if that step can finish,
which needs every other worker, and in ps mode the servers for the save too;
a process that died at the first SIGTERM took that step with it. So:

- the chief stops after the training step it is in, saving a checkpoint
  (runtime/step/stop.py), and exits with status 143; if it has not left
  CHIEF_STOP_S after the SIGTERM (a peer hangs), it exits then, unsaved;
- every other worker and every server keeps running, and exits at once at
  its second SIGTERM (the launcher's, once the chief has stopped:
  common/procs.py stop_processes sends two), at the latest PEER_STOP_S after
  the first (a job joined without the launcher, whose chief went away);
- the launcher waits at most CHIEF_STOP_S for the chief
  (runtime/launcher.py); the fork server ignores SIGTERM, since its death
  kills what it forked (runtime/forkserver.py).

Everything is over within PEER_STOP_S, inside a 30 s grace period.

A Python signal handler runs only when the main thread is between bytecodes,
never while it waits in a TensorFlow step; the second SIGTERM must end a
worker waiting in a collective all the same. The handler's C half writes
each signal's number to a pipe (signal.set_wakeup_fd), and a thread reading
that pipe acts on it at once.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("autopar.stopping")

GRACE_S = 30.0           # what clusters give by default between SIGTERM and SIGKILL
CHIEF_STOP_S = 20.0      # the chief's bound to finish its step and save
PEER_STOP_S = 25.0       # other workers' and servers' bound after their first SIGTERM
TERM_STATUS = 128 + signal.SIGTERM


def exit_now(status: int = TERM_STATUS) -> None:
    """End the process at once, as an unhandled SIGTERM would (no exit
    handlers), its output flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(status)


class SigtermWatch:
    """SIGTERM handling for one process (module docstring): the first calls
    ``first()`` (a stop request: it should not block) and ends the process
    ``bound_s`` later if it still runs; the second ends it at once.

    Installed from the main thread only; ``uninstall`` puts the previous
    SIGTERM handling back (a Runner closed, the script goes on)."""

    def __init__(self, what: str, first: Callable[[], None], bound_s: float,
                 status: int = TERM_STATUS) -> None:
        """``status``: the process's exit status when it ends itself."""
        self._what = what
        self._status = status
        self._first = first
        self._bound_s = bound_s
        self._count = 0
        self._lock = threading.Lock()
        self._previous = None
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._installed = False

    @property
    def received(self) -> bool:
        return self._count > 0

    def install(self) -> bool:
        """False (nothing changed) outside the main thread or where the
        program handles SIGTERM itself."""
        if threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGTERM)
        if previous not in (signal.SIG_DFL, None):
            return False
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:
            old = None
        if old is None or old != -1:
            # The program has a wakeup descriptor of its own (asyncio's): leave
            # it, and act when the main thread runs the handler.
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(read)
            os.close(write)
        else:
            self._pipe = (read, write)
            threading.Thread(target=self._watch, args=(read,), name="autopar-sigterm",
                             daemon=True).start()
        self._previous = previous
        signal.signal(signal.SIGTERM, self._handler)
        self._installed = True
        global _installed, _fork_hook
        _installed = self
        if not _fork_hook:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True
        return True

    def uninstall(self) -> None:
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._installed = False
        global _installed
        if _installed is self:
            _installed = None
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None
                      else signal.SIG_DFL)
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._pipe[1])     # the watching thread reads EOF and ends

    def _handler(self, signum, frame) -> None:
        if self._pipe is None:
            self._received()
        # else: the watching thread has acted on it already

    def _watch(self, read: int) -> None:
        try:
            while data := os.read(read, 64):
                for _ in range(data.count(signal.SIGTERM)):
                    self._received()
        except OSError:
            pass
        finally:
            os.close(read)

    def _received(self) -> None:
        with self._lock:
            self._count += 1
            count = self._count
        if count > 1:
            log.debug("%s: SIGTERM again: exiting now", self._what)   # the launcher's, usually
            exit_now(self._status)
        timer = threading.Timer(self._bound_s, self._too_late)
        timer.daemon = True
        timer.start()
        self._first()

    def _too_late(self) -> None:
        log.warning("%s: still running %.0f s after SIGTERM: exiting now", self._what,
                    self._bound_s)
        exit_now(self._status)


_installed: SigtermWatch | None = None     # the process's watch, while installed
_fork_hook = False


def _after_fork_in_child() -> None:
    """A fork that does not exec (multiprocessing): the child gets SIGTERM
    as a new process has it, and writes none of its signals to the
    parent's pipe."""
    global _installed
    watch, _installed = _installed, None
    if watch is None:
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if watch._pipe is not None:
            signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for fd in watch._pipe or ():
        try:
            os.close(fd)
        except OSError:
            pass
