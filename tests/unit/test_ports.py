"""Port allocation: distinct, bindable local ports; ranges; taken ports."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.common.errors import LaunchError
from autopar.runtime.ports import (DEFAULT_REMOTE_RANGE, allocate_cluster, is_bind_failure, is_local_address,
                           lock_dir, port_is_free, reserve_cluster)
from autopar.runtime.spec import HostSpec, ResourceSpec
from autopar.transforms.methods.herring.sumserver import SUMMATION_SERVER

REPO = Path(__file__).resolve().parents[2]
REMOTE = "192.0.2.1"  # TEST-NET-1: documentation-only, never assigned to this machine


def spec(*hosts: HostSpec) -> ResourceSpec:
    return ResourceSpec(hosts=tuple(hosts), source="test.yaml")


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def free_range(size: int) -> tuple[int, int]:
    """A range starting at an OS-chosen free port (its neighbours may be taken;
    the allocator skips those)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        start = s.getsockname()[1]
    start = min(start, 65535 - size)
    return start, start + size - 1


def listening(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.parametrize("address", ["127.0.0.1", "127.3.4.5", "::1", "localhost", "LOCALHOST",
                                     socket.gethostname()])
def test_local_addresses(address):
    assert is_local_address(address)


@pytest.mark.parametrize("address", [REMOTE, "", "no-such-host.invalid"])
def test_non_local_addresses(address):
    assert not is_local_address(address)


def test_local_ports_are_distinct_and_bindable():
    cluster = allocate_cluster(spec(HostSpec("127.0.0.1", workers=3, servers=2),
                                    HostSpec("localhost", workers=1)))
    assert len(cluster["worker"]) == 4 and len(cluster["ps"]) == 2
    endpoints = cluster["worker"] + cluster["ps"]
    assert len({port_of(e) for e in endpoints}) == 6
    assert cluster["worker"][3].startswith("localhost:")
    for e in endpoints:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port_of(e)))


def test_no_ps_key_without_servers():
    assert set(allocate_cluster(spec(HostSpec("127.0.0.1", workers=2)))) == {"worker"}


def test_local_range_is_honoured():
    start, end = free_range(20)
    cluster = allocate_cluster(spec(HostSpec("127.0.0.1", workers=2, servers=1, ports=(start, end))))
    ports = [port_of(e) for e in cluster["worker"] + cluster["ps"]]
    assert len(set(ports)) == 3 and all(start <= p <= end for p in ports)


def test_local_range_skips_taken_port():
    with listening() as taken:
        port = taken.getsockname()[1]
        cluster = allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, ports=(port, min(port + 50, 65535)))))
    assert port_of(cluster["worker"][0]) != port


def test_local_range_exhausted():
    with listening() as a:
        port = a.getsockname()[1]
        with pytest.raises(LaunchError, match=f"no free port left in {port}-{port}"):
            allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, ports=(port, port))))


def test_explicit_local_port_already_bound():
    with listening() as taken:
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError) as info:
            allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, worker_ports=(port,))))
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "already in use" in message and "choose another port" in message


def test_explicit_ports_used_as_given_and_skipped_by_others():
    start, _ = free_range(2)
    cluster = allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, servers=1,
                                             worker_ports=(start,), ports=(start, start + 10))))
    assert cluster["worker"] == [f"127.0.0.1:{start}"]
    assert port_of(cluster["ps"][0]) != start


def test_remote_hosts_sequential():
    cluster = allocate_cluster(spec(HostSpec(REMOTE, workers=2, servers=1),
                                    HostSpec("192.0.2.2", workers=1, ports=(30000, 30005))))
    lo = DEFAULT_REMOTE_RANGE[0]
    assert cluster["worker"] == [f"{REMOTE}:{lo}", f"{REMOTE}:{lo + 1}", "192.0.2.2:30000"]
    assert cluster["ps"] == [f"{REMOTE}:{lo + 2}"]


def test_remote_same_address_twice_never_repeats():
    cluster = allocate_cluster(spec(HostSpec(REMOTE, workers=1, worker_ports=(23000,)),
                                    HostSpec("192.0.2.9", workers=1),
                                    HostSpec(REMOTE, workers=2)))
    assert cluster["worker"] == [f"{REMOTE}:23000", "192.0.2.9:23000", f"{REMOTE}:23001", f"{REMOTE}:23002"]


def test_ipv6_endpoints_are_bracketed():
    cluster = allocate_cluster(spec(HostSpec("2001:db8::1", workers=1)))
    assert cluster["worker"] == ["[2001:db8::1]:23000"]


# ----------------------------------------------------------------- probing the bind address(es)

def _range_after(sock_port: int, size: int = 20) -> tuple[int, int]:
    return sock_port, min(sock_port + size, 65535)


@pytest.mark.parametrize("holder", ["127.0.0.2", "0.0.0.0", "::1", "::"])
def test_port_held_on_another_address_is_not_handed_out(holder):
    """TensorFlow's server binds the wildcard: a port some process holds on
    any address (another loopback address, the wildcard, IPv6) would make it
    fail, so it is skipped although 127.0.0.1:port itself could be bound."""
    family = socket.AF_INET6 if ":" in holder else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as foreign:
        foreign.bind((holder, 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        if holder == "127.0.0.2":
            with socket.socket() as probe:   # the old, address-only probe would pass
                probe.bind(("127.0.0.1", port))
        assert not port_is_free("127.0.0.1", port, reuse=False)
        cluster = allocate_cluster(spec(HostSpec("127.0.0.1", workers=2, ports=_range_after(port))))
    ports = [port_of(e) for e in cluster["worker"]]
    assert port not in ports and len(set(ports)) == 2


def test_explicit_port_held_on_wildcard_is_refused():
    with socket.socket() as foreign:
        foreign.bind(("0.0.0.0", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        with pytest.raises(LaunchError, match=f"127.0.0.1:{port} .*already in use"):
            allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, worker_ports=(port,))))


# ----------------------------------------------------------------- reservations between launchers

def test_reservation_keeps_ports_from_a_second_allocation_until_released():
    start, end = free_range(20)
    host = HostSpec("127.0.0.1", workers=2, servers=1, ports=(start, end))
    with reserve_cluster(spec(host)) as first:
        held = {port_of(e) for e in first.cluster["worker"] + first.cluster["ps"]}
        second = allocate_cluster(spec(host))
        assert held.isdisjoint(port_of(e) for e in second["worker"] + second["ps"])
        with pytest.raises(LaunchError, match="reserved by another autopar job"):
            allocate_cluster(spec(HostSpec("127.0.0.1", workers=1, worker_ports=(min(held),))))
    # Released: the same ports are free again, and no lock file is left behind.
    again = allocate_cluster(spec(host))
    assert {port_of(e) for e in again["worker"] + again["ps"]} == held
    assert not list(Path(lock_dir()).glob(f"local-{min(held)}.lock"))


@pytest.mark.slow
def test_reservation_of_another_launcher_process_is_respected(tmp_path):
    """A separate process holding a reservation (as a running launcher does)
    is never handed the same ports, although they are not bound yet."""
    start, end = free_range(20)
    code = ("import sys\n"
            "from autopar.runtime.ports import reserve_cluster\n"
            "from autopar.runtime.spec import HostSpec, ResourceSpec\n"
            f"r = reserve_cluster(ResourceSpec(hosts=(HostSpec('127.0.0.1', workers=3, ports=({start}, {end})),)))\n"
            "print(' '.join(e.rsplit(':', 1)[1] for e in r.cluster['worker']), flush=True)\n"
            "sys.stdin.readline()\n")
    other = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        theirs = {int(p) for p in other.stdout.readline().split()}
        assert len(theirs) == 3
        mine = allocate_cluster(spec(HostSpec("127.0.0.1", workers=3, ports=(start, end))))
        assert theirs.isdisjoint(port_of(e) for e in mine["worker"])
    finally:
        other.stdin.close()
        other.wait(timeout=30)
    # Its reservation ended with it.
    after = allocate_cluster(spec(HostSpec("127.0.0.1", workers=3, ports=(start, end))))
    assert {port_of(e) for e in after["worker"]} == theirs


# What TensorFlow 2.21 prints when its gRPC server cannot bind (copied from a
# worker whose port was held on 127.0.0.2).
TF_BIND_FAILURE = [
    "E0000 00:00:1795423531.156533    2819 add_port.cc:83] Failed to add port to server: "
    "No address added out of total 1 resolved for '0.0.0.0:43543'",
    "E0000 00:00:1795423531.160212    2819 grpc_server_lib.cc:618] UNKNOWN: Could not start gRPC server",
    "tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server",
]


def test_avoided_endpoints_are_not_chosen_again():
    """After a bind failure the launcher avoids that endpoint: on a remote host
    nothing else would stop the same port from being handed out again."""
    lo = DEFAULT_REMOTE_RANGE[0]
    cluster = allocate_cluster(spec(HostSpec(REMOTE, workers=2)), avoid={f"{REMOTE}:{lo + 1}"})
    assert cluster["worker"] == [f"{REMOTE}:{lo}", f"{REMOTE}:{lo + 2}"]


def test_tf_bind_failure_is_recognised():
    assert all(is_bind_failure(line) for line in TF_BIND_FAILURE)
    assert not is_bind_failure("worker 1: initial state received from the chief")
    assert not is_bind_failure("UnavailableError: Socket closed")


def test_reservation_directory_must_be_the_users(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)   # not a directory of its own: could be swapped
    monkeypatch.setenv("AUTOPAR_RUNTIME_DIR", str(tmp_path / "link"))
    with pytest.raises(LaunchError, match="is not a directory owned by you"):
        allocate_cluster(spec(HostSpec("127.0.0.1", workers=1)))
    monkeypatch.setenv("AUTOPAR_RUNTIME_DIR", str(tmp_path / "mine"))
    allocate_cluster(spec(HostSpec("127.0.0.1", workers=1)))
    assert (tmp_path / "mine" / "ports").is_dir()


def test_summation_servers_get_their_own_reserved_ports_on_the_servers_hosts():
    start, end = free_range(20)
    hosts = (HostSpec("127.0.0.1", workers=1, servers=2, ports=(start, end)),
             HostSpec("192.0.2.10", workers=1, servers=1))   # TEST-NET-1: never local
    with reserve_cluster(spec(*hosts), helpers=[SUMMATION_SERVER]) as reservation:
        sums = reservation.helpers["sumserver"]
        assert [e.rpartition(":")[0] for e in sums] == ["127.0.0.1", "127.0.0.1", "192.0.2.10"]
        taken = reservation.cluster["worker"] + reservation.cluster["ps"]
        assert len(set(sums + taken)) == len(sums + taken)
        assert all(start <= port_of(e) <= end for e in sums[:2])
        # Reserved like the others: a second allocation keeps off them.
        again = allocate_cluster(spec(hosts[0]))
        assert {port_of(e) for e in sums[:2]}.isdisjoint(
            port_of(e) for e in again["worker"] + again["ps"])
    with reserve_cluster(spec(*hosts)) as without:
        assert without.helpers == {}
    assert is_bind_failure("autopar_sumserver: cannot listen on 127.0.0.1:5000: Address in use")


@pytest.mark.slow
def test_reservations_of_a_killed_launcher_are_cleaned_up_at_the_next_start(tmp_path, monkeypatch):
    """A launcher killed with SIGKILL cannot remove its lock files; the next
    reservation removes every lock file no launcher holds, never a held one."""
    monkeypatch.setenv("AUTOPAR_RUNTIME_DIR", str(tmp_path))
    start, end = free_range(20)
    code = ("import sys, time\n"
            "from autopar.runtime.ports import reserve_cluster\n"
            "from autopar.runtime.spec import HostSpec, ResourceSpec\n"
            f"r = reserve_cluster(ResourceSpec(hosts=(HostSpec('127.0.0.1', workers=2, ports=({start}, {end})),)))\n"
            "print('reserved', flush=True)\n"
            "time.sleep(600)\n")
    killed = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert killed.stdout.readline().strip() == "reserved"
    finally:
        killed.kill()
        killed.wait(timeout=30)
    stale = sorted(p.name for p in (tmp_path / "ports").glob("*.lock"))
    assert len(stale) == 2
    with reserve_cluster(spec(HostSpec("127.0.0.1", workers=1))) as held:
        mine = {p.name for p in (tmp_path / "ports").glob("*.lock")}
        # Only this process's lock is left (the OS may hand out a port the
        # killed one had reserved: its file is then this process's own).
        assert len(mine) == 1
        assert [p.read_text().strip() for p in (tmp_path / "ports").glob("*.lock")] == [
            str(os.getpid())]
        # Another launcher's start leaves this running one's reservation alone.
        allocate_cluster(spec(HostSpec("127.0.0.1", workers=1)))
        assert mine <= {p.name for p in (tmp_path / "ports").glob("*.lock")}
    assert held.cluster
    assert not list((tmp_path / "ports").glob("*.lock"))
