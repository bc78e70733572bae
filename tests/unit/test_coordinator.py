"""The job coordinator (real gRPC on loopback), its stall/mismatch diagnosis,
and the bind shim (real sockets in a child process with LD_PRELOAD)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import grpc
import pytest

from autopar.common import env as envvars
from autopar.runtime.coordinator import (PHASE_CLOSED, PHASE_FAILED, PHASE_OTHER, PHASE_SCRIPT, PHASE_STEP,
                                         Coordinator, ProcessState, _grpc_modules)
from autopar.runtime.coordinator_client import CoordinatorClient, ProgressHook
from autopar.runtime.health import (MISMATCH_GRACE_S, SERVER_QUIET_S, SERVER_SILENCE_MIN_S,
                                    JobMonitor, diagnose, stall_warning)
from autopar.runtime.commands import bind_env_value, bind_shim_path


@pytest.fixture
def coordinator():
    c = Coordinator("127.0.0.1", num_workers=2, num_servers=1)
    c.start()
    yield c
    c.stop()


def _stub(address: str):
    pb2, pb2_grpc = _grpc_modules()
    channel = grpc.insecure_channel(address)
    return pb2, pb2_grpc.CoordinatorStub(channel), channel


def test_listens_on_the_given_address_only(coordinator):
    assert coordinator.address.startswith("127.0.0.1:")
    # The kernel's view: the listening socket is 127.0.0.1:port (gRPC may use
    # an IPv6 socket bound to the v4-mapped form of it), not *:port.
    out = subprocess.run(["ss", "-Hltn", f"sport = :{coordinator.port}"], capture_output=True,
                         text=True).stdout.split()
    assert out[0] == "LISTEN", out
    assert out[3] in (f"127.0.0.1:{coordinator.port}", f"[::ffff:127.0.0.1]:{coordinator.port}"), out


@pytest.mark.parametrize("token", [None, "", "wrong"])
def test_calls_without_the_token_are_refused(coordinator, token):
    pb2, stub, channel = _stub(coordinator.address)
    metadata = None if token is None else (("autopar-token", token),)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.Register(pb2.RegisterRequest(process=pb2.ProcessId(role="worker", index=0), pid=1),
                      metadata=metadata, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not coordinator.snapshot()["worker 0"].registered


def test_register_report_and_exchange(coordinator):
    clients = [CoordinatorClient(coordinator.address, coordinator.token, "worker", i)
               for i in range(2)]
    try:
        reply = clients[0].register("127.0.0.1:1")
        assert (reply.num_workers, reply.num_servers) == (2, 1)
        clients[0].report(3, PHASE_STEP, 3)
        assert clients[0].flush(10)
        state = coordinator.snapshot()["worker 0"]
        assert (state.registered, state.steps_done, state.phase, state.global_step) == (
            True, 3, PHASE_STEP, 3)
        # Exchange is a barrier: both calls return both values.
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(
            i, clients[i].exchange("seed", str(i).encode(), expect=2, timeout_s=20)))
            for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results[0] == results[1] == {"worker 0": b"0", "worker 1": b"1"}
        with pytest.raises(grpc.RpcError) as info:
            clients[0].exchange("alone", b"x", expect=2, timeout_s=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for c in clients:
            c.close()


def test_publish_once_fetch_waits_for_it(coordinator):
    """What the launcher publishes every process fetches; a value published
    by a process reaches one already waiting for it; a key is written once."""
    coordinator.publish("plan", b"from the launcher")
    clients = [CoordinatorClient(coordinator.address, coordinator.token, "worker", i)
               for i in range(2)]
    try:
        assert clients[1].fetch("plan", timeout_s=5) == b"from the launcher"
        got = {}
        waiting = threading.Thread(target=lambda: got.__setitem__(
            "v", clients[1].fetch("other", timeout_s=20)))
        waiting.start()
        clients[0].publish("other", b"from the chief")
        waiting.join(30)
        assert got == {"v": b"from the chief"}
        clients[0].publish("other", b"from the chief")          # the same value: fine
        with pytest.raises(grpc.RpcError) as info:
            clients[0].publish("other", b"changed")
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert clients[1].fetch("other", timeout_s=5) == b"from the chief"
        with pytest.raises(grpc.RpcError) as info:
            clients[1].fetch("never", timeout_s=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for c in clients:
            c.close()


def test_a_plan_larger_than_grpcs_default_message_limit_travels_both_ways(coordinator):
    """A plan (which may carry a traced step's graph: runtime/step_graph.py)
    of more than gRPC's default 4 MiB per message, published by the
    launcher or by the chief and fetched by the others."""
    large = os.urandom(6 << 20)
    coordinator.publish("plan", large)
    clients = [CoordinatorClient(coordinator.address, coordinator.token, "worker", i)
               for i in range(2)]
    try:
        assert clients[1].fetch("plan", timeout_s=10) == large
        clients[0].publish("plan/job2", large[::-1])
        assert clients[1].fetch("plan/job2", timeout_s=10) == large[::-1]
    finally:
        for c in clients:
            c.close()


def test_unknown_process_is_refused(coordinator):
    client = CoordinatorClient(coordinator.address, coordinator.token, "worker", 7)
    try:
        with pytest.raises(grpc.RpcError) as info:
            client.register("x")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        client.close()


@pytest.mark.slow
def test_stop_request_reaches_only_the_asked_process_without_new_reports(coordinator):
    # Neither client reports after registering: the heartbeat carries the
    # request to worker 0, paused between steps; worker 1 is not asked.
    clients = [CoordinatorClient(coordinator.address, coordinator.token, "worker", i)
               for i in range(2)]
    stopped = [threading.Event(), threading.Event()]
    try:
        for i, client in enumerate(clients):
            client.on_stop = stopped[i].set
            client.register(f"127.0.0.1:{i + 1}")
            client.report(2, PHASE_SCRIPT, 2)
            assert client.flush(10)
        assert not stopped[0].wait(1.5)   # nothing asked yet: heartbeats say so
        coordinator.request_stop("worker", 0)
        assert stopped[0].wait(20)
        assert not stopped[1].wait(1.5)
        # Heartbeats resend the last state without changing it.
        state = coordinator.snapshot()["worker 0"]
        assert (state.steps_done, state.phase, state.global_step) == (2, PHASE_SCRIPT, 2)
    finally:
        for c in clients:
            c.close()


def test_client_from_env_needs_address_and_token():
    assert CoordinatorClient.from_env("worker", 0, {}) is None
    assert CoordinatorClient.from_env("worker", 0, {envvars.COORDINATOR: "127.0.0.1:1"}) is None


# -- diagnosis ---------------------------------------------------------------

def _workers(*specs, now=100.0):
    """specs: (steps_done, phase, seconds in that state)."""
    return {f"worker {i}": ProcessState("worker", i, pid=1000 + i, registered=True,
                                         steps_done=d, phase=p, phase_since=now - age)
            for i, (d, p, age) in enumerate(specs)}


def test_stall_names_the_stuck_worker_and_its_step():
    states = _workers((3, PHASE_STEP, 6), (3, PHASE_SCRIPT, 6))
    verdict = diagnose(states, {}, stall_timeout_s=5, now=100.0)
    assert verdict is not None and verdict.kind == "stall"
    assert "worker 0 (in step 4" in verdict.message
    assert "worker 1, pid 1001: has not started step 4" in verdict.message
    assert "finished step 3 and is in the training script" in verdict.message


def test_a_restarted_job_s_stall_names_global_steps():
    # Resumed from the checkpoint of global step 9: its 8th step makes 17.
    states = _workers((7, PHASE_STEP, 6), (7, PHASE_SCRIPT, 6))
    for state in states.values():
        state.global_step = 16
    verdict = diagnose(states, {}, stall_timeout_s=5, now=100.0)
    assert "worker 0 (in step 17 for 6 s) waits for worker 1 to join step 17" in verdict.message
    assert "finished step 16 and is in the training script" in verdict.message
    (step, _), text = stall_warning(states, {}, 10, 100.0)
    assert step == 17 and "inside step 17 for worker 1" in text


def test_no_stall_before_the_timeout_or_when_disabled_or_all_in_the_step():
    assert diagnose(_workers((3, PHASE_STEP, 4), (3, PHASE_SCRIPT, 4)), {}, 5, 100.0) is None
    assert diagnose(_workers((3, PHASE_STEP, 60), (3, PHASE_SCRIPT, 60)), {}, 0, 100.0) is None
    # Everybody inside the same step: a slow step, not a stall ...
    assert diagnose(_workers((3, PHASE_STEP, 60), (3, PHASE_STEP, 60)), {}, 5, 100.0) is None


def test_a_stall_is_warned_of_from_half_the_timeout_once_per_step(caplog):
    # Half of the 10 s timeout: not yet at 4 s, warned at 6 s, not for a
    # step everybody is inside, nor when the timed checks are off.
    assert stall_warning(_workers((3, PHASE_STEP, 4), (3, PHASE_SCRIPT, 4)), {}, 10, 100.0) is None
    (step, round_), text = stall_warning(_workers((3, PHASE_STEP, 6), (3, PHASE_SCRIPT, 6)), {},
                                         10, 100.0)
    assert (step, round_) == (4, 0)
    assert text.startswith("worker 0 has waited 6 s inside step 4 for worker 1 to join it")
    assert "ended as stalled after 10 s" in text
    assert stall_warning(_workers((3, PHASE_STEP, 6), (3, PHASE_STEP, 6)), {}, 10, 100.0) is None
    assert stall_warning(_workers((3, PHASE_STEP, 6), (3, PHASE_SCRIPT, 6)), {}, 0, 100.0) is None

    class Coordinator:
        warnings = 0

        def __init__(self):
            self.states = _workers((3, PHASE_STEP, 6), (3, PHASE_SCRIPT, 6))

        def snapshot(self):
            return self.states

        def count_stall_warning(self):
            self.warnings += 1

    coordinator = Coordinator()
    monitor = JobMonitor(coordinator, 10, clock=lambda: 100.0)
    assert monitor.check({}) is None and monitor.check({}) is None
    assert coordinator.warnings == 1     # once for step 4
    coordinator.states = _workers((4, PHASE_STEP, 7), (4, PHASE_SCRIPT, 7))
    assert monitor.check({}) is None
    assert coordinator.warnings == 2     # and once for step 5
    assert [r.getMessage()[:40] for r in caplog.records if r.levelname == "WARNING"] == [
        "worker 0 has waited 6 s inside step 4 fo", "worker 0 has waited 7 s inside step 5 fo"]


def _busy_chief(waited: float, silent_for: float = 0.2, phase: str = PHASE_OTHER) -> dict:
    """Worker 1 has waited `waited` s inside step 5 for worker 0, which
    finished step 4 and runs other ops (evaluates), last heard `silent_for`
    s before now = 100."""
    states = _workers((4, phase, waited), (4, PHASE_STEP, waited))
    for state in states.values():
        state.heard = 100.0 - 0.1
    states["worker 0"].heard = 100.0 - silent_for
    return states


def test_a_process_busy_outside_a_step_is_waited_for_with_a_warning_every_timeout():
    """The chief evaluating while worker 1 waits inside the next step: past
    the 10 s stall timeout no verdict, a warning from 5 s and again every
    10 s (rounds 0, 1, 2 ...), the job ended only after busy_timeout_s (100 s),
    never with 0."""
    for waited in (11, 60, 99):
        assert diagnose(_busy_chief(waited), {}, 10, 100.0, busy_timeout_s=100) is None
    assert diagnose(_busy_chief(5000), {}, 10, 100.0, busy_timeout_s=0) is None
    rounds = [stall_warning(_busy_chief(w), {}, 10, 100.0, 100)[0] for w in (5, 14, 15, 26, 36)]
    assert rounds == [(5, 0), (5, 0), (5, 1), (5, 2), (5, 3)]
    _, text = stall_warning(_busy_chief(15), {}, 10, 100.0, 100)
    assert text.startswith("worker 1 has waited 15 s inside step 5 for worker 0 to join it; it "
                           "is busy outside a step and still reporting (worker 0: it finished "
                           "step 4 and is running ops that are not a training step)"), text
    assert "ended as stalled after 100 s (Config(busy_timeout_s=...); 0: never)" in text
    verdict = diagnose(_busy_chief(100), {}, 10, 100.0, busy_timeout_s=100)
    assert verdict is not None and verdict.kind == "stall"
    assert verdict.message.startswith("job stalled: worker 1 (in step 5 for 100 s) waits for "
                                      "worker 0 to join step 5")
    assert verdict.message.endswith("Ending the job after 100 s of waiting for a busy process "
                                    "(Config(busy_timeout_s=...); 0: never).")
    # In the script between steps, or still initialising, is busy too.
    assert diagnose(_busy_chief(50, phase=PHASE_SCRIPT), {}, 10, 100.0, 100) is None


def test_a_process_that_stopped_reporting_ends_the_job_after_the_stall_timeout():
    """The same wait for a chief not heard from for 8 s (SIGSTOPped, hung,
    cut off): stuck, not busy, so the stall timeout ends the job as before,
    whatever busy_timeout_s says, and the warning says so."""
    verdict = diagnose(_busy_chief(11, silent_for=8), {}, 10, 100.0, busy_timeout_s=0)
    assert verdict is not None and verdict.kind == "stall"
    assert "worker 0, pid 1000: has not started step 5 for 11 s; it finished step 4 and is " \
           "running ops that are not a training step (its last report, 8 s ago: it has " \
           "stopped reporting" in verdict.message, verdict.message
    assert verdict.message.endswith("Ending the job after 10 s without progress "
                                    "(Config(stall_timeout_s=...); 0 disables).")
    key, text = stall_warning(_busy_chief(6, silent_for=8), {}, 10, 100.0, 0)
    assert key == (5, 0) and text.endswith("the job is ended as stalled after 10 s "
                                           "(Config(stall_timeout_s=...))")


def test_the_monitor_warns_once_per_round_while_a_busy_process_is_waited_for(caplog):
    class Coordinator:
        warnings = 0
        states = _busy_chief(6)

        def snapshot(self):
            return self.states

        def count_stall_warning(self):
            self.warnings += 1

    coordinator = Coordinator()
    monitor = JobMonitor(coordinator, 10, clock=lambda: 100.0, busy_timeout_s=0)
    for waited in (6, 9, 16, 24, 26):
        coordinator.states = _busy_chief(waited)
        assert monitor.check({}) is None
    assert coordinator.warnings == 3      # from 5 s, 15 s and 25 s


def test_every_worker_inside_one_step_for_twenty_timeouts_is_a_hung_step():
    # ... until nobody has finished it for 20 stall timeouts: a deadlock.
    verdict = diagnose(_workers((3, PHASE_STEP, 101), (3, PHASE_STEP, 100)), {}, 5, 100.0)
    assert verdict is not None and verdict.kind == "stall"
    assert "every worker has been inside step 4 for 100 s" in verdict.message
    assert diagnose(_workers((3, PHASE_STEP, 101), (3, PHASE_STEP, 99)), {}, 5, 100.0) is None
    assert diagnose(_workers((3, PHASE_STEP, 900), (3, PHASE_STEP, 900)), {}, 0, 100.0) is None


@pytest.mark.parametrize("exited", [{}, {"worker 1": 0}])
def test_mismatch_when_a_finished_worker_ran_fewer_steps(exited):
    states = _workers((9, PHASE_STEP, MISMATCH_GRACE_S),
                      (9, PHASE_CLOSED if not exited else PHASE_SCRIPT, 0))
    verdict = diagnose(states, exited, stall_timeout_s=0, now=100.0)
    assert verdict is not None and verdict.kind == "mismatch"
    assert "worker 1 stopped after 9 steps, worker 0 ran 10" in verdict.message


def test_a_step_just_begun_past_a_finished_worker_is_no_mismatch_yet():
    """A finite dataset's end: every worker's next step fails (OutOfRangeError),
    on worker 0 a moment after worker 1 has closed its Runner."""
    just_begun = _workers((9, PHASE_STEP, 1.0), (9, PHASE_CLOSED, 0))
    assert diagnose(just_begun, {}, stall_timeout_s=60, now=100.0) is None
    waited = _workers((9, PHASE_STEP, MISMATCH_GRACE_S), (9, PHASE_CLOSED, 0))
    verdict = diagnose(waited, {}, stall_timeout_s=60, now=100.0)
    assert verdict is not None and verdict.kind == "mismatch"


def test_mismatch_reported_when_the_waiting_worker_dies():
    # Worker 1 exited 0 after 9 steps; worker 0 then died in step 10
    # (UnavailableError in its all-reduce).
    states = _workers((9, PHASE_STEP, 0), (9, PHASE_CLOSED, 0))
    verdict = diagnose(states, {"worker 1": 0, "worker 0": 1}, 60, 100.0)
    assert verdict is not None and "worker 1 stopped after 9 steps, worker 0 ran 10" in verdict.message


def test_equal_step_counts_finishing_is_not_a_mismatch():
    # Worker 1 finished its 10 steps; worker 0 is still completing step 10.
    states = _workers((9, PHASE_STEP, 0), (10, PHASE_CLOSED, 0))
    assert diagnose(states, {"worker 1": 0}, 60, 100.0) is None


# -- bind shim ---------------------------------------------------------------

_BIND_PROBE = r"""
import errno, json, socket, sys
port, other = int(sys.argv[1]), int(sys.argv[2])
out = {}
for name, family, wildcard in (("v4", socket.AF_INET, "0.0.0.0"), ("v6", socket.AF_INET6, "::")):
    s = socket.socket(family)
    try:
        s.bind((wildcard, port)); out[name] = s.getsockname()[0]
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
o = socket.socket(socket.AF_INET); o.bind(("0.0.0.0", other)); out["other"] = o.getsockname()[0]
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, elsewhere, expected", [
    ("127.0.0.1", "10.214.255.254", {"v4": "127.0.0.1", "v6": "EAFNOSUPPORT"}),
    ("::1", "fd00:214::1", {"v4": "EAFNOSUPPORT", "v6": "::1"}),
])
@pytest.mark.slow
def test_bind_shim_rewrites_wildcard_binds_of_job_ports_only(address, elsewhere, expected):
    port, other = _free_port(), _free_port()
    # Another host's address on the same port is tried first and skipped.
    bind = f"{elsewhere}/{port},{address}/{port}"
    env = dict(os.environ, LD_PRELOAD=bind_shim_path(), **{envvars.BIND: bind})
    out = subprocess.run([sys.executable, "-c", _BIND_PROBE, str(port), str(other)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {**expected, "other": "0.0.0.0"}


def test_bind_env_value_lists_every_endpoint():
    cluster = {"worker": ["127.0.0.1:5000", "localhost:5001"], "ps": ["[::1]:5002"]}
    assert bind_env_value(cluster) == "127.0.0.1/5000,127.0.0.1/5001,::1/5002"


def test_children_get_the_token_in_their_environment_or_on_ssh_stdin():
    from autopar.runtime.commands import give_token, job_env, plan_children
    from autopar.runtime.spec import HostSpec, ResourceSpec, SSHSettings
    spec = ResourceSpec(hosts=(
        HostSpec(address="127.0.0.1", workers=1, servers=0),
        HostSpec(address="192.0.2.10", workers=1, servers=0,  # TEST-NET-1: never local
                 ssh=SSHSettings(user="bob")),
    ))
    cluster = {"worker": ["127.0.0.1:5000", "192.0.2.10:5000"]}
    coordinator = Coordinator("127.0.0.1", num_workers=2, num_servers=0)
    plans = plan_children(spec, cluster, [sys.executable, "train.py"],
                          extra_env=job_env(coordinator, cluster), cwd="/here")
    local, remote = give_token(plans, coordinator)
    assert local.env[envvars.COORD_TOKEN] == coordinator.token
    assert local.env[envvars.COORDINATOR] == coordinator.address
    assert local.env[envvars.BIND] == "127.0.0.1/5000,192.0.2.10/5000"
    assert local.env["LD_PRELOAD"].split()[0] == bind_shim_path()
    assert local.stdin_secret is None
    # The remote child reads it from ssh's stdin: it is on no command line,
    # in no environment of a local process, in no repr of a plan.
    assert remote.remote and remote.stdin_secret == coordinator.token
    assert coordinator.token not in " ".join(local.command + remote.command)
    assert envvars.COORD_TOKEN not in remote.env
    assert coordinator.token not in repr(remote)
    assert f"IFS= read -r {envvars.COORD_TOKEN}" in remote.command[-1]


def test_missing_compiler_names_what_to_install(monkeypatch, tmp_path):
    from autopar.runtime import native
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(native.BuildError, match="needs a C compiler: install one.*apt-get install gcc"):
        native.build_shim(tmp_path)


def test_missing_cxx_compiler_names_what_to_install(monkeypatch, tmp_path):
    """Without a C++ compiler, herring is unavailable, said with the package
    to install, and the planner keeps every other run option: hybrid stays on
    the ring, run_option='herring' is refused naming the package."""
    from autopar.common.errors import SpecError
    from autopar.runtime import native
    from autopar.transforms.compile import compile_plan
    from autopar.transforms.methods.registry import METHODS
    from autopar.transforms.plan import PlanOptions
    from autopar.transforms.topology import Topology
    from tests import models
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setattr(native, "RUNTIME_DIR", tmp_path / "installed")   # none built at install
    monkeypatch.setenv("AUTOPAR_BUILD_CACHE", str(tmp_path / "cache"))
    tensorflow = native.TensorFlowBuild(("-I/tf/include",), ("-L/tf",), "2.21.0")
    for build in (lambda: native.build_sumserver(tmp_path / "out"), native.sumserver_path,
                  lambda: native.herring_ops_path(tensorflow)):
        with pytest.raises(native.BuildError, match="needs a C\\+\\+17 compiler: install one.*"
                                                    "apt-get install g\\+\\+"):
            build()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    missing = native.program_unavailable("autopar_sumserver")
    assert "apt-get install g++" in missing and "every run option but herring works" in missing
    # 4 workers on 4 hosts and 4 servers: with summation servers hybrid picks herring.
    model = models.build("cnn_momentum")
    hosts = tuple(f"10.0.0.{i}" for i in range(1, 5))
    c = compile_plan(model.graph, Topology(hosts, 4, missing_processes=(("sumserver", missing),)),
                     PlanOptions(run_option="hybrid"))
    assert {v.method for v in c.plan.variables} == {"allreduce"}
    assert "apt-get install g++" in METHODS["herring"].state(c.plan).why
    with pytest.raises(SpecError, match="run_option='herring' needs summation servers: .*g\\+\\+"):
        compile_plan(model.graph, Topology(hosts, 4, missing_processes=(("sumserver", missing),)),
                     PlanOptions(run_option="herring"))


def test_coordinator_address_is_this_hosts_spec_address_never_the_wildcard():
    from autopar.common.addresses import launcher_host
    local = {"127.0.0.2", "0.0.0.0", "localhost"}.__contains__
    assert launcher_host(["192.0.2.10", "127.0.0.2"], local) == "127.0.0.2"
    assert launcher_host(["localhost"], local) == "127.0.0.1"
    assert launcher_host(["0.0.0.0"], local) == "127.0.0.1"
    # No local host in the spec: the address this machine reaches the first one from.
    assert launcher_host(["127.0.0.3"], lambda a: False) == "127.0.0.1"


def test_coordinator_on_an_address_not_of_this_machine_is_a_launch_error():
    from autopar.common.errors import LaunchError
    with pytest.raises(LaunchError, match="could not listen on 192.0.2.10"):
        Coordinator("192.0.2.10", 1, 0).start()


# -- failures, silent servers, stale reports (issue 28) -------------------------

def test_a_worker_closing_its_runner_on_an_exception_failed_it_did_not_finish(coordinator):
    """Closed on the way out of an exception (the Runner's `with`), a worker
    reports a failure, not a finished run: its peer still inside the next
    step is no step-count mismatch, and the launcher names the failure."""
    client = CoordinatorClient(coordinator.address, coordinator.token, "worker", 1)
    try:
        client.register("127.0.0.1:2")
        hook = ProgressHook(client)
        for step in range(5):
            hook.before_run(True)
            hook.after_run(True, step + 1)
        try:
            raise ValueError("boom")
        except ValueError:
            hook.closed()          # as Runner.__exit__ -> close() -> on_close does
        hook.closed()              # later reports cannot undo the failure
        state = coordinator.snapshot()["worker 1"]
        assert state.phase == f"{PHASE_FAILED}:{PHASE_SCRIPT}" and state.failed_at
        assert (state.steps_done, state.global_step) == (5, 5)
    finally:
        client.close()
    states = coordinator.snapshot()
    states["worker 0"] = ProcessState("worker", 0, registered=True, steps_done=5,
                                      phase=PHASE_STEP, phase_since=0.0)
    assert diagnose(states, {}, 0, 100.0) is None


def test_a_stale_report_is_not_a_waiter():
    """Worker 1's last report (300 s old) has it inside step 424 while worker 0
    waits in step 448: worker 1 is the one waited for, not a waiter too."""
    states = _workers((447, PHASE_STEP, 60), (423, PHASE_STEP, 300))
    states["worker 1"].heard = 100.0 - 300
    verdict = diagnose(states, {}, stall_timeout_s=5, now=100.0)
    assert verdict is not None and verdict.kind == "stall"
    assert verdict.message.startswith("job stalled: worker 0 (in step 448 for 60 s) waits for "
                                      "worker 1 to join step 448"), verdict.message
    assert "worker 1, pid 1001: has not started step 448 for 300 s; it is inside step 424 " \
           "(its last report, 300 s ago: it has stopped reporting" in verdict.message


def _with_server(role: str, silent_for: float, *workers) -> dict:
    """_workers(*workers) and server 0 of `role` (pid 77), last heard
    `silent_for` s before now = 100."""
    found = _workers(*workers)
    found[f"{role} 0"] = ProcessState(role, 0, pid=77, address="127.0.0.1:5000",
                                      registered=True, phase_since=0.0, heard=100.0 - silent_for)
    return found


@pytest.mark.parametrize("role", ["server", "sumserver"])
def test_a_silent_server_is_named_after_the_stall_timeout(role):
    def states(silent_for: float) -> dict:
        return _with_server(role, silent_for, (3, PHASE_STEP, silent_for),
                            (3, PHASE_STEP, silent_for))
    verdict = diagnose(states(12), {}, stall_timeout_s=5, now=100.0)
    assert verdict is not None and verdict.kind == "server"
    assert verdict.message.startswith(f"{role} 0 (pid 77) on 127.0.0.1:5000 stopped answering: "
                                      "nothing heard from it for 12 s")
    # Heard from lately, the stall check disabled, or exited (reported as an exit): no verdict.
    assert diagnose(states(2), {}, 5, 100.0) is None
    assert diagnose(states(12), {}, 0, 100.0) is None
    assert diagnose(states(12), {f"{role} 0": 1}, 5, 100.0) is None


@pytest.mark.parametrize("role", ["server", "sumserver"])
def test_a_stall_waits_for_a_quiet_server_to_be_named(role):
    """Worker 1 reads a server variable between steps (PHASE_OTHER) when the
    server stops: worker 0 waits inside the next step for it. The server is
    the first cause, so while it is quiet the stall is held, and once it has
    been silent for the minimum it is the verdict; a server heard from lately
    leaves the stall verdict as it was."""
    def states(quiet_for: float) -> dict:
        return _with_server(role, quiet_for, (4, PHASE_STEP, quiet_for),
                            (4, PHASE_OTHER, quiet_for))
    assert diagnose(states(SERVER_QUIET_S + 1), {}, stall_timeout_s=3, now=100.0) is None
    verdict = diagnose(states(SERVER_SILENCE_MIN_S), {}, stall_timeout_s=3, now=100.0)
    assert verdict is not None and verdict.kind == "server", verdict
    heard_lately = states(SERVER_QUIET_S + 1)
    heard_lately[f"{role} 0"].heard = 99.5
    verdict = diagnose(heard_lately, {}, stall_timeout_s=3, now=100.0)
    assert verdict is not None and verdict.kind == "stall", verdict
    # Nor is the stall warned of while the server is quiet.
    assert stall_warning(states(SERVER_QUIET_S + 1), {}, 3, 100.0) is None
    assert stall_warning(heard_lately, {}, 3, 100.0) is not None
    assert "worker 1, pid 1001: has not started step 5" in verdict.message
    # A quiet server that has exited is the launcher's to report: the stall stands.
    verdict = diagnose(states(SERVER_QUIET_S + 1), {f"{role} 0": 1}, 3, 100.0)
    assert verdict is not None and verdict.kind == "stall", verdict


@pytest.mark.slow
def test_a_stopped_summation_server_does_not_answer_the_probe():
    """The launcher's liveness probe of a summation server (it sends no
    heartbeats): a running one closes the probe's connection, a SIGSTOPped
    one (its kernel still accepts connections) does not."""
    from autopar.runtime.commands import native_program
    from autopar.runtime.native import SUMSERVER_NAME
    from autopar.runtime.netns import answers
    server = subprocess.Popen([native_program(SUMSERVER_NAME), "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().split()[-1]
        assert answers(address, 5.0)
        server.send_signal(signal.SIGSTOP)
        assert not answers(address, 1.0)
        server.send_signal(signal.SIGCONT)
        assert answers(address, 5.0)
    finally:
        server.kill()
        server.wait(timeout=10)
