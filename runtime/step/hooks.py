"""The hooks of a worker's step loop, in their order (runtime/step/hook.py:
`before_run` in this order, `after_run`, `end` and `closed` in the reverse).
The coordinator's reports wrap everything; a stop is acted on around
everything but them; a step's record (DropCompute's, the measured bytes,
the timeline's trace) is taken before the progress line that shows it and
the checkpoint that follows it. The Runner adds the Python-variable bridge
(runtime/step/python_bridge.py) innermost."""
from __future__ import annotations

from autopar.runtime.step.checkpoint_hook import CheckpointHook
from autopar.runtime.step.dropcompute_hook import DropComputeHook
from autopar.runtime.step.hook import RunHook
from autopar.runtime.step.progress_hooks import (CoordinatorReportHook, ProgressLogHook,
                                                 UnequalBatchHook)
from autopar.runtime.step.stop import StopHook
from autopar.runtime.step.trace_hooks import MeterHook, TimelineHook


def step_hooks(worker_index: int, *, reports=None, checkpointer=None, progress=None,
               timeline=None, hand_in=None, meter=None, dropcompute=None) -> list[RunHook]:
    """`reports`: the process's runtime.coordinator_client.ProgressHook;
    `checkpointer` (runtime/checkpoint.py), `progress` (runtime/progress.py),
    `meter` (runtime/measured.py): the chief's; `timeline`: the worker's
    runtime.timeline.Recorder and `hand_in` how its events leave when the
    Runner closes; `dropcompute`: the worker's DropCompute state when its
    steps accumulate micro-batches. None: not in this job."""
    hooks: list[RunHook] = []
    if reports is not None:
        hooks.append(CoordinatorReportHook(reports))
    hooks.append(StopHook(worker_index, checkpointer))
    if dropcompute is None:
        # (an accumulated step's examples are its micro-batches')
        hooks.append(UnequalBatchHook())
    if checkpointer is not None:
        hooks.append(CheckpointHook(checkpointer, timeline))
    if progress is not None:
        hooks.append(ProgressLogHook(progress))
    if timeline is not None:
        hooks.append(TimelineHook(timeline, hand_in))
    if meter is not None and dropcompute is None:
        # (an accumulated step computes its gradients over several runs)
        hooks.append(MeterHook(meter))
    if dropcompute is not None:
        hooks.append(DropComputeHook(dropcompute))
    return hooks
