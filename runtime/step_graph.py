"""The graph a process of a job trains, from what the program gave
get_runner: a tf.compat.v1 graph (its conditions lowered,
transforms/lower_cond.py), a traced step lifted into one
(transforms/lift.py), or autopar.fit's step, which is traced only where its
graph is needed and taken from the job's plan elsewhere
(transforms/portable_step.py): the process that compiles the plan traces
it and packs it into the plan; a worker that receives the plan takes it."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from autopar.transforms.portable_step import NotPortable, pack, unpack

log = logging.getLogger("autopar")


@dataclass
class DeferredStep:
    """A training step to trace when its graph is needed: `trace` gives its
    ConcreteFunction; `variables` are the tf.Variables it may capture, made
    (before any trace) in an order every process of the job makes alike;
    `made_by_trace` and `remake`, transforms.portable_step.pack's and
    unpack's: what the trace built besides (an optimizer), rebuilt alike in
    a process that takes the graph."""
    trace: Callable[[], object]
    variables: list
    made_by_trace: Callable[[], tuple] | None = None
    remake: Callable[[object], list] | None = None


class StepGraph:
    """What the program gave get_runner, lifted once, when first needed;
    `check` is called with the LiftedGraph (or None) once it is made."""

    def __init__(self, source, check: Callable[[object], None] | None = None) -> None:
        self._source = source
        self._check = check
        self._made = None      # (tf.Graph, its LiftedGraph or None)

    @property
    def traced(self) -> bool:
        """Whether it is a traced step (a tf.function's), whatever it is lifted from."""
        from autopar.transforms.lift import is_traced
        return isinstance(self._source, DeferredStep) or is_traced(self._source)

    def graph(self):
        return self.made()[0]

    def lifted(self):
        return self.made()[1]

    def made(self) -> tuple:
        """(the tf.Graph, the LiftedGraph it was lifted from or None),
        tracing a deferred step here."""
        if self._made is None:
            from autopar.transforms.lift import is_traced, lift
            from autopar.transforms.lower_cond import lowered_graph
            source = self._source
            if isinstance(source, DeferredStep):
                source = source.trace()
            if is_traced(source):
                lifted = lift(source)
                self._made = lifted.graph, lifted
            else:
                self._made = lowered_graph(source), None
            self._checked()
        return self._made

    def _checked(self) -> None:
        if self._check is not None:
            self._check(self._made[1])

    def packed_into(self, compiled):
        """`compiled` (its CompiledPlan) carrying the lifted step, for the
        workers that receive the plan, when the step is deferred and can
        travel; else `compiled` itself."""
        if not isinstance(self._source, DeferredStep):
            return compiled
        try:
            text = pack(self.lifted(), self._source.variables, self._source.made_by_trace)
        except NotPortable as e:
            log.debug("the traced step stays in this process, each worker traces its own: %s", e)
            return compiled
        return replace(compiled, step=text)

    def made_from(self, compiled, who: str) -> tuple:
        """`made()`, taking a deferred step from `compiled` (a plan received
        from the process that compiled it) when it carries one that fits this
        process's variables."""
        if self._made is None and isinstance(self._source, DeferredStep) and compiled.step:
            try:
                lifted = unpack(compiled.step, self._source.variables, self._source.remake)
            except NotPortable as e:
                log.info("%s: tracing the step itself, the plan's does not fit: %s", who, e)
            else:
                log.info("%s: step graph taken from the plan (not traced here)", who)
                self._made = lifted.graph, lifted
                self._checked()
        return self.made()
