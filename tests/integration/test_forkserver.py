"""The fork server (runtime/forkserver.py) with a real server process: its
children behave as the same command started anew would (argv, environment,
working directory, sys.path, streams, exit status, own session), and none
outlives it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autopar.runtime.forkserver import ForkedProcess, ForkServer, ForkServerError, forkable
from tests.integration.cluster import child_env, pid_alive

SCRIPT = Path(__file__).resolve().parent / "scripts" / "describe_process.py"
ADOPT = Path(__file__).resolve().parent / "scripts" / "adopt_spare.py"


@pytest.fixture(scope="module")
def server():
    server = ForkServer(child_env())
    yield server
    server.stop()


def _finish(child: ForkedProcess, timeout: float = 60.0) -> tuple[int, list[str]]:
    """Its whole output (lines), then its exit status."""
    assert child.stdout is not None
    lines = child.stdout.read().decode().splitlines()
    deadline = time.monotonic() + timeout
    while child.poll() is None:
        assert time.monotonic() < deadline, "no exit status"
        time.sleep(0.02)
    return child.returncode, lines


def _described(lines: list[str]) -> dict:
    return json.loads(next(line for line in lines if line.startswith("{")))


def test_a_child_is_the_script_run_anew(server, tmp_path):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": child_env()["PYTHONPATH"],
           "ONLY_IN_THE_CHILD": "yes"}
    child = server.start([sys.executable, str(SCRIPT), "a b", "--exit", "3"], env, str(tmp_path))
    status, lines = _finish(child)
    seen = _described(lines)

    assert status == 3
    assert seen["argv"] == [str(SCRIPT), "a b", "--exit", "3"]
    assert seen["name"] == "__main__"
    assert seen["cwd"] == str(tmp_path)
    assert seen["path0"] == str(SCRIPT.parent)
    assert seen["env"] == env        # exactly the request's, nothing of the server's
    assert seen["stdin"] == ""       # /dev/null
    assert "to stderr" in lines      # stderr on the same pipe
    assert seen["preloaded"] is True
    assert seen["ppid"] == server.pid
    assert seen["pid"] == child.pid == seen["pgid"] == seen["sid"]   # its own session


def test_module_form_exceptions_and_fresh_random_state(server, tmp_path):
    env = child_env()
    module = [sys.executable, "-m", "tests.integration.scripts_module_probe"]
    # `-m` runs a module from the working directory, as python -m does.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "integration").mkdir()
    (tmp_path / "tests" / "integration" / "__init__.py").write_text("")
    (tmp_path / "tests" / "integration" / "scripts_module_probe.py").write_text(
        "import sys\nprint('module', __name__, sys.argv[1:], flush=True)\nsys.exit(5)\n")
    status, lines = _finish(server.start([*module, "x"], env, str(tmp_path)))
    assert status == 5 and "module __main__ ['x']" in lines

    status, lines = _finish(server.start([sys.executable, str(SCRIPT), "--raise"], env,
                                         str(tmp_path)))
    assert status == 1
    assert any("RuntimeError: raised on purpose" in line for line in lines)

    draws = {_described(_finish(server.start([sys.executable, str(SCRIPT)], env,
                                              str(tmp_path)))[1])["random"] for _ in range(3)}
    assert len(draws) == 3     # not the server's NumPy random state, copied


def test_a_killed_child_and_the_server_stopping_take_everything_down(tmp_path):
    server = ForkServer(child_env())
    try:
        argv = [sys.executable, str(SCRIPT), "--sleep", "300"]
        killed = server.start(argv, child_env(), str(tmp_path))
        os.killpg(killed.pid, signal.SIGKILL)
        status, _ = _finish(killed)
        assert status == -signal.SIGKILL

        left = server.start(argv, child_env(), str(tmp_path))
        assert left.stdout is not None and left.stdout.readline().startswith(b"{")
        assert left.poll() is None
    finally:
        server.stop()
    assert not pid_alive(server.pid)
    deadline = time.monotonic() + 30
    while pid_alive(left.pid):
        assert time.monotonic() < deadline, "a child outlived its fork server"
        time.sleep(0.05)
    # Its exit is known although nobody is left to report it.
    assert left.poll() is not None
    with pytest.raises(ForkServerError, match="fork server is gone"):
        server.start(argv, child_env(), str(tmp_path))


def test_a_child_with_a_spare_adopts_it_as_the_fork_server_of_its_own_children(server, tmp_path):
    def run(*args: str) -> dict:
        status, lines = _finish(server.start([sys.executable, str(ADOPT), *args], child_env(),
                                             str(tmp_path), spare=True))
        assert status == 0, lines
        return _described(lines)

    # The fixture's server was started without LD_PRELOAD: a spare is
    # adopted only by a launcher whose children need the same libraries.
    adopted = run("")
    assert adopted["adopted"] and adopted["status"] == 0, adopted
    # Forked from the spare, which the adopting process had forked: a copy
    # of the server with its imports done, serving like one.
    assert adopted["child"]["ppid"] == adopted["spare"]
    assert adopted["child"]["preloaded"] is True
    assert adopted["child"]["argv"] == [str(SCRIPT)]
    assert adopted["again"] is False      # one spare, adopted once

    refused = run("/nonexistent/other.so")
    assert refused["spare"] is not None and refused["adopted"] is False, refused
    unused = run("--leave")
    # None outlives the process it was made for: stopped with the job's fork
    # server, exited on refusing, or killed with its process.
    deadline = time.monotonic() + 30
    while any(pid_alive(r["spare"]) for r in (adopted, refused, unused)):
        assert time.monotonic() < deadline, "a spare outlived the process it was made for"
        time.sleep(0.05)


def test_what_can_be_forked():
    assert forkable([sys.executable, str(SCRIPT), "--x"])
    assert forkable([sys.executable, "-m", "autopar.runtime.server_main"])
    assert not forkable([sys.executable, "-u", str(SCRIPT)])         # interpreter options
    assert not forkable([sys.executable, "-m"])
    assert not forkable([sys.executable, str(SCRIPT.parent / "missing.py")])
    assert not forkable(["/bin/sh", "-c", "true"])
    assert not forkable([sys.executable])


def test_a_dead_fork_server_is_reported_and_its_children_count_as_killed(tmp_path, caplog):
    server = ForkServer(child_env())
    try:
        child = server.start([sys.executable, str(SCRIPT), "--sleep", "300"], child_env(),
                             str(tmp_path))
        assert child.stdout is not None and child.stdout.readline().startswith(b"{")
        os.kill(server.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert not pid_alive(child.pid)
    finally:
        server.stop()
    assert any(f"the fork server (pid {server.pid}) exited unexpectedly" in r.getMessage()
               for r in caplog.records)


def test_outputs_to_files_in_a_named_network_namespace_from_another_preload(tmp_path):
    """What the benchmark harness asks of it: a server importing only the
    modules it is given, whose child enters an emulated host's namespace
    (/var/run/netns/NAME) and writes stdout and stderr to two files."""
    if os.geteuid() != 0:
        pytest.skip("creating a named network namespace needs root")
    name = f"apfs{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    light = ForkServer(child_env(), preload=["json"])
    try:
        light.wait_ready(60)
        out, err = tmp_path / "out", tmp_path / "err"
        with open(out, "wb") as o, open(err, "wb") as e:
            child = light.start([sys.executable, str(SCRIPT), "--exit", "4"], child_env(),
                                str(tmp_path), outputs=(o.fileno(), e.fileno()),
                                netns=f"/var/run/netns/{name}")
        assert child.stdout is None
        assert child.wait(60) == 4
        seen = _described(out.read_text().splitlines())
        assert err.read_text().splitlines() == ["to stderr"]
        assert seen["netns"] == os.stat(f"/var/run/netns/{name}").st_ino
        assert seen["netns"] != os.stat("/proc/self/ns/net").st_ino
        assert seen["preloaded"] is False          # the server imported json only
        assert seen["pid"] == child.pid == seen["sid"]
    finally:
        light.stop()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
