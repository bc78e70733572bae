"""Jobs on a host the launcher reaches over ssh: the processes there get the
coordinator token on ssh's stdin (never on a command line or in the output),
register and report with it, so stall detection covers them, and Ctrl-C
makes a remote chief save a final checkpoint through the coordinator. A
host that cannot be reached when the job restarts is dropped
(Config.min_workers) and the job goes on, re-planned, on the others.

The "remote host" is a network namespace of the test's own, joined to this
one by a veth pair (tests/integration/test_coordinator.py `_OutsideNetwork`):
its address is not this machine's, so the launcher's real ssh path is taken.
An executable named `ssh`, first on the launcher's PATH, stands in for the
ssh client: it checks the options end with `--` and the destination is the
namespace's address, then runs the remote command with `sh -c` inside the
namespace, its stdin being ssh's, as sshd runs it with the login shell.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, load_worker,
                                       pid_alive, run_single_device, train_command)
from tests.integration.test_coordinator import _OutsideNetwork, _stop
from tests.integration.test_failures import LineReader

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a network namespace as the remote host needs root (CAP_NET_ADMIN)")

_FAKE_SSH = """#!/bin/sh
printf '%s\\n' "$*" >> {log}
# The host is down once the file FAKE_SSH_DOWN names exists.
[ -n "$FAKE_SSH_DOWN" ] && [ -e "$FAKE_SSH_DOWN" ] && {{
    echo "ssh: connect to host {host} port 22: No route to host" >&2; exit 255; }}
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
[ "$1" = "--" ] || {{ echo "fake ssh: no -- before the destination" >&2; exit 255; }}
[ "$2" = "{host}" ] || {{ echo "fake ssh: unknown host $2" >&2; exit 255; }}
exec ip netns exec {ns} sh -c "$3"
"""


@pytest.fixture
def remote_host(tmp_path):
    """(namespace network, environment whose PATH finds the fake ssh first,
    log of the fake ssh's argv)."""
    with _OutsideNetwork() as net:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        log = tmp_path / "ssh_argv.log"
        ssh = bin_dir / "ssh"
        ssh.write_text(_FAKE_SSH.format(log=log, host=net.ns_ip, ns=net.ns))
        ssh.chmod(0o755)
        env = child_env()
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        yield net, env, log


def _spec(tmp_path: Path, address: str, servers: int) -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(f"hosts:\n  - address: {address}\n    workers: 2\n    servers: {servers}\n")
    return path


def _launch(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _started(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"started (\w+ \d+) at \S+, pid (\d+) \(via ssh\)", text)}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def test_remote_workers_report_with_the_token_and_stall_detection_names_them(
        tmp_path, remote_host):
    net, env, ssh_log = remote_host
    proc = _launch(train_command("mlp_sgd", tmp_path / "out", "--steps", "1000",
                                 "--run-option", "ps",     # the server holds every variable
                                 "--stall-at", "3", "--stall-how", "stop", "--stall-timeout", "5",
                                 "--spec", str(_spec(tmp_path, net.ns_ip, servers=1))), env)
    reader = LineReader(proc)
    pids: set[int] = {proc.pid}
    try:
        reader.wait_for(r"worker 1 stalling at step 3", 180)
        started = _started(reader.text)
        assert set(started) == {"server 0", "worker 0", "worker 1"}, reader.text[-3000:]
        pids |= set(started.values())
        # The remote processes hold the token (read from stdin); it is on no
        # command line: not the launcher's, not ssh's, not the processes'.
        token = _environ(started["worker 1"])["AUTOPAR_COORD_TOKEN"]
        assert len(token) == 64
        assert all(_environ(p)["AUTOPAR_COORD_TOKEN"] == token for p in started.values())
        for pid in pids:
            assert token not in Path(f"/proc/{pid}/cmdline").read_text()
        argv_log = ssh_log.read_text()
        assert argv_log.count(f"-- {net.ns_ip} ") == 3 and token not in argv_log
        rest = reader.rest(timeout=60)
    finally:
        _stop(proc, pids)
    text = reader.text
    assert proc.returncode == 1, text[-3000:]
    # Worker 1's registered pid is the one the launcher started through ssh:
    # it reached the coordinator (on this side of the veth) with the token.
    assert re.search(r"job stalled: worker 0 \(in step 4 .*\) waits for worker 1", rest), rest
    assert re.search(rf"worker 1, pid {started['worker 1']}: has not started step 4 "
                     r".* finished step 3", rest), rest
    assert token not in text and "ready for the job token" not in text


def test_ctrl_c_makes_a_remote_chief_save_a_final_checkpoint(tmp_path, remote_host):
    net, env, _ = remote_host
    ckpt = tmp_path / "ckpt"
    proc = _launch(train_command("mlp_sgd", tmp_path / "out", "--steps", "30",
                                 "--checkpoint-dir", str(ckpt), "--save-every", "100",
                                 "--pause-at", "5",
                                 "--spec", str(_spec(tmp_path, net.ns_ip, servers=0))), env)
    reader = LineReader(proc)
    pids: set[int] = {proc.pid}
    try:
        reader.wait_for([r"\] step 5 ", r"worker 0 pausing at step 5"], 180)
        pids |= set(_started(reader.text).values())
        assert len(pids) == 3, reader.text[-3000:]
        os.killpg(proc.pid, signal.SIGINT)   # what a Ctrl-C at the terminal does
        reader.rest(timeout=90)
    finally:
        _stop(proc, pids)
    text = reader.text
    assert proc.returncode == 130, text[-3000:]
    assert re.search(r"job stopped on SIGINT: the chief stopped at global step 5; "
                     r"checkpoint \S*model\.ckpt-5", text), text[-3000:]
    assert (ckpt / "model.ckpt-5.index").exists(), sorted(os.listdir(ckpt))
    assert not any(pid_alive(p) for p in pids)


def test_a_remote_worker_cut_off_from_the_launcher_stops_itself(tmp_path, remote_host):
    """The link to the remote host goes down (the launcher's stall check is
    off, so nothing on this side ends the job): the remote worker notices it
    cannot reach the coordinator and exits within the link timeout (5 s here,
    AUTOPAR_LINK_TIMEOUT_S) + 15 s, instead of running until the link returns."""
    net, env, _ = remote_host
    env = {**env, "AUTOPAR_LINK_TIMEOUT_S": "5"}
    spec = tmp_path / "one.yaml"
    spec.write_text(f"hosts:\n  - address: {net.ns_ip}\n    workers: 1\n")
    proc = _launch(train_command("mlp_sgd", tmp_path / "out", "--steps", "1000",
                                 "--stall-at", "3", "--stall-worker", "0", "--stall-timeout", "0",
                                 "--spec", str(spec)), env)
    reader = LineReader(proc)
    pids: set[int] = {proc.pid}
    try:
        reader.wait_for(r"worker 0 stalling at step 3", 180)
        worker = _started(reader.text)["worker 0"]
        pids.add(worker)
        subprocess.run(["ip", "link", "set", net.host_if, "down"], check=True)
        cut = time.monotonic()
        while pid_alive(worker) and time.monotonic() - cut < 5 + 15:
            time.sleep(0.1)
        elapsed = time.monotonic() - cut
        assert not pid_alive(worker), f"worker 0 still runs {elapsed:.0f} s after the cut"
        reader.rest(timeout=60)
    finally:
        _stop(proc, pids)
    assert "the job coordinator (the launcher) has been unreachable for" in reader.text, \
        reader.text[-3000:]
    assert proc.returncode == 1, reader.text[-3000:]


def test_a_host_unreachable_on_restart_is_dropped_and_the_job_goes_on(tmp_path, remote_host):
    """Worker 1, on the remote host, kills itself at global step 7 of 20;
    the host is down from then on (ssh exits 255). With min_workers=1 the
    restart goes on with worker 0 alone, from the last checkpoint; the
    script feeds its global batch of 12 to however many workers there are,
    so the result equals one device's 20 steps."""
    net, env, _ = remote_host
    out = tmp_path / "job"
    env = {**env, "FAKE_SSH_DOWN": f"{out}.killed"}     # train_model's marker of the kill
    spec = tmp_path / "two.yaml"
    spec.write_text(f"hosts:\n  - address: {net.host_ip}\n    workers: 1\n"
                    f"  - address: {net.ns_ip}\n    workers: 1\n")
    proc = _launch(train_command("mlp_adam_clip_ema", out, "--steps", "20", "--batch", "12",
                                 "--spec", str(spec), "--checkpoint-dir", str(tmp_path / "ckpt"),
                                 "--save-every", "5", "--kill-at", "7", "--max-restarts", "1",
                                 "--min-workers", "1"), env)
    reader = LineReader(proc)
    try:
        text = reader.rest(timeout=300)
    finally:
        _stop(proc, {proc.pid})
    assert proc.returncode == 0, text[-4000:]
    assert "worker 1 killing itself at step 7" in text
    assert re.search(rf"cannot reach {net.ns_ip} to restart it \(ssh exited 255\): dropped it "
                     r"\(min_workers=1\); the job goes on with 1 worker\(s\) instead of 2 .*"
                     r"The global batch is now 1/2 of what it was; the learning rate is unchanged",
                     text), text[-4000:]
    assert "the plan for the 1 remaining worker(s):" in text
    restored = re.search(r"restored .*model\.ckpt-(\d+) \(global step \1\)", text)
    assert restored and int(restored.group(1)) in (5, 7), text[-4000:]
    run_single_device("mlp_adam_clip_ema", tmp_path / "one", "--steps", "20", "--batch", "12")
    actual = load_worker(out, 0)
    assert int(actual["global_step"]) == 20
    assert_same_parameters(load_worker(tmp_path / "one", 0), actual, what="worker 0 after the drop")
