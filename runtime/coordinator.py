"""The job coordinator: a small gRPC service in the launcher that every worker
and server process of a job registers with (runtime/coordinator.proto).

It is the one place that knows the job's health: workers report their
progress (steps done, phase) whenever it changes, from a background thread so
the training loop never waits on it, and the launcher's ``JobMonitor`` turns
that into stall and step-count-mismatch diagnoses. ``Exchange`` (post a value
under a key, get everybody's once ``expect`` have posted) is the generic
barrier / agreement call later control messages build on. The reply to a
report carries control messages for the process: ``stop_requested`` is how
the launcher asks a chief on another host for a graceful stop (a local one
gets SIGINT); clients send a heartbeat report when they have nothing new, so
a process that is not stepping still hears it within a second. ``Publish`` and
``Fetch`` carry data written once for the whole job (the compiled plan,
transforms/compile.py): the launcher publishes it before any process starts,
every process fetches it.

Every call carries the job's random token (``AUTOPAR_COORD_TOKEN``, given to
local children in their environment and to remote ones on ssh's stdin, never
on a command line or in a log) as the
``autopar-token`` metadata entry; the server refuses calls without it with
UNAUTHENTICATED. The server listens on the launcher's address from the spec
(loopback for a local job), never on the wildcard address.
"""
from __future__ import annotations

import hmac
import importlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc  # noqa: E402 - GRPC_ENABLE_FORK_SUPPORT is set by autopar/__init__.py

from autopar.common import env as envvars  # noqa: E402
from autopar.common.roles import SERVER_ROLE, SUMSERVER_ROLE, WORKER_ROLE  # noqa: E402

logger = logging.getLogger("autopar.coordinator")

TOKEN_METADATA = "autopar-token"

# Phases a worker reports (ProgressReport.phase).
PHASE_INIT = "init"        # registered; building the graph, starting, initialising
PHASE_STEP = "step"        # inside a training step (its collectives wait for every worker)
PHASE_SCRIPT = "script"    # between steps, in the training script
PHASE_OTHER = "other"      # running ops that are not a training step (e.g. evaluation)
PHASE_CLOSED = "closed"    # the Runner was closed: this worker trains no more
# An exception is ending the process (reported before it exits, so the
# launcher can tell the first failure from the failures it causes in peers):
# "failed:<phase it failed in>".
PHASE_FAILED = "failed"


def failed_phase(phase: str) -> str | None:
    """The phase a worker failed in, if ``phase`` is PHASE_FAILED's, else None."""
    head, _, during = phase.partition(":")
    return (during or PHASE_SCRIPT) if head == PHASE_FAILED else None


_RPC_TIMEOUT_S = 5.0
# At most one progress report per this many seconds per process: states that
# change faster are coalesced (the stall check works on a scale of seconds).
_REPORT_INTERVAL_S = 0.1
# A client with nothing new to report sends its last state again this often,
# so control messages in the reply (a stop request) reach a process that is
# paused or blocked between steps.
_HEARTBEAT_S = 0.5
_REGISTER_TIMEOUT_S = 60.0
# A process started over ssh that has not reached the coordinator for this many
# seconds (its launcher is gone, or the network between them is cut) stops
# itself, instead of running on until the link returns. Set by the launcher
# for remote children only (LINK_TIMEOUT); a local child dies with its launcher.
LINK_TIMEOUT = "AUTOPAR_LINK_TIMEOUT_S"
DEFAULT_LINK_TIMEOUT_S = 60.0


def _grpc_modules() -> tuple[ModuleType, ModuleType]:
    """runtime.coordinator_pb2 and _pb2_grpc, generated at install time; built
    here if missing (a source checkout used without ``make install``)."""
    try:
        return (importlib.import_module("autopar.runtime.coordinator_pb2"),
                importlib.import_module("autopar.runtime.coordinator_pb2_grpc"))
    except ImportError:
        from autopar.runtime import native
        native.build_protos()
        importlib.invalidate_caches()
        return (importlib.import_module("autopar.runtime.coordinator_pb2"),
                importlib.import_module("autopar.runtime.coordinator_pb2_grpc"))


def new_token() -> str:
    return secrets.token_hex(32)


def process_name(role: str, index: int) -> str:
    return f"{role} {index}"


# ---------------------------------------------------------------------------
# Server (in the launcher)
# ---------------------------------------------------------------------------

@dataclass
class ProcessState:
    role: str
    index: int
    pid: int = 0
    address: str = ""
    registered: bool = False
    steps_done: int = 0
    phase: str = PHASE_INIT
    global_step: int = -1
    seq: int = -1
    phase_since: float = 0.0     # monotonic time the current (steps_done, phase) began
    heard: float = 0.0           # monotonic time of its last call (0: never)
    failed_at: float = 0.0       # monotonic time it reported PHASE_FAILED (0: it did not)

    @property
    def name(self) -> str:
        return process_name(self.role, self.index)


class _TokenInterceptor(grpc.ServerInterceptor):
    """Refuse every call whose metadata lacks the job's token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        def refuse(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong autopar job token")

        self._refuse = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation, handler_call_details):
        given = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA, "")
        if isinstance(given, str):
            given = given.encode()
        if not hmac.compare_digest(given, self._token):
            return self._refuse
        return continuation(handler_call_details)


class Coordinator:
    """The coordinator service and the job state it holds. Thread-safe."""

    def __init__(self, host: str, num_workers: int, num_servers: int,
                 token: str | None = None, num_sumservers: int = 0) -> None:
        self.host = host
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.token = token or new_token()
        self._lock = threading.Condition()
        now = time.monotonic()
        self._states: dict[str, ProcessState] = {}
        for role, count in ((WORKER_ROLE, num_workers), (SERVER_ROLE, num_servers),
                            (SUMSERVER_ROLE, num_sumservers)):
            for i in range(count):
                self._states[process_name(role, i)] = ProcessState(role, i, phase_since=now)
        self._exchanges: dict[str, dict[str, bytes]] = {}
        self._stop_requested: set[str] = set()
        self._published: dict[str, bytes] = {}
        self._server: grpc.Server | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> str:
        """Serve on ``host`` (an ephemeral port); returns "host:port"."""
        pb2, pb2_grpc = _grpc_modules()
        # Exchange calls block a thread each until everybody has posted.
        threads = 2 * (self.num_workers + self.num_servers) + 4
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads,
                                                        thread_name_prefix="autopar-coord"),
                             interceptors=[_TokenInterceptor(self.token)])
        pb2_grpc.add_CoordinatorServicer_to_server(_Servicer(self, pb2), server)
        try:
            self.port = server.add_insecure_port(self._listen_address(0))
        except RuntimeError:   # grpc's way of saying the bind failed
            self.port = 0
        if not self.port:
            from autopar.common.errors import LaunchError
            raise LaunchError(f"the job coordinator could not listen on {self.host}: is that "
                              "address assigned to this machine?")
        server.start()
        self._server = server
        logger.debug("coordinator listening on %s", self.address)
        return self.address

    def _listen_address(self, port: int) -> str:
        if self.host.startswith("unix:"):    # a socket file (runtime/netns.py)
            return self.host
        bind_host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{bind_host}:{port}"

    @property
    def address(self) -> str:
        return self._listen_address(self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        with self._lock:
            self._lock.notify_all()

    def child_env(self) -> dict[str, str]:
        """What a child needs to reach the coordinator (the token included)."""
        return {envvars.COORDINATOR: self.address, envvars.COORD_TOKEN: self.token}

    # -- state ---------------------------------------------------------------
    def snapshot(self) -> dict[str, ProcessState]:
        with self._lock:
            return {k: ProcessState(**vars(v)) for k, v in self._states.items()}

    def _state(self, role: str, index: int) -> ProcessState:
        key = process_name(role, index)
        state = self._states.get(key)
        if state is None:
            raise KeyError(key)
        return state

    def register(self, role: str, index: int, pid: int, address: str) -> None:
        with self._lock:
            state = self._state(role, index)
            state.registered, state.pid, state.address = True, pid, address
            state.phase_since = state.heard = time.monotonic()
        logger.debug("%s registered (pid %d, %s)", process_name(role, index), pid, address)

    def report(self, role: str, index: int, steps_done: int, phase: str, global_step: int,
               seq: int) -> None:
        with self._lock:
            state = self._state(role, index)
            now = time.monotonic()
            state.heard = now
            if seq <= state.seq:
                return   # reordered or repeated: keep the newest
            if (steps_done, phase) != (state.steps_done, state.phase):
                state.phase_since = now
            if failed_phase(phase) is not None and not state.failed_at:
                state.failed_at = now
            state.steps_done, state.phase, state.global_step, state.seq = (
                steps_done, phase, global_step, seq)

    def heard_from(self, role: str, index: int, pid: int = 0, address: str = "") -> None:
        """A sign of life of a process that does not call the coordinator itself
        (a summation server, probed by the launcher): it counts as registered."""
        with self._lock:
            state = self._state(role, index)
            if not state.registered:
                state.registered, state.pid, state.address = True, pid, address
                state.phase_since = time.monotonic()
            state.heard = time.monotonic()

    def request_stop(self, role: str, index: int) -> None:
        """Ask a process to stop after its current step: the reply to its next
        report (or heartbeat) says so."""
        with self._lock:
            self._stop_requested.add(process_name(role, index))

    def stop_requested(self, role: str, index: int) -> bool:
        with self._lock:
            return process_name(role, index) in self._stop_requested

    def exchange(self, role: str, index: int, key: str, value: bytes, expect: int,
                 timeout_s: float) -> dict[str, bytes] | None:
        """Post ``value`` under ``key``; every posted value once ``expect`` have
        posted, or None after ``timeout_s``."""
        with self._lock:
            posted = self._exchanges.setdefault(key, {})
            posted[process_name(role, index)] = value
            self._lock.notify_all()
            if not self._wait_locked(lambda: len(posted) >= expect, timeout_s):
                return None
            return dict(posted)


    def publish(self, key: str, value: bytes) -> bool:
        """Make ``value`` what ``fetch(key)`` returns; False (nothing changed)
        if ``key`` already holds a different value: a key is written once."""
        with self._lock:
            if self._published.setdefault(key, value) != value:
                return False
            self._lock.notify_all()
            return True

    def fetch(self, key: str, timeout_s: float) -> bytes | None:
        """The value published under ``key``, or None if none is within ``timeout_s``."""
        with self._lock:
            if not self._wait_locked(lambda: key in self._published, timeout_s):
                return None
            return self._published[key]

    def _wait_locked(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """With the lock held: wait until ``ready()``; False once ``timeout_s``
        passed or the coordinator stopped first."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._server is None:
                return False
            self._lock.wait(remaining)
        return True


class _Servicer:
    """The generated servicer's methods, on a Coordinator."""

    def __init__(self, coordinator: Coordinator, pb2: ModuleType) -> None:
        self._c = coordinator
        self._pb2 = pb2

    def _check(self, process: Any, context: grpc.ServicerContext) -> None:
        try:
            self._c._state(process.role, process.index)
        except KeyError:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no {process.role} {process.index} in this job")

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check(request.process, context)
        self._c.register(request.process.role, request.process.index, request.pid,
                         request.address)
        return self._pb2.RegisterReply(num_workers=self._c.num_workers,
                                       num_servers=self._c.num_servers)

    def Report(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check(request.process, context)
        self._c.report(request.process.role, request.process.index, request.steps_done,
                       request.phase, request.global_step, request.seq)
        return self._pb2.ReportReply(
            stop_requested=self._c.stop_requested(request.process.role, request.process.index))

    def Exchange(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check(request.process, context)
        timeout = request.timeout_s if request.timeout_s > 0 else 60.0
        values = self._c.exchange(request.process.role, request.process.index, request.key,
                                  request.value, request.expect, timeout)
        if values is None:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"fewer than {request.expect} processes posted {request.key!r} "
                          f"within {timeout:.0f} s")
        return self._pb2.ExchangeReply(values=values)

    def Publish(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check(request.process, context)
        if not self._c.publish(request.key, request.value):
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          f"{request.key!r} was already published with another value")
        return self._pb2.PublishReply()

    def Fetch(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._check(request.process, context)
        timeout = request.timeout_s if request.timeout_s > 0 else 60.0
        value = self._c.fetch(request.key, timeout)
        if value is None:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"nothing was published under {request.key!r} within {timeout:.0f} s")
        return self._pb2.FetchReply(value=value)


# ---------------------------------------------------------------------------
# Stall and step-count diagnosis (in the launcher)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    kind: str       # "mismatch" or "stall"
    message: str


def _ran(state: ProcessState) -> int:
    """Steps a worker has run, the one it is inside counted."""
    return state.steps_done + (1 if state.phase == PHASE_STEP else 0)


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
    steps = sorted({_ran(s) for s in live})
    return Verdict("stall", (
        f"job stalled: every worker has been inside step {', '.join(map(str, steps))} for "
        f"{waited:.0f} s and none has finished it: an operation of the step never completes "
        f"(a collective deadlock, or a server operation that waits forever).\nEnding the job "
        f"after {HUNG_STEP_FACTOR} x stall_timeout_s = {HUNG_STEP_FACTOR * stall_timeout_s:g} s "
        f"(Config(stall_timeout_s=...) for steps that are legitimately this slow; 0 disables)."))


def diagnose(states: Mapping[str, ProcessState], exited: Mapping[str, int],
             stall_timeout_s: float, now: float) -> Verdict | None:
    """Why the job cannot go on, or None if nothing is known to be wrong.

    ``exited`` maps the name of each process that has exited to its return
    code. Pure, so it is unit-testable.

    - Mismatch: a worker that finished training (closed its Runner or exited
      0) after N steps while another has started step N+1, which can never
      complete without it (or died in it). A worker that failed (reported
      PHASE_FAILED) did not finish: its failure is the cause, named by the
      launcher.
    - Silent server: a server or summation server not heard from (heartbeat,
      or the launcher's probe) for ``stall_timeout_s``: stopped, hung or cut
      off, so the steps that need it wait forever.
    - Stall: a worker has waited inside a step for ``stall_timeout_s`` while
      another has not started that step; or every worker has been inside one
      step for HUNG_STEP_FACTOR x ``stall_timeout_s``.
    """
    workers = sorted((s for s in states.values() if s.role == WORKER_ROLE),
                     key=lambda s: s.index)
    finished = [s for s in workers if s.registered and failed_phase(s.phase) is None
                and (s.phase == PHASE_CLOSED or exited.get(s.name) == 0)]
    for done in finished:
        ahead = [s for s in workers if s is not done and _ran(s) > done.steps_done
                 and (s.phase == PHASE_STEP or exited.get(s.name, 0) != 0)]
        if ahead:
            others = ", ".join(f"{s.name} ran {_ran(s)}" for s in ahead)
            how = "has exited" if done.name in exited else "has closed its Runner"
            return Verdict("mismatch", (
                f"mismatched step counts: {done.name} stopped after {done.steps_done} steps, "
                f"{others}. Every worker must run the same number of training steps (a step's "
                f"collectives need all of them); {done.name} {how}."))

    if stall_timeout_s <= 0:
        return None
    if (verdict := _silent_server(states, exited, stall_timeout_s, now)) is not None:
        return verdict
    waiting = [s for s in workers if s.name not in exited and s.phase == PHASE_STEP
               and now - s.phase_since >= stall_timeout_s]
    if not waiting:
        return None
    step = max(_ran(s) for s in waiting)
    # Only the workers inside that step wait for the others; one inside an
    # earlier step (its last report says so) is among those waited for.
    waiting = [s for s in waiting if _ran(s) == step]
    stuck = [s for s in workers if s.name not in exited
             and not (s.phase == PHASE_STEP and _ran(s) >= step)]
    if not stuck:
        return _hung_step(workers, exited, stall_timeout_s, now)
    lines = []
    for s in stuck:
        if not s.registered:
            where = "it never registered with the coordinator (still starting, or hung before)"
        elif failed_phase(s.phase) is not None:
            where = f"it failed after {s.steps_done} steps and has not exited"
        elif s.phase == PHASE_INIT:
            where = "it is still initialising"
        elif s.phase == PHASE_STEP:
            where = f"it is inside step {_ran(s)}"
        else:
            place = {PHASE_SCRIPT: "in the training script, outside autopar",
                     PHASE_OTHER: "running ops that are not a training step",
                     PHASE_CLOSED: "its Runner is closed"}.get(s.phase, s.phase)
            where = f"it finished step {s.steps_done} and is {place}"
        if s.heard and now - s.heard >= 2 * _HEARTBEAT_S + _RPC_TIMEOUT_S:
            where += (f" (its last report, {now - s.heard:.0f} s ago: it has stopped reporting, "
                      "so it is stopped, hung or cut off)")
        pid = f", pid {s.pid}" if s.pid else ""
        lines.append(f"  {s.name}{pid}: has not started step {step} for "
                     f"{now - s.phase_since:.0f} s; {where}")
    waits = ", ".join(f"{s.name} (in step {_ran(s)} for {now - s.phase_since:.0f} s)"
                      for s in waiting)
    names = ", ".join(s.name for s in stuck)
    return Verdict("stall", (
        f"job stalled: {waits} {'waits' if len(waiting) == 1 else 'wait'} for {names} to join "
        f"step {step} (a step's collectives need every worker):\n" + "\n".join(lines) +
        f"\nEnding the job after {stall_timeout_s:g} s without progress "
        f"(Config(stall_timeout_s=...); 0 disables)."))


# A server is declared silent after the stall timeout, but never sooner than
# this: a few missed heartbeats of a busy machine are not a stopped server.
SERVER_SILENCE_MIN_S = 10.0


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
    on a stall, a step-count mismatch or a silent server."""

    def __init__(self, coordinator: Coordinator, stall_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.coordinator = coordinator
        self.stall_timeout_s = stall_timeout_s
        self._clock = clock

    def check(self, exited: Mapping[str, int]) -> Verdict | None:
        return diagnose(self.coordinator.snapshot(), exited, self.stall_timeout_s,
                        self._clock())


# ---------------------------------------------------------------------------
# Client (in workers and servers)
# ---------------------------------------------------------------------------

class CoordinatorClient:
    """A process's connection to its job's coordinator.

    ``report`` only records the newest state and wakes a background thread
    that sends it, so a training step never waits on the network; states
    newer than the last report are coalesced into one at most every
    _REPORT_INTERVAL_S, and reports that fail are dropped (the next one
    carries the newest state anyway). With nothing new for _HEARTBEAT_S, the
    last state is sent again; ``on_stop`` is called (once, from that thread)
    when a reply says the launcher asked this process to stop.
    """

    def __init__(self, address: str, token: str, role: str, index: int,
                 link_timeout_s: float | None = None) -> None:
        global _PROCESS_CLIENT
        self._pb2, pb2_grpc = _grpc_modules()
        self.role, self.index = role, index
        self._metadata = ((TOKEN_METADATA, token),)
        self._channel = grpc.insecure_channel(address)
        self._stub = pb2_grpc.CoordinatorStub(self._channel)
        self._process = self._pb2.ProcessId(role=role, index=index)
        self._cond = threading.Condition()
        self._latest: tuple[int, str, int] | None = None
        self._seq = 0
        self._sent_seq = 0
        self._closed = False
        self._warned = False
        self.on_stop: Callable[[], None] | None = None
        self._stop_seen = False
        self._failed = False
        # None: never give up on the coordinator (see LINK_TIMEOUT).
        self._link_timeout_s = link_timeout_s
        self._last_reached = time.monotonic()
        if _PROCESS_CLIENT is None:
            _PROCESS_CLIENT = self     # report_failure() tells the launcher through it
        self._thread = threading.Thread(target=self._send_loop, name="autopar-coord-report",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, role: str, index: int,
                 environ: Mapping[str, str] | None = None) -> "CoordinatorClient | None":
        """The client for this process, or None when not started by the launcher."""
        environ = os.environ if environ is None else environ
        address, token = environ.get(envvars.COORDINATOR), environ.get(envvars.COORD_TOKEN)
        if not address or not token:
            return None
        link = environ.get(LINK_TIMEOUT)
        try:
            link_timeout = float(link) if link else None
        except ValueError:
            link_timeout = DEFAULT_LINK_TIMEOUT_S
        return cls(address, token, role, index, link_timeout)

    def register(self, address: str, timeout_s: float = _REGISTER_TIMEOUT_S) -> Any:
        return self._stub.Register(
            self._pb2.RegisterRequest(process=self._process, pid=os.getpid(), address=address),
            metadata=self._metadata, timeout=timeout_s, wait_for_ready=True)

    def report(self, steps_done: int, phase: str, global_step: int = -1) -> None:
        with self._cond:
            if self._failed:
                return     # a failing process stays failed, whatever it does on its way out
            self._seq += 1
            self._latest = (steps_done, phase, global_step)
            self._cond.notify_all()

    def report_failed(self, timeout_s: float = 2.0) -> None:
        """Tell the coordinator this process is failing (PHASE_FAILED, with the
        phase it failed in) and wait up to ``timeout_s`` for it to arrive."""
        with self._cond:
            if self._failed:
                return
            steps_done, phase, global_step = self._latest or (0, PHASE_INIT, -1)
            self._seq += 1
            self._latest = (steps_done, f"{PHASE_FAILED}:{phase}", global_step)
            self._failed = True
            self._cond.notify_all()
        self.flush(timeout_s)

    def flush(self, timeout_s: float = _RPC_TIMEOUT_S) -> bool:
        """Wait until the newest state has been sent (True) or ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._sent_seq < self._seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._cond.wait(remaining)
        return True

    def exchange(self, key: str, value: bytes, expect: int,
                 timeout_s: float = 60.0) -> dict[str, bytes]:
        reply = self._stub.Exchange(
            self._pb2.ExchangeRequest(process=self._process, key=key, value=value, expect=expect,
                                      timeout_s=timeout_s),
            metadata=self._metadata, timeout=timeout_s + _RPC_TIMEOUT_S)
        return dict(reply.values)

    def publish(self, key: str, value: bytes) -> None:
        self._stub.Publish(self._pb2.PublishRequest(process=self._process, key=key, value=value),
                           metadata=self._metadata, timeout=_RPC_TIMEOUT_S)

    def fetch(self, key: str, timeout_s: float = 60.0) -> bytes:
        """The value published under ``key``, waiting up to ``timeout_s`` for it."""
        reply = self._stub.Fetch(
            self._pb2.FetchRequest(process=self._process, key=key, timeout_s=timeout_s),
            metadata=self._metadata, timeout=timeout_s + _RPC_TIMEOUT_S)
        return reply.value

    def close(self) -> None:
        global _PROCESS_CLIENT
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if _PROCESS_CLIENT is self:
            _PROCESS_CLIENT = None
        self._channel.close()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                # Nothing new within _HEARTBEAT_S: send the last state again
                # (the coordinator keeps it; the reply may carry a request).
                self._cond.wait_for(lambda: self._closed or self._sent_seq < self._seq,
                                    timeout=_HEARTBEAT_S)
                if self._closed:
                    return
                seq = self._seq
                steps_done, phase, global_step = self._latest or (0, PHASE_INIT, -1)
            try:
                reply = self._stub.Report(
                    self._pb2.ProgressReport(process=self._process, steps_done=steps_done,
                                             phase=phase, global_step=global_step, seq=seq),
                    metadata=self._metadata, timeout=_RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                if not self._warned:
                    logger.debug("progress report to the coordinator failed: %s", exc.code())
                    self._warned = True
                self._check_link()
            else:
                self._last_reached = time.monotonic()
                if reply.stop_requested and not self._stop_seen:
                    self._stop_seen = True
                    if self.on_stop is not None:
                        self.on_stop()
            with self._cond:
                self._sent_seq = max(self._sent_seq, seq)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed, timeout=_REPORT_INTERVAL_S)


    def _check_link(self) -> None:
        """Stop this process once the coordinator has been unreachable for
        the link timeout: its launcher is gone or cut off, and nobody will
        ever stop it otherwise (a remote process; see LINK_TIMEOUT)."""
        if self._link_timeout_s is None or self._closed:
            return
        lost = time.monotonic() - self._last_reached
        if lost < self._link_timeout_s:
            return
        logger.error("%s %d: the job coordinator (the launcher) has been unreachable for %.0f s: "
                     "the launcher is gone or the network to it is cut; stopping this process",
                     self.role, self.index, lost)
        for handler in logging.getLogger("autopar").handlers + logging.getLogger().handlers:
            handler.flush()
        os._exit(1)


# This process's own client (the first made): report_failure() uses it.
_PROCESS_CLIENT: CoordinatorClient | None = None


def report_failure() -> None:
    """Tell the launcher that this worker is failing (an uncaught exception,
    an autopar error), before its peers fail because of it: the launcher then
    names this process as the cause. Nothing outside a launched job."""
    client = _PROCESS_CLIENT
    if client is not None and client.role == WORKER_ROLE:
        client.report_failed()


class ProgressHook:
    """What the Runner calls around each session.run: turns runs into
    (steps_done, phase) reports."""

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client
        self.steps_done = 0
        self.global_step = -1
        client.on_stop = _interrupt_self

    def before_run(self, is_step: bool) -> None:
        self.client.report(self.steps_done, PHASE_STEP if is_step else PHASE_OTHER,
                           self.global_step)

    def after_run(self, is_step: bool, global_step: int = -1) -> None:
        if is_step:
            self.steps_done += 1
            self.global_step = global_step
        self.client.report(self.steps_done, PHASE_SCRIPT, self.global_step)

    def closed(self) -> None:
        if _failing():
            # Closed on the way out of an exception (the Runner's `with`, a
            # `finally`): the worker fails, it did not finish.
            self.client.report_failed()
            return
        self.client.report(self.steps_done, PHASE_CLOSED, self.global_step)
        self.client.flush()


def _failing() -> bool:
    """Whether an exception is propagating (or being handled) here, other
    than a clean exit and the end of an input (which a script may catch and
    then close its Runner normally)."""
    error = sys.exc_info()[1]
    if error is None or isinstance(error, (StopIteration, GeneratorExit)):
        return False
    if isinstance(error, SystemExit):
        # TrainingStopped (runtime/runner.py) is a requested stop, not a failure.
        return error.code not in (None, 0) and type(error).__name__ != "TrainingStopped"
    return type(error).__name__ != "OutOfRangeError"


def _interrupt_self() -> None:
    """A stop request from the launcher becomes the SIGINT a local chief
    gets: the Runner's handler then stops after the current step, saving a
    checkpoint (runtime/runner.py), exactly as on the local path."""
    logger.info("the launcher asked this process to stop")
    os.kill(os.getpid(), signal.SIGINT)


def host_address(address: str) -> str:
    """The IP literal of a spec address ("localhost" → "127.0.0.1")."""
    import socket
    bare = address.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return bare
    families = sorted(infos, key=lambda i: i[0] != socket.AF_INET)   # IPv4 first
    return str(families[0][4][0]) if families else bare


def launcher_host(addresses: Sequence[str], is_local: Callable[[str], bool]) -> str:
    """The address the coordinator listens on: the spec's address of this
    machine if it is one of the spec's hosts (loopback for a wildcard one),
    else the local address that routes to the first host."""
    import ipaddress
    import socket
    for address in addresses:
        if is_local(address):
            ip = host_address(address)
            try:
                if ipaddress.ip_address(ip).is_unspecified:
                    return "::1" if ":" in ip else "127.0.0.1"
            except ValueError:
                pass
            return ip
    target = host_address(addresses[0])
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))   # UDP connect sends nothing; it picks the route
            return str(probe.getsockname()[0])
    except OSError as exc:
        from autopar.common.errors import LaunchError
        raise LaunchError(f"no route from this machine to {addresses[0]} for the job "
                          f"coordinator ({exc}); check the host's address in the spec") from exc
