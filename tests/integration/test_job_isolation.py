"""No other user reaches a job's ports (docs/security.md).

- A job on loopback addresses runs in a private network namespace: its own
  processes train together there, while another local user (and this
  machine's own network) finds nothing listening on its ports, and its
  coordinator is a socket file only the job's user may open.
- A job on another address of this machine gets per-job nftables rules: a
  namespace outside the spec is refused, and so is another local user, while
  the job's own user connects, and the rules are gone when the job ends.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.integration.cluster import (LineReader, child_env, latest_attempt, start_job,
                                       train_command, write_spec)
from tests.integration.test_coordinator import _job_pids, _OutsideNetwork, _stop

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another local user and making namespaces needs root")

OTHER_UID = 65534   # nobody


def connect_as(uid: int, host: str, port: int) -> str:
    """"open" or "refused": a TCP connection to host:port from a process of
    user ``uid`` in this machine's network namespace."""
    # Loaded here: the other user may not read this interpreter's library.
    "localhost".encode("idna")
    pid = os.fork()
    if pid == 0:   # the child does only system calls, then _exit
        code = 3
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            socket.create_connection((host, port), timeout=3).close()
            code = 0
        except OSError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) in (0, 1), "the probe could not become the other user"
    return "open" if os.WEXITSTATUS(status) == 0 else "refused"


def _ports(text: str) -> list[tuple[str, int]]:
    return [(host.strip("[]"), int(port)) for host, port in
            re.findall(r"started \w+ \d+ at (\S+):(\d+), pid", latest_attempt(text))]


def _environ(pid: int) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in
                Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)


def _stalled_job(tmp_path, spec: Path, **env: str):
    """A job whose worker 1 stalls at step 3 (the job waits there, its
    ports open, until the test stops it)."""
    # ps: every variable on the server, which the plan so gives work (a
    # server with nothing to do is not started).
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--steps", "1000", "--run-option",
                                   "ps", "--stall-at", "3", "--stall-timeout", "0",
                                   "--spec", str(spec)),
                     env={**child_env(), **env})
    reader = LineReader(proc)
    reader.wait_for(r"worker 1 stalling at step 3", 180)
    return proc, reader


def test_a_loopback_job_lives_in_a_private_network_namespace(tmp_path):
    spec = write_spec(tmp_path, workers=2, servers=1)
    # Started anew (not forked): /proc/PID/environ then shows each child's own
    # environment. Forked children inherit the fork server's namespace, which
    # every other loopback job of the suite runs in.
    proc, reader = _stalled_job(tmp_path, spec, AUTOPAR_FORK_SERVER="0")
    pids = _job_pids(reader.text, proc.pid)
    try:
        children = sorted(pids - {proc.pid})
        assert len(children) == 3, reader.text
        ours = os.readlink("/proc/self/ns/net")
        theirs = {os.readlink(f"/proc/{pid}/ns/net") for pid in children}
        # One namespace for the whole job, not this machine's.
        assert len(theirs) == 1 and ours not in theirs, (ours, theirs)
        assert "private network namespace" in reader.text
        # They reached each other there: worker 1 got to step 3 with worker 0
        # and the server. From this machine's network nobody reaches the ports,
        # the job's own user included.
        ports = _ports(reader.text)
        assert len(ports) == 3, reader.text
        for host, port in ports:
            assert connect_as(OTHER_UID, host, port) == "refused", (host, port)
            assert connect_as(os.getuid(), host, port) == "refused", (host, port)
        # The coordinator: a socket file in a directory only the job's user opens.
        address = _environ(children[0])["AUTOPAR_COORDINATOR"]
        assert address.startswith("unix:"), address
        directory = Path(address[len("unix:"):]).parent
        assert directory.stat().st_mode & 0o777 == 0o700
        assert directory.stat().st_uid == os.getuid()
    finally:
        _stop(proc, pids | _job_pids(reader.text, proc.pid, every_attempt=True))
    assert not directory.exists(), "the job's private directory outlived it"


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed "
                    "(make test installs it when run as root)")
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_a_job_on_another_address_admits_only_its_hosts_and_its_user(tmp_path, family):
    """On IPv6 this is also a job on a global-scope v6 address (not ::1),
    its processes listening and connecting there."""
    with _OutsideNetwork() as outside:
        address = outside.host_ip if family == "ipv4" else outside.host_ip6
        spec = write_spec(tmp_path, workers=2, servers=1, address=address)
        proc, reader = _stalled_job(tmp_path, spec)
        pids = _job_pids(reader.text, proc.pid)
        try:
            ports = [port for _, port in _ports(reader.text)]
            assert len(ports) == 3, reader.text
            assert "firewall rules in place" in reader.text
            # Control: a listener of this machine on the same address is open
            # to the outside namespace, so "closed" below is the rules' doing.
            with socket.socket(socket.AF_INET if family == "ipv4" else socket.AF_INET6) as control:
                control.bind((address, 0))
                control.listen()
                control_port = control.getsockname()[1]
                probed = outside.probe([control_port, *ports], address)
            assert probed.pop(control_port) == "open"
            assert probed == {port: "closed" for port in ports}, probed
            for port in ports:
                assert connect_as(OTHER_UID, address, port) == "refused", port
                assert connect_as(os.getuid(), address, port) == "open", port
        finally:
            _stop(proc, pids | _job_pids(reader.text, proc.pid, every_attempt=True))
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert not any(f"autopar_{pid}" in tables for pid in pids), tables
