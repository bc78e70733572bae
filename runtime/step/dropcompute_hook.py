"""DropCompute in the step loop: each accumulated step's record (computed
and dropped micro-batches, latencies), which chooses the threshold and
feeds the drop rate the progress line shows; its summary when the Runner
closes (runtime/dropcompute/worker_state.py)."""
from __future__ import annotations

from autopar.runtime.dropcompute.records import StepRecord
from autopar.runtime.step.hook import RunHook, StepRun


class DropComputeHook(RunHook):
    def __init__(self, dropcompute) -> None:
        self.dropcompute = dropcompute

    def after_run(self, run: StepRun) -> None:
        times = run.micro
        if not run.is_step or times is None:
            return
        self.dropcompute.record(StepRecord(
            step=run.index, computed=times.computed, dropped=times.dropped,
            compute_s=times.compute_s, step_s=times.step_s, apply_s=times.apply_s,
            latencies=times.latencies))

    def closed(self) -> None:
        self.dropcompute.close()
