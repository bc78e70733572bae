"""The emulated cluster (bench/cluster.py): a real job across two network namespaces moves the bytes
it should over the hosts' links, the rate limit holds, and nothing the cluster creates outlives it —
not on a normal exit, not on SIGTERM/Ctrl-C, and not after a harness killed with SIGKILL (the next
run clears it). Tests that build a cluster need root; they use their own prefix so they never touch
a benchmark's cluster (default prefix 'apb')."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cluster import (ClusterError, ClusterPermissionError, EmulatedCluster, cleanup_leftovers, measure_throughput,
                           namespace_name, require_root)
from tests.integration.cluster import child_env
from tests.integration.cluster import pid_alive as alive

REPO = Path(__file__).resolve().parents[2]
PREFIX = "apbt"
PORT = 24000
TENSOR_BYTES = 4 << 20   # 4 MiB of float32

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces")

ALLREDUCE = r"""
import json, socket, sys, time
import numpy as np
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
index, peers, nbytes = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
config = tf1.ConfigProto()
config.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
config.device_filters.append(f"/job:worker/task:{index}")
server = tf.distribute.Server(tf.train.ClusterSpec({"worker": peers}), job_name="worker", task_index=index,
                              protocol="grpc", config=config, start=True)

def accepting(peer):
    host, port = peer.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False

deadline = time.monotonic() + 60
while not all(accepting(p) for p in peers):
    assert time.monotonic() < deadline, "peers did not come up"
    time.sleep(0.1)
with tf1.device(f"/job:worker/task:{index}/device:CPU:0"):
    x = tf.fill([nbytes // 4], float(index + 1))
    y = tf.raw_ops.CollectiveReduceV2(input=x, group_size=len(peers), group_key=1, instance_key=1,
                                      ordering_token=[], merge_op="Add", final_op="Id", communication_hint="ring")
with tf1.Session(server.target, config=config) as sess:
    out = sess.run(y)
expected = sum(range(1, len(peers) + 1))
print(json.dumps({"ok": bool(out.size == nbytes // 4 and np.all(out == expected)), "first": float(out[0])}), flush=True)
# The leader serves the others until they have their result (they exit once they do).
deadline = time.monotonic() + 30
while index == 0 and any(accepting(p) for p in peers[1:]) and time.monotonic() < deadline:
    time.sleep(0.1)
"""


def _ours(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(PREFIX + "-")]


def leftovers() -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                                      check=True).stdout or "[]")
    return _ours([line.split()[0] for line in ns.splitlines() if line.strip()]) + \
        _ours([d["ifname"] for d in links])


def netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(t) for t in out.split()]


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output from {proc.args} within {timeout} s")
    return proc.stdout.readline()


@pytest.fixture
def no_leftovers():
    """Whatever a test does, nothing with the test prefix survives it."""
    yield
    if os.geteuid() == 0:
        cleanup_leftovers(PREFIX)


@needs_root
def test_allreduce_across_two_hosts_moves_the_expected_bytes_and_leaves_nothing(tmp_path, no_leftovers):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    with EmulatedCluster(2, prefix=PREFIX) as cluster:
        from autopar.runtime.spec import load_spec
        spec = load_spec(cluster.write_spec(tmp_path / "spec.yaml", workers_per_host=1))
        assert [h.address for h in spec.hosts] == cluster.addresses
        assert spec.bandwidth_gbps == pytest.approx(1.0)

        peers = ",".join(f"{address}:{PORT}" for address in cluster.addresses)
        before = cluster.counters()
        sampled_before = [cluster.link_bytes(i) for i in range(2)]
        procs = [cluster.popen(i, [sys.executable, str(script), str(i), peers, str(TENSOR_BYTES)], env=child_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        after = cluster.counters()
        sampled_after = [cluster.link_bytes(i) for i in range(2)]
        started = cluster.processes
    for i, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"worker {i} exited {proc.returncode}:\n{out[-3000:]}"
        assert json.loads(out.strip().splitlines()[-1])["ok"], f"worker {i} got a wrong sum: {out[-500:]}"

    n = 2
    expected = (n - 1) / n * 2 * TENSOR_BYTES
    for host in range(n):
        rx, tx = (after[host][k] - before[host][k] for k in (0, 1))
        print(f"host {host}: rx {rx / 1e6:.2f} MB, tx {tx / 1e6:.2f} MB (all-reduce payload {expected / 1e6:.2f} MB)")
        assert expected <= rx < 3 * expected, f"host {host} received {rx} bytes"
        assert expected <= tx < 3 * expected, f"host {host} sent {tx} bytes"
        # The sampler's reading from the link's root side (no process per
        # read) sees the same bytes as the host's own counters.
        sampled = [a - b for a, b in zip(sampled_after[host], sampled_before[host])]
        assert sampled == pytest.approx([rx, tx], rel=0.01), (host, sampled, rx, tx)

    assert leftovers() == []
    assert [p.pid for p in started if alive(p.pid)] == []


@needs_root
def test_start_clears_a_half_finished_previous_run(no_leftovers):
    ns = namespace_name(PREFIX, 0)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", f"{PREFIX}-v9", "type", "veth", "peer", "name", f"{PREFIX}-e9"], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while sleeper.pid not in netns_pids(ns):
            assert time.monotonic() < deadline, "sleep did not enter the namespace"
            time.sleep(0.05)
        with EmulatedCluster(2, prefix=PREFIX) as cluster:
            assert sleeper.wait(timeout=10) == -signal.SIGKILL
            assert f"{PREFIX}-v9" not in leftovers()
            assert netns_pids(cluster.namespace(0)) == []   # a fresh namespace under the old name
        assert leftovers() == []
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait(timeout=10)


@needs_root
def test_a_harness_killed_with_sigkill_is_cleared_by_the_next_run(no_leftovers):
    harness = subprocess.Popen([sys.executable, "-m", "bench.cluster", "--hosts", "2", "--prefix", PREFIX,
                                "--hold", "60"], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        line = read_line(harness, timeout=30)
        assert line.startswith("ready"), line
        sleepers = [int(pid) for pid in line.split()[1:]]
        harness.kill()
        harness.wait(timeout=10)
        assert leftovers() and all(alive(pid) for pid in sleepers)   # SIGKILL leaves them behind...
        with EmulatedCluster(2, prefix=PREFIX):
            assert not any(alive(pid) for pid in sleepers)       # ...and the next run clears them
        assert leftovers() == []
    finally:
        if harness.poll() is None:
            harness.kill()
        harness.wait(timeout=10)


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_harness_removes_everything_itself(sig, no_leftovers):
    harness = subprocess.Popen([sys.executable, "-m", "bench.cluster", "--hosts", "2", "--prefix", PREFIX,
                                "--hold", "60"], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = read_line(harness, timeout=30)
        assert line.startswith("ready"), line
        sleepers = [int(pid) for pid in line.split()[1:]]
        harness.send_signal(sig)
        assert harness.wait(timeout=20) != 0
        assert leftovers() == []
        assert not any(alive(pid) for pid in sleepers)
    finally:
        if harness.poll() is None:
            harness.kill()
        harness.wait(timeout=10)


@needs_root
def test_a_second_cluster_with_the_same_prefix_is_refused_and_harms_nothing(no_leftovers):
    with EmulatedCluster(2, prefix=PREFIX) as cluster:
        with pytest.raises(ClusterError, match="another emulated cluster"):
            with EmulatedCluster(2, prefix=PREFIX):
                pass
        assert sorted(leftovers()) == sorted([f"{PREFIX}-br", *(cluster.namespace(i) for i in range(2)),
                                              *(f"{PREFIX}-v{i}" for i in range(2))])
    assert leftovers() == []


@needs_root
def test_rate_limit_at_100_mbit(no_leftovers):
    with EmulatedCluster(2, rate_mbit=100, prefix=PREFIX) as cluster:
        result = measure_throughput(cluster, 0, 1, seconds=1.0, timeout_s=30)
    print(f"100 Mbit/s configured: {result.mbit_s:.1f} Mbit/s measured over {result.nbytes / 1e6:.1f} MB "
          f"in {result.seconds:.2f} s, RTT {result.rtt_ms:.3f} ms")
    assert 0 < result.mbit_s < 2 * 100      # loose: a test asserts behaviour, not timing
    assert leftovers() == []


@needs_root
def test_losses_count_a_short_queue_dropping_a_transfer(no_leftovers):
    # The benchmark records drops, retransmissions and timeouts per point (bench/run.py): with
    # the link's queue cut to 20 frames, a TCP transfer out of host 0 must show up in them.
    with EmulatedCluster(2, rate_mbit=100, prefix=PREFIX) as cluster:
        before = cluster.losses()
        assert sorted(before) == [0, 1]
        assert all(v >= 0 for counts in before.values() for v in counts.values())
        subprocess.run(["tc", "-n", cluster.namespace(0), "qdisc", "change", "dev", cluster.link(0), "root",
                        "handle", "1:", "tbf", "rate", "100mbit", "burst", "16384", "limit", "30000"],
                       check=True, capture_output=True, text=True)
        measure_throughput(cluster, 0, 1, seconds=1.0, timeout_s=30)
        after = cluster.losses()
    assert after[0]["egress_drops"] > before[0]["egress_drops"], (before, after)
    assert after[0]["retransmitted_segments"] > before[0]["retransmitted_segments"], (before, after)
    assert after[1]["egress_drops"] == before[1]["egress_drops"] == 0     # nothing queued the other way
    assert leftovers() == []


@needs_root
def test_set_rate_reshapes_both_directions_of_every_link(no_leftovers):
    # The harness starts jobs fast and shapes the links to the measured rate at the start barrier.
    with EmulatedCluster(2, rate_mbit=10000, prefix=PREFIX) as cluster:
        cluster.set_rate(100)
        shown = [subprocess.run(["tc", "-n", cluster.namespace(i), "qdisc", "show", "dev", cluster.link(i)],
                                capture_output=True, text=True, check=True).stdout for i in range(2)]
        shown += [subprocess.run(["tc", "qdisc", "show", "dev", f"{PREFIX}-v{i}"],
                                 capture_output=True, text=True, check=True).stdout for i in range(2)]
        assert all("tbf" in out and "rate 100Mbit" in out for out in shown), shown
        result = measure_throughput(cluster, 0, 1, seconds=1.0, timeout_s=30)
        assert cluster.rate_mbit == 100.0
        with pytest.raises(ValueError):
            cluster.set_rate(0)
    assert 0 < result.mbit_s < 2 * 100
    assert leftovers() == []


HOLD_CONNECTION = r"""
import socket, sys, time
if sys.argv[1] == "listen":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], int(sys.argv[3])))
    s.listen()
    print("listening", flush=True)
    conn, _ = s.accept()
else:
    conn = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=10)
    conn.sendall(b"x" * 100000)
print("connected", flush=True)
sys.stdin.readline()        # hold the connection until the test has looked at it
"""


def _congestion_controls(cluster: EmulatedCluster, host: int) -> list[str]:
    """The congestion control of every established TCP connection in a host (ss -ti)."""
    out = subprocess.run(["ip", "netns", "exec", cluster.namespace(host), "ss", "-tin", "state", "established"],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    known = {"cubic", "bbr", "reno", "dctcp", "vegas", "westwood", "htcp", "bic"}
    return [word for line in out.splitlines() for word in line.split() if word in known]


@needs_root
@pytest.mark.parametrize("algorithm", ["cubic", "reno"])
def test_connections_between_hosts_run_the_configured_congestion_control(tmp_path, no_leftovers, algorithm):
    # A namespace inherits the machine's default (bbr on some machines) and may not pick one outside
    # tcp_allowed_congestion_control itself: the cluster sets it on each host's route, which both
    # the connecting and the accepting side of a connection between hosts must use.
    script = tmp_path / "hold.py"
    script.write_text(HOLD_CONNECTION)
    with EmulatedCluster(2, rate_mbit=100, prefix=PREFIX, congestion_control=algorithm) as cluster:
        assert cluster.tcp_congestion_control == algorithm
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        server = cluster.popen(1, [sys.executable, str(script), "listen", cluster.addresses[1], str(PORT)], **pipes)
        try:
            assert read_line(server, 30).strip() == "listening"
            client = cluster.popen(0, [sys.executable, str(script), "connect", cluster.addresses[1], str(PORT)],
                                   **pipes)
            assert read_line(client, 30).strip() == "connected"
            assert read_line(server, 30).strip() == "connected"
            seen = {host: _congestion_controls(cluster, host) for host in (0, 1)}
            assert seen == {0: [algorithm], 1: [algorithm]}, seen
            for proc in (client, server):
                proc.communicate("done\n", timeout=30)
        finally:
            for proc in cluster.processes:
                if proc.poll() is None:
                    proc.kill()
    assert leftovers() == []


def test_without_root_it_says_so_and_exits_non_zero(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as exc:
        require_root()
    assert "needs root" in str(exc.value.code)
    with pytest.raises(ClusterPermissionError, match="needs root"):
        with EmulatedCluster(2, prefix=PREFIX):
            pass
