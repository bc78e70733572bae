"""Host lists as MPI and Horovod users write them, turned into a resource spec:

    autopar launch -H host1:4,host2:4 -- python train.py
    autopar launch --hostfile hosts.txt -- python train.py

`-H` takes Horovod's `host:slots` items separated by commas (a bare `host`
is one slot). A hostfile has one host per line in OpenMPI's and Horovod's
format, `host slots=N` (`max_slots=M` and other OpenMPI keys are accepted
and ignored), `#` comments and blank lines. Slots are workers; servers per
host come from `--servers-per-host`. Every problem names the item or line it
is in, and nothing starts.
"""
from __future__ import annotations

import re

from autopar.common.errors import SpecError, shown
from autopar.runtime.spec import MAX_PROCESSES_PER_HOST, ResourceSpec, load_spec

# Keys an OpenMPI hostfile line may carry besides slots (ignored here).
_IGNORED_KEYS = ("max_slots", "max-slots", "count", "cpu", "cpus")
_NAME = re.compile(r"^[A-Za-z0-9_.:\-\[\]%]+$")


def parse_host_list(text: str) -> list[tuple[str, int]]:
    """`-H host1:4,host2:4`: [(host, slots)]. An IPv6 host is written in
    brackets (`[::1]:2`)."""
    if not text.strip():
        raise SpecError("-H is empty: give hosts as host:slots,host:slots (e.g. -H node1:4,node2:4)")
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise SpecError(f"-H {shown(text)}: an empty item between commas; "
                            "give hosts as host:slots,host:slots")
        host, slots = _split_slots(item)
        hosts.append((_host_name(host, f"-H item {shown(item)}"),
                      _count(slots, f"-H item {shown(item)}") if slots is not None else 1))
    return _no_repeats(hosts, "-H")


def parse_hostfile(text: str, source: str) -> list[tuple[str, int]]:
    """A hostfile's `host slots=N` lines: [(host, slots)]."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {source} line {number} ({shown(line)})"
        host, *fields = line.split()
        slots = None
        for f in fields:
            key, eq, value = f.partition("=")
            if not eq:
                raise SpecError(f"{where}: {shown(f)} is not key=value; write 'host slots=N'")
            if key == "slots":
                if slots is not None:
                    raise SpecError(f"{where}: slots given twice; write 'host slots=N' once")
                slots = _count(value, where)
            elif key not in _IGNORED_KEYS:
                raise SpecError(f"{where}: unknown key {shown(key)}; write 'host slots=N'")
        if slots is None:
            raise SpecError(f"{where}: no slots; write 'host slots=N' (N workers on that host)")
        hosts.append((_host_name(host, where), slots))
    if not hosts:
        raise SpecError(f"hostfile {source} lists no host; write one 'host slots=N' line per host")
    return _no_repeats(hosts, f"hostfile {source}")


def spec_from_hosts(hosts: list[tuple[str, int]], servers_per_host: int = 0,
                    gpus_per_worker: int = 0) -> ResourceSpec:
    """The resource spec of `hosts` (workers = slots) with `servers_per_host`
    servers on each; with `gpus_per_worker` K, slot k of a host owns its GPUs
    kK .. kK+K-1 (the local rank's, as Horovod assigns them)."""
    check_servers_per_host(servers_per_host)
    return load_spec({"hosts": [{"address": host, "workers": slots, "servers": servers_per_host,
                                 **({"gpus": list(range(slots * gpus_per_worker))}
                                    if gpus_per_worker else {})}
                                for host, slots in hosts]})


def _split_slots(item: str) -> tuple[str, str | None]:
    if item.startswith("["):                       # [v6 address]:slots
        close = item.find("]")
        if close < 0:
            raise SpecError(f"-H item {shown(item)}: an IPv6 address needs its closing ']'")
        rest = item[close + 1:]
        if rest and not rest.startswith(":"):
            raise SpecError(f"-H item {shown(item)}: write [address]:slots")
        return item[1:close], (rest[1:] if rest else None)
    host, colon, slots = item.rpartition(":")
    return (host, slots) if colon else (item, None)


def check_servers_per_host(count: int) -> None:
    """--servers-per-host: a count from 0 to MAX_PROCESSES_PER_HOST."""
    if not 0 <= count <= MAX_PROCESSES_PER_HOST:
        raise SpecError(f"--servers-per-host must be from 0 to {MAX_PROCESSES_PER_HOST} (the "
                        f"processes one host can have), got {shown(count, 40)}")


def _count(value: str, where: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise SpecError(f"{where}: the slot count {shown(value)} is not a whole number >= 1")
    if len(value) > 12 or int(value) > MAX_PROCESSES_PER_HOST:
        raise SpecError(f"{where}: {shown(value, 40)} slots, more than the "
                        f"{MAX_PROCESSES_PER_HOST} processes one host can have")
    return int(value)


def _host_name(host: str, where: str) -> str:
    if not host or not _NAME.match(host):
        raise SpecError(f"{where}: {shown(host)} is not a host name or address")
    return host


def _no_repeats(hosts: list[tuple[str, int]], source: str) -> list[tuple[str, int]]:
    seen = set()
    for host, _ in hosts:
        if host in seen:
            raise SpecError(f"{source}: host {shown(host)} is listed twice; give its slots once")
        seen.add(host)
    return hosts
