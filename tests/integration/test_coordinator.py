"""The job coordinator in real jobs: nothing of a loopback job is reachable
from another network (a network namespace of the test's own, joined to this
one by a veth pair), the coordinator refuses calls without the job's token,
and stalls and step-count mismatches end the job with a message naming the
workers, leaving nothing running."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from autopar.runtime.coordinator import _grpc_modules
from tests.integration.cluster import (REPO, LineReader, assert_same_parameters, child_env,
                                       latest_attempt, load_worker, run_single_device,
                                       run_training, start_job, survivors, train_command,
                                       write_spec)

_CONNECT = ("import socket, sys\n"
            "for port in sys.argv[2:]:\n"
            "    try:\n"
            "        socket.create_connection((sys.argv[1], int(port)), timeout=3).close()\n"
            "        print(port, 'open')\n"
            "    except OSError as e:\n"
            "        print(port, 'closed', e.errno)\n")


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


class _OutsideNetwork:
    """A network namespace "apt<pid>" with a veth pair: this side 10.214.X.1
    and fd14:X::1, the namespace's side 10.214.X.2 and fd14:X::2. Connecting
    from the namespace to this side is reaching this machine through a
    non-loopback address."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.ns = f"apt{pid}"
        self.host_if, self.ns_if = f"apt{pid}h", f"apt{pid}n"
        x = pid % 250
        self.host_ip, self.ns_ip = f"10.214.{x}.1", f"10.214.{x}.2"
        self.host_ip6, self.ns_ip6 = f"fd14:{x:x}::1", f"fd14:{x:x}::2"

    def __enter__(self) -> "_OutsideNetwork":
        try:
            _run("ip", "netns", "add", self.ns)
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _run("ip", "link", "set", self.ns_if, "netns", self.ns)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            _run("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.ns_ip}/30",
                 "dev", self.ns_if)
            _run("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
            _run("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
            # nodad: usable at once, not after duplicate address detection.
            _run("ip", "-6", "addr", "add", f"{self.host_ip6}/64", "dev", self.host_if, "nodad")
            _run("ip", "netns", "exec", self.ns, "ip", "-6", "addr", "add", f"{self.ns_ip6}/64",
                 "dev", self.ns_if, "nodad")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def probe(self, ports: list[int], host: str | None = None) -> dict[int, str]:
        """Connect from inside the namespace to this machine's veth address
        (``host``: one of them, default the IPv4 one)."""
        out = subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", _CONNECT,
                              host or self.host_ip, *map(str, ports)],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        return {int(p): state for p, state, *_ in (line.split() for line in out.splitlines())}


def _listening(pids: set[int]) -> dict[int, str]:
    """port -> local address of every TCP socket the processes listen on."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            local = line.split()[3]
            address, _, port = local.rpartition(":")
            found[int(port)] = address
    return found


def _job_pids(text: str, launcher: int, every_attempt: bool = False) -> set[int]:
    """The launcher and the processes it started: those of its latest attempt,
    or of every attempt (for checking that none outlives the job)."""
    started = text if every_attempt else latest_attempt(text)
    return {launcher} | {int(p) for p in
                         re.findall(r"started \w+ \d+ at \S+, pid (\d+)", started)}


def _stop(proc: subprocess.Popen, pids: set[int]) -> None:
    """End a job whose worker is stalled: the first SIGTERM asks the chief
    to finish its step (which it cannot, its peer being stalled), the second
    makes the launcher stop every process at once."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not survivors(pids)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a network namespace and a veth pair "
                    "needs root (CAP_NET_ADMIN)")
def test_loopback_job_unreachable_from_outside_and_coordinator_needs_token(tmp_path):
    # In this machine's own network (no private namespace): what the bind
    # shim and the coordinator's token guard is reachable from here.
    spec = write_spec(tmp_path, workers=2, servers=1, isolation="none")
    # Processes started anew, not forked (runtime/forkserver.py): the test reads
    # the token from a child's /proc/PID/environ, which shows only the
    # environment a process was exec'd with. Forked children's binding is
    # checked by test_stalled_worker_ends_job_naming_it.
    proc = subprocess.Popen(
        train_command("mlp_sgd", tmp_path / "out", "--steps", "1000", "--stall-at", "3",
                      "--run-option", "ps",      # the server holds every variable
                      "--stall-timeout", "0", "--spec", str(spec)),
        cwd=REPO, env={**child_env(), "AUTOPAR_FORK_SERVER": "0"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    reader = LineReader(proc)
    pids: set[int] = {proc.pid}
    try:
        reader.wait_for(r"worker 1 stalling at step 3", 180)
        text = reader.text
        pids = _job_pids(text, proc.pid)
        assert len(pids) == 4, text   # launcher, 2 workers, 1 server
        listening = _listening(pids)
        # 2 workers' and 1 server's TensorFlow servers, and the coordinator.
        assert len(listening) >= 4, listening
        assert set(listening.values()) <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, listening

        with _OutsideNetwork() as outside:
            # Control: a wildcard listener of this machine is reachable from the
            # namespace, so "closed" below is the job's doing.
            with socket.socket() as control:
                control.bind(("0.0.0.0", 0))
                control.listen()
                control_port = control.getsockname()[1]
                probed = outside.probe([control_port, *listening])
            assert probed.pop(control_port) == "open"
            assert probed == {port: "closed" for port in listening}, probed

        # The coordinator: the launcher's own listening port.
        coordinator_ports = [p for p in _listening({proc.pid})]
        assert len(coordinator_ports) == 1, coordinator_ports
        address = f"127.0.0.1:{coordinator_ports[0]}"
        child = min(pids - {proc.pid})   # every child has the token
        environ = dict(kv.split("=", 1) for kv in
                       Path(f"/proc/{child}/environ").read_text().split("\0") if "=" in kv)
        token = environ["AUTOPAR_COORD_TOKEN"]
        assert len(token) >= 32
        pb2, pb2_grpc = _grpc_modules()
        with grpc.insecure_channel(address) as channel:
            stub = pb2_grpc.CoordinatorStub(channel)
            request = pb2.ExchangeRequest(process=pb2.ProcessId(role="worker", index=0),
                                          key="probe", value=b"x", expect=1, timeout_s=5)
            for metadata in (None, (("autopar-token", "0" * len(token)),)):
                with pytest.raises(grpc.RpcError) as info:
                    stub.Exchange(request, metadata=metadata, timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Control: the same call with the job's token is answered.
            reply = stub.Exchange(request, metadata=(("autopar-token", token),), timeout=10)
            assert reply.values["worker 0"] == b"x"
        # The token is in no command line and no log line.
        for pid in pids:
            assert token not in Path(f"/proc/{pid}/cmdline").read_text()
        assert token not in reader.text
    finally:
        _stop(proc, pids | _job_pids(reader.text, proc.pid, every_attempt=True))


def _run_until_end(tmp_path, *extra: str, ready: str,
                   isolation: str | None = None) -> tuple[subprocess.Popen, LineReader, str,
                                                          float, set[int], dict[int, str]]:
    spec = write_spec(tmp_path, workers=2, servers=1, isolation=isolation)
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--stall-timeout", "5",
                                   "--spec", str(spec), *extra))
    with LineReader(proc) as reader:
        reader.wait_for(ready, 180)
        seen = time.monotonic()
        pids = _job_pids(reader.text, proc.pid)
        listening = _listening(pids)
        rest = reader.rest(timeout=60)
        elapsed = time.monotonic() - seen
    assert not survivors(_job_pids(reader.text, proc.pid, every_attempt=True)), \
        reader.text[-3000:]
    return proc, reader, rest, elapsed, pids, listening


def test_stalled_worker_ends_job_naming_it(tmp_path):
    # Worker 1 stops itself (SIGSTOP) between steps: it stops reporting, so it
    # is stuck, not busy, and the stall timeout ends the job.
    proc, reader, rest, elapsed, pids, listening = _run_until_end(
        tmp_path, "--steps", "1000", "--stall-at", "3", "--stall-how", "stop",
        ready=r"worker 1 stalling at step 3",
        isolation="none")   # this machine's network, where `ss` sees the listening ports
    assert proc.returncode == 1, reader.text[-3000:]
    assert len(pids) == 3     # the launcher and 2 workers: the plan gives the server nothing
    assert "(forked)" in reader.text
    # Forked from the fork server, the workers' TensorFlow servers (and the
    # launcher's coordinator) still listen on loopback only.
    assert len(listening) >= 3, listening
    assert set(listening.values()) <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, listening
    assert elapsed < 5 + 10, f"the job ended {elapsed:.1f} s after worker 1 stalled"
    assert re.search(r"job stalled: worker 0 \(in step 4 .*\) waits for worker 1", rest), rest
    assert re.search(r"worker 1, pid \d+: has not started step 4 .* finished step 3 .* it has "
                     r"stopped reporting", rest), rest


def test_a_chief_evaluating_longer_than_the_stall_timeout_is_waited_for(tmp_path):
    """The chief runs forward passes (not training steps) for 8 s after step
    3 while worker 1 waits inside step 4; the stall timeout is 2 s. The chief
    still reports, so it is busy, not stuck: the launcher warns every 2 s and
    the job goes on, ending equal to one device. (The spec also lists a
    server, which the hybrid plan of this dense model on one machine gives
    nothing to do: it is not started.)"""
    out = tmp_path / "out"
    log = run_training("mlp_sgd", out, "--steps", "6", "--stall-timeout", "2",
                       "--chief-busy-at", "3", "--chief-busy-for", "8",
                       "--spec", str(write_spec(tmp_path, workers=2, servers=1)))
    assert "the plan puts no variable on the spec's 1 server: it is not started" in log, log
    assert "started server" not in log and "started sumserver" not in log, log
    warnings = [line for line in log.splitlines()
                if "inside step 4 for worker 0 to join it; it is busy outside a step" in line]
    assert len(warnings) >= 3, log[-3000:]       # from 1 s, then every 2 s
    assert "job stalled" not in log
    run_single_device("mlp_sgd", tmp_path / "single", "--steps", "6")
    expected = load_worker(tmp_path / "single", 0)
    for i in range(2):
        assert_same_parameters(expected, load_worker(out, i), what=f"worker {i}")


@pytest.mark.parametrize("after", ["exit", "sleep"])
def test_mismatched_step_counts_end_job(tmp_path, after):
    proc, reader, rest, elapsed, pids, _ = _run_until_end(
        tmp_path, "--steps", "6", "--fewer-steps", after, ready=r"worker 1 stops after 5 steps")
    assert proc.returncode == 1, reader.text[-3000:]
    assert "mismatched step counts: worker 1 stopped after 5 steps, worker 0 ran 6" in rest, rest
    assert "UnavailableError" not in reader.text


def _assert_every_process_titled(text: str, launcher: int) -> None:
    """`ps -eo args` shows every process of the running job as
    `autopar[JOB] ...` with the job's id: the launcher, its fork server, the
    network namespace's anchor, each worker and summation server."""
    job = re.search(r"job ([0-9a-f]{6}): its processes show as autopar\[\1\] in ps", text)
    assert job, text[-3000:]
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True,
                         check=True).stdout
    titles = {int(pid): args for pid, _, args in
              (line.strip().partition(" ") for line in out.splitlines() if line.strip())}
    prefix = f"autopar[{job.group(1)}] "
    started = {name: int(pid) for name, pid in re.findall(r"started (\w+ \d+) at \S+, pid (\d+)", text)}
    # (No parameter server: the herring plan of a dense model puts nothing on it.)
    expected = {"worker 0": "worker 0/2 train_model.py", "worker 1": "worker 1/2 train_model.py",
                "sumserver 0": "sumserver 0"}
    assert set(started) == set(expected), started
    for name, pid in started.items():
        assert titles[pid].startswith(prefix + expected[name]), (name, titles[pid])
    assert titles[launcher].startswith(prefix + "launcher train_model.py"), titles[launcher]
    helpers = sorted(t[len(prefix):].strip() for pid, t in titles.items()
                     if t.startswith(prefix) and pid != launcher and pid not in started.values())
    assert helpers == ["fork server", "network namespace"], helpers


def test_a_stopped_server_ends_the_job_naming_it(tmp_path):
    """A SIGSTOPped parameter server (its heartbeats stop) or summation server
    (it stops answering the launcher's probe) ends the job within the stall
    timeout + 15 s, named with its pid and address, instead of leaving the
    workers inside the step until 20 stall timeouts. (Before that, the
    herring job, with a summation server, shows each process's title.)
    The two jobs run side by side: each waits out the servers' minimum
    silence (health.SERVER_SILENCE_MIN_S, 10 s), once for both."""
    jobs = []
    for run_option, role in (("ps", "server"), ("herring", "sumserver")):
        out = tmp_path / run_option
        out.mkdir()
        spec = write_spec(out, workers=2, servers=1)
        proc = start_job(train_command("mlp_sgd", out / "out", "--stall-timeout", "3",
                                       "--steps", "100000", "--run-option", run_option,
                                       "--spec", str(spec)))
        jobs.append((role, proc, LineReader(proc)))
    try:
        stopped = {}
        for role, proc, reader in jobs:
            reader.wait_for(r"\] step 3 ", 180)
            if role == "sumserver":
                _assert_every_process_titled(reader.text, proc.pid)
            found = re.search(rf"started {role} 0 at (\S+), pid (\d+)",
                              latest_attempt(reader.text))
            address, pid = found.group(1), int(found.group(2))
            os.kill(pid, signal.SIGSTOP)
            stopped[role] = (address, pid, _job_pids(reader.text, proc.pid, every_attempt=True),
                             time.monotonic())
        for role, proc, reader in jobs:
            reader.rest(timeout=120)
            address, pid, pids, at = stopped[role]
            elapsed = time.monotonic() - at
            lines = reader.text.rstrip("\n").splitlines()
            assert proc.returncode == 1, reader.text[-3000:]
            assert lines[-1].startswith(f"{role} 0 (pid {pid}) on {address} stopped answering"), \
                reader.text[-4000:]
            assert elapsed < 3 + 15, f"the job ended {elapsed:.1f} s after {role} 0 was stopped"
            assert not survivors(pids), reader.text[-3000:]
    finally:
        for _, _, reader in jobs:
            reader.__exit__(None, None, None)
