"""The launcher with real processes on loopback: output streaming, exit codes,
failure teardown, signals, and the ssh command it would run on remote hosts.

Every process a test starts carries a unique AUTOPAR_TEST_TAG in its
environment, so "nothing left running" is checked by scanning /proc for that
tag rather than by trusting the launcher's own bookkeeping.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autopar.common import env as envvars
from autopar.common.errors import SpecError
from autopar.runtime.commands import REPO_ROOT, build_ssh_command, plan_children
from autopar.runtime.launcher import launch
from autopar.runtime.spec import HostSpec, ResourceSpec, SSHSettings, load_spec
from tests.integration.cluster import (LineReader, child_env, job_processes, pid_alive, start_job,
                                       survivors, train_command)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="uses /proc and PR_SET_PDEATHSIG")

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TAG_VAR = "AUTOPAR_TEST_TAG"


# --------------------------------------------------------------------------- helpers

def _tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds AUTOPAR_TEST_TAG=tag."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if needle in environ and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _read_pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid")}


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique tag for this test's processes; anything still carrying it at
    the end (a failed test) is killed so it cannot leak into other tests."""
    value = uuid.uuid4().hex
    yield value
    for pid in _tagged_pids(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def pid_dir(tmp_path: Path) -> Path:
    d = tmp_path / "pids"
    d.mkdir()
    return d


def _spec(workers: int, servers: int = 0) -> ResourceSpec:
    return load_spec({"hosts": [{"address": "127.0.0.1", "workers": workers, "servers": servers}]})


def _env(tag: str, pid_dir: Path | None = None) -> dict[str, str]:
    env = {TAG_VAR: tag}
    if pid_dir is not None:
        env["AUTOPAR_TEST_PIDDIR"] = str(pid_dir)
    return env


# --------------------------------------------------------------------------- in-process launches

def test_success_streams_prefixed_output_and_returns_0(capsys, caplog, tag):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    handlers_before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    extra = {**_env(tag), "AUTOPAR_TEST_EXTRA": "from-extra-env"}
    status = launch(_spec(2), [sys.executable, str(SCRIPTS / "echo_role.py"), "a b", "c"],
                    extra_env=extra)
    out = capsys.readouterr().out

    assert status == 0
    for i in (0, 1):
        assert f"[worker {i}] hello from worker {i} of 2\n" in out
        assert f"[worker {i}] to stderr\n" in out  # stderr is merged
    assert "[worker 0] args=['a b', 'c']" in out
    assert "[worker 0] AUTOPAR_TTY=0" in out
    assert "[worker 0] PYTHONUNBUFFERED=1" in out
    assert "[worker 1] AUTOPAR_TEST_EXTRA=from-extra-env" in out
    assert f"[worker 0] PYTHONPATH={REPO_ROOT}" in out
    assert "[worker 1] spec_has_hosts=True" in out
    # Lines are written whole: every output line carries exactly one prefix.
    for line in out.splitlines():
        assert line.startswith(("[worker 0] ", "[worker 1] ")), line
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("started ")]
    assert len(started) == 2
    assert any(m.startswith("started worker 1 at 127.0.0.1:") and ", pid " in m for m in started)
    assert _tagged_pids(tag) == []
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers_before


def test_failing_worker_stops_everyone_and_returns_its_status(capsys, caplog, tag, pid_dir):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    status = launch(_spec(2, servers=1), [sys.executable, str(SCRIPTS / "fail_worker1.py")],
                    extra_env=_env(tag, pid_dir), grace_seconds=3.0, log_tail_lines=5)
    out = capsys.readouterr().out

    assert status == 3
    assert "[worker 1] worker 1 giving up" in out
    assert "[worker 0] worker 0 sleeping" in out
    # Worker 0 sleeps as long as the test's timeout: the launcher stopped it, it did not finish.
    assert "woke up" not in out

    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2
    message = errors[0]
    pids = _read_pids(pid_dir)
    assert f"worker 1 (pid {pids['worker-1']}) exited with status 3" in message
    # The launcher's last word: which process failed, how.
    assert errors[1].startswith(f"job failed: worker 1 (pid {pids['worker-1']}) ")
    assert errors[1].endswith("status 3, no error in its output")
    # Its output was streamed: said once, not again in the report.
    assert message.endswith("(its output is above)"), message
    assert out.count("[worker 1] worker 1 giving up") == 1 and out.count("step 99") == 1, out

    assert set(pids) == {"worker-0", "worker-1"}
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} (pid {pid}) still running"
    started_server = [r.getMessage() for r in caplog.records
                      if r.getMessage().startswith("started server 0 at 127.0.0.1:")]
    assert len(started_server) == 1
    assert _tagged_pids(tag) == []  # the server too


def test_signal_death_and_sigterm_ignoring_worker(capsys, caplog, tag, pid_dir):
    # Worker 1 is SIGKILLed (status 128+9); worker 0 ignores SIGTERM, so the
    # launcher must escalate to SIGKILL after the grace period.
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    status = launch(_spec(2), [sys.executable, str(SCRIPTS / "stubborn.py")],
                    extra_env=_env(tag, pid_dir), grace_seconds=0.5)
    capsys.readouterr()

    assert status == 128 + signal.SIGKILL
    messages = [r.getMessage() for r in caplog.records]
    assert any("worker 1 (pid " in m and "exited with status 137 (killed by SIGKILL)" in m
               for m in messages)
    assert any("did not stop within 0.5 s of SIGTERM" in m for m in messages)
    for name, pid in _read_pids(pid_dir).items():
        assert not pid_alive(pid), f"{name} (pid {pid}) still running"
    assert _tagged_pids(tag) == []


def test_server_listens_and_is_stopped_after_success(capsys, caplog, tag):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    status = launch(_spec(1, servers=1), [sys.executable, str(SCRIPTS / "wait_for_server.py")],
                    extra_env=_env(tag))
    out = capsys.readouterr().out

    assert status == 0, out
    assert "[worker 0] worker 0: server reachable at 127.0.0.1:" in out
    assert "[server 0] " in out and "server 0 listening on 127.0.0.1:" in out
    server_pid = next(int(re.search(r"pid (\d+)", m).group(1))
                      for m in (r.getMessage() for r in caplog.records)
                      if m.startswith("started server 0"))
    assert not pid_alive(server_pid)
    assert _tagged_pids(tag) == []


def test_server_exiting_early_fails_the_job(capsys, caplog, tag, pid_dir, monkeypatch):
    # A server given a task index outside the cluster exits 2 at once; the
    # launcher must treat that as a failure even though workers are healthy.
    # AUTOPAR_CLUSTER from the launcher overrides the environment, so break the
    # server through PYTHONPATH instead: an autopar/runtime/server_main that exits 2.
    fake_root = pid_dir.parent / "fake_root"
    (fake_root / "autopar" / "runtime").mkdir(parents=True)
    (fake_root / "autopar" / "__init__.py").write_text("")
    (fake_root / "autopar" / "runtime" / "__init__.py").write_text("")
    (fake_root / "autopar" / "runtime" / "server_main.py").write_text(
        "print('server failing on purpose'); raise SystemExit(2)\n")
    monkeypatch.setattr("autopar.runtime.commands.REPO_ROOT", str(fake_root))
    # `python -m` puts the working directory first on sys.path: leave the repo.
    monkeypatch.chdir(pid_dir.parent)
    caplog.set_level(logging.INFO, logger="autopar.launcher")

    status = launch(_spec(1, servers=1), [sys.executable, str(SCRIPTS / "sleep_forever.py")],
                    extra_env=_env(tag, pid_dir))
    out = capsys.readouterr().out

    assert status == 2
    assert "[server 0] server failing on purpose" in out
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and "server 0 (pid " in errors[0] and "exited with status 2" in errors[0]
    assert errors[1].startswith("job failed: server 0 (pid ") and "status 2" in errors[1]
    assert _tagged_pids(tag) == []


# --------------------------------------------------------------------------- launcher in a subprocess

LAUNCHER_CODE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from autopar.runtime.launcher import launch
from autopar.runtime.spec import load_spec
spec = load_spec(json.loads(sys.argv[1]))
sys.exit(launch(spec, [sys.executable, sys.argv[2]], extra_env=json.loads(sys.argv[3])))
"""


def _start_launcher(tmp_path: Path, spec: dict, script: str, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "launcher.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER_CODE, json.dumps(spec), str(SCRIPTS / script), json.dumps(env)],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            # Own session: signals we send reach only the launcher, and its
            # children cannot be stopped by accident through our group.
            start_new_session=True)
    return proc, log


def _stop_launcher(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# The launcher process imports the library (and with it TensorFlow, several
# seconds); generous so a loaded machine does not fail the test.
STARTUP_TIMEOUT = 45.0
SPEC_2W_1S = {"hosts": [{"address": "127.0.0.1", "workers": 2, "servers": 1}]}


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_everything(tmp_path, tag, pid_dir, sig, expected):
    proc, log = _start_launcher(tmp_path, SPEC_2W_1S, "sleep_forever.py", _env(tag, pid_dir))
    try:
        _wait_until(lambda: len(_read_pids(pid_dir)) == 2, STARTUP_TIMEOUT, "both workers to start")
        _wait_until(lambda: b"[worker 1] worker 1 ready" in log.read_bytes(), 30, "worker output")
        # Two workers, the server, the fork server they were forked from and
        # the anchor of the job's private network namespace (runtime/netns.py).
        assert len(_tagged_pids(tag)) == 5
        proc.send_signal(sig)
        status = proc.wait(timeout=60)   # a bound on waiting, not a claim about speed
    finally:
        _stop_launcher(proc)
    text = log.read_text()
    assert status == expected, text
    assert f"received {signal.Signals(sig).name}" in text
    for name, pid in _read_pids(pid_dir).items():
        assert not pid_alive(pid), f"{name} (pid {pid}) still running"
    assert _tagged_pids(tag) == []


def test_sigkilled_launcher_takes_children_down(tmp_path, tag, pid_dir):
    proc, log = _start_launcher(tmp_path, SPEC_2W_1S, "sleep_forever.py", _env(tag, pid_dir))
    try:
        _wait_until(lambda: len(_read_pids(pid_dir)) == 2, STARTUP_TIMEOUT, "both workers to start")
        children = _tagged_pids(tag)
        assert len(children) == 5   # two workers, the server, the fork server, the namespace anchor
        # Only the launcher: its children live in sessions of their own, so
        # nothing but PR_SET_PDEATHSIG can stop them now.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _wait_until(lambda: not any(pid_alive(p) for p in children), 30, "children to die with the launcher")
    finally:
        _stop_launcher(proc)
    assert _tagged_pids(tag) == []


# --------------------------------------------------------------------------- Ctrl-C while starting

# The points of `autopar launch`'s start-up where Ctrl-C is pressed: its
# first and second forks (the namespace's anchor, then the fork server; a
# KeyboardInterrupt raised in CPython's at-fork callbacks was dropped and
# the job trained to its end), the run of the script that compiles the plan
# (the fork server's first child), the first worker started, every process
# started. The first two in a launcher started anew (it starts its fork
# server itself), the others in one forked from the tests' fork server (its
# spare is ready at once).
STARTUP_POINTS = ["first fork", "second fork", "compiling", "worker 0 started",
                  "worker 1 started"]
# Presses at each point: AUTOPAR_STARTUP_PRESSES (20 in `make stress`, the
# acceptance run); `make test` presses once at the two forks (a second each;
# the later points cost seconds of start-up each).
PRESSES = int(os.environ.get("AUTOPAR_STARTUP_PRESSES", "0"))
CASES = [(point, press) for point in STARTUP_POINTS for press in range(PRESSES)] if PRESSES \
    else [(point, 0) for point in STARTUP_POINTS[:2]]


def _launch_command(tmp_path: Path) -> list[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text("hosts:\n  - address: 127.0.0.1\n    workers: 2\n")
    return [sys.executable, "-m", "autopar.cli", "launch", "--spec", str(spec), "--",
            *train_command("mlp_sgd", tmp_path / "out", "--steps", "300")]


def _wait_until_point(proc, reader: LineReader, point: str, seen: set[int]) -> None:
    """Until the launcher reached ``point``, polling its process tree
    tightly (a fork is over in milliseconds)."""
    deadline = time.monotonic() + 180
    forks = {"first fork": 1, "second fork": 2}.get(point)
    while time.monotonic() < deadline and proc.poll() is None:
        tree = job_processes(proc.pid)
        seen |= tree
        if forks is not None and len(tree) > forks:
            return
        if point == "compiling" and any(job_processes(child) - {child} for child in
                                        tree - {proc.pid}):
            return
        if point.endswith(" started") and any(f"started {point[:-8]} at" in line
                                              for line in reader.lines_so_far()):
            return
        time.sleep(0.0002)
    raise AssertionError(f"the launcher never reached {point}:\n{reader.text[-3000:]}")


@pytest.mark.parametrize("point, press", CASES, ids=[f"{p}-{i}" for p, i in CASES])
def test_ctrl_c_at_each_point_of_the_start_up_stops_the_job(tmp_path, point, press):
    command = _launch_command(tmp_path)
    if point in ("first fork", "second fork"):
        proc = subprocess.Popen(command, cwd=REPO_ROOT, env=child_env(), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    else:
        proc = start_job(command)
    seen: set[int] = set()
    with LineReader(proc) as reader:
        _wait_until_point(proc, reader, point, seen)
        os.killpg(proc.pid, signal.SIGINT)       # what a terminal's Ctrl-C sends
        while proc.poll() is None:
            seen |= job_processes(proc.pid)
            time.sleep(0.01)
        reader.rest(timeout=60)
    text = reader.text
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert "done at global step" not in text, text[-3000:]
    assert not survivors(seen), text[-3000:]


# --------------------------------------------------------------------------- ssh commands (not run)

def test_ssh_command_for_remote_host():
    host = HostSpec(address="10.0.0.2", workers=1,
                    ssh=SSHSettings(user="alice", port=2222, key_file="~/.ssh/id_job",
                                    python="/opt/py/bin/python", workdir="/srv/my job"))
    argv = build_ssh_command(host, [sys.executable, "train.py", "--name", "a b"],
                             {"AUTOPAR_ROLE": "worker", "AUTOPAR_CLUSTER": '{"worker": ["x:1"]}'},
                             default_workdir="/home/alice")
    assert argv[:-1] == [
        "ssh", "-tt", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=10",
        "-o", "ServerAliveCountMax=3", "-p", "2222", "-i", "~/.ssh/id_job", "--", "alice@10.0.0.2"]
    # The remote login shell runs `sh -c SCRIPT`; sh splits SCRIPT back into
    # exactly the intended commands and words.
    words = shlex.split(argv[-1])
    assert words[:3] == ["exec", "sh", "-c"] and len(words) == 4
    commands = [shlex.split(c) for c in words[3].split("; ")]
    assert commands == [
        ["cd", "/srv/my job", "||", "exit", "1"],
        ["stty", "-echo", "2>/dev/null"],
        ["echo", "autopar: ready for the job token"],
        ["IFS=", "read", "-r", "AUTOPAR_COORD_TOKEN", "||", "exit", "1"],
        ["export", "AUTOPAR_COORD_TOKEN"],
        ["exec", "env", "AUTOPAR_ROLE=worker", 'AUTOPAR_CLUSTER={"worker": ["x:1"]}',
         "/opt/py/bin/python", "train.py", "--name", "a b", "</dev/null"],
    ]


def test_ssh_remote_command_reads_the_token_from_stdin_only(tmp_path):
    # Run the remote command as the remote login shell would, fed the token
    # line on stdin: the command gets it in its environment and an empty
    # stdin; without a token line nothing runs.
    host = HostSpec(address="node7", workers=1)
    probe = ("import os, sys; print('token=' + os.environ['AUTOPAR_COORD_TOKEN'], "
             "'A=' + os.environ['A'], 'stdin=' + repr(sys.stdin.read()), 'cwd=' + os.getcwd())")
    argv = build_ssh_command(host, [sys.executable, "-c", probe], {"A": "1 2"},
                             default_workdir=str(tmp_path))
    remote = argv[-1]
    run = subprocess.run(["sh", "-c", remote], input="s3cret\nmore input\n",
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["autopar: ready for the job token",
                                       f"token=s3cret A=1 2 stdin='' cwd={tmp_path}"]
    assert "s3cret" not in remote
    none = subprocess.run(["sh", "-c", remote], input="", capture_output=True, text=True,
                          timeout=60)
    assert none.returncode == 1 and "token=" not in none.stdout


def test_ssh_remote_command_on_a_terminal_does_not_echo_the_token(tmp_path):
    # ssh -tt gives the remote command a terminal, whose echo would send the
    # token back into the launcher's output: run the remote command on a pty
    # as sshd does and answer the prompt as the launcher does.
    import hashlib
    import pty
    host = HostSpec(address="node7", workers=1)
    probe = ("import hashlib, os; print('digest', hashlib.sha256("
             "os.environ['AUTOPAR_COORD_TOKEN'].encode()).hexdigest())")
    remote = build_ssh_command(host, [sys.executable, "-c", probe], {},
                               default_workdir=str(tmp_path))[-1]
    token = uuid.uuid4().hex
    master, slave = pty.openpty()
    proc = subprocess.Popen(["sh", "-c", remote], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    out = b""
    try:
        while b"ready for the job token" not in out:
            out += os.read(master, 4096)
        os.write(master, token.encode() + b"\n")
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # EIO: the terminal's last user is gone
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    assert f"digest {hashlib.sha256(token.encode()).hexdigest()}" in text, text
    assert token not in text, text


def test_ssh_command_defaults():
    host = HostSpec(address="node7", workers=1)  # no ssh settings at all
    argv = build_ssh_command(host, [sys.executable, "-m", "autopar.runtime.server_main"], {"A": "1"},
                             default_workdir="/work/dir")
    assert argv[:10] == ["ssh", "-tt", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=10",
                         "-o", "ServerAliveCountMax=3", "-p", "22"]
    assert argv[10:12] == ["--", "node7"] and "-i" not in argv
    assert argv[12].startswith("exec sh -c 'cd /work/dir || exit 1; ")
    assert argv[12].endswith(f"; exec env A=1 {sys.executable} -m autopar.runtime.server_main "
                             "</dev/null'")


def test_ssh_command_pins_the_host_key_to_the_spec_s_known_hosts():
    host = HostSpec(address="node7", workers=1,
                    ssh=SSHSettings(key_file="~/.ssh/id", known_hosts="~/.ssh/cluster_hosts"))
    argv = build_ssh_command(host, ["python", "t.py"], {}, default_workdir="/w")
    options = argv[:argv.index("--")]
    for option in ("UserKnownHostsFile=~/.ssh/cluster_hosts", "GlobalKnownHostsFile=none",
                   "StrictHostKeyChecking=yes"):
        assert options[options.index(option) - 1] == "-o"
    with pytest.raises(SpecError, match="known_hosts.*space"):
        load_spec({"hosts": [{"address": "node7", "workers": 1,
                              "ssh": {"known_hosts": "/a b"}}]})


def test_plan_mixes_local_and_remote_children():
    spec = ResourceSpec(hosts=(
        HostSpec(address="127.0.0.1", workers=1, servers=1),
        HostSpec(address="192.0.2.10", workers=1, servers=1,  # TEST-NET-1: never local
                 ssh=SSHSettings(user="bob", workdir="/jobs")),
    ))
    cluster = {"worker": ["127.0.0.1:5000", "192.0.2.10:5000"],
               "ps": ["127.0.0.1:5001", "192.0.2.10:5001"]}
    plans = plan_children(spec, cluster, [sys.executable, "train.py"],
                          extra_env={"MY_FLAG": "1"}, cwd="/here")
    assert [(p.name, p.address, p.remote) for p in plans] == [
        ("server 0", "127.0.0.1:5001", False), ("server 1", "192.0.2.10:5001", True),
        ("worker 0", "127.0.0.1:5000", False), ("worker 1", "192.0.2.10:5000", True),
    ]
    local_worker, remote_worker = plans[2], plans[3]
    assert local_worker.command == [sys.executable, "train.py"]
    assert local_worker.cwd == "/here"
    env = local_worker.env
    assert env[envvars.ROLE] == "worker" and env[envvars.TASK_INDEX] == "0"
    assert json.loads(env[envvars.CLUSTER]) == cluster
    assert ResourceSpec.from_dict(json.loads(env[envvars.SPEC])) == spec
    assert env["MY_FLAG"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == REPO_ROOT
    assert env["PATH"] == os.environ["PATH"]  # local children inherit the launcher's env
    assert plans[0].command == [sys.executable, "-m", "autopar.runtime.server_main"]
    assert plans[0].env[envvars.ROLE] == "server"

    assert remote_worker.command[:1] == ["ssh"] and "bob@192.0.2.10" in remote_worker.command
    script = shlex.split(remote_worker.command[-1])[-1]   # exec sh -c SCRIPT
    assert script.startswith("cd /jobs || exit 1; ")
    remote = shlex.split(script.rsplit("; ", 1)[-1])
    assert remote[:2] == ["exec", "env"] and remote[-1] == "</dev/null"
    remote = remote[:-1]
    assignments = dict(w.split("=", 1) for w in remote if "=" in w and w.split("=", 1)[0].isupper())
    assert assignments[envvars.ROLE] == "worker" and assignments[envvars.TASK_INDEX] == "1"
    assert assignments["MY_FLAG"] == "1"
    assert "PATH" not in assignments  # the remote host keeps its own PATH
    assert remote[-2:] == [sys.executable, "train.py"]
