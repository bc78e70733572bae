"""An emulated multi-host cluster on one Linux machine, for benchmarks and tests.

Each host is a network namespace with its own veth link and IPv4 address in a
private /24; the links meet on a bridge in the root namespace that carries no
address, so processes in the hosts reach each other and nothing else. Every
host's link is shaped with `tc`: a token bucket (`tbf`) at the configured rate
on its egress (host -> bridge) and, by default, on its ingress too (bridge ->
host, shaped on the root side of the veth), i.e. a full-duplex NIC into a
non-blocking switch. Each direction queues 1000 frames (1.5 MB; at least
20 ms of the rate): a Linux host's default txqueuelen, and a switch port's
share of a datacenter switch's shared buffer; a `netem` delay is added to the egress when the kernel
has `sch_netem` (`delay_emulated` says whether it did).

Everything created carries the name prefix (default `apb`): namespaces
`apb-h<i>`, veths `apb-v<i>` (root side) / `apb-e<i>` (host side), bridge
`apb-br`. `cleanup_leftovers(prefix)` kills every process running inside a
namespace with the prefix and deletes those namespaces and links; a cluster
calls it before building and again when it is torn down (`__exit__`, Ctrl-C,
SIGTERM/SIGHUP, interpreter exit). A harness killed with SIGKILL leaves things
behind that the next cluster (or `python -m bench.cluster --cleanup`) removes.
Only one live cluster per prefix: an abstract unix socket named after the
prefix is the lock (released by the kernel when its holder dies).

    with EmulatedCluster(2, rate_mbit=100) as cluster:
        spec = cluster.write_spec("/tmp/spec.yaml", workers_per_host=1)
        before = cluster.counters()
        procs = [cluster.popen(i, [sys.executable, "train.py"]) for i in range(2)]
        ...
        after = cluster.counters()

Needs root (namespaces, links, qdiscs) and iproute2 (`ip`, `tc`).
"""
from __future__ import annotations

import argparse
import atexit
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autopar.common.procs import stop_processes

log = logging.getLogger("autopar.bench.cluster")

SUBNET = "10.213.0"            # host i gets SUBNET.(i+1)/24; only ever exists inside our namespaces
MAX_HOSTS = 250
# A link direction's queue, in full-size Ethernet frames: Linux's default
# txqueuelen on the host's side, within a datacenter switch port's share of
# its buffer on the switch's side.
QUEUE_FRAMES = 1000
# TCP congestion control of every connection between emulated hosts, set on
# each host's subnet route: a namespace inherits the machine's default (this
# VM's is bbr) and may not choose one outside net.ipv4.tcp_allowed_congestion_control,
# while a route's `congctl` may. cubic is Linux's own default and what most
# clusters run; None keeps the machine's.
DEFAULT_CONGESTION_CONTROL = "cubic"
ETHERNET_FRAME_BYTES = 1514
CHECK_PORT = 23950             # port of the throughput check, inside the namespaces
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")   # keeps every name <= 15 chars (IFNAMSIZ)
_CMD_TIMEOUT_S = 20.0
_TERM_GRACE_S = 3.0            # SIGTERM -> SIGKILL for the processes a cluster started
_KILL_WAIT_S = 5.0             # how long SIGKILLed processes may take to disappear

ROOT_MESSAGE = ("the emulated cluster needs root: it creates network namespaces, veth links, a bridge "
                "and tc qdiscs. Run it as root, e.g. `sudo .venv/bin/python -m bench.cluster --hosts 2 --check`.")


class ClusterError(RuntimeError):
    """Building, using or removing the emulated cluster failed; the message says what to do."""


class ClusterPermissionError(ClusterError, PermissionError):
    """The emulated cluster needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)."""


def require_root() -> None:
    """Exit non-zero with a clear message unless this process runs as root."""
    if os.geteuid() != 0:
        raise SystemExit(ROOT_MESSAGE)


# --------------------------------------------------------------------------- names

def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be 1-8 lowercase letters/digits starting with a letter "
                         "(names like '<prefix>-br' must fit in 15 characters)")


def bridge_name(prefix: str) -> str:
    return f"{prefix}-br"


def namespace_name(prefix: str, host: int) -> str:
    return f"{prefix}-h{host}"


def root_veth_name(prefix: str, host: int) -> str:
    return f"{prefix}-v{host}"


def host_veth_name(prefix: str, host: int) -> str:
    return f"{prefix}-e{host}"


# --------------------------------------------------------------------------- commands

def _run(argv: list[str], check: bool = True, timeout: float = _CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise ClusterError(f"{argv[0]} not found: the emulated cluster needs iproute2 (ip, tc)") from e
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from e
    if check and proc.returncode != 0:
        msg = proc.stderr.strip() or proc.stdout.strip()
        if "Operation not permitted" in msg or "Permission denied" in msg:
            raise ClusterPermissionError(f"`{' '.join(argv)}` failed: {msg}. {ROOT_MESSAGE}")
        raise ClusterError(f"`{' '.join(argv)}` failed with status {proc.returncode}: {msg}")
    return proc


def _netns_with_prefix(prefix: str) -> list[str]:
    out = _run(["ip", "netns", "list"]).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix + "-")]


def _links_with_prefix(prefix: str) -> list[str]:
    out = _run(["ip", "-j", "link", "show"]).stdout.strip()
    return [d["ifname"] for d in json.loads(out or "[]") if d.get("ifname", "").startswith(prefix + "-")]


def _netns_pids(ns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", ns], check=False)
    if proc.returncode != 0:   # the namespace vanished meanwhile
        return []
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _kill_namespace_processes(ns: str) -> list[str]:
    """SIGKILL every process inside namespace `ns` until none is left; returns what was killed."""
    killed: list[str] = []
    seen: set[int] = set()
    deadline = time.monotonic() + _KILL_WAIT_S
    while True:
        pids = [p for p in _netns_pids(ns) if p != os.getpid()]
        if not pids:
            return killed
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} inside namespace {ns} survived SIGKILL for "
                               f"{_KILL_WAIT_S:.0f} s (uninterruptible I/O?); remove them and run "
                               "`python -m bench.cluster --cleanup`")
        for pid in pids:
            name = _comm(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            if pid not in seen:
                seen.add(pid)
                killed.append(f"process {pid} ({name}) in {ns}")
        time.sleep(0.05)


def cleanup_leftovers(prefix: str = "apb") -> list[str]:
    """Kill every process inside a namespace named `<prefix>-...`, delete those namespaces and every
    link in the root namespace named `<prefix>-...`. Returns a description of each thing removed.

    It does not check whether a live cluster owns them: `EmulatedCluster` and the CLI call it only
    while holding the prefix's lock."""
    _check_prefix(prefix)
    removed: list[str] = []
    for ns in _netns_with_prefix(prefix):
        removed += _kill_namespace_processes(ns)
        _run(["ip", "netns", "del", ns])
        removed.append(f"namespace {ns}")
    for link in _links_with_prefix(prefix):
        proc = _run(["ip", "link", "del", link], check=False)
        if proc.returncode == 0:
            removed.append(f"link {link}")
        elif link in _links_with_prefix(prefix):   # not merely gone with its veth peer
            raise ClusterError(f"could not delete link {link}: {proc.stderr.strip()}")
    return removed


def _acquire_lock(prefix: str) -> socket.socket:
    """One live cluster per prefix. An abstract unix socket leaves no file behind and is released by
    the kernel when its holder dies, even by SIGKILL."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind("\0autopar-bench-cluster-" + prefix)
    except OSError as e:
        lock.close()
        if e.errno == errno.EADDRINUSE:
            raise ClusterError(f"another emulated cluster with prefix '{prefix}' is running on this machine; "
                               "wait for it to finish or use another prefix") from e
        raise
    return lock


def _disable_ipv6(iface: str, ns: str | None = None) -> None:
    """No IPv6 link-local addresses, router solicitations or MLD reports on our links: the only
    traffic is between the IPv4 addresses we assign (and the counters count only that)."""
    if not os.path.isdir("/proc/sys/net/ipv6"):
        return
    path = f"/proc/sys/net/ipv6/conf/{iface}/disable_ipv6"
    if ns is None:
        Path(path).write_text("1\n")
    else:
        _run(["ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > {path}"])


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- the cluster

class EmulatedCluster:
    """H hosts as network namespaces joined by a bridge in the root namespace, each host with its own
    veth link and address, egress rate limit and delay set with tc (defaults 1 Gbit/s, 0.1 ms;
    configurable down to 100 Mbit/s). With `shape_downlink` (default) the bridge -> host direction is
    rate-limited too, so a host receives no faster than its link rate."""

    def __init__(self, num_hosts: int, rate_mbit: float = 1000.0, delay_ms: float = 0.1, prefix: str = "apb",
                 shape_downlink: bool = True, congestion_control: str | None = DEFAULT_CONGESTION_CONTROL):
        _check_prefix(prefix)
        if not 1 <= int(num_hosts) <= MAX_HOSTS:
            raise ValueError(f"num_hosts must be 1..{MAX_HOSTS}, got {num_hosts}")
        if not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        if not delay_ms >= 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        self.num_hosts = int(num_hosts)
        self.rate_mbit = float(rate_mbit)
        self.delay_ms = float(delay_ms)
        self.prefix = prefix
        self.shape_downlink = shape_downlink
        self.congestion_control = congestion_control
        self.addresses: list[str] = [f"{SUBNET}.{i + 1}" for i in range(self.num_hosts)]
        self.delay_emulated = False      # set when built: False if the kernel has no sch_netem
        self._procs: list[subprocess.Popen] = []
        self._lock: socket.socket | None = None
        self._prev_handlers: dict[int, Any] = {}
        self._active = False
        self._ip = shutil.which("ip") or "ip"

    @property
    def tcp_congestion_control(self) -> str:
        """What the hosts' TCP connections to each other run: the configured
        algorithm, or the machine's default that namespaces inherit."""
        if self.congestion_control:
            return self.congestion_control
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()

    def __repr__(self) -> str:
        return (f"EmulatedCluster({self.num_hosts} hosts, {self.rate_mbit:g} Mbit/s, {self.delay_ms:g} ms, "
                f"prefix={self.prefix!r}, {'up' if self._active else 'down'})")

    # ------------------------------------------------------------------ names

    def namespace(self, i: int) -> str:
        self._check_host(i)
        return namespace_name(self.prefix, i)

    def link(self, i: int) -> str:
        """Host i's veth, inside its namespace."""
        self._check_host(i)
        return host_veth_name(self.prefix, i)

    def _check_host(self, i: int) -> None:
        if not 0 <= i < self.num_hosts:
            raise IndexError(f"host {i} does not exist: the cluster has hosts 0..{self.num_hosts - 1}")

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "EmulatedCluster":
        if os.geteuid() != 0:
            raise ClusterPermissionError(ROOT_MESSAGE)
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise ClusterError(f"`{tool}` not found: the emulated cluster needs iproute2")
        self._lock = _acquire_lock(self.prefix)
        self._active = True
        self._install_signal_handlers()
        atexit.register(self._atexit)
        try:
            removed = cleanup_leftovers(self.prefix)
            if removed:
                log.warning("removed leftovers of an earlier run: %s", ", ".join(removed))
            self._build()
        except BaseException:
            try:
                self._teardown()
            except Exception:   # keep the error that stopped the build; report this one
                log.exception("removing the half-built cluster %r failed", self.prefix)
            raise
        log.info("emulated cluster up: %s", self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._teardown()

    def close(self) -> None:
        self._teardown()

    def _build(self) -> None:
        br = bridge_name(self.prefix)
        _run(["ip", "link", "add", br, "type", "bridge"])
        _disable_ipv6(br)
        _run(["ip", "link", "set", br, "up"])
        netem_missing = False
        for i, address in enumerate(self.addresses):
            ns, root_end, host_end = self.namespace(i), root_veth_name(self.prefix, i), self.link(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", root_end, "type", "veth", "peer", "name", host_end, "netns", ns])
            _disable_ipv6(root_end)
            _disable_ipv6(host_end, ns)
            _run(["ip", "link", "set", root_end, "master", br])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", host_end])
            tbf = self._tbf_args()
            _run(["tc", "-n", ns, "qdisc", "add", "dev", host_end, "root", "handle", "1:", *tbf])
            if self.delay_ms > 0 and not netem_missing:
                proc = _run(["tc", "-n", ns, "qdisc", "add", "dev", host_end, "parent", "1:1", "handle", "10:",
                             "netem", "delay", f"{self.delay_ms}ms", "limit", "10000"], check=False)
                if proc.returncode != 0:
                    # "Specified qdisc kind is unknown" (extack) or ENOENT on older kernels: no sch_netem
                    if not any(m in proc.stderr for m in ("unknown", "No such file or directory")):
                        raise ClusterError(f"adding the netem delay on {host_end} failed: {proc.stderr.strip()}")
                    netem_missing = True
            if self.shape_downlink:
                _run(["tc", "qdisc", "add", "dev", root_end, "root", "handle", "1:", *tbf])
            _run(["ip", "-n", ns, "link", "set", host_end, "up"])
            if self.congestion_control:   # the subnet's route exists once the link is up
                _run(["ip", "-n", ns, "route", "replace", f"{SUBNET}.0/24", "dev", host_end, "proto", "kernel",
                      "scope", "link", "src", address, "congctl", "lock", self.congestion_control])
            _run(["ip", "link", "set", root_end, "up"])
        self.delay_emulated = self.delay_ms > 0 and not netem_missing
        if netem_missing:
            log.warning("this kernel has no sch_netem: the configured delay of %g ms is not emulated "
                        "(links keep only the veth/bridge latency, ~0.03 ms RTT); the rate limit is applied", self.delay_ms)

    def set_rate(self, rate_mbit: float) -> None:
        """Change every link's rate (both directions) on the running cluster:
        `tc qdisc change` of each tbf; a netem delay under it stays as it is.
        The benchmark starts its jobs at a fast rate (the initial parameter
        broadcast is not measured) and shapes the links before the warm-up."""
        if not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        self.rate_mbit = float(rate_mbit)
        tbf = self._tbf_args()
        for i in range(self.num_hosts):
            _run(["tc", "-n", self.namespace(i), "qdisc", "change", "dev", self.link(i), "root", "handle", "1:",
                  *tbf])
            if self.shape_downlink:
                _run(["tc", "qdisc", "change", "dev", root_veth_name(self.prefix, i), "root", "handle", "1:", *tbf])

    def _tbf_args(self) -> list[str]:
        """A link direction's token bucket. Its queue is sized in frames, not in
        time: the messages are the model's, as large as on a fast cluster,
        while the rate is 10-1000x lower. 20 ms at 100 Mbit/s is 250 KB, less
        than a parameter-server pull gathers into one worker at once (4
        servers x 130 KB on the sparse LM): the port dropped 160-290 segments
        per run and each server timed out ~25 times (200 ms minimum RTO, which
        does not scale with the rate), and the host's own egress made a worker
        pushing on 5 connections retransmit ~900 segments per run. Rings,
        sending on one connection, lost none; their step times are the same
        with either queue."""
        rate_bytes = self.rate_mbit * 1e6 / 8
        burst = max(int(rate_bytes * 0.001), 16 * 1024)     # 1 ms at the rate, >= 16 KiB
        limit = max(int(rate_bytes * 0.020), 4 * burst,     # >= 20 ms of queue
                    QUEUE_FRAMES * ETHERNET_FRAME_BYTES)
        return ["tbf", "rate", f"{self.rate_mbit * 1e6:.0f}bit", "burst", str(burst), "limit", str(limit)]

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP unwind like Ctrl-C does (SystemExit instead of KeyboardInterrupt), so the
        with-block's teardown runs; handlers someone else installed are left alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._prev_handlers[sig] = signal.signal(sig, _raise_exit)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._prev_handlers.items():
            signal.signal(sig, handler)
        self._prev_handlers.clear()

    def _atexit(self) -> None:
        try:
            self._teardown()
        except Exception:   # interpreter exit: report, do not mask the exit status
            log.exception("tearing down the emulated cluster at exit failed")

    def _teardown(self) -> None:
        if not self._active:
            return
        main = threading.current_thread() is threading.main_thread()
        stop_signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        if main:   # a second Ctrl-C must not interrupt the cleanup half-way
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        try:
            # Only groups whose leader is not reaped yet: its pid (= the group id) cannot have been
            # reused. Anything else still inside a namespace (a child that left the group) dies in
            # cleanup_leftovers.
            stop_processes([p for p in self._procs if p.poll() is None], _TERM_GRACE_S, _KILL_WAIT_S)
            removed = cleanup_leftovers(self.prefix)
            log.debug("removed %s", ", ".join(removed))
        finally:
            self._active = False
            atexit.unregister(self._atexit)
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            if main:
                self._restore_signal_handlers()
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        log.info("emulated cluster %r removed", self.prefix)

    # ------------------------------------------------------------------ use

    def popen(self, host: int, argv: list[str], env: dict | None = None, **popen_kwargs: Any) -> subprocess.Popen:
        """Run argv inside host `host`'s namespace, in its own session and process group, tracked so
        that teardown kills it. Other keyword arguments go to subprocess.Popen."""
        if not self._active:
            raise ClusterError("the cluster is not up: use it as `with EmulatedCluster(...) as cluster:`")
        for key in ("start_new_session", "process_group", "preexec_fn"):
            if key in popen_kwargs:
                raise TypeError(f"popen() sets {key} itself (each process gets its own process group)")
        argv = [self._ip, "netns", "exec", self.namespace(host), *map(str, argv)]
        proc = subprocess.Popen(argv, env=env, start_new_session=True, **popen_kwargs)
        self._procs.append(proc)
        return proc

    @property
    def processes(self) -> list[subprocess.Popen]:
        """Every process popen() started (running or not)."""
        return list(self._procs)

    def counters(self) -> dict[int, tuple[int, int]]:
        """host -> (rx_bytes, tx_bytes) of the host's veth, read inside its namespace."""
        result = {}
        for i in range(self.num_hosts):
            out = _run(["ip", "-n", self.namespace(i), "-j", "-s", "link", "show", "dev", self.link(i)]).stdout
            stats = json.loads(out)[0]
            stats = stats.get("stats64") or stats["stats"]
            result[i] = (int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"]))
        return result

    def link_bytes(self, i: int) -> tuple[int, int]:
        """(bytes host i has received, bytes it has sent) on its link, read
        from the link's root side (its transmit is what the host receives):
        two file reads, no process, so it can be sampled every few ms."""
        stats = Path("/sys/class/net") / root_veth_name(self.prefix, i) / "statistics"
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())

    def losses(self) -> dict[int, dict[str, int]]:
        """host -> cumulative loss counters: frames its link's queues dropped
        (`egress_drops`: host -> switch, `ingress_drops`: switch -> host) and its
        TCP stack's retransmitted segments, retransmission timeouts and
        tail-loss probes. A timeout costs at least 200 ms (Linux's minimum RTO,
        which does not scale with the emulated rate), so a run that has any is
        measuring the queues."""
        ingress = _drops_by_device(_run(["tc", "-s", "-j", "qdisc", "show"]).stdout)
        result = {}
        for i in range(self.num_hosts):
            out = _run(["ip", "netns", "exec", self.namespace(i), "sh", "-c",
                        f"tc -s -j qdisc show; echo {_SEPARATOR}; "
                        "cat /proc/net/snmp /proc/net/netstat"]).stdout
            qdiscs, _, proc_net = out.partition(_SEPARATOR)
            tcp = _proc_net_counters(proc_net)
            result[i] = {"egress_drops": _drops_by_device(qdiscs).get(self.link(i), 0),
                         "ingress_drops": ingress.get(root_veth_name(self.prefix, i), 0),
                         "retransmitted_segments": tcp.get(("Tcp", "RetransSegs"), 0),
                         "timeouts": tcp.get(("TcpExt", "TCPTimeouts"), 0),
                         # sent without a loss; a probe that resends a segment is also a retransmission
                         "loss_probes": tcp.get(("TcpExt", "TCPLossProbes"), 0)}
        return result

    def write_spec(self, path: str | os.PathLike, workers_per_host: int, servers_per_host: int = 0,
                   ports: tuple[int, int] = (24000, 24999)) -> str:
        """Write the autopar YAML resource spec of this cluster; returns the path."""
        import yaml
        data = {
            "hosts": [{"address": a, "workers": int(workers_per_host), "servers": int(servers_per_host),
                       "ports": [int(ports[0]), int(ports[1])]} for a in self.addresses],
            # every emulated host's processes run on this machine's cores
            "network": {"bandwidth_gbps": self.rate_mbit / 1000.0,
                        "shared_cores": float(os.cpu_count() or 1)},
        }
        header = (f"# Emulated cluster '{self.prefix}': {self.num_hosts} hosts, {self.rate_mbit:g} Mbit/s, "
                  f"{self.delay_ms:g} ms (written by bench/cluster.py)\n")
        Path(path).write_text(header + yaml.safe_dump(data, sort_keys=False))
        return str(path)


_SEPARATOR = "--autopar-bench--"


def _drops_by_device(tc_json: str) -> dict[str, int]:
    """device -> frames its qdiscs dropped, from `tc -s -j qdisc show` output."""
    out: dict[str, int] = {}
    for q in json.loads(tc_json.strip() or "[]"):
        out[q.get("dev", "")] = out.get(q.get("dev", ""), 0) + int(q.get("drops", 0))
    return out


def _proc_net_counters(text: str) -> dict[tuple[str, str], int]:
    """{(section, name): value} from /proc/net/snmp or /proc/net/netstat text
    (each section is a line of names followed by a line of values)."""
    out: dict[tuple[str, str], int] = {}
    lines = [ln.split() for ln in text.splitlines() if ":" in ln]
    for names, values in zip(lines[::2], lines[1::2]):
        if names[0] != values[0]:
            continue
        for name, value in zip(names[1:], values[1:]):
            try:
                out[(names[0].rstrip(":"), name)] = int(value)
            except ValueError:
                pass
    return out


# --------------------------------------------------------------------------- throughput check

_PEER_SCRIPT = r"""
import json, socket, statistics, sys, time
role, addr, port, nbytes, timeout, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
deadline = time.monotonic() + timeout
def left():
    t = deadline - time.monotonic()
    if t <= 0:
        raise TimeoutError(f"{role}: no result within {timeout:.0f} s")
    return t
if role == "recv":
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port)); srv.listen(1); srv.settimeout(left())
    conn, _ = srv.accept()
    buf = bytearray(1 << 20); got = 0; first = None
    while got < nbytes:
        conn.settimeout(left())
        n = conn.recv_into(buf)
        if n == 0:
            raise EOFError(f"sender closed after {got} of {nbytes} bytes")
        if first is None:
            first = time.perf_counter()
        got += n
    last = time.perf_counter()
    conn.sendall(b"k")
    for _ in range(rounds):
        conn.settimeout(left()); conn.sendall(conn.recv(1))
    print(json.dumps({"received": got, "seconds": last - first}))
else:
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=min(2.0, left())); break
        except ConnectionRefusedError:
            time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chunk = memoryview(bytes(1 << 20)); sent = 0
    t0 = time.perf_counter()
    while sent < nbytes:
        conn.settimeout(left())
        n = min(len(chunk), nbytes - sent); conn.sendall(chunk[:n]); sent += n
    conn.settimeout(left())
    assert conn.recv(1) == b"k"
    t1 = time.perf_counter()
    rtts = []
    for _ in range(rounds):
        conn.settimeout(left()); t = time.perf_counter(); conn.sendall(b"p"); conn.recv(1)
        rtts.append(time.perf_counter() - t)
    print(json.dumps({"sent": sent, "seconds": t1 - t0,
                      "rtt_ms": 1e3 * statistics.median(rtts) if rtts else None}))
"""


@dataclass
class Throughput:
    src: int
    dst: int
    nbytes: int
    seconds: float             # sender: first byte sent -> receiver's acknowledgement of the last
    mbit_s: float              # nbytes / seconds
    receiver_mbit_s: float     # receiver: first byte -> last byte
    rtt_ms: float | None       # median of 1-byte TCP ping-pongs after the transfer
    configured_mbit: float
    configured_delay_ms: float
    delay_emulated: bool


def measure_throughput(cluster: EmulatedCluster, src: int = 0, dst: int = 1, nbytes: int | None = None,
                       seconds: float = 2.0, port: int = CHECK_PORT, rounds: int = 200,
                       timeout_s: float | None = None) -> Throughput:
    """One TCP stream from host `src` to host `dst` (by default `seconds` worth of bytes at the configured
    rate), bounded by `timeout_s`; both ends are Python socket loops run inside the namespaces."""
    if src == dst:
        raise ValueError("src and dst must be different hosts")
    if nbytes is None:
        nbytes = max(int(cluster.rate_mbit * 1e6 / 8 * seconds), 1 << 20)
    if timeout_s is None:
        timeout_s = 15.0 + 5.0 * nbytes * 8 / (cluster.rate_mbit * 1e6)
    common = [str(port), str(nbytes), str(timeout_s), str(rounds)]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    recv = cluster.popen(dst, [sys.executable, "-c", _PEER_SCRIPT, "recv", cluster.addresses[dst], *common], **pipes)
    send = cluster.popen(src, [sys.executable, "-c", _PEER_SCRIPT, "send", cluster.addresses[dst], *common], **pipes)
    results = {}
    for name, proc in (("sender", send), ("receiver", recv)):
        try:
            out, err = proc.communicate(timeout=timeout_s + 10.0)
        except subprocess.TimeoutExpired:
            stop_processes([p for p in (send, recv) if p.poll() is None], grace_seconds=0.0)
            for p in (send, recv):
                p.communicate()
            raise ClusterError(f"throughput check {src}->{dst}: the {name} did not finish in {timeout_s:.0f} s")
        if proc.returncode != 0:
            raise ClusterError(f"throughput check {src}->{dst}: the {name} exited {proc.returncode}:\n{err[-2000:]}")
        results[name] = json.loads(out.strip().splitlines()[-1])
    s, r = results["sender"], results["receiver"]
    return Throughput(src=src, dst=dst, nbytes=nbytes, seconds=s["seconds"], mbit_s=nbytes * 8 / s["seconds"] / 1e6,
                      receiver_mbit_s=r["received"] * 8 / max(r["seconds"], 1e-9) / 1e6, rtt_ms=s["rtt_ms"],
                      configured_mbit=cluster.rate_mbit, configured_delay_ms=cluster.delay_ms,
                      delay_emulated=cluster.delay_emulated)


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster",
        description="Build an emulated cluster (network namespaces + bridge + tc), check it, or remove leftovers.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true",
                      help="measure a bounded TCP transfer host 0 -> host 1 against the configured rate, then tear down")
    mode.add_argument("--cleanup", action="store_true",
                      help="remove namespaces, links and processes left by a run that died (by prefix)")
    mode.add_argument("--hold", type=float, metavar="SECONDS",
                      help="build, start `sleep` in every host, print 'ready', wait SECONDS, tear down "
                           "(for testing teardown on signals)")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--delay-ms", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=2.0, help="--check: transfer this long at the configured rate")
    parser.add_argument("--prefix", default="apb")
    parser.add_argument("--json", action="store_true", help="--check: print the result as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    require_root()

    if args.cleanup:
        lock = _acquire_lock(args.prefix)
        try:
            removed = cleanup_leftovers(args.prefix)
        finally:
            lock.close()
        print("removed: " + ", ".join(removed) if removed else f"nothing with prefix '{args.prefix}' to remove")
        return 0

    if args.check and args.hosts < 2:
        parser.error("--check needs --hosts 2 or more")
    with EmulatedCluster(args.hosts, rate_mbit=args.rate_mbit, delay_ms=args.delay_ms, prefix=args.prefix) as cluster:
        if args.hold is not None:
            sleepers = [cluster.popen(i, ["sleep", str(int(args.hold) + 60)]) for i in range(cluster.num_hosts)]
            print("ready " + " ".join(str(p.pid) for p in sleepers), flush=True)
            deadline = time.monotonic() + args.hold
            while time.monotonic() < deadline:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            return 0
        result = measure_throughput(cluster, 0, 1, seconds=args.seconds)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        delay = (f"{result.configured_delay_ms:g} ms one-way delay"
                 + ("" if result.delay_emulated or result.configured_delay_ms == 0
                    else " (NOT emulated: the kernel has no sch_netem)"))
        print(f"configured {result.configured_mbit:g} Mbit/s, {delay}\n"
              f"measured   {result.mbit_s:.1f} Mbit/s ({result.mbit_s / result.configured_mbit:.0%} of the rate; "
              f"receiver {result.receiver_mbit_s:.1f} Mbit/s) for {result.nbytes / 1e6:.1f} MB in "
              f"{result.seconds:.2f} s; TCP ping-pong RTT {result.rtt_ms:.3f} ms")
    if result.mbit_s > 1.5 * result.configured_mbit:
        print("the rate limit is not effective", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
