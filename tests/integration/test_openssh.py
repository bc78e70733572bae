"""A two-host job through a real OpenSSH: the second host is a network
namespace of the test's own (tests/integration/test_coordinator.py
`_OutsideNetwork`) running a real `sshd` (Debian's openssh-server) that
accepts only a throwaway key, with the namespace's host key pinned in a
known_hosts file of the spec (`ssh.known_hosts`). The job trains equal to one
device; the coordinator token reaches the remote process only on ssh's stdin
(on no command line and in no log, this side's or sshd's); a Ctrl-C at the
launcher stops both sides and leaves nothing running on either.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.cluster import (REPO, LineReader, assert_same_parameters, child_env,
                                       load_worker, pid_alive, run_single_device, survivors,
                                       train_command)
from tests.integration.test_coordinator import _OutsideNetwork

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a network namespace with its own sshd needs root")

STEPS = 4
BATCH = 8


def _sshd() -> str:
    """The sshd binary: installed by `make install` (system-packages) as root;
    by the same target here if a run skipped it."""
    path = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
    if path is None:
        subprocess.run(["make", "-C", str(REPO), "system-packages"], capture_output=True,
                       timeout=600)
        path = "/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None
    if path is None:
        pytest.skip("sshd is not installed and cannot be (apt-get install openssh-server)")
    return path


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "autopar-test",
                    "-f", str(path)], check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def _wait_listening(address: str, port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"sshd exited {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"sshd never listened on {address}:{port}: {log.read_text()[-2000:]}")


@pytest.fixture
def ssh_host(tmp_path):
    """(namespace network, spec path, sshd's log): a spec of one worker on
    this side of the veth and one in the namespace, reached over ssh."""
    sshd = _sshd()
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    host_key = _keygen(keys / "host_key")
    user_key = _keygen(keys / "user_key")
    (keys / "authorized_keys").write_text(user_key + "\n")
    with _OutsideNetwork() as net:
        (keys / "known_hosts").write_text(f"{net.ns_ip} {host_key}\n")
        config = keys / "sshd_config"
        config.write_text("\n".join([
            "Port 22", f"ListenAddress {net.ns_ip}", f"HostKey {keys / 'host_key'}",
            f"AuthorizedKeysFile {keys / 'authorized_keys'}", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
            f"PidFile {keys / 'sshd.pid'}", "LogLevel VERBOSE", ""]))
        log = tmp_path / "sshd.log"
        made_privsep = not os.path.isdir("/run/sshd")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
        daemon = subprocess.Popen(["ip", "netns", "exec", net.ns, sshd, "-D", "-f", str(config),
                                   "-E", str(log)], stdin=subprocess.DEVNULL)
        try:
            _wait_listening(net.ns_ip, 22, daemon, log)
            spec = tmp_path / "two_hosts.yaml"
            spec.write_text(
                "hosts:\n"
                f"  - address: {net.host_ip}\n    workers: 1\n"
                f"  - address: {net.ns_ip}\n    workers: 1\n"
                f"    ssh: {{user: root, key_file: {keys / 'user_key'}, "
                f"known_hosts: {keys / 'known_hosts'}}}\n")
            yield net, spec, log, daemon.pid
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            if made_privsep:
                shutil.rmtree("/run/sshd", ignore_errors=True)


def _namespace_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _launch(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_job_over_real_ssh_trains_as_one_device(tmp_path, ssh_host):
    net, spec, sshd_log, _ = ssh_host
    out = tmp_path / "out"
    proc = _launch(train_command("mlp_sgd", out, "--steps", str(STEPS), "--batch", str(BATCH),
                                 "--spec", str(spec)))
    with LineReader(proc) as reader:
        text = reader.rest(timeout=180)
    assert proc.returncode == 0, text[-4000:]
    assert re.search(r"started worker 1 at \S+, pid \d+ \(via ssh\)", text), text[-3000:]
    assert f"Accepted publickey for root from {net.host_ip}" in sshd_log.read_text()
    single = tmp_path / "single"
    run_single_device("mlp_sgd", single, "--steps", str(STEPS), "--batch", str(BATCH))
    expected = load_worker(single, 0)
    for i in range(2):
        assert_same_parameters(expected, load_worker(out, i), what=f"worker {i} over ssh")


def test_token_only_on_stdin_and_ctrl_c_stops_both_sides(tmp_path, ssh_host):
    net, spec, sshd_log, sshd_pid = ssh_host
    proc = _launch(train_command("mlp_sgd", tmp_path / "out", "--steps", "30",
                                 "--pause-at", "3", "--spec", str(spec)))
    reader = LineReader(proc)
    local: set[int] = {proc.pid}
    try:
        reader.wait_for(r"worker 0 pausing at step 3", 180)
        local |= {int(p) for p in re.findall(r"started \w+ \d+ at \S+, pid (\d+)", reader.text)}
        remote = _namespace_pids(net.ns) - {sshd_pid}
        workers = [p for p in remote
                   if b"train_model.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 1, (remote, reader.text[-3000:])
        raw = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        token = next(kv.split(b"=", 1)[1] for kv in raw if kv.startswith(b"AUTOPAR_COORD_TOKEN="))
        assert len(token) == 64
        for pid in remote | local:
            try:
                assert token not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
            except FileNotFoundError:
                pass
        os.killpg(proc.pid, signal.SIGINT)   # what a Ctrl-C at the terminal does
        reader.rest(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = reader.text
    assert proc.returncode == 130, text[-3000:]
    assert token.decode() not in text and token.decode() not in sshd_log.read_text()
    assert not survivors(local)
    deadline = time.monotonic() + 30
    while _namespace_pids(net.ns) - {sshd_pid} and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _namespace_pids(net.ns) - {sshd_pid}
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left if pid_alive(p)]
