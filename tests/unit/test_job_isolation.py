"""The pieces that keep other users off a job's ports, as an unprivileged
user runs them (runtime/netns.py, runtime/firewall.py).

A user who is not root gets the job's private network namespace inside a user
namespace of its own; another process of the same user joins it (as the
launcher's children do between fork and exec) and reaches what listens there,
while nothing outside does. Where firewall rules cannot be installed, the
process says which ports stay open to whom. Root runs these as user nobody
(single-threaded forked children: the kernel moves only those into a user
namespace).
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import socket

import pytest

from autopar.runtime import firewall, netns

OTHER_UID = 65534
_PR_SET_DUMPABLE = 4


def _become_unprivileged() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)
        # As a process exec'd by the user would be: its /proc/PID/ns files
        # are the user's to open (setuid made them root's).
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def _fork(body) -> tuple[int, int]:
    """(pid, read end of its pipe): ``body(write_fd)`` in a forked child
    that exits 0 if it returns, 1 if it raises."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            body(w)
            code = 0
        except BaseException as exc:   # noqa: BLE001 - reported through the pipe, then _exit
            os.write(w, f"error {exc!r}\n".encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


@pytest.mark.slow
def test_an_unprivileged_private_network_is_joined_by_its_own_user_only():
    "localhost".encode("idna")   # loaded now: nobody may not read this interpreter's library
    release_r, release_w = os.pipe()

    def anchor(out: int) -> None:
        _become_unprivileged()
        netns.unshare()
        listeners = []
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            sock = socket.socket(family)
            sock.bind((host, 0))
            sock.listen()
            listeners.append(sock)
        ports = [s.getsockname()[1] for s in listeners]
        os.write(out, (json.dumps({"uid": os.getuid(), "ports": ports}) + "\n").encode())
        os.read(release_r, 1)   # until the test is done

    pid, out = _fork(anchor)
    try:
        first = _read_line(out)
        assert not first.startswith("error"), first
        told = json.loads(first)
        assert told["uid"] == (OTHER_UID if os.geteuid() == 0 else os.getuid())
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        # Its own user namespace, mapping only its own uid.
        assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")
        uid_map = open(f"/proc/{pid}/uid_map").read().split()
        assert uid_map == [str(told["uid"]), str(told["uid"]), "1"]
        port4, port6 = told["ports"]
        # From this machine's network: nothing listens there.
        for family, host, port in ((socket.AF_INET, "127.0.0.1", port4),
                                   (socket.AF_INET6, "::1", port6)):
            with socket.socket(family) as probe:
                probe.settimeout(3)
                assert probe.connect_ex((host, port)) != 0, (host, port)

        def member(out: int) -> None:
            _become_unprivileged()
            fds = netns.namespaces_of(pid)
            if not netns.join(fds):
                raise OSError(ctypes.get_errno(), "setns")
            for family, host, port in ((socket.AF_INET, "127.0.0.1", port4),
                                       (socket.AF_INET6, "::1", port6)):
                with socket.socket(family) as sock:
                    sock.settimeout(3)
                    sock.connect((host, port))
            os.write(out, f"joined uid {os.getuid()}\n".encode())

        member_pid, member_out = _fork(member)
        said = _read_line(member_out)
        _, status = os.waitpid(member_pid, 0)
        assert os.WEXITSTATUS(status) == 0 and said == f"joined uid {told['uid']}", said
        os.close(member_out)
    finally:
        os.write(release_w, b"x")
        os.waitpid(pid, 0)
        for fd in (out, release_r, release_w):
            os.close(fd)


@pytest.mark.slow
def test_without_rights_the_firewall_warns_what_stays_exposed():
    """A process that may not administer the network installs nothing and
    names the ports that stay open."""
    if os.geteuid() != 0 and firewall._may_administer_network():
        pytest.skip("this user has CAP_NET_ADMIN: the rules would be installed")
    "localhost".encode("idna")
    cluster = {"worker": ["127.0.0.1:41001", "10.9.9.9:41002"], "ps": ["127.0.0.1:41003"]}
    environ = {firewall.ENABLE: "1", "AUTOPAR_SUMSERVERS": "127.0.0.1:41004",
               "AUTOPAR_COORDINATOR": "127.0.0.1:41005"}

    def unprivileged_guard(out: int) -> None:
        _become_unprivileged()
        handler = logging.StreamHandler(os.fdopen(os.dup(out), "w"))
        logging.getLogger("autopar.firewall").addHandler(handler)
        installed = firewall.guard_this_process(cluster, environ)
        handler.flush()
        os.write(out, f"\ninstalled {installed}\n".encode())

    pid, out = _fork(unprivileged_guard)
    text = b""
    while chunk := os.read(out, 4096):
        text += chunk
    os.waitpid(pid, 0)
    os.close(out)
    said = text.decode()
    assert "installed False" in said, said
    assert "it needs root or CAP_NET_ADMIN" in said, said
    # This host's ports, and only those, are named as exposed.
    assert "127.0.0.1:41001, 127.0.0.1:41003, 127.0.0.1:41004, 127.0.0.1:41005" in said, said
    assert "10.9.9.9" not in said, said
    # Without a request from the launcher, nothing is attempted or said.
    assert firewall.guard_this_process(cluster, {}) is False


@pytest.mark.slow
def test_a_killed_launchers_job_directory_is_removed_by_the_next(tmp_path, monkeypatch):
    """The directory of a launcher killed with SIGKILL (it holds the
    coordinator's socket) goes at the next job's start; a live one stays."""
    import subprocess
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"autopar-job-{gone.pid}-abc"
    live = tmp_path / f"autopar-job-{os.getpid()}-def"
    for path in (stale, live):
        path.mkdir(mode=0o700)
        (path / "coordinator.sock").touch()
    try:
        network = netns.PrivateNetwork()
    except netns.NamespaceUnavailable as exc:
        pytest.skip(f"no private network namespace here: {exc}")
    try:
        assert not stale.exists() and live.exists()
        assert network.coordinator_address.startswith(f"unix:{tmp_path}/autopar-job-{os.getpid()}-")
    finally:
        network.close()
    assert [p.name for p in tmp_path.iterdir()] == [live.name]
