"""What the step loop records of its steps: the timeline's traced steps
(runtime/timeline.py) and the chief's measured bytes (runtime/measured.py)."""
from __future__ import annotations

from autopar.runtime.step.hook import RunHook, StepRun


class TimelineHook(RunHook):
    """Traces the steps the worker's runtime.timeline.Recorder asks for (not
    a run the caller traces itself), with an accumulated step's
    micro-batches and drops as spans of their own; hands the events in when
    the Runner closes (`hand_in`, or None)."""

    def __init__(self, recorder, hand_in=None) -> None:
        self.recorder = recorder
        self._hand_in = hand_in

    def before_run(self, run: StepRun) -> None:
        run.trace = (run.is_step and run.options is None and run.run_metadata is None
                     and self.recorder.traced(run.step))

    def after_run(self, run: StepRun) -> None:
        if not run.trace:
            return
        spans = []
        if run.micro is not None:
            for m, (start, latency) in enumerate(zip(run.micro.starts, run.micro.latencies)):
                spans.append(self.recorder.span(f"micro-batch {m}", "micro-batch",
                                                run.started + start,
                                                run.started + start + latency))
            if run.micro.dropped:
                at = run.started + run.micro.update_start
                spans.append(self.recorder.span(f"dropped {run.micro.dropped}", "micro-batch",
                                                at, at))
        self.recorder.record_step(run.step, run.started, run.ended, run.trace_metadata, spans)

    def closed(self) -> None:
        if self._hand_in is not None:
            self._hand_in()


class MeterHook(RunHook):
    """The chief's runtime.measured.Meter: fetches its counts with a step
    (plain steps only: an accumulated step computes its gradients over
    several runs), and summarises when the Runner closes."""

    def __init__(self, meter) -> None:
        self.meter = meter

    def before_run(self, run: StepRun) -> None:
        if run.is_step:
            measure = self.meter.fetches(run.step, run.groups)
            if measure is not None:
                run.fetches["measure"] = measure

    def after_run(self, run: StepRun) -> None:
        if "measure" in run.got:
            self.meter.measured(run.step, run.got["measure"])

    def closed(self) -> None:
        self.meter.close()
