"""Stop requests, acted on at a training step's boundary.

A stop request (SIGINT to the chief: Ctrl-C on a single-device run, or the
launcher passing on its own SIGINT/SIGTERM; or SIGTERM, as a cluster sends
it to every process of a job) is acted on at the next step boundary: the
chief saves a final checkpoint (when checkpointing is on) and leaves by
raising TrainingStopped, a SystemExit, so the script's ``with`` and
``finally`` blocks run and no traceback is printed. A second SIGINT raises
KeyboardInterrupt at once; a second SIGTERM ends the process at once. Other
workers train on after a SIGTERM, until the job stops (runtime/stopping.py)."""
from __future__ import annotations

import logging
import signal
import threading

from autopar.common.env import STOPPED_LINE
from autopar.runtime import stopping
from autopar.runtime.step.hook import RunHook, StepRun

log = logging.getLogger("autopar.runner")


class TrainingStopped(SystemExit):
    """Raised by Runner.run once a requested stop has been carried out; exits
    the script with status 128 + the signal that asked (130 for Ctrl-C, 143
    for SIGTERM), as the shell reports them."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(128 + signum)


class StopHook(RunHook):
    """Watches SIGINT (the chief) and SIGTERM from the Runner's making to its
    closing; stops before and after a training step once asked.
    `checkpointer`: the chief's (runtime/checkpoint.py), which saves the
    final checkpoint, or None."""

    def __init__(self, worker_index: int, checkpointer=None) -> None:
        self.worker_index = worker_index
        self._checkpointer = checkpointer
        self.requested = False
        self._signal = signal.SIGINT      # the signal that asked for the stop
        self._previous_sigint = None
        self._sigterm: stopping.SigtermWatch | None = None

    def begin(self, runner) -> None:
        self.session = runner.session
        if self.worker_index == 0:
            self._previous_sigint = self._install_sigint()
        self._sigterm = self._watch_sigterm()

    def before_run(self, run: StepRun) -> None:
        if run.is_step and self.requested:
            self._stop(run.step - 1)

    def after_run(self, run: StepRun) -> None:
        if run.is_step and self.requested:
            self._stop(run.step)

    def end(self, session) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
        if self._sigterm is not None:
            self._sigterm.uninstall()

    def _install_sigint(self):
        # Only where Python lets us (main thread) and the script has not set
        # its own SIGINT handling.
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return None
        return signal.signal(signal.SIGINT, self._on_sigint)

    def _watch_sigterm(self) -> stopping.SigtermWatch:
        """SIGTERM: the chief's stop request, another worker's cue to train
        on until the job stops (runtime/stopping.py)."""
        if self.worker_index == 0:
            watch = stopping.SigtermWatch(
                "the chief", lambda: self._request(signal.SIGTERM), stopping.CHIEF_STOP_S)
        else:
            watch = stopping.SigtermWatch(
                f"worker {self.worker_index}", lambda: log.warning(
                    "worker %d: SIGTERM: training on while the chief finishes its step and "
                    "saves; exiting when the job stops, at the latest %.0f s from now",
                    self.worker_index, stopping.PEER_STOP_S), stopping.PEER_STOP_S)
        watch.install()
        return watch

    def _on_sigint(self, signum, frame) -> None:
        if self.requested and self._signal == signal.SIGINT:
            raise KeyboardInterrupt
        # The launcher passes a SIGTERM it got on as SIGINT: after this
        # process's own SIGTERM, the same request.
        self._request(signal.SIGINT)

    def _request(self, signum: int) -> None:
        """The first stop request, by SIGINT or SIGTERM: the chief stops
        after its current training step (called from a signal handler or
        the SIGTERM watch's thread)."""
        if self.requested:
            return
        self._signal = signum
        self.requested = True
        again = "interrupt again" if signum == signal.SIGINT else "SIGTERM again"
        log.warning("stop requested (%s): stopping after the current training step%s "
                    "(%s to stop at once)", signal.Signals(signum).name,
                    " with a final checkpoint" if self._checkpointer is not None else "", again)

    def _stop(self, step: int) -> None:
        """Stop at global step `step`: save it (when checkpointing) and leave."""
        if self._checkpointer is None:
            where = "no checkpoint_dir is set, nothing was saved"
        else:
            if step != self._checkpointer.last_saved:
                self._checkpointer.save(self.session, step)
            where = f"checkpoint {self._checkpointer.prefix}-{step}"
        log.warning("%s%d; %s", STOPPED_LINE, step, where)
        raise TrainingStopped(self._signal)
