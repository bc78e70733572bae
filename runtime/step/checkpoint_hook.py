"""The chief's checkpoints in the step loop: restored once the variables are
initialised, saved every `save_every_steps` training steps and when the
Runner closes (runtime/checkpoint.py does the saving)."""
from __future__ import annotations

import time

from autopar.runtime.step.hook import RunHook, StepRun


class CheckpointHook(RunHook):
    """`timeline`: the worker's runtime.timeline.Recorder, which keeps a save
    with its step's trace, or None."""

    def __init__(self, checkpointer, timeline=None) -> None:
        self.checkpointer = checkpointer
        self._timeline = timeline
        self._runner = None

    def begin(self, runner) -> None:
        self._runner = runner

    def after_create_session(self, session) -> None:
        self.checkpointer.restore(session)

    def after_run(self, run: StepRun) -> None:
        if not run.is_step:
            return
        started = time.time()
        self.checkpointer.maybe_save(self._runner.session, run.step)
        if self._timeline is not None and self.checkpointer.last_saved == run.step:
            # Kept with the step's trace, if the step was traced.
            self._timeline.add(run.step, self._timeline.span("checkpoint save", "checkpoint",
                                                             started, time.time()))

    def end(self, session) -> None:
        if self._runner.steps_run:
            step = self._runner.global_step
            if step != self.checkpointer.last_saved:
                self.checkpointer.save(session, step)
