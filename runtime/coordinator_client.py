"""A worker's or server's connection to its job's coordinator
(runtime/coordinator.py): progress reports from a background thread, the
exchange/publish/fetch calls, the stop request, the lost-link check, and the
Runner's progress hook."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from autopar.common import env as envvars
from autopar.common.roles import WORKER_ROLE
from autopar.runtime.coordinator import (PHASE_CLOSED, PHASE_FAILED, PHASE_INIT, PHASE_OTHER,
                                         PHASE_SCRIPT, PHASE_STEP, TOKEN_METADATA, _grpc_modules,
                                         HEARTBEAT_S, REPORT_INTERVAL_S, RPC_TIMEOUT_S,
                                         UNLIMITED_MESSAGES)
from autopar.runtime.rpc import grpc

logger = logging.getLogger("autopar.coordinator")

_REGISTER_TIMEOUT_S = 60.0
# A process started over ssh that has not reached the coordinator for this many
# seconds (its launcher is gone, or the network between them is cut) stops
# itself, instead of running on until the link returns. Set by the launcher
# for remote children only (LINK_TIMEOUT); a local child dies with its launcher.
LINK_TIMEOUT = "AUTOPAR_LINK_TIMEOUT_S"
DEFAULT_LINK_TIMEOUT_S = 60.0





class CoordinatorClient:
    """A process's connection to its job's coordinator.

    ``report`` only records the newest state and wakes a background thread
    that sends it, so a training step never waits on the network; states
    newer than the last report are coalesced into one at most every
    REPORT_INTERVAL_S, and reports that fail are dropped (the next one
    carries the newest state anyway). With nothing new for HEARTBEAT_S, the
    last state is sent again; ``on_stop`` is called (once, from that thread)
    when a reply says the launcher asked this process to stop.
    """

    def __init__(self, address: str, token: str, role: str, index: int,
                 link_timeout_s: float | None = None) -> None:
        global _PROCESS_CLIENT
        self._pb2, pb2_grpc = _grpc_modules()
        self.role, self.index = role, index
        self._metadata = ((TOKEN_METADATA, token),)
        self._channel = grpc.insecure_channel(address, options=UNLIMITED_MESSAGES)
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
        # The coordinator's clock minus this process's (seconds), measured on the
        # heartbeats (_clock_sample); None until one was answered.
        self.clock_offset_s: float | None = None
        self.clock_rtt_s: float | None = None
        # Called (from the reporting thread) with each better offset and its
        # round trip: a server hands its offset in for the timeline.
        self.on_clock: Callable[[float, float], None] | None = None
        # Stall warnings the launcher has issued so far (the last reply's).
        self.stall_warnings = 0
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

    def flush(self, timeout_s: float = RPC_TIMEOUT_S) -> bool:
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
            metadata=self._metadata, timeout=timeout_s + RPC_TIMEOUT_S)
        return dict(reply.values)

    def publish(self, key: str, value: bytes) -> None:
        self._stub.Publish(self._pb2.PublishRequest(process=self._process, key=key, value=value),
                           metadata=self._metadata, timeout=RPC_TIMEOUT_S)

    def fetch(self, key: str, timeout_s: float = 60.0) -> bytes:
        """The value published under ``key``, waiting up to ``timeout_s`` for it."""
        reply = self._stub.Fetch(
            self._pb2.FetchRequest(process=self._process, key=key, timeout_s=timeout_s),
            metadata=self._metadata, timeout=timeout_s + RPC_TIMEOUT_S)
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
                # Nothing new within HEARTBEAT_S: send the last state again
                # (the coordinator keeps it; the reply may carry a request).
                self._cond.wait_for(lambda: self._closed or self._sent_seq < self._seq,
                                    timeout=HEARTBEAT_S)
                if self._closed:
                    return
                seq = self._seq
                steps_done, phase, global_step = self._latest or (0, PHASE_INIT, -1)
            try:
                sent = time.time()
                reply = self._stub.Report(
                    self._pb2.ProgressReport(process=self._process, steps_done=steps_done,
                                             phase=phase, global_step=global_step, seq=seq),
                    metadata=self._metadata, timeout=RPC_TIMEOUT_S)
                self._clock_sample(sent, reply.now_s, time.time())
            except grpc.RpcError as exc:
                if not self._warned:
                    logger.debug("progress report to the coordinator failed: %s", exc.code())
                    self._warned = True
                self._check_link()
            else:
                self._last_reached = time.monotonic()
                self.stall_warnings = reply.stall_warnings
                if reply.stop_requested and not self._stop_seen:
                    self._stop_seen = True
                    if self.on_stop is not None:
                        self.on_stop()
            with self._cond:
                self._sent_seq = max(self._sent_seq, seq)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed, timeout=REPORT_INTERVAL_S)


    def _clock_sample(self, sent: float, theirs: float, received: float) -> None:
        """Keep the coordinator's clock minus this one's, from the report
        with the shortest round trip (its error is at most half of it)."""
        rtt = received - sent
        if theirs > 0 and (self.clock_rtt_s is None or rtt < self.clock_rtt_s):
            self.clock_offset_s, self.clock_rtt_s = theirs - (sent + received) / 2, rtt
            if self.on_clock is not None:
                try:
                    self.on_clock(self.clock_offset_s, self.clock_rtt_s)
                except grpc.RpcError as exc:
                    logger.debug("could not hand in the clock offset: %s", exc.code())

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

    def began_job(self) -> None:
        """A later job of the script begins (its steps count on): this
        worker trains again, no longer closed."""
        self.client.report(self.steps_done, PHASE_INIT, self.global_step)

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
        # TrainingStopped (runtime/step/stop.py) is a requested stop, not a failure.
        return error.code not in (None, 0) and type(error).__name__ != "TrainingStopped"
    return type(error).__name__ != "OutOfRangeError"


def _interrupt_self() -> None:
    """A stop request from the launcher becomes the SIGINT a local chief
    gets: the Runner's handler then stops after the current step, saving a
    checkpoint (runtime/step/stop.py), exactly as on the local path."""
    logger.info("the launcher asked this process to stop")
    os.kill(os.getpid(), signal.SIGINT)


