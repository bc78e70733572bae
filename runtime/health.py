"""The job's health, judged in the launcher from the coordinator's process
states: stalls, step-count mismatches, silent servers (JobMonitor, checked by
the launcher's supervision loop)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autopar.common.roles import WORKER_ROLE
from autopar.runtime.coordinator import (HEARTBEAT_S, PHASE_CLOSED, PHASE_INIT, PHASE_OTHER,
                                         PHASE_SCRIPT, PHASE_STEP, RPC_TIMEOUT_S, Coordinator,
                                         ProcessState, failed_phase)


@dataclass(frozen=True)
class Verdict:
    kind: str       # "mismatch" or "stall"
    message: str


def _ran(state: ProcessState) -> int:
    """Steps a worker has run, the one it is inside counted."""
    return state.steps_done + (1 if state.phase == PHASE_STEP else 0)


# A process reports at least every HEARTBEAT_S, each report taking at most
# RPC_TIMEOUT_S: one not heard from for this long has stopped reporting.
SILENT_AFTER_S = 2 * HEARTBEAT_S + RPC_TIMEOUT_S


def _busy(state: ProcessState, now: float) -> bool:
    """Outside a step and still reporting: working (the chief evaluating,
    saving a checkpoint, logging), not stuck. A process that stopped
    reporting (killed, SIGSTOPped, cut off), failed, never registered or
    closed its Runner is not."""
    return (state.registered and state.phase in (PHASE_INIT, PHASE_SCRIPT, PHASE_OTHER)
            and bool(state.heard) and now - state.heard < SILENT_AFTER_S)


def _where(state: ProcessState, now: float, base: int) -> str:
    """Where a process that has not started the step others wait in is."""
    if not state.registered:
        where = "it never registered with the coordinator (still starting, or hung before)"
    elif failed_phase(state.phase) is not None:
        where = f"it failed after {state.steps_done} steps and has not exited"
    elif state.phase == PHASE_INIT:
        where = "it is still initialising"
    elif state.phase == PHASE_STEP:
        where = f"it is inside step {base + _ran(state)}"
    else:
        place = {PHASE_SCRIPT: "in the training script, outside autopar",
                 PHASE_OTHER: "running ops that are not a training step",
                 PHASE_CLOSED: "its Runner is closed"}.get(state.phase, state.phase)
        where = f"it finished step {base + state.steps_done} and is {place}"
    if state.heard and now - state.heard >= SILENT_AFTER_S:
        where += (f" (its last report, {now - state.heard:.0f} s ago: it has stopped reporting, "
                  "so it is stopped, hung or cut off)")
    return where


def _resumed_at(workers) -> int:
    """The global step this start of the job began at (a restarted job's
    restored checkpoint), from any worker that reported its global step; 0
    when none has. Messages name steps by the global step they make, not
    by the steps of this start."""
    return next((s.global_step - s.steps_done for s in workers if s.global_step >= 0), 0)


# A worker inside a step more than a finished worker ran is a mismatch only
# after this long in it: the step a finite dataset's end fails (each worker's
# iterator raises OutOfRangeError) ends on some workers a moment after others
# have closed their Runner. A real mismatch waits forever.
MISMATCH_GRACE_S = 5.0

# Every worker inside one step that none finishes: a slow step or a deadlock
# (a collective whose peers launched it in another order, a server op that
# never completes). Slow steps exist (a first step optimising a large graph),
# so the job is ended only after this many stall timeouts (20 min by default).
HUNG_STEP_FACTOR = 20


def _hung_step(workers, exited, stall_timeout_s: float, now: float) -> Verdict | None:
    live = [s for s in workers if s.name not in exited]
    if not live or any(s.phase != PHASE_STEP for s in live):
        return None
    waited = min(now - s.phase_since for s in live)
    if waited < HUNG_STEP_FACTOR * stall_timeout_s:
        return None
    steps = sorted({_ran(s) + _resumed_at(workers) for s in live})
    return Verdict("stall", (
        f"job stalled: every worker has been inside step {', '.join(map(str, steps))} for "
        f"{waited:.0f} s and none has finished it: an operation of the step never completes "
        f"(a collective deadlock, or a server operation that waits forever).\nEnding the job "
        f"after {HUNG_STEP_FACTOR} x stall_timeout_s = {HUNG_STEP_FACTOR * stall_timeout_s:g} s "
        f"(Config(stall_timeout_s=...) for steps that are legitimately this slow; 0 disables)."))


def diagnose(states: Mapping[str, ProcessState], exited: Mapping[str, int],
             stall_timeout_s: float, now: float, busy_timeout_s: float = 0.0) -> Verdict | None:
    """Why the job cannot go on, or None if nothing is known to be wrong.

    ``exited`` maps the name of each process that has exited to its return
    code. Pure, so it is unit-testable.

    - Mismatch: a worker that finished training (closed its Runner or exited
      0) after N steps while another has been inside step N+1 for
      MISMATCH_GRACE_S, which can never complete without it (or died in
      it). A worker that failed (reported
      PHASE_FAILED) did not finish: its failure is the cause, named by the
      launcher.
    - Silent server: a server or summation server not heard from (heartbeat,
      or the launcher's probe) for ``stall_timeout_s``: stopped, hung or cut
      off, so the steps that need it wait forever.
    - Stall: a worker has waited inside a step for ``stall_timeout_s`` while
      another, stuck (not reporting, failed, never registered), has not
      started that step; or for ``busy_timeout_s`` (0: never) while every
      one that has not started it is busy (outside a step and still
      reporting: the chief evaluating); or every worker has been inside one
      step for HUNG_STEP_FACTOR x ``stall_timeout_s``. Not while a server has
      been quiet for SERVER_QUIET_S: it may be the cause, named once silent.
    """
    workers = sorted((s for s in states.values() if s.role == WORKER_ROLE),
                     key=lambda s: s.index)
    finished = [s for s in workers if s.registered and failed_phase(s.phase) is None
                and (s.phase == PHASE_CLOSED or exited.get(s.name) == 0)]
    for done in finished:
        ahead = [s for s in workers if s is not done and _ran(s) > done.steps_done
                 and ((s.phase == PHASE_STEP and now - s.phase_since >= MISMATCH_GRACE_S)
                      or exited.get(s.name, 0) != 0)]
        if ahead:
            others = ", ".join(f"{s.name} ran {_ran(s)}" for s in ahead)
            how = "has exited" if done.name in exited else "has closed its Runner"
            return Verdict("mismatch", (
                f"mismatched step counts: {done.name} stopped after {done.steps_done} steps, "
                f"{others}. Every worker must run the same number of training steps (a step's "
                f"collectives need all of them); {done.name} {how}. (A finite dataset split by "
                "autopar.shard whose last global batch has fewer examples than there are "
                "workers leaves some workers without it: batch with drop_remainder=True.)"))

    if stall_timeout_s <= 0:
        return None
    if (verdict := _silent_server(states, exited, stall_timeout_s, now)) is not None:
        return verdict
    found = _waiting(workers, exited, stall_timeout_s, now)
    if found is None or _quiet_server(states, exited, now) is not None:
        return None
    step, waiting, stuck = found
    if not stuck:
        return _hung_step(workers, exited, stall_timeout_s, now)
    waited = max(now - s.phase_since for s in waiting)
    busy = all(_busy(s, now) for s in stuck)
    if busy and (not busy_timeout_s or waited < busy_timeout_s):
        return None
    base = _resumed_at(workers)
    lines = []
    for s in stuck:
        pid = f", pid {s.pid}" if s.pid else ""
        lines.append(f"  {s.name}{pid}: has not started step {base + step} for "
                     f"{now - s.phase_since:.0f} s; {_where(s, now, base)}")
    waits = ", ".join(f"{s.name} (in step {base + _ran(s)} for {now - s.phase_since:.0f} s)"
                      for s in waiting)
    names = ", ".join(s.name for s in stuck)
    ending = (f"Ending the job after {busy_timeout_s:g} s of waiting for a busy process "
              "(Config(busy_timeout_s=...); 0: never)." if busy else
              f"Ending the job after {stall_timeout_s:g} s without progress "
              "(Config(stall_timeout_s=...); 0 disables).")
    return Verdict("stall", (
        f"job stalled: {waits} {'waits' if len(waiting) == 1 else 'wait'} for {names} to join "
        f"step {base + step} (a step's collectives need every worker):\n" + "\n".join(lines) +
        f"\n{ending}"))


def _waiting(workers, exited, after_s: float, now: float):
    """(step, the workers inside it for ``after_s`` or more, the live
    workers that have not started it), for the latest step workers wait
    in; None if none waits that long."""
    waiting = [s for s in workers if s.name not in exited and s.phase == PHASE_STEP
               and now - s.phase_since >= after_s]
    if not waiting:
        return None
    step = max(_ran(s) for s in waiting)
    # Only the workers inside that step wait for the others; one inside an
    # earlier step (its last report says so) is among those waited for.
    waiting = [s for s in waiting if _ran(s) == step]
    stuck = [s for s in workers if s.name not in exited
             and not (s.phase == PHASE_STEP and _ran(s) >= step)]
    return step, waiting, stuck


# Workers waiting this share of the stall timeout for others to join a step
# are warned about, before the job is ended at the timeout; while those they
# wait for are busy, again every stall timeout after that.
STALL_WARNING_SHARE = 0.5


def stall_warning(states: Mapping[str, ProcessState], exited: Mapping[str, int],
                  stall_timeout_s: float, now: float,
                  busy_timeout_s: float = 0.0) -> tuple[tuple[int, int], str] | None:
    """((step, round), warning) when workers have waited inside a step for
    half the stall timeout (round 0), or for k more stall timeouts (round
    k) while those they wait for are busy, and others have not started it
    (and no server is quiet, see SERVER_QUIET_S); None otherwise. Pure."""
    if stall_timeout_s <= 0:
        return None
    workers = sorted((s for s in states.values() if s.role == WORKER_ROLE),
                     key=lambda s: s.index)
    found = _waiting(workers, exited, STALL_WARNING_SHARE * stall_timeout_s, now)
    if found is None or not found[2] or _quiet_server(states, exited, now) is not None:
        return None
    step, waiting, stuck = found
    base = _resumed_at(workers)
    step += base
    waited = max(now - s.phase_since for s in waiting)
    names = ", ".join(s.name for s in stuck)
    head = (f"{', '.join(s.name for s in waiting)} {'has' if len(waiting) == 1 else 'have'} "
            f"waited {waited:.0f} s inside step {step} for {names} to join it")
    if not all(_busy(s, now) for s in stuck):
        return (step, 0), (f"{head}; the job is ended as stalled after {stall_timeout_s:g} s "
                           "(Config(stall_timeout_s=...))")
    limit = (f"after {busy_timeout_s:g} s (Config(busy_timeout_s=...); 0: never)"
             if busy_timeout_s else "never for waiting alone (Config(busy_timeout_s=0))")
    where = "; ".join(f"{s.name}: {_where(s, now, base)}" for s in stuck)
    return (step, int(waited / stall_timeout_s - STALL_WARNING_SHARE)), (
        f"{head}; {'it is' if len(stuck) == 1 else 'they are'} busy outside a step and still "
        f"reporting ({where}), so the job waits, warning every {stall_timeout_s:g} s: it is "
        f"ended as stalled {limit}, or {stall_timeout_s:g} s after "
        f"{'it stops' if len(stuck) == 1 else 'one stops'} reporting")


# A server is declared silent after the stall timeout, but never sooner than
# this: a few missed heartbeats of a busy machine are not a stopped server.
SERVER_SILENCE_MIN_S = 10.0


# A server not heard from for this long has missed several heartbeats
# (every HEARTBEAT_S) or launcher probes (every second): while one is that
# quiet, workers that wait may wait for it (a worker blocked reading a server
# variable between steps looks like one that never joined the step), so the
# stall verdict is held until it is heard again or named silent.
SERVER_QUIET_S = 2.0


def _quiet_server(states: Mapping[str, ProcessState], exited: Mapping[str, int],
                  now: float) -> ProcessState | None:
    return next((s for s in states.values()
                 if s.role != WORKER_ROLE and s.registered and s.heard and s.name not in exited
                 and now - s.heard >= SERVER_QUIET_S), None)


def _silent_server(states: Mapping[str, ProcessState], exited: Mapping[str, int],
                   stall_timeout_s: float, now: float) -> Verdict | None:
    """The first server or summation server heard from once and not for
    ``stall_timeout_s`` since (one that exited is the launcher's to report)."""
    silence = max(stall_timeout_s, SERVER_SILENCE_MIN_S)
    for s in sorted(states.values(), key=lambda s: (s.role, s.index)):
        if (s.role == WORKER_ROLE or not s.registered or not s.heard or s.name in exited
                or now - s.heard < silence):
            continue
        pid = f" (pid {s.pid})" if s.pid else ""
        where = f" on {s.address}" if s.address else ""
        return Verdict("server", (
            f"{s.name}{pid}{where} stopped answering: nothing heard from it for "
            f"{now - s.heard:.0f} s (stopped, hung, or cut off from this machine), so every step "
            f"that needs it waits forever. Ending the job after {silence:g} s "
            f"(Config(stall_timeout_s=...); 0 disables)."))
    return None


class JobMonitor:
    """Checked by the launcher's supervision loop: the verdict ending the job
    on a stall, a step-count mismatch or a silent server; before a stall
    ends the job, a warning (logged once per step and round, and counted by
    the coordinator, which tells the workers: the chief's TensorBoard
    scalar)."""

    def __init__(self, coordinator: Coordinator, stall_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 busy_timeout_s: float = 0.0) -> None:
        self.coordinator = coordinator
        self.stall_timeout_s = stall_timeout_s
        self.busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._warned: set[tuple[int, int]] = set()

    def check(self, exited: Mapping[str, int]) -> Verdict | None:
        states, now = self.coordinator.snapshot(), self._clock()
        verdict = diagnose(states, exited, self.stall_timeout_s, now, self.busy_timeout_s)
        if verdict is None:
            warning = stall_warning(states, exited, self.stall_timeout_s, now, self.busy_timeout_s)
            if warning is not None and warning[0] not in self._warned:
                self._warned.add(warning[0])
                self.coordinator.count_stall_warning()
                logging.getLogger("autopar.launcher").warning("%s", warning[1])
        return verdict


