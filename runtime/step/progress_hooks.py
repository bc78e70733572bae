"""What the step loop says of its steps: the chief's progress log
(runtime/progress.py), the reports to the job coordinator
(runtime/coordinator_client.py), and the warning of a step whose batch is
not the size of the worker's first."""
from __future__ import annotations

import logging

import numpy as np

from autopar.runtime.step.hook import RunHook, StepRun

log = logging.getLogger("autopar.runner")


class ProgressLogHook(RunHook):
    """Every training step to a runtime.progress.Progress (the chief's)."""

    def __init__(self, progress) -> None:
        self.progress = progress

    def after_run(self, run: StepRun) -> None:
        if run.is_step:
            loss = float(np.mean(run.got["loss"])) if "loss" in run.got else None
            self.progress.step(run.step, loss, run.examples)


class CoordinatorReportHook(RunHook):
    """Every run, and the Runner's closing, to the launcher's job coordinator
    through the process's runtime.coordinator_client.ProgressHook."""

    def __init__(self, reports) -> None:
        self.reports = reports

    def after_start(self, first_step: int) -> None:
        # Known from here on: a restarted job's stall messages name global
        # steps (runtime/health.py).
        self.reports.global_step = first_step

    def before_run(self, run: StepRun) -> None:
        self.reports.before_run(run.is_step)

    def after_run(self, run: StepRun) -> None:
        self.reports.after_run(run.is_step, run.step)

    def closed(self) -> None:
        self.reports.closed()


class UnequalBatchHook(RunHook):
    """Warn, once, when a training step's batch is not the size of this
    worker's first: workers' gradients of a loss averaged over each one's
    batch are combined with equal weights, which is one device's mean over
    the step's examples only when every worker's batch of the step has the
    same size (a dataset's last, partial batch, split over the workers, may
    not). A worker cannot see the others' sizes without another exchange in
    every step, so it says what it sees (not where the gradients combine
    exactly whatever the sizes: Runner.combines_unequal_batches, nor where
    the caller splits every batch into equal shares: Runner.equal_shares)."""

    def __init__(self) -> None:
        self._runner = None
        self._first_batch: int | None = None
        self._warned = False

    def begin(self, runner) -> None:
        self._runner = runner

    def after_run(self, run: StepRun) -> None:
        runner, examples = self._runner, run.examples
        if (not run.is_step or examples is None or runner.num_workers == 1
                or runner.equal_shares or runner.combines_unequal_batches()):
            return
        if self._first_batch is None:
            self._first_batch = examples
        elif examples != self._first_batch and not self._warned:
            self._warned = True
            log.warning(
                "worker %d: training step %d had %d examples where its first had %d. Each "
                "worker's gradients of the loss, a mean over its own batch, are averaged with "
                "equal weights: if the %d workers' batches of a step differ in size (a "
                "dataset's last, partial batch split over them), that step is not one device's "
                "mean over their examples (autopar weighs each worker's gradients by its batch's "
                "size when the graph leaves that size unknown, without micro-batches). Batch "
                "with drop_remainder=True after autopar.shard, or give every worker equally "
                "many examples, to train as one device does (warned once)", runner.worker_index,
                run.step, examples, self._first_batch, runner.num_workers)
