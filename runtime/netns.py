"""A private network namespace for a job whose hosts are all loopback
addresses (docs/security.md).

TensorFlow's servers run any op for whoever connects, so on a shared machine
another user could drive a job through its loopback ports. In its own network
namespace, which has nothing but a loopback interface, a job's ports exist
for its own processes only: no other user of the machine, and nothing outside
it, can connect to them.

How. An *anchor* process (this module's ``main``) unshares a new network
namespace, first a user namespace mapping only its own uid and gid where it
is not root (unprivileged user namespaces), brings loopback up and stays,
answering probes. The launcher keeps descriptors of the anchor's namespaces;
every local child of the job enters them between fork and exec
(``PrivateNetwork.enter``), and what the fork server forks inherits its
namespace. The launcher itself stays outside (it is the user's script): its
job coordinator listens on a Unix socket in a directory only the user can
open (``coordinator_address``), and its liveness probes of summation servers
go through the anchor (``answers``).
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import select
import shutil
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Mapping

from autopar.common import procs

logger = logging.getLogger("autopar.netns")

_CLONE_NEWUSER = 0x10000000   # from <linux/sched.h>
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1   # <linux/sockios.h>, <net/if.h>
_IFREQ = "16sH22x"            # struct ifreq: name, flags, the rest of the union
_READY = "ready"
_DIR_PREFIX = "autopar-job-"   # + the launcher's pid + "-" + random
_SETNS = procs.libc_function("setns")
_STARTUP_TIMEOUT_S = 30.0


class NamespaceUnavailable(Exception):
    """The kernel or this user cannot have a private network namespace."""


def answers(address: str, timeout_s: float) -> bool:
    """Whether the process listening on ``address`` ("host:port") is alive:
    it accepts a connection and closes it when this side has closed (a
    stopped process's kernel accepts, but nobody closes)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.shutdown(socket.SHUT_WR)
            return sock.recv(1) == b""
    except ConnectionResetError:
        return True        # it closed the connection abruptly: alive all the same
    except OSError:
        return False


def namespaces_of(pid: int) -> list[tuple[int, int]]:
    """Descriptors of process ``pid``'s network namespace, and of its user
    namespace first if it differs from ours: (fd, CLONE_NEW* type) to join."""
    fds = []
    for kind, flag in (("user", _CLONE_NEWUSER), ("net", _CLONE_NEWNET)):
        theirs = f"/proc/{pid}/ns/{kind}"
        if kind == "user" and os.readlink(theirs) == os.readlink(f"/proc/self/ns/{kind}"):
            continue    # root: no user namespace of its own
        fds.append((os.open(theirs, os.O_RDONLY | os.O_CLOEXEC), flag))
    return fds


def enter_named(path: str) -> None:
    """Move this single-threaded process into the network namespace `path`
    names (/var/run/netns/NAME, what `ip netns exec` enters)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _SETNS is None or not join([(fd, _CLONE_NEWNET)]):
            raise OSError(ctypes.get_errno(), f"setns({path}) failed")
    finally:
        os.close(fd)


def join(fds: list[tuple[int, int]]) -> bool:
    """Enter the namespaces ``namespaces_of`` gave (a single-threaded process:
    the kernel refuses to move a threaded one into a user namespace)."""
    return all(_SETNS(fd, flag) == 0 for fd, flag in fds)


class PrivateNetwork:
    """The job's namespace, held by its anchor process. Thread-safe."""

    def __init__(self, job_env: Mapping[str, str] | None = None) -> None:
        """``job_env``: variables the anchor gets besides this process's
        (the job's id, for its title)."""
        if _SETNS is None:
            raise NamespaceUnavailable("this system's C library has no setns()")
        self._lock = threading.Lock()
        self._fds: list[tuple[int, int]] = []    # (descriptor, CLONE_NEW* type) to enter
        _remove_stale_directories()
        # 0700: only this user. Named by the launcher's pid, so the next
        # launcher removes it if this one is killed before closing it.
        self._dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
        try:
            self._anchor = procs.start_process(
                [sys.executable, "-m", "autopar.runtime.netns"], {**os.environ, **(job_env or {})},
                stdin_pipe=True)
            first = self._read_line(_STARTUP_TIMEOUT_S)
            if first != _READY:
                raise NamespaceUnavailable(first.partition(" ")[2] or "its anchor process died")
            self._fds = namespaces_of(self._anchor.pid)
            self.name = os.readlink(f"/proc/{self._anchor.pid}/ns/net")
        except BaseException:
            self.close()
            raise
        logger.debug("private network namespace %s, anchor pid %d", self.name, self._anchor.pid)

    def _read_line(self, timeout_s: float) -> str:
        """One line from the anchor; its death or silence is its failure."""
        # It writes each line whole, with one write: readable means a line.
        ready, _, _ = select.select([self._anchor.stdout], [], [], timeout_s)
        line = self._anchor.stdout.readline() if ready else b""
        if not line:
            return f"failed its anchor process gave no answer within {timeout_s:g} s"
        return line.decode(errors="replace").strip()

    @property
    def coordinator_address(self) -> str:
        """Where the job coordinator listens: a Unix socket (file sockets are
        shared across network namespaces) in the user's private directory."""
        return f"unix:{os.path.join(self._dir, 'coordinator.sock')}"

    def descriptors(self) -> list[tuple[int, int]]:
        """(descriptor, CLONE_NEW* type) of the namespaces to join, in order
        (the launcher keeps them open until ``close``)."""
        return list(self._fds)

    def enter(self) -> None:
        """Join the namespace: called in a child between fork and exec, so
        nothing but already resolved functions and plain system calls."""
        if not join(self._fds):
            os._exit(126)

    def answers(self, address: str, timeout_s: float) -> bool:
        """``answers`` from inside the namespace (asked of the anchor)."""
        with self._lock:
            if self._anchor.poll() is not None:
                return False
            try:
                self._anchor.stdin.write(f"{address} {timeout_s:g}\n".encode())
                self._anchor.stdin.flush()
            except OSError:
                return False
            return self._read_line(timeout_s + 5.0) == "1"

    def close(self) -> None:
        for fd, _ in self._fds:
            os.close(fd)
        self._fds = []
        anchor = getattr(self, "_anchor", None)
        if anchor is not None:
            procs.stop_processes([anchor], 1.0)
            for stream in (anchor.stdin, anchor.stdout):
                if stream is not None:
                    stream.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _remove_stale_directories() -> None:
    """Remove this user's job directories whose launcher is gone (killed
    with SIGKILL, it could not remove its own)."""
    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(_DIR_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_DIR_PREFIX):].partition("-")[0]
        path = os.path.join(base, name)
        try:
            mine = os.stat(path).st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not procs.pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def private_network_or_none(reason_if_not: str,
                            job_env: Mapping[str, str] | None = None) -> PrivateNetwork | None:
    """A PrivateNetwork, or None with a warning that says what stays exposed."""
    try:
        return PrivateNetwork(job_env)
    except (NamespaceUnavailable, OSError) as exc:
        logger.warning("autopar: could not give the job a private network namespace (%s); %s",
                       exc, reason_if_not)
        return None


# ---------------------------------------------------------------------------
# The anchor process
# ---------------------------------------------------------------------------

def unshare() -> None:
    """Enter a new network namespace (and a new user namespace first, unless
    root) and bring its loopback interface up."""
    unshare = procs.libc_function("unshare")
    if unshare is None:
        raise NamespaceUnavailable("this system's C library has no unshare()")
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | (0 if uid == 0 else _CLONE_NEWUSER)
    if unshare(flags) != 0:
        code = ctypes.get_errno()
        hint = (" (unprivileged user namespaces are disabled here: see "
                "/proc/sys/user/max_user_namespaces, or run as root)" if uid != 0 else "")
        raise NamespaceUnavailable(f"unshare: {os.strerror(code)}{hint}")
    if uid != 0:
        # Map only our own ids, so files are read and written as ourselves.
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags_now = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS,
                                                      struct.pack(_IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags_now | _IFF_UP))


def main() -> int:
    procs.set_title("network namespace")
    out = sys.stdout
    try:
        unshare()
    except (NamespaceUnavailable, OSError) as exc:
        out.write(f"failed {exc}\n")
        out.flush()
        return 1
    out.write(_READY + "\n")
    out.flush()
    for line in sys.stdin:
        address, _, timeout = line.strip().rpartition(" ")
        try:
            alive = answers(address, float(timeout))
        except ValueError:
            alive = False
        out.write("1\n" if alive else "0\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
