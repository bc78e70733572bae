"""Port allocation: one address:port per worker and server process of a spec.

Two things can take a port between the moment it is chosen and the moment
TensorFlow's server binds it:

- another autopar launcher on this machine, choosing from the same range at
  the same moment. Every chosen port is reserved with an exclusive ``flock``
  on a lock file per port in a per-user runtime directory (see ``lock_dir``);
  a launcher holds its reservations for the whole job, so no other autopar
  job on this machine is handed a port of a running job, whether or not its
  process has bound it yet. The kernel drops the locks when the launcher dies,
  however it dies. A lock file is removed by its holder before it unlocks,
  and a launcher that locked a file checks that it is still the one under
  that name, so removal never lets two launchers hold the same port.
- any other process. A port on this machine is handed out only if it can be
  bound on the wildcard address (IPv4 and IPv6) *and* on the process's own
  address: TensorFlow's gRPC server listens on the wildcard, and one bound to
  the spec's address needs that address free, so this is right for both.
  What remains is the short window between this probe and TensorFlow's bind;
  the launcher covers it by restarting the job on fresh ports when a process
  reports a bind failure before training started (``is_bind_failure``).

Ports on remote hosts cannot be probed from here; they are handed out
sequentially from the host's range (or a default range), also reserved
against other launchers on this machine, and a clash there surfaces when the
remote server starts.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import ipaddress
import logging
import os
import re
import socket
import stat
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from autopar.common.errors import LaunchError
from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.runtime.spec import HostSpec, ResourceSpec
from autopar.transforms.keys import REMOTE_PORTS
from autopar.transforms.methods.process_kind import ProcessKind
from autopar.transforms.methods.process_registry import PROCESS_KINDS

logger = logging.getLogger(__name__)

DEFAULT_REMOTE_RANGE = (REMOTE_PORTS.first, REMOTE_PORTS.end - 1)   # inclusive
RUNTIME_DIR_ENV = "AUTOPAR_RUNTIME_DIR"   # overrides where reservations are kept
_LOCAL_POOL = "local"
_MAX_OS_PORT_TRIES = 64
_WILDCARDS = ("0.0.0.0", "::")

# What TensorFlow's gRPC server prints when it cannot bind its port (C++ log
# line from grpc's add_port.cc, then the UnknownError it raises), and what
# each helper-process kind says (ProcessKind.bind_failure).
_BIND_FAILURE = re.compile("|".join([r"Could not start gRPC server",
                                     r"Failed to add port to server",
                                     *(k.bind_failure for k in PROCESS_KINDS.values()
                                       if k.bind_failure)]))


def is_bind_failure(line: str) -> bool:
    """True if a line of a process's output says its server could not bind its port."""
    return _BIND_FAILURE.search(line) is not None


def is_local_address(address: str) -> bool:
    """True for loopback, "localhost", this machine's hostname and any address
    assigned to one of its interfaces (checked by binding it)."""
    addr = address.strip().strip("[]").lower()
    if not addr:
        return False
    if addr == "localhost":
        return True
    ip = _parse_ip(addr)
    if ip is not None:
        # A non-loopback IP is local iff the kernel lets us bind it; this also
        # covers veth/alias addresses that no hostname lookup would reveal.
        return ip.is_loopback or ip.is_unspecified or _bindable(addr)
    if addr in {socket.gethostname().lower(), socket.getfqdn().lower()}:
        return True
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return any(_parse_ip(str(info[4][0])) is not None and is_local_address(str(info[4][0])) for info in infos)


@dataclass
class PortReservation:
    """A job's cluster and the locks that keep other autopar launchers on this
    machine off its ports until ``release`` (also on leaving a ``with``)."""

    cluster: dict[str, list[str]]
    # "addr:port" of each helper-process kind's processes, by role (one per
    # server, like cluster's SERVER_JOB: ProcessKind.placement): not
    # TensorFlow tasks, so not in the cluster.
    helpers: dict[str, list[str]] = field(default_factory=dict)
    _locks: list[tuple[int, str]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        locks, self._locks = self._locks, []
        for fd, path in locks:
            _unlock(fd, path)

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve_cluster(spec: ResourceSpec, avoid: Collection[str] = (), *,
                    helpers: Sequence[ProcessKind] = (), servers: bool = True) -> PortReservation:
    """{WORKER_JOB: [...num_workers], SERVER_JOB: [...num_servers]} as "addr:port"
    strings, numbered like spec.worker_hosts() / spec.server_hosts(), with
    every port reserved until the reservation is released. Ports chosen by
    autopar are never one of the ``avoid`` endpoints (that failed to bind
    before: on a remote host nothing else would tell). For each kind of
    ``helpers``, also one port per server for each of its processes
    (``.helpers[kind.role]``).
    Without ``servers``, no server job (a plan with nothing on servers)."""
    remove_stale_locks()
    alloc = _Allocator(spec, avoid)
    try:
        alloc.reserve_explicit()
        workers: list[str] = []
        server_endpoints: list[str] = []
        for i, host in enumerate(spec.hosts):
            workers += alloc.endpoints(i, host, host.workers, host.worker_ports)
            if servers:
                server_endpoints += alloc.endpoints(i, host, host.servers, host.server_ports)
        for kind in helpers:    # ProcessKind.placement: PER_SERVER
            endpoints = alloc.reservation.helpers.setdefault(kind.role, [])
            for i, host in enumerate(spec.hosts):
                endpoints += alloc.endpoints(i, host, host.servers, None)
    except BaseException:
        alloc.reservation.release()
        raise
    cluster = _cluster(workers, server_endpoints if servers else [])
    alloc.reservation.cluster = cluster
    logger.info("allocated ports for %s: %s%s", spec.source, cluster,
                "".join(f", {kind.what} {alloc.reservation.helpers[kind.role]}"
                        for kind in helpers))
    return alloc.reservation


def allocate_cluster(spec: ResourceSpec, avoid: Collection[str] = ()) -> dict[str, list[str]]:
    """The cluster ``reserve_cluster`` would give, released at once: for
    callers that only need the addresses (a launcher keeps the reservation)."""
    with reserve_cluster(spec, avoid) as reservation:
        return reservation.cluster


def explicit_cluster(spec: ResourceSpec) -> dict[str, list[str]]:
    """The cluster of a spec whose every port is given (TF_CONFIG). Nothing is
    probed: in a job started by an external launcher the peers already hold
    their ports, so a bound port is expected, not a clash."""
    workers: list[str] = []
    servers: list[str] = []
    for host in spec.hosts:
        workers += [_endpoint(host.address, p) for p in host.worker_ports or ()]
        servers += [_endpoint(host.address, p) for p in host.server_ports or ()]
    return _cluster(workers, servers)


def _cluster(workers: list[str], servers: list[str]) -> dict[str, list[str]]:
    """The ClusterSpec dict: the server job only when there are servers."""
    cluster = {WORKER_JOB: workers}
    if servers:
        cluster[SERVER_JOB] = servers
    return cluster


def lock_dir() -> str:
    """Where port reservations are kept: $AUTOPAR_RUNTIME_DIR, else
    $XDG_RUNTIME_DIR/autopar, else <tmp>/autopar-<uid>; a directory of this
    user's only (mode 0700), so no other user can hold or fake a lock."""
    base = os.environ.get(RUNTIME_DIR_ENV)
    if not base:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        base = (os.path.join(xdg, "autopar") if xdg and os.path.isdir(xdg)
                else os.path.join(tempfile.gettempdir(), f"autopar-{os.getuid()}"))
    path = os.path.join(base, "ports")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        # Both levels must be ours: whoever owns a directory can swap what is in it.
        infos = [(d, os.lstat(d)) for d in (base, path)]
    except OSError as exc:
        raise LaunchError(f"cannot create the port reservation directory {path} ({exc}); "
                          f"set {RUNTIME_DIR_ENV} to a writable directory of yours") from exc
    for d, info in infos:
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise LaunchError(f"the port reservation directory {d} is not a directory owned by you; "
                              f"remove it or set {RUNTIME_DIR_ENV} to a directory of yours")
    return path


def _lock_path(pool: str, port: int) -> str:
    return os.path.join(lock_dir(), f"{pool.replace('/', '_')}-{port}.lock")


def _try_lock(pool: str, port: int) -> tuple[int, str] | None:
    """(fd, path) holding the exclusive lock of pool:port, or None if another
    launcher (or another reservation of this one) holds it."""
    path = _lock_path(pool, port)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        # The previous holder may have removed the file between our open and
        # our lock: then we hold a lock on a name-less file, and must retry.
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)
    # The holder's pid, for the message another launcher gives.
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd, path


def _unlock(fd: int, path: str) -> None:
    # Remove while still holding the lock (see _try_lock), then drop it.
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(fd)


def remove_stale_locks() -> int:
    """Remove the lock files no launcher holds (one killed with SIGKILL had no
    chance to remove its own); how many. As a holder does (see _try_lock):
    lock the file, check it is still the one under that name, remove it,
    then unlock; a file some launcher holds is left alone."""
    directory = lock_dir()
    removed = 0
    for name in os.listdir(directory):
        if not name.endswith(".lock"):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue            # held: a running job's reservation
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            mine = os.fstat(fd)
            if (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(path)
                removed += 1
        finally:
            os.close(fd)
    if removed:
        logger.debug("removed %d port reservation(s) left by launchers that were killed", removed)
    return removed


def _lock_holder(pool: str, port: int) -> str:
    try:
        with open(_lock_path(pool, port), encoding="ascii") as f:
            pid = f.read().strip()
    except OSError:
        pid = ""
    return f"launcher pid {pid}" if pid.isdigit() else "another launcher"


class _Allocator:
    def __init__(self, spec: ResourceSpec, avoid: Collection[str] = ()) -> None:
        self.spec = spec
        self.avoid = set(avoid)
        self.reservation = PortReservation(cluster={})
        self.used: set[tuple[str, int]] = set()
        self.local: dict[str, bool] = {}

    def is_local(self, host: HostSpec) -> bool:
        if host.address not in self.local:
            self.local[host.address] = is_local_address(host.address)
        return self.local[host.address]

    def pool(self, host: HostSpec) -> str:
        # TensorFlow's gRPC server listens on all interfaces, so every local
        # address shares one port space; remote hosts each have their own.
        return _LOCAL_POOL if self.is_local(host) else host.address.lower()

    def lock(self, pool: str, port: int) -> bool:
        held = _try_lock(pool, port)
        if held is None:
            return False
        self.reservation._locks.append(held)
        return True

    def unlock_last(self) -> None:
        _unlock(*self.reservation._locks.pop())

    def reserve_explicit(self) -> None:
        """Claim explicit ports first so range and OS allocation skip them."""
        for i, host in enumerate(self.spec.hosts):
            for name in ("worker_ports", "server_ports"):
                for port in getattr(host, name) or ():
                    where = f"{_endpoint(host.address, port)} (hosts[{i}].{name} in {self.spec.source})"
                    pool = self.pool(host)
                    if (pool, port) in self.used:
                        raise LaunchError(f"{where} is given to two processes on this machine; "
                                          "give each local process its own port")
                    if not self.lock(pool, port):
                        raise LaunchError(f"{where} is reserved by another autopar job on this machine "
                                          f"({_lock_holder(pool, port)}); wait for it to end, choose "
                                          "another port, or drop the explicit ports to let autopar pick free ones")
                    # SO_REUSEADDR on, as gRPC sets it: a port left in TIME_WAIT by
                    # an earlier run is usable, only a live owner is a clash.
                    if self.is_local(host) and not port_is_free(host.address, port, reuse=True):
                        raise LaunchError(
                            f"{where} is already in use; stop the process holding it "
                            f"(find it with `ss -ltnp 'sport = :{port}'`) or choose another port, "
                            "or drop the explicit ports to let autopar pick free ones")
                    self.used.add((pool, port))

    def endpoints(self, i: int, host: HostSpec, count: int, explicit: tuple[int, ...] | None) -> list[str]:
        if explicit is not None:
            return [_endpoint(host.address, p) for p in explicit]
        return [_endpoint(host.address, self.next_port(i, host)) for _ in range(count)]

    def next_port(self, i: int, host: HostSpec) -> int:
        pool, local = self.pool(host), self.is_local(host)
        if host.ports is None and local:
            return self.os_port(i, host)
        start, end = host.ports or DEFAULT_REMOTE_RANGE
        # First pass with SO_REUSEADDR off: with a whole range to choose from,
        # prefer ports nothing (not even a TIME_WAIT connection) is using. A
        # range whose ports earlier jobs left in TIME_WAIT is still usable:
        # the second pass probes as gRPC binds, with SO_REUSEADDR on.
        for reuse in ((False, True) if local else (False,)):
            for port in range(start, end + 1):
                if ((pool, port) in self.used or _endpoint(host.address, port) in self.avoid
                        or not self.lock(pool, port)):
                    continue
                if local and not port_is_free(host.address, port, reuse=reuse):
                    self.unlock_last()
                    continue
                self.used.add((pool, port))
                return port
        raise LaunchError(
            f"no free port left in {start}-{end} on {host.address} (hosts[{i}] in {self.spec.source}); "
            f"widen hosts[{i}].ports or free ports in that range (other autopar jobs on this "
            "machine hold theirs until they end)")

    def os_port(self, i: int, host: HostSpec) -> int:
        for _ in range(_MAX_OS_PORT_TRIES):
            sock = _bind(_WILDCARDS[0], 0, reuse=False)
            if sock is None:
                break
            port = sock.getsockname()[1]
            sock.close()
            if ((_LOCAL_POOL, port) in self.used or _endpoint(host.address, port) in self.avoid
                    or not self.lock(_LOCAL_POOL, port)):
                continue
            if not port_is_free(host.address, port, reuse=False):
                self.unlock_last()
                continue
            self.used.add((_LOCAL_POOL, port))
            return port
        raise LaunchError(f"could not get a free port on {host.address} (hosts[{i}] in {self.spec.source}); "
                          "check that the address belongs to this machine, or give the host a 'ports' range")


def port_is_free(address: str, port: int, *, reuse: bool) -> bool:
    """True if ``port`` can be bound on the wildcard addresses (IPv4, and IPv6
    where this machine has it) and on ``address``: free for a server that
    listens on either. Each probe socket is closed before the next, since a
    wildcard socket would itself block the specific bind."""
    hosts = [h for h in _WILDCARDS if _family_available(h)] + [address]
    for host in hosts:
        sock = _bind(host, port, reuse)
        if sock is None:
            return False
        sock.close()
    return True


@functools.cache
def _family_available(wildcard: str) -> bool:
    # A machine without IPv6 cannot bind "::" at all; that says nothing about a port.
    return _bindable(wildcard)


def _parse_ip(addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(addr)
    except ValueError:
        return None


def _bind(address: str, port: int, reuse: bool) -> socket.socket | None:
    """A TCP socket bound to address:port, or None if the bind fails."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1 if reuse else 0)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        return None
    return sock


def _bindable(address: str) -> bool:
    sock = _bind(address, 0, reuse=False)
    if sock is None:
        return False
    sock.close()
    return True


def _endpoint(address: str, port: int) -> str:
    # IPv6 literals need brackets in a host:port string, as gRPC expects.
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
