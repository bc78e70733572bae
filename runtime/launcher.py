"""The launcher: start servers and workers, stream their logs, stop them all.

``launch`` is what a user's script becomes when run directly (see
``autopar.get_runner``) and what ``autopar launch`` runs: it allocates ports,
starts one ``runtime.server_main`` per server and re-executes the user's
command once per worker (locally, or over ssh on remote hosts), prefixes and
forwards every line they print, and waits. The job ends when every worker
exited 0; the first failure (a worker exiting non-zero, a server exiting at
all) stops everything and becomes the launcher's exit status.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, Callable

from autopar.common import env as envvars
from autopar.common import procs
from autopar.common.timeouts import NO_TIMEOUT_S, peer_timeout_s
from autopar.common.addresses import launcher_host
from autopar.common.errors import LaunchError
from autopar.common.text import plural
from autopar.common.roles import SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE
from autopar.runtime.console import cause_in_output
from autopar.runtime import firewall
from autopar.runtime.gpus import report_lines
from autopar.runtime.children import DRAIN_SECONDS, Child, pump, report_tail, start_child
from autopar.runtime.commands import (SSH, ChildPlan, give_token, job_env, local_env, new_job,
                                      tf_log_level,
                                      plan_children, preload_value)
from autopar.runtime.coordinator import (PHASE_INIT, PHASE_STEP, Coordinator, ProcessState,
                                         failed_phase)
from autopar.runtime.forkserver import ForkServer, forkable, preload_extras
from autopar.runtime.health import JobMonitor
from autopar.runtime.netns import (NamespaceUnavailable, PrivateNetwork, answers,
                                   private_network_or_none)
from autopar.runtime.outputs import writable_file
from autopar.runtime.ports import is_local_address, reserve_cluster
from autopar.runtime import stopping
from autopar.runtime.spec import HostSpec, ResourceSpec, is_loopback_job
from autopar.runtime.timeline import TimelineOptions, merge as merge_timeline
from autopar.runtime.timeline import write as write_timeline
from autopar.transforms.keys import PLAN_KEY, TIMELINE_KEY_PREFIX
from autopar.transforms.methods.process_kind import PROBE_CONNECT, ProcessKind
from autopar.transforms.methods.process_registry import PROCESS_KINDS, process_kinds

logger = logging.getLogger("autopar.launcher")


_POLL_SECONDS = 0.1

# A process that could not bind its port before training started makes the
# launcher restart the job on fresh ports, this many attempts in all.
PORT_ATTEMPTS = 4


# ---------------------------------------------------------------------------
# Commands and environments (pure: unit-testable without starting anything)
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Running children
# ---------------------------------------------------------------------------


def start_fork_server(spec: ResourceSpec, argv: Sequence[str],
                      extra_env: Mapping[str, str] | None = None,
                      network: PrivateNetwork | None = None) -> ForkServer | None:
    """The job's fork server (runtime/forkserver.py), or None when it would
    fork nothing: AUTOPAR_FORK_SERVER=0, no worker or server on this machine,
    or a worker command it cannot run. Start it before compiling, so its
    imports overlap the compile step; the caller stops it after the job."""
    if os.environ.get(envvars.FORK_SERVER, "1") == "0":
        return None
    local = [h for h in spec.hosts if is_local_address(h.address) and (h.workers or h.servers)]
    if not local or not (forkable(argv) or any(h.servers for h in local)):
        return None
    # Each child gets its whole environment with its request; the server's own
    # is what is read at import and at load (LD_PRELOAD), and what a child's
    # /proc/PID/environ shows (the block a process starts with, copied by fork).
    env = local_env(tf_log_level(),
                    {**(extra_env or {}), "LD_PRELOAD": preload_value(),
                     envvars.FORK_PRELOAD: preload_extras(sys.modules)})
    # A launcher forked from a fork server with a spare (the test suite's)
    # adopts it: its imports are done already.
    server = ForkServer.adopt_spare(env, network.descriptors() if network else ())
    if server is not None:
        logger.debug("fork server: adopted the spare, pid %d", server.pid)
        return server
    try:
        server = ForkServer(env, enter=network.enter if network else None)
    except OSError as exc:
        logger.warning("could not start the fork server (%s); starting every process anew", exc)
        return None
    logger.debug("fork server started, pid %d", server.pid)
    return server


@dataclass
class _SignalState:
    """The launcher's SIGINT and SIGTERM, for the whole of its life: installed
    before its first fork (run_job, launch), read before every start of a
    process and between the starts of a restart, so a signal at any moment
    stops the job with 128 + its number and nothing starts after it."""
    signum: int | None = None
    count: int = 0
    # True only while the plan compiles: a signal then also raises
    # KeyboardInterrupt, so a long compile ends at once. Never while the
    # launcher forks: a KeyboardInterrupt raised in CPython's at-fork
    # callbacks is printed and dropped, and the start-up went on.
    interruptible: bool = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        # Otherwise only record: teardown happens in the main loop, and a
        # second Ctrl-C must not interrupt it half-way.
        if self.signum is None:
            self.signum = signum
        self.count += 1
        if self.interruptible:
            self.interruptible = False
            raise KeyboardInterrupt

    @property
    def status(self) -> int:
        """The launcher's exit status for the signal received (128 + N)."""
        assert self.signum is not None
        return 128 + self.signum

    def stops(self, before: str) -> bool:
        """Whether a signal came: then say that ``before`` (what would start
        next) does not happen."""
        if self.signum is None:
            return False
        logger.warning("received %s: stopping the job; %s", signal.Signals(self.signum).name,
                       before)
        return True


_Handler = Callable[[int, FrameType | None], Any] | int | None


def _current_handlers() -> dict[int, _Handler]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _install_handlers(state: _SignalState) -> dict[int, _Handler]:
    # signal.signal only works in the main thread; elsewhere the caller's
    # own handling (KeyboardInterrupt in the main thread) applies.
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, state.handler)
    return previous


def _restore_handlers(previous: Mapping[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _stop_with_checkpoint(chief: Child, state: _SignalState, timeout: float,
                          coordinator: Coordinator) -> int:
    """After the launcher's first SIGINT/SIGTERM: ask the chief to finish its
    step, save a checkpoint and exit, while every other process stays up (a
    ps-mode save reads the servers); give up after ``timeout`` s or a second
    signal. The caller then stops everything.

    A local chief gets SIGINT (runtime/step/stop.py). A signal cannot be sent
    through ssh, so a remote chief is asked through the job coordinator: the
    reply to its next report or heartbeat makes it send itself that SIGINT.
    Children run in their own sessions, so a Ctrl-C typed at the terminal
    reaches only the launcher and the chief is asked exactly once."""
    assert state.signum is not None
    status = 128 + state.signum
    name = signal.Signals(state.signum).name
    if chief.popen.poll() is not None:
        logger.warning("received %s; stopping all processes", name)
        return status
    if not chief.past_startup:
        # Its Runner, which turns SIGINT into a stop after the step, is not
        # there yet (a KeyboardInterrupt traceback from the script), and
        # nothing has trained: nothing to save.
        logger.warning("received %s before training began; stopping all processes", name)
        return status
    logger.warning("received %s: the chief stops after its current step, saving a checkpoint if "
                   "checkpoint_dir is set (at most %.0f s; interrupt again to stop at once)",
                   name, timeout)
    if chief.plan.remote:
        coordinator.request_stop(WORKER_ROLE, chief.plan.index)
    else:
        os.kill(chief.popen.pid, signal.SIGINT)
    deadline, said_stopped = time.monotonic() + timeout, None
    while chief.popen.poll() is None and state.count == 1 and time.monotonic() < deadline:
        # Once it said it stopped, its exit is only teardown: do not wait long.
        if said_stopped is None and envvars.STOPPED_LINE in chief.tail_text():
            said_stopped = time.monotonic()
        if said_stopped is not None and time.monotonic() - said_stopped > DRAIN_SECONDS * 5:
            break
        time.sleep(_POLL_SECONDS)
    if chief.reader is not None and chief.popen.poll() is not None:
        chief.reader.join(timeout=DRAIN_SECONDS)
    lines = [line for line in chief.tail_text().splitlines() if envvars.STOPPED_LINE in line]
    if lines:
        logger.warning("job stopped on %s: the chief %s", name,
                       lines[-1][lines[-1].index(envvars.STOPPED_LINE):])
    elif state.count > 1:
        logger.warning("interrupted again: stopping all processes now, without a final checkpoint")
    else:
        logger.warning("job stopped on %s; the chief did not save a final checkpoint (%s)", name,
                       "it did not stop within %.0f s" % timeout if chief.popen.poll() is None
                       else f"it exited with {procs.describe_returncode(chief.popen.returncode)}")
    return status


@dataclass
class _Outcome:
    """How the job ended: the launcher's exit status and the verdict, logged
    once every process is stopped, so that it is the launcher's last word."""
    status: int
    verdict: list[str] = field(default_factory=list)
    # A process died, failed or stalled (not a stop asked for, not a usage
    # error): starting the job again may get past it (Config.max_restarts).
    restartable: bool = False


@dataclass
class _Ended:
    """One start of the job, ended: its status; the processes whose port was
    taken (it may start again on fresh ports); whether a restart may get past
    its failure, and the highest global step a worker reported."""
    status: int
    clash: list[ChildPlan] = field(default_factory=list)
    restartable: bool = False
    reached: int = -1
    # Hosts ssh could not reach (exit 255 before the process got the initial
    # state): Config.min_workers may drop them.
    unreachable: list[HostSpec] = field(default_factory=list)
    # It ended on the launcher's SIGINT or SIGTERM.
    asked_to_stop: bool = False


# A failed process that reported its failure gets this long to exit (its
# output ends with the error the verdict names).
_FAILING_EXIT_SECONDS = 5.0
# Failures of peers are collected until none is new for this long (at most DRAIN_SECONDS).
_SETTLE_SECONDS = 0.3


def _supervise(children: list[Child], state: _SignalState, stop_timeout: float,
               monitor: JobMonitor, quiet: threading.Event) -> _Outcome:
    """Wait until the job ends; how it ended."""
    workers = [c for c in children if c.plan.role == WORKER_ROLE]
    chief = workers[0]
    while True:
        exited = {c.name: rc for c in children if (rc := c.popen.poll()) is not None}
        # First, so a worker that died of a step-count mismatch is reported as one.
        verdict = monitor.check(exited)
        if (verdict is not None or exited.get(chief.name, 0) != 0) and _said_stopped(chief):
            # The chief stopped on a SIGTERM of its own (sent to it alone):
            # the job stops, as if the launcher had been signalled, not a
            # mismatch of step counts or a failure to restart.
            return _chief_stopped(chief)
        if verdict is not None:
            quiet.set()
            return _Outcome(1, [verdict.message], restartable=True)
        if state.signum is not None:
            return _Outcome(_stop_with_checkpoint(chief, state, stop_timeout,
                                                  monitor.coordinator))
        if any(exited.get(c.name, 0) != 0 for c in workers):
            quiet.set()
            return _failure(children, monitor)
        if all(c.name in exited for c in workers):
            return _Outcome(0)
        # A server never exits on its own while workers need it, so even status 0 is a failure.
        if any(c.name in exited for c in children if c.plan.role != WORKER_ROLE):
            quiet.set()
            return _failure(children, monitor)
        time.sleep(_POLL_SECONDS)


def _said_stopped(chief: Child) -> bool:
    """Whether the chief's output says it stopped on request; the line may
    reach this side after its exit or its last report: waits for it up to
    DRAIN_SECONDS."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while envvars.STOPPED_LINE not in chief.tail_text():
        if time.monotonic() > deadline or (chief.ended_at is not None
                                           and chief.popen.poll() is not None):
            return envvars.STOPPED_LINE in chief.tail_text()
        time.sleep(0.02)
    return True


def _chief_stopped(chief: Child) -> _Outcome:
    """The chief stopped after a stop request the launcher did not send:
    the job's status is its exit status (143 after a SIGTERM), and it is
    not restarted."""
    deadline = time.monotonic() + DRAIN_SECONDS * 5
    while chief.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)    # saved already: what is left is its exit
    line = next(line for line in reversed(chief.tail_text().splitlines())
                if envvars.STOPPED_LINE in line)
    rc = chief.popen.poll()
    logger.warning("job stopped: the chief was asked to stop and %s",
                   line[line.index(envvars.STOPPED_LINE):])
    return _Outcome(procs.exit_status(rc) if rc else 128 + signal.SIGTERM)


def _failure(children: list[Child], monitor: JobMonitor) -> _Outcome:
    """A process failed: find the first failure (the cause) among every
    failure seen by now, the others being its effects (peers whose
    collectives aborted), and say which process, which error, at which step.

    A worker reports its failure to the coordinator before it exits (an
    uncaught exception, an error closing its Runner: runtime/console.py,
    runtime/coordinator_client.py report_failure), so its peers' failures, which
    it causes only by exiting, come later; a process killed without a word
    failed when its output ended."""
    deadline = time.monotonic() + DRAIN_SECONDS
    # Processes whose output just ended: wait for their exit status.
    while (any(c.ended_at is not None and c.popen.poll() is None for c in children)
           and time.monotonic() < deadline):
        time.sleep(0.02)
    states = monitor.coordinator.snapshot()

    def failed_at(child: Child) -> float | None:
        state = states.get(child.name)
        times = [state.failed_at] if state is not None and state.failed_at else []
        rc = child.popen.poll()
        if rc is not None and (rc != 0 or child.plan.role != WORKER_ROLE):
            times.append(child.ended_at or time.monotonic())
        return min(times) if times else None

    failures = sorted(((t, c) for c in children if (t := failed_at(c)) is not None),
                      key=lambda tc: tc[0])
    first = failures[0][1]
    deadline = time.monotonic() + _FAILING_EXIT_SECONDS
    while first.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)   # reported its failure; its error is still to come
    rc = first.popen.poll()
    report_tail(first, rc, _pid(first, states))
    # Peers failing because of it (a collective aborted) say so within moments.
    seen, deadline = len(failures), time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        time.sleep(_SETTLE_SECONDS)
        states = monitor.coordinator.snapshot()
        failures = sorted(((t, c) for c in children if (t := failed_at(c)) is not None),
                          key=lambda tc: tc[0])
        if len(failures) == seen:
            break
        seen = len(failures)
    lines = [f"  then {_failure_text(c, states, limit=160)}"
             for _, c in failures if c is not first]
    lines.append(f"job failed: {_failure_text(first, states)}")
    status = procs.exit_status(rc) if rc else 1
    # Status 2 is a usage error (autopar: ...): it would fail again.
    return _Outcome(status, lines, restartable=status != 2)


def _pid(child: Child, states: Mapping[str, ProcessState]) -> int:
    """The process's own pid (a remote one's as it registered), else the local one."""
    state = states.get(child.name)
    return state.pid if state is not None and state.pid else child.popen.pid


def _failure_text(child: Child, states: Mapping[str, ProcessState], limit: int = 400) -> str:
    """"worker 1 (pid 42) failed after global step 5: ValueError: boom (status 1)",
    the error cut to ``limit`` characters."""
    rc = child.popen.poll()
    state = states.get(child.name)
    status = "still running" if rc is None else procs.describe_returncode(rc)
    cause = cause_in_output(child.tail_text().splitlines())
    if cause is not None and len(cause) > limit:
        cause = cause[:limit - 3] + "..."
    if cause is None:
        cause = f"{status}, no error in its output" if rc is not None and rc >= 0 else status
    else:
        cause = f"{cause} ({status})"
    return f"{child.name} (pid {_pid(child, states)}) {_when(child, state)}: {cause}"


def _when(child: Child, state: ProcessState | None) -> str:
    """When a process failed, in training steps (global steps where known)."""
    if child.plan.role != WORKER_ROLE:
        return "failed"
    if state is None or not state.registered:
        return "failed while starting, before training"
    phase = failed_phase(state.phase) or state.phase
    known = state.global_step >= 0 and state.steps_done > 0
    if phase == PHASE_INIT:
        return "failed while starting, before training"
    if phase == PHASE_STEP:
        return (f"failed in global step {state.global_step + 1}" if known
                else f"failed in training step {state.steps_done + 1}")
    if state.steps_done == 0:
        return "failed before its first training step"
    return (f"failed after global step {state.global_step}" if known
            else f"failed after {state.steps_done} training steps")


def _stdout_is_tty() -> bool:
    try:
        return bool(sys.stdout is not None and sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def launch(spec: ResourceSpec, argv: list[str], *, extra_env: dict[str, str] | None = None,
           grace_seconds: float = 3.0, log_tail_lines: int = 30,
           stall_timeout_s: float = 60.0, busy_timeout_s: float = 0.0,
           stop_timeout_s: float = stopping.CHIEF_STOP_S,
           published: Mapping[str, bytes] | None = None, processes: Collection[str] = (),
           fork_server: ForkServer | None = None, network: PrivateNetwork | None = None,
           max_restarts: int = 0, min_workers: int = 0,
           replan: Callable[[ResourceSpec], Mapping[str, bytes]] | None = None,
           timeline: TimelineOptions | None = None, keep_handlers: bool = False,
           signals: _SignalState | None = None) -> int:
    """Run ``argv`` once per worker of ``spec`` (plus one server process per
    server) and wait for the job to end. ``published``: values the job
    coordinator serves to every process (Coordinator.publish), e.g. the
    compiled plan. ``processes``: the roles the job needs besides the workers
    (the plan's SyncMethod.processes); for the role of a helper kind
    (transforms/methods/process_registry.py: herring's summation servers)
    also its processes, one per server on that server's host, and the
    variable naming them for every process (ProcessKind.publishes); like a
    server, one that exits fails the job. The spec's servers start whatever
    it lists. ``fork_server``: the one to fork local
    Python processes from (``start_fork_server``; the caller stops it);
    without one ``launch`` starts its own. ``network``: the job's private
    network namespace (``isolate``; the caller closes it), which the fork
    server must have been started in; without one ``launch`` makes its own
    when the spec asks for it. ``max_restarts``: start the job again (every
    process, fresh ports; the chief restores its last checkpoint) after a
    process died, failed or stalled once training had begun, at most this
    many times (Config.max_restarts). ``min_workers``: when a restart
    cannot reach a host over ssh, go on without it if the other hosts run at
    least this many workers (0: never), with the values ``replan(smaller
    spec)`` gives in place of ``published`` (the plan compiled for it).
    ``timeline``: trace the workers' steps and write the job's merged
    timeline (runtime/timeline.py) after each start of the job.
    ``signals``: the launcher's signal state (run_job's, installed before it
    forked anything); without one ``launch`` installs its own.

    Returns 0 when every worker exited 0; otherwise the exit status of the
    first process that failed (a signal death N becomes 128+N), 130 after
    Ctrl-C, 143 after SIGTERM (the chief first gets up to ``stop_timeout_s``
    to save a final checkpoint; a second signal stops everything at once;
    runtime/stopping.py). A signal between two starts of a restart, or
    while processes start, starts nothing more.
    Every child is stopped and reaped before this
    returns, whatever the path. Raises LaunchError if a process cannot be
    started (after stopping those that were). A job in which some workers
    wait in a step for ``stall_timeout_s`` for others (0: never), or whose
    workers run different numbers of steps, is ended with status 1.

    Ports stay reserved against other autopar launchers until the job ends
    (runtime/ports.py). If a process reports that its port was taken anyway
    (by another program, after allocation) before any worker received the
    initial state, every process is stopped and the job starts again on
    fresh ports, at most PORT_ATTEMPTS times in all. Workers waiting for a
    process that is busy outside a step (still reporting) end the job after
    ``busy_timeout_s`` (0: never; runtime/health.py).
    """
    if not argv:
        raise LaunchError("nothing to launch: the worker command is empty")
    helpers = process_kinds(processes)
    _prepare_client_libraries(helpers)
    # The spec's servers start only when the job's plan (when known) puts
    # variables on them: a process with nothing to do only costs.
    with_servers = SERVER_ROLE in processes or PLAN_KEY not in (published or {})
    if not with_servers and spec.num_servers:
        logger.info("the plan puts no variable on the spec's %s: %s not started",
                    plural(spec.num_servers, "server"),
                    "it is" if spec.num_servers == 1 else "they are")
    for kind in helpers:
        if kind.transport_timeout and kind.transport_timeout not in os.environ:
            # A push/pull waiting for a slow peer is the coordinator's stall to
            # report (it names the worker); the transport's own timeout is the
            # backstop behind it, for a stalled server: past the longest the
            # coordinator lets workers wait (Config.peer_timeout_s; none: never).
            peer = peer_timeout_s(stall_timeout_s, busy_timeout_s)
            timeout = max(60.0, 2 * peer) if peer else NO_TIMEOUT_S
            extra_env = {**(extra_env or {}), kind.transport_timeout: f"{timeout:g}"}
    # The job's own handlers (_launch_plans) stay installed after it ends, so
    # a Ctrl-C during the teardown that follows (coordinator, ports, fork
    # server, namespace) is held, not a KeyboardInterrupt half-way through;
    # the caller's come back last, unless ``keep_handlers`` (a caller that
    # exits once the job is over: a Ctrl-C between the restore and its exit
    # was a KeyboardInterrupt traceback).
    callers_handlers = _current_handlers()
    if signals is None:
        signals = _SignalState()
        _install_handlers(signals)
    if envvars.JOB_ID not in (extra_env or {}):
        extra_env = {**(extra_env or {}), **new_job()}
    if timeline is not None:
        extra_env = {**extra_env, **timeline.env()}
    own_network = network is None and fork_server is None
    own_fork_server = fork_server is None
    try:
        if own_network:
            network = isolate(spec, extra_env)
        extra_env = {**extra_env, **isolation_env(spec, network)}
        if own_fork_server and signals.signum is None:
            fork_server = start_fork_server(spec, argv, extra_env, network)
        return _launch_restarts(spec, argv, extra_env, fork_server, signals,
                                max_restarts=max_restarts,
                                min_workers=min_workers, replan=replan,
                                grace_seconds=grace_seconds, log_tail_lines=log_tail_lines,
                                stall_timeout_s=stall_timeout_s,
                                busy_timeout_s=busy_timeout_s, stop_timeout_s=stop_timeout_s,
                                published=published, helpers=helpers,
                                with_servers=with_servers,
                                network=network, timeline=timeline)
    finally:
        _stop_local(fork_server if own_fork_server else None, network if own_network else None)
        if not keep_handlers:
            _restore_handlers(callers_handlers)


def _prepare_client_libraries(helpers: Sequence[ProcessKind]) -> None:
    """Build the op library the helpers' clients load (the Herring op
    library: ProcessKind.client_library) now, once, when this is its first
    use and this process has the workers' TensorFlow imported (the script
    run directly), rather than have every worker wait on one build
    (runtime/native.py). Under `autopar launch` the first worker builds it."""
    libraries = [kind.client_library for kind in helpers if kind.client_library]
    if not libraries or "tensorflow" not in sys.modules:
        return
    from autopar.runtime import native
    try:
        for library in libraries:
            native.client_library_path(library, native.TensorFlowBuild.of_imported())
    except native.BuildError as exc:
        raise LaunchError(str(exc)) from exc


# The plan of a job for a spec: (CompiledPlan.to_bytes(), the roles it needs
# besides the workers, its report, the autopar.Config it was compiled with),
# compiled with the fork server at hand.
CompilePlan = Callable[[ResourceSpec, "ForkServer | None"],
                       tuple[bytes, Collection[str], str, Any]]


def run_job(spec: ResourceSpec, argv: list[str], compile_plan: CompilePlan) -> int:
    """Compile the job's plan, log its report, and run exactly the processes
    it needs: how get_runner's launcher and `autopar launch` start a job,
    with the settings of the Config the plan was compiled with (stall and
    busy timeouts, restarts, timeline), checked before any process of the
    job starts. The fork server starts first, so its imports overlap the
    compile step (or serve it); it and the job's private network (if any)
    are gone when this returns. Both callers exit then: Ctrl-C and SIGTERM
    stay held from the job's start to the process's exit."""
    # Before the first fork (the namespace's anchor, the fork server), for
    # good: both callers exit when this returns.
    signals = _SignalState()
    _install_handlers(signals)
    extra_env = {envvars.REPORT_PRINTED: "1", envvars.PLAN: PLAN_KEY, **new_job()}
    network = fork_server = None

    def replan(smaller: ResourceSpec) -> dict[str, bytes]:
        plan, _, report, _ = compile_plan(smaller, fork_server)
        logger.info("the plan for the %d remaining worker(s):\n%s", smaller.num_workers, report)
        return {PLAN_KEY: plan}
    try:
        if signals.stops("starting nothing"):
            return signals.status
        network = isolate(spec, extra_env)
        if signals.stops("starting nothing more"):
            return signals.status
        fork_server = start_fork_server(spec, argv,
                                        {**extra_env, **isolation_env(spec, network)}, network)
        if signals.stops("compiling nothing, starting nothing more"):
            return signals.status
        try:
            signals.interruptible = True
            plan, processes, report, config = compile_plan(spec, fork_server)
        except KeyboardInterrupt:
            if signals.signum is None:
                raise
        finally:
            signals.interruptible = False
        if signals.stops("no process of the job started"):
            return signals.status
        check_restart_options(spec, config.max_restarts, config.min_workers)
        timeline = TimelineOptions.of(config)
        if timeline is not None:
            writable_file(timeline.path, "timeline")
        logger.info("\n%s", "\n".join([report, *report_lines(spec)]))   # + each worker's GPU
        return launch(spec, argv, extra_env=extra_env, stall_timeout_s=config.stall_timeout_s,
                      busy_timeout_s=config.busy_timeout_s,
                      published={PLAN_KEY: plan}, processes=processes,
                      fork_server=fork_server, network=network,
                      max_restarts=config.max_restarts, min_workers=config.min_workers,
                      replan=replan, timeline=timeline, keep_handlers=True, signals=signals)
    finally:
        stop_quietly(fork_server, network)


def check_restart_options(spec: ResourceSpec, max_restarts: int, min_workers: int) -> None:
    """LaunchError for restart options that contradict each other or the
    spec (Config.max_restarts, min_workers; --max-restarts, --min-workers)."""
    if min_workers and not max_restarts:
        raise LaunchError(f"min_workers={min_workers} drops a host only when the job restarts, "
                          "and max_restarts is 0: give max_restarts >= 1 too (--max-restarts), "
                          "or leave min_workers at 0")
    if min_workers > spec.num_workers:
        raise LaunchError(f"min_workers={min_workers} is more than the {spec.num_workers} "
                          f"worker(s) of {spec.source}: a job never has more than it starts "
                          "with; give at most that many")


def stop_quietly(fork_server: ForkServer | None, network: PrivateNetwork | None = None) -> None:
    """Stop the fork server and close the private network at the end of a
    job, with Ctrl-C and SIGTERM held back meanwhile: the job is over, and an
    interrupt here would only leave a KeyboardInterrupt traceback (and the
    processes to PR_SET_PDEATHSIG)."""
    previous = _install_handlers(_SignalState())
    try:
        _stop_local(fork_server, network)
    finally:
        _restore_handlers(previous)


def _stop_local(fork_server: ForkServer | None, network: PrivateNetwork | None) -> None:
    try:
        if fork_server is not None:
            fork_server.stop()
    finally:
        if network is not None:
            network.close()


def _launch_restarts(spec: ResourceSpec, argv: list[str], extra_env: dict[str, str],
                     fork_server: ForkServer | None, signals: _SignalState, *,
                     max_restarts: int, min_workers: int,
                     replan: Callable[[ResourceSpec], Mapping[str, bytes]] | None,
                     published: Mapping[str, bytes] | None, **options) -> int:
    """``launch``, started again after a process died, failed or stalled
    once training had begun, at most ``max_restarts`` times: every process
    anew on fresh ports, the chief restoring its last checkpoint. A restart
    that cannot reach a host goes on without it (``_without``) while
    ``min_workers`` workers remain."""
    restart = 0
    while True:
        if signals.stops("starting nothing" if not restart else
                         f"restart {restart} of {max_restarts} does not start"):
            return signals.status
        ended = _launch_attempts(spec, argv, extra_env, fork_server, signals,
                                 published=published, **options)
        if ended.status and signals.signum is not None:
            # A stop asked for as the job failed (its verdict being said, its
            # processes stopped): nothing starts again.
            if not ended.asked_to_stop:
                signals.stops("no restart")
            return signals.status
        if restart and ended.status and ended.unreachable:
            smaller = _without(spec, ended.unreachable, min_workers)
            if smaller is not None:
                spec = smaller
                if replan is not None:
                    published = {**(published or {}), **replan(spec)}
                continue
        if ended.status == 0 or not ended.restartable or restart >= max_restarts:
            if ended.restartable and max_restarts:
                logger.error("no restart left (max_restarts=%d)", max_restarts)
            return ended.status
        restart += 1
        after = f" after global step {ended.reached}" if ended.reached >= 0 else ""
        logger.warning("restart %d of %d%s: every process starts again on fresh ports, and the "
                       "chief resumes from its last checkpoint", restart, max_restarts, after)
        extra_env = {**extra_env, envvars.RESTART: f"{restart}/{max_restarts}/{ended.reached}"}


def _without(spec: ResourceSpec, unreachable: Sequence[HostSpec],
             min_workers: int) -> ResourceSpec | None:
    """``spec`` without the hosts ssh could not reach, if it still runs
    ``min_workers`` workers (and any at all), else None; says which."""
    gone = {h.address for h in unreachable}
    hosts = tuple(h for h in spec.hosts if h.address not in gone)
    workers = sum(h.workers for h in hosts)
    names = ", ".join(sorted(gone))
    if not min_workers or not workers or workers < min_workers:
        logger.error("cannot reach %s to restart it (ssh exited 255); %s", names,
                     "no host is dropped without Config.min_workers (--min-workers)"
                     if not min_workers else
                     f"the other hosts run {workers} worker(s), fewer than min_workers="
                     f"{min_workers}")
        return None
    logger.warning("cannot reach %s to restart it (ssh exited 255): dropped it (min_workers=%d); "
                   "the job goes on with %d worker(s) instead of %d and %d server(s) instead of "
                   "%d, re-planned. The global batch is now %d/%d of what it was; the learning "
                   "rate is unchanged unless the script scales it by autopar.num_workers()",
                   names, min_workers, workers, spec.num_workers,
                   sum(h.servers for h in hosts), spec.num_servers, workers, spec.num_workers)
    return replace(spec, hosts=hosts)


def _launch_attempts(spec: ResourceSpec, argv: list[str], extra_env: dict[str, str] | None,
                     fork_server: ForkServer | None, signals: _SignalState, *,
                     helpers: Sequence[ProcessKind], with_servers: bool = True,
                     **options) -> _Ended:
    """``launch`` on fresh ports until no process finds its port taken."""
    taken: set[str] = set()   # endpoints that failed to bind, avoided from then on
    for attempt in range(1, PORT_ATTEMPTS + 1):
        with reserve_cluster(spec, avoid=taken, helpers=helpers,
                             servers=with_servers) as reservation:
            ended = _launch_once(spec, reservation.cluster, argv, signals, extra_env=extra_env,
                                 helpers=reservation.helpers,
                                 fork_server=fork_server, **options)
        clash = ended.clash
        if not clash or signals.signum is not None:
            return ended
        taken.update(plan.address for plan in clash)
        if attempt < PORT_ATTEMPTS:
            logger.warning("attempt %d of %d: %s could not bind its port (another program took it "
                           "after allocation); restarting every process on fresh ports",
                           attempt, PORT_ATTEMPTS, ", ".join(f"{p.name} ({p.address})" for p in clash))
    logger.error("%d attempts in a row failed because ports were taken during startup; give the "
                 "hosts a 'ports' range that other programs do not use", PORT_ATTEMPTS)
    return ended


def _launch_once(spec: ResourceSpec, cluster: Mapping[str, list[str]], argv: list[str],
                 signals: _SignalState, *, extra_env: dict[str, str] | None, grace_seconds: float,
                 log_tail_lines: int, stall_timeout_s: float, busy_timeout_s: float,
                 stop_timeout_s: float,
                 published: Mapping[str, bytes] | None = None,
                 helpers: Mapping[str, list[str]] | None = None,
                 fork_server: ForkServer | None = None,
                 network: PrivateNetwork | None = None,
                 timeline: TimelineOptions | None = None) -> _Ended:
    """One start of the job on ``cluster``, with its own coordinator;
    ``helpers``: the addresses of each helper kind's processes, by role."""
    helpers = helpers or {}
    counts = {role: len(addresses) for role, addresses in helpers.items()}
    coordinator = _start_coordinator(spec, cluster, counts, network)
    for key, value in (published or {}).items():
        coordinator.publish(key, value)
    try:
        plans = plan_children(spec, cluster, argv, tty=_stdout_is_tty(), helpers=helpers,
                              extra_env={**(extra_env or {}), **job_env(coordinator, cluster)})
        plans = give_token(plans, coordinator)
        ended = _launch_plans(plans, signals, grace_seconds, log_tail_lines,
                              JobMonitor(coordinator, stall_timeout_s,
                                         busy_timeout_s=busy_timeout_s), stop_timeout_s,
                              fork_server, network)
        ended.reached = max((s.global_step for s in coordinator.snapshot().values()
                             if s.role == WORKER_ROLE), default=-1)
        if timeline is not None:
            _write_timeline(timeline, coordinator, cluster, counts,
                            (extra_env or {}).get(envvars.JOB_ID, ""))
        return ended
    finally:
        coordinator.stop()


def _write_timeline(options: TimelineOptions, coordinator: Coordinator,
                    cluster: Mapping[str, list[str]], helpers: Mapping[str, int],
                    job: str) -> None:
    """The job's merged timeline, from the parts its workers published."""
    parts = coordinator.published(TIMELINE_KEY_PREFIX)
    workers = coordinator.published(TIMELINE_KEY_PREFIX + WORKER_ROLE)
    if not workers:
        logger.warning("timeline: no worker handed in its events (none closed its Runner); "
                       "%s not written", options.path)
        return
    trace = merge_timeline(parts, cluster, helpers, job)
    try:
        write_timeline(options.path, trace)
    except OSError as exc:
        logger.error("timeline: cannot write %s: %s", options.path, exc)
        return
    logger.info("timeline: %d traced steps of %d workers written to %s (%d KB; open it in "
                "chrome://tracing or ui.perfetto.dev)", len(trace["otherData"]["steps"]),
                len(workers), options.path, os.path.getsize(options.path) // 1024)


def _launch_plans(plans: list[ChildPlan], state: _SignalState, grace_seconds: float,
                  log_tail_lines: int, monitor: JobMonitor, stop_timeout_s: float,
                  fork_server: ForkServer | None = None,
                  network: PrivateNetwork | None = None) -> _Ended:
    interrupted = False
    children: list[Child] = []
    outcome = _Outcome(1)
    quiet = threading.Event()        # set once the job's end is decided
    try:
        try:
            for plan in plans:
                if state.stops(f"{plan.name} and the processes after it do not start"):
                    break
                children.append(start_child(plan, log_tail_lines, fork_server, network))
            if len(children) < len(plans):
                # Stopped half-way through the start: nothing trained, nothing to save.
                outcome = _Outcome(state.status)
            else:
                outcome = _run_started(children, state, stop_timeout_s, monitor, quiet,
                                       network)
        except KeyboardInterrupt:
            # Defensive: our SIGINT handler normally prevents this, but a
            # KeyboardInterrupt from anywhere must still tear the job down.
            logger.warning("interrupted; stopping all processes")
            outcome = _Outcome(128 + signal.SIGINT)
            interrupted = True
    finally:
        if children:
            logger.debug("stopping %d processes", len(children))
            procs.stop_processes([c.popen for c in children], grace_seconds)
            for child in children:
                if child.popen.stdin is not None:   # a token prompt never came
                    child.popen.stdin.close()
                if child.reader is not None:
                    child.reader.join(timeout=DRAIN_SECONDS)
                elif child.popen.stdout is not None:
                    child.popen.stdout.close()
    return _ended(children, outcome, state, interrupted)


def _run_started(children: list[Child], state: _SignalState, stop_timeout_s: float,
                 monitor: JobMonitor, quiet: threading.Event,
                 network: PrivateNetwork | None) -> _Outcome:
    """Stream the started processes' output and supervise them to the job's end."""
    # Readers start only once every process is forked: preexec_fn runs
    # between fork and exec, best done while this is the only thread.
    chief_stopped = threading.Event()
    for child in children:
        child.reader = threading.Thread(target=pump, args=(child, chief_stopped, quiet),
                                        name=f"autopar-log-{child.name}", daemon=True)
        child.reader.start()
    probe = _HelperProbe(children, monitor, network.answers if network else answers)
    try:
        return _supervise(children, state, stop_timeout_s, monitor, quiet)
    finally:
        probe.stop()


def _ended(children: list[Child], outcome: _Outcome, state: _SignalState,
           interrupted: bool) -> _Ended:
    """How one start of the job ended, once its processes are stopped; the
    verdict logged last."""
    status = outcome.status
    if status == 0:
        logger.info("all %d workers finished", sum(c.plan.role == WORKER_ROLE for c in children))
    asked_to_stop = interrupted or state.signum is not None
    started = any(c.past_startup for c in children)
    if status == 0 or asked_to_stop or started:
        clash = []
    else:
        clash = [c.plan for c in children if c.bind_failed]
    if not clash:
        # Last, after every process stopped: the launcher's final lines say why the job ended.
        for line in outcome.verdict:
            logger.error("%s", line)
    unreachable = {c.plan.host.address: c.plan.host for c in children
                   if c.plan.via == SSH and c.popen.poll() == 255 and not c.past_startup}
    return _Ended(status, clash, restartable=outcome.restartable and started and not asked_to_stop,
                  unreachable=list(unreachable.values()), asked_to_stop=asked_to_stop)


class _HelperProbe:
    """Checks every second that each helper process probed by connecting
    (ProcessKind.probe PROBE_CONNECT: herring's summation servers) answers
    (it has no coordinator client to send heartbeats): a connection it
    accepts and closes when this side closes. A stopped or hung one still completes the
    connection in the kernel, but never closes it; the coordinator then
    stops hearing from it and the job monitor names it (diagnose)."""

    INTERVAL_S = 1.0
    TIMEOUT_S = 2.0

    def __init__(self, children: Sequence[Child], monitor: JobMonitor,
                 probe: Callable[[str, float], bool]) -> None:
        self._answers = probe
        self._targets = [c for c in children if c.plan.role in PROCESS_KINDS
                         and PROCESS_KINDS[c.plan.role].probe == PROBE_CONNECT]
        self._coordinator = monitor.coordinator
        self._stop = threading.Event()
        self._thread = None
        for child in self._targets:
            # Its start counts as a sign of life: one stopped before its first
            # probe is named too (it starts in milliseconds; workers take seconds).
            self._heard(child)
        if self._targets:
            self._thread = threading.Thread(target=self._run, name="autopar-helper-probe",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            for child in self._targets:
                if child.popen.poll() is None and self._answers(child.plan.address, self.TIMEOUT_S):
                    self._heard(child)

    def _heard(self, child: Child) -> None:
        pid = 0 if child.plan.remote else child.popen.pid
        self._coordinator.heard_from(child.plan.role, child.plan.index, pid, child.plan.address)


# ---------------------------------------------------------------------------
# Keeping other users off the job's ports (runtime/netns.py, runtime/firewall.py)
# ---------------------------------------------------------------------------

def isolate(spec: ResourceSpec, job_env: Mapping[str, str] | None = None) -> PrivateNetwork | None:
    """The job's private network namespace when the spec's isolation asks for
    one (``auto``: every host on loopback), else None. Start it before the
    fork server, which must live in it; the caller closes it after the job.
    ``job_env``: the job's variables (new_job) its anchor process gets."""
    wanted = spec.isolation == "namespace" or (spec.isolation == "auto" and is_loopback_job(spec))
    if not wanted:
        return None
    if spec.isolation == "namespace":
        try:
            network = PrivateNetwork(job_env)
        except (NamespaceUnavailable, OSError) as exc:
            raise LaunchError(f"the spec asks for network isolation 'namespace', but {exc}; "
                              "use 'firewall' or 'none'") from exc
    else:
        network = private_network_or_none("falling back to firewall rules", job_env)
    if network is not None:
        logger.info("the job runs in a private network namespace: only its own processes reach "
                    "its ports, and they reach no other machine (spec network.isolation: "
                    "'firewall' or 'none' to change that)")
    return network


def isolation_env(spec: ResourceSpec, network: PrivateNetwork | None) -> dict[str, str]:
    """What children need to guard the job's ports outside a private
    namespace: the request for firewall rules (runtime/firewall.py)."""
    if network is not None or spec.isolation == "none":
        return {}
    return {firewall.ENABLE: "1"}


# ---------------------------------------------------------------------------
# Job coordinator and bind shim (runtime/coordinator.py, cpp_ops/bind_shim.c)
# ---------------------------------------------------------------------------

def _start_coordinator(spec: ResourceSpec, cluster: Mapping[str, list[str]],
                       helpers: Mapping[str, int] | None = None,
                       network: PrivateNetwork | None = None) -> Coordinator:
    """The job's coordinator, listening on this machine's address in the spec
    (loopback for a local job), or on a Unix socket for a job in a private
    network namespace (which no TCP port of this side reaches)."""
    host = (network.coordinator_address if network is not None
            else launcher_host([h.address for h in spec.hosts], is_local_address))
    coordinator = Coordinator(host, len(cluster[WORKER_JOB]),
                              len(cluster.get(SERVER_JOB, [])), helpers=helpers)
    coordinator.start()
    return coordinator


