"""The interface of the step loop's hooks, in the manner of
tf.train.SessionRunHook, and what one run tells them.

A Runner calls its hooks in their order for `begin`, `after_create_session`,
`after_start` and `before_run`, and in the reverse order for `after_run`,
`end` and `closed`: each hook wraps the ones after it (the coordinator's
report of a run is the outermost: it is told of a run before anything else
happens and after everything else is done). runtime/step/hooks.py puts the
hooks in that order."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MicroBatchTimes:
    """How an accumulated training step ran (runtime/step/executor.py): each
    computed micro-batch's start (seconds after the step's) and latency (its
    compute time and DropCompute's simulated delay), and the update's."""
    planned: int                 # micro-batches the step computes at most
    starts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    compute_s: float = 0.0       # the latencies' sum
    update_start: float = 0.0    # seconds after the step's start
    step_s: float = 0.0          # the whole step
    apply_s: float = 0.0         # the update's run
    dropped: int = 0             # micro-batches a compute threshold dropped

    @property
    def computed(self) -> int:
        return len(self.latencies)


@dataclass
class StepRun:
    """One run of the Runner, as its hooks see it. Before the run: whether it
    is a training step, the global step (for a training step the one it
    makes, else the one reached), the train groups it updates; a hook may
    ask for fetches (`fetches`, run with a plain step only) and for the step
    to be traced (`trace`). After it: the values fetched for the loop and the
    hooks (`got`), the step's examples, its wall-clock span and trace, and,
    for an accumulated step, its micro-batches' times."""
    is_step: bool
    step: int
    index: int = 0                   # training steps this Runner ran before this one
    groups: set[int] = field(default_factory=set)
    options: object = None           # the caller's RunOptions / RunMetadata: a run
    run_metadata: object = None      #   the caller traces is not traced again
    fetches: dict = field(default_factory=dict)
    trace: bool = False
    got: dict = field(default_factory=dict)
    examples: int | None = None
    started: float = 0.0             # time.time() at the step's start and end
    ended: float = 0.0
    trace_metadata: object = None    # the RunMetadata of a traced step
    micro: MicroBatchTimes | None = None


class RunHook:
    """A part of the step loop that acts around runs (module docstring). Every
    method does nothing unless a hook overrides it."""

    def begin(self, runner) -> None:
        """The Runner was made (not started yet)."""

    def after_create_session(self, session) -> None:
        """The variables were initialised; the chief's state is not yet
        given to the other replicas."""

    def after_start(self, first_step: int) -> None:
        """Training (re)starts from global step `first_step`."""

    def before_run(self, run: StepRun) -> None:
        """Before a run (`run.is_step`: a training step)."""

    def after_run(self, run: StepRun) -> None:
        """After a run that succeeded."""

    def end(self, session) -> None:
        """The Runner closes; its session is still open."""

    def closed(self) -> None:
        """The Runner closed its session: its last act."""
