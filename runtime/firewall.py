"""Per-job nftables rules for a job on addresses other than loopback
(docs/security.md).

TensorFlow's servers run any op for whoever connects. A job that spans hosts
cannot hide in a private namespace (runtime/netns.py), so where it may (root
or CAP_NET_ADMIN, and `nft` installed), every Python process of the job,
on every host, holds one nftables table that

- rejects a connection to a job port on its host from any address that is
  neither one of the job's hosts nor the launcher's, and
- rejects a new connection to any of the job's ports, on any host, from a
  socket of another user of its own host (``meta skuid``).

The table has nftables' ``owner`` flag: the kernel deletes it when the
netlink socket that created it closes. That socket belongs to an ``nft -i``
process the job process starts and holds (it dies with its parent), so the
rules go when the job process ends, however it ends (kill -9 included), and
none is ever left behind. Where the rules cannot be installed, the process
says in one warning what stays exposed.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping

from autopar.common import env as envvars
from autopar.common import procs
from autopar.common.addresses import host_address
from autopar.transforms.methods.process_registry import PROCESS_KINDS

logger = logging.getLogger("autopar.firewall")

ENABLE = "AUTOPAR_FIREWALL"     # "1": the launcher asks for the rules (spec network.isolation)
_CAP_NET_ADMIN = 12             # from <linux/capability.h>
_CONFIRM_TIMEOUT_S = 10.0
_held: subprocess.Popen[bytes] | None = None   # this process's nft -i, while it lives


def _endpoint(address: str) -> tuple[str, int] | None:
    """("ip literal", port) of "host:port" / "[v6]:port": the address the
    job's servers bind (common.addresses.host_address resolves names for the bind
    shim too); None for a name that does not resolve."""
    host, _, port = address.rpartition(":")
    try:
        return str(ipaddress.ip_address(host_address(host))), int(port)
    except ValueError:
        return None


def _family(ip: str) -> str:
    return "ip6" if ipaddress.ip_address(ip).version == 6 else "ip"


def _may_administer_network() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
        return bool(int(caps.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except (OSError, StopIteration, ValueError):
        return False


def _nft() -> str | None:
    return shutil.which("nft") or next(
        (p for p in ("/usr/sbin/nft", "/sbin/nft") if os.access(p, os.X_OK)), None)


def ruleset(table: str, endpoints: Iterable[tuple[str, int]], local: Iterable[tuple[str, int]],
            sources: Iterable[str], uid: int) -> list[str]:
    """The nft commands (one a line, for ``nft -i``) of one process's table:
    ``endpoints`` every port of the job, ``local`` those on this host,
    ``sources`` the addresses allowed to connect to them."""
    endpoints, local, sources = sorted(set(endpoints)), sorted(set(local)), sorted(set(sources))
    lines = [f"add table inet {table} {{ flags owner; }}"]
    for hook in ("input", "output"):
        lines.append(f"add chain inet {table} {hook} "
                     f"{{ type filter hook {hook} priority 0; policy accept; }}")
    for family in ("ip", "ip6"):
        def pairs(items):
            return ", ".join(f"{ip} . {port}" for ip, port in items if _family(ip) == family)
        if local_pairs := pairs(local):
            allowed = ", ".join(s for s in sources if _family(s) == family)
            source_test = f"{family} saddr != {{ {allowed} }} " if allowed else ""
            lines.append(f"add rule inet {table} input {family} daddr . tcp dport "
                         f"{{ {local_pairs} }} {source_test}reject with tcp reset")
        if all_pairs := pairs(endpoints):
            lines.append(f"add rule inet {table} output tcp flags & (syn | ack) == syn "
                         f"{family} daddr . tcp dport {{ {all_pairs} }} meta skuid != {uid} "
                         f"reject with tcp reset")
    return lines


def job_endpoints(cluster: Mapping[str, list[str]], environ: Mapping[str, str]) -> list[str]:
    """Every "host:port" of the job a process may be driven through: its
    TensorFlow servers, helper processes (the addresses each helper kind
    publishes: transforms/methods/process_registry.py) and coordinator (if
    on TCP)."""
    addresses = [a for job in cluster.values() for a in job]
    for kind in PROCESS_KINDS.values():
        addresses += [a for a in environ.get(kind.publishes, "").split(",") if a]
    coordinator = environ.get(envvars.COORDINATOR, "")
    if coordinator and not coordinator.startswith("unix:"):
        addresses.append(coordinator)
    return addresses


def guard_this_process(cluster: Mapping[str, list[str]],
                       environ: Mapping[str, str] | None = None) -> bool:
    """Install this process's table when the launcher asks for one; once.
    True when the rules are in place."""
    environ = os.environ if environ is None else environ
    if environ.get(ENABLE) != "1":
        return False
    if _held is not None and _held.poll() is None:
        return True
    from autopar.runtime.ports import is_local_address
    resolved = {a: _endpoint(a) for a in job_endpoints(cluster, environ)}
    endpoints = [e for e in resolved.values() if e is not None]
    local = [e for e in endpoints if is_local_address(e[0])]
    exposed = ", ".join(f"{ip}:{port}" for ip, port in sorted(set(local))) or "none"
    nft = _nft()
    why = ("it needs root or CAP_NET_ADMIN" if not _may_administer_network()
           else "nft is not installed (apt-get install nftables)" if nft is None else None)
    if why is None:
        table = f"autopar_{os.getpid()}"
        commands = ruleset(table, endpoints, local, {ip for ip, _ in endpoints}, os.geteuid())
        why = _hold(nft, table, commands)
    if why is not None:
        logger.warning("autopar: no firewall rules for this job on %s (%s): its ports here (%s) "
                       "accept connections from every user of this machine and every host that "
                       "can reach it, and TensorFlow runs any op it is sent. Run jobs on a "
                       "private network, or as root with nftables.", socket.gethostname(), why,
                       exposed)
        return False
    logger.info("firewall rules in place: job ports on this host admit only the job's hosts, "
                "and only uid %d of this host", os.geteuid())
    return True


def _hold(nft: str, table: str, commands: list[str]) -> str | None:
    """Start ``nft -i`` holding ``commands``' table; None once it exists,
    else why not."""
    global _held
    text = "\n".join(commands) + "\n"
    check = subprocess.run([nft, "-c", "-f", "-"], input=text.encode(), capture_output=True,
                           timeout=30)
    if check.returncode != 0:
        return f"nft refused the rules: {check.stderr.decode(errors='replace').strip()[:300]}"
    holder = procs.start_process([nft, "-i"], dict(os.environ), stdin_pipe=True,
                                 argv0=f"autopar[{os.environ.get(envvars.JOB_ID, '?')}] firewall")
    holder.stdin.write(text.encode())
    holder.stdin.flush()
    rules = sum(line.startswith("add rule") for line in commands)
    deadline = time.monotonic() + _CONFIRM_TIMEOUT_S
    while time.monotonic() < deadline and holder.poll() is None:
        listed = subprocess.run([nft, "list", "table", "inet", table], capture_output=True,
                                timeout=30)
        if listed.returncode == 0 and listed.stdout.count(b"reject") == rules:
            _held = holder
            return None
        time.sleep(0.05)
    procs.stop_processes([holder], 1.0)
    return f"nft did not install table {table} within {_CONFIRM_TIMEOUT_S:g} s"
