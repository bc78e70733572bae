"""The Herring flow window (runtime/flow_windows.py): from the
link speed and the flows that share a link, and handed by the launcher to
every process of a job with summation servers; the same rule bounds the
receive windows of the connections between workers and parameter servers
(the bind shim)."""
from __future__ import annotations

import re
import sys

import pytest

from autopar.common import env as envvars
from autopar.common.roles import SERVER_ROLE, SUMSERVER_ROLE, WORKER_ROLE
from autopar.runtime import flow_windows as window
from tests.integration.cluster import REPO

WIRE_H = (REPO / "cpp_ops" / "herring_wire.h").read_text()
SHIM_C = (REPO / "cpp_ops" / "bind_shim.c").read_text()


def test_the_transport_reads_the_window_the_launcher_sets():
    assert re.search(r'kFlowWindowEnv = "' + envvars.HERRING_WINDOW + '"', WIRE_H)
    default = re.search(r"kFlowWindowBytes = (\d+) << (\d+);", WIRE_H)
    assert int(default.group(1)) << int(default.group(2)) == window.DEFAULT_BYTES


def test_the_launcher_refuses_exactly_what_the_transports_would_ignore():
    """window.SETTABLE_BYTES is the range herring_wire.h and bind_shim.c read."""
    low, high = window.SETTABLE_BYTES
    wire = re.search(r"value < \((\d+) << (\d+)\) \|\| value > \((\d+) << (\d+)\)", WIRE_H)
    assert wire, "herring_wire.h's window bounds moved"
    assert (int(wire.group(1)) << int(wire.group(2)), int(wire.group(3)) << int(wire.group(4))) \
        == (low, high)
    shim = re.search(r"value >= (\d+) && value <= \((\d+)L << (\d+)\)", SHIM_C)
    assert shim, "bind_shim.c's window bounds moved"
    assert (int(shim.group(1)), int(shim.group(2)) << int(shim.group(3))) == (low, high)


def test_unknown_link_speed_keeps_the_transports_default():
    assert window.flow_window_bytes(None, 8, 8) is None
    assert window.flow_window_bytes(0, 8, 8) is None


@pytest.mark.parametrize("gbps, workers, servers, expected", [
    # A link holds QUEUE_S of its rate in flight, split over its flows ...
    (0.1, 4, 4, 25_000),
    (1.0, 8, 2, 125_000),       # a server's link carries a flow from each of 8 workers
    (1.0, 2, 8, 125_000),       # a worker's link one from each of 8 servers
    (1.0, 16, 16, 62_500),
    # ... but no flow less than MIN_BYTES or more than the default.
    (0.025, 8, 8, window.MIN_BYTES),
    (0.1, 8, 8, window.MIN_BYTES),
    (1.0, 4, 4, window.DEFAULT_BYTES),
    (10.0, 4, 4, window.DEFAULT_BYTES),
])
def test_window_splits_the_links_bytes_in_flight_over_its_flows(gbps, workers, servers, expected):
    assert window.flow_window_bytes(gbps, workers, servers) == expected


def _children(bandwidth_gbps):
    from autopar.runtime.commands import plan_children
    from autopar.runtime.spec import HostSpec, ResourceSpec
    spec = ResourceSpec(hosts=(HostSpec(address="127.0.0.1", workers=2, servers=0),
                               HostSpec(address="127.0.0.2", workers=0, servers=1)),
                        bandwidth_gbps=bandwidth_gbps)
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"], "ps": ["127.0.0.2:5002"]}
    return plan_children(spec, cluster, [sys.executable, "train.py"], cwd="/here",
                         helpers={SUMSERVER_ROLE: ["127.0.0.2:5003"]})


def test_launcher_gives_every_process_the_window_of_its_links(monkeypatch):
    monkeypatch.delenv(envvars.HERRING_WINDOW, raising=False)
    plans = _children(1.0)
    assert {p.role for p in plans} >= {WORKER_ROLE, SUMSERVER_ROLE}
    expected = str(window.flow_window_bytes(1.0, 2, 1))
    assert all(p.env[envvars.HERRING_WINDOW] == expected for p in plans), plans
    # Without a link speed the launcher adds nothing; the user's own setting
    # (inherited by the local children) wins.
    assert all(envvars.HERRING_WINDOW not in p.env for p in _children(None))
    monkeypatch.setenv(envvars.HERRING_WINDOW, "65536")
    assert all(p.env[envvars.HERRING_WINDOW] == "65536" for p in _children(1.0))


def test_launcher_bounds_the_windows_of_tensorflows_connections(monkeypatch):
    """A worker's connections to the other workers and to the parameter
    servers, and a server's to the workers, get the window of their links,
    as the shim's "ADDR/PORT" list; the summation servers have their own."""
    monkeypatch.delenv(envvars.TCP_WINDOW, raising=False)
    plans = _children(0.025)
    expected = str(window.flow_window_bytes(0.025, 2, 1))
    peers = {p.role: p.env.get(envvars.TCP_WINDOW_PEERS) for p in plans}
    workers = "127.0.0.1/5000,127.0.0.1/5001"
    assert peers == {WORKER_ROLE: workers + ",127.0.0.2/5002", SERVER_ROLE: workers,
                     SUMSERVER_ROLE: None}, peers
    assert {p.role: p.env.get(envvars.TCP_WINDOW) for p in plans} == {
        WORKER_ROLE: expected, SERVER_ROLE: expected, SUMSERVER_ROLE: None}
    # No link speed: the kernel's autotuning, unless the user sets the bytes.
    assert all(envvars.TCP_WINDOW not in p.env for p in _children(None))
    monkeypatch.setenv(envvars.TCP_WINDOW, "40000")
    assert all(p.env[envvars.TCP_WINDOW] == "40000" and p.env[envvars.TCP_WINDOW_PEERS]
               for p in _children(None) if p.role != SUMSERVER_ROLE)
    monkeypatch.setenv(envvars.TCP_WINDOW, "0")      # turned off
    assert all(envvars.TCP_WINDOW_PEERS not in p.env for p in _children(0.025))


@pytest.mark.parametrize("gbps, workers, servers, expected", [
    (0.025, 8, 8, window.MIN_BYTES),
    (0.1, 4, 0, 25_000),        # a ring without servers: the workers' links
    (1.0, 8, 8, 125_000),
    # Where the rule reaches the transport's default, the kernel's autotuning
    # decides (a fixed SO_RCVBUF is capped by net.core.rmem_max).
    (1.0, 4, 4, None),
    (10.0, 8, 8, None),
    (None, 8, 8, None),
])
def test_tcp_window_leaves_fast_links_to_the_kernel(gbps, workers, servers, expected):
    assert window.tcp_window_bytes(gbps, workers, servers) == expected


def test_a_job_without_servers_bounds_its_rings_connections(monkeypatch):
    from autopar.runtime.commands import tcp_window_env
    monkeypatch.delenv(envvars.TCP_WINDOW, raising=False)
    ring = tcp_window_env(WORKER_ROLE, {"worker": ["127.0.0.1:1", "127.0.0.2:2"]}, 0.025)
    assert ring == {envvars.TCP_WINDOW: str(window.MIN_BYTES),
                    envvars.TCP_WINDOW_PEERS: "127.0.0.1/1,127.0.0.2/2"}
    assert tcp_window_env(WORKER_ROLE, {"worker": ["127.0.0.1:1"]}, 10.0) == {}


@pytest.mark.parametrize("name, value", [
    (envvars.TCP_WINDOW, "64k"), (envvars.TCP_WINDOW, "1000"), (envvars.TCP_WINDOW, "-5"),
    (envvars.HERRING_WINDOW, "0"), (envvars.HERRING_WINDOW, str(1 << 30)),
])
def test_a_window_the_transports_would_ignore_is_refused_by_name(monkeypatch, name, value):
    """The shim and the Herring transport fall back silently on a value out
    of their range; the launcher says so before starting anything."""
    from autopar.common.errors import LaunchError
    monkeypatch.setenv(name, value)
    with pytest.raises(LaunchError, match=f"{name}='{re.escape(value)}': must be a whole number"):
        _children(0.025)
