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

This module holds the protocol's names and the server; the client side is
runtime/coordinator_client.py, the stall and step-count diagnosis
runtime/health.py.
"""
from __future__ import annotations

import hmac
import importlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autopar.common import env as envvars
from autopar.common.roles import SERVER_ROLE, WORKER_ROLE, process_name
from autopar.runtime.rpc import grpc

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


# Every key a job's processes post (Exchange) or publish (Publish/Fetch)
# under is in transforms/keys.py (COORDINATOR_KEYS), with the job's other
# keys and ids.


# How clients report (runtime/coordinator_client.py); the health checks
# (runtime/health.py) read a report's age against it.
RPC_TIMEOUT_S = 5.0
# Published values (a plan, which may carry a traced step's graph; a
# timeline's part) of any size, both ways: gRPC refuses a received message
# over 4 MiB by default.
UNLIMITED_MESSAGES = [("grpc.max_receive_message_length", -1),
                      ("grpc.max_send_message_length", -1)]
# At most one progress report per this many seconds per process: states that
# change faster are coalesced (the stall check works on a scale of seconds).
REPORT_INTERVAL_S = 0.1
# A client with nothing new to report sends its last state again this often,
# so control messages in the reply (a stop request) reach a process that is
# paused or blocked between steps.
HEARTBEAT_S = 0.5


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
                 token: str | None = None, helpers: Mapping[str, int] | None = None) -> None:
        """``helpers``: how many processes of each helper kind the job runs,
        by role (transforms/methods/process_registry.py), heard from through
        the launcher's probe (``heard_from``)."""
        self.host = host
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.token = token or new_token()
        self._lock = threading.Condition()
        now = time.monotonic()
        self._states: dict[str, ProcessState] = {}
        for role, count in ((WORKER_ROLE, num_workers), (SERVER_ROLE, num_servers),
                            *(helpers or {}).items()):
            for i in range(count):
                self._states[process_name(role, i)] = ProcessState(role, i, phase_since=now)
        self._exchanges: dict[str, dict[str, bytes]] = {}
        self._stop_requested: set[str] = set()
        self._published: dict[str, bytes] = {}
        self._stall_warnings = 0
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
                             interceptors=[_TokenInterceptor(self.token)],
                             options=UNLIMITED_MESSAGES)
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
        (a helper process, probed by the launcher): it counts as registered."""
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

    def count_stall_warning(self) -> None:
        """The launcher warned of a stall (runtime/health.py JobMonitor);
        every report's reply carries the count."""
        with self._lock:
            self._stall_warnings += 1

    @property
    def stall_warnings(self) -> int:
        with self._lock:
            return self._stall_warnings

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

    def published(self, prefix: str) -> dict[str, bytes]:
        """Every value published under a key starting with ``prefix``."""
        with self._lock:
            return {k: v for k, v in self._published.items() if k.startswith(prefix)}

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
            stop_requested=self._c.stop_requested(request.process.role, request.process.index),
            now_s=time.time(), stall_warnings=self._c.stall_warnings)

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


