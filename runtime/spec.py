"""Resource specs: which hosts run how many worker and server processes.

A spec is loaded from YAML (the primary format), from the Parallax text format
(`host: ids` per line) or from a TF_CONFIG set by an external launcher. Every
loader ends in the same `ResourceSpec`, and every `ResourceSpec` is validated
when it is constructed, so a bad spec fails with one readable `SpecError`
before any process or socket exists.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml

from autopar.common.addresses import is_loopback_address
from autopar.common.errors import SpecError, shown
from autopar.common.text import plural
from autopar.common.roles import CHIEF_JOB, SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE

logger = logging.getLogger(__name__)

MIN_PORT, MAX_PORT = 1, 65535
# Upper bounds of a spec's counts (docs/resource-specs.md#limits): above any
# cluster a job of autopar's runs on (thousands of machines, a few hundred
# processes on one), and low enough that checking, planning and starting a
# job at the bound cannot exhaust the launcher's memory or time.
MAX_HOSTS = 4096
MAX_PROCESSES_PER_HOST = 1024   # workers + servers on one host
MAX_WORKERS = 16384
MAX_SERVERS = 4096

_TOP_KEYS = ("hosts", "network")
_HOST_KEYS = ("address", "workers", "servers", "ports", "worker_ports", "server_ports", "ssh",
              "slurm_node", "gpus")
_SSH_KEYS = ("user", "port", "key_file", "known_hosts", "python", "workdir")
_NETWORK_KEYS = ("bandwidth_gbps", "isolation", "shared_cores")
_DICT_KEYS = ("hosts", "bandwidth_gbps", "isolation", "shared_cores", "source")
# How a job keeps other users off its ports (runtime/launcher.py `isolate`,
# docs/security.md): "auto" picks a private network namespace for a
# job on loopback addresses only and firewall rules otherwise.
ISOLATIONS = ("auto", "namespace", "firewall", "none")

# RFC 1123 host name label: letters, digits, '-', not at either end, 1-63 chars.
_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
# POSIX portable user name (portable filename characters, no leading '-'),
# at most 32 characters as on Linux.
_USER_RE = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}")
_ZONE_RE = re.compile(r"[A-Za-z0-9_.-]+")
# A Slurm node name (srun --nodelist): no leading '-', nothing a shell or a
# host list would read.
_NODE_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class SSHSettings:
    """How the launcher reaches a remote host. Paths are kept as written
    (`~` included): OpenSSH expands `~` in identity files itself."""

    user: str | None = None
    port: int = 22
    key_file: str | None = None
    # A known_hosts file pinning the host's key (strict checking against it
    # only); default: ssh's own files and settings.
    known_hosts: str | None = None
    python: str | None = None   # interpreter on the remote host (default: same path as launcher's)
    workdir: str | None = None  # cd here on the remote host (default: launcher's cwd)


@dataclass(frozen=True)
class HostSpec:
    address: str
    workers: int
    servers: int = 0
    ports: tuple[int, int] | None = None          # inclusive range to allocate this host's ports from
    worker_ports: tuple[int, ...] | None = None   # explicit per-process ports; len == workers
    server_ports: tuple[int, ...] | None = None   # likewise for servers
    ssh: SSHSettings | None = None
    # Started by srun on this Slurm node (runtime/slurm.py), not over ssh.
    slurm_node: str | None = None
    # The host's GPU ids its workers use (docs/gpus.md): ids shared out in
    # order (worker_gpus), or one list of ids per worker.
    gpus: tuple[int, ...] | tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        # Accept lists from callers building specs in code; tuples keep the
        # dataclass hashable and make to_dict/from_dict round-trips exact.
        for name in ("ports", "worker_ports", "server_ports", "gpus"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(tuple(v) if isinstance(v, list) else v
                                                     for v in value))

    def worker_gpus(self) -> list[tuple[int, ...]]:
        """The GPU ids of each of this host's workers, in order (() for
        none): a list per worker as given, or the host's ids dealt out: L
        ids over W workers give each L/W consecutive ids (L a multiple of
        W), or let W/L consecutive workers share each id (W a multiple of L)."""
        ids = self.gpus
        if not ids:
            return [()] * self.workers
        if isinstance(ids[0], tuple):
            return list(ids)
        count, workers = len(ids), self.workers
        if count >= workers:
            per = count // workers
            return [tuple(ids[k * per:(k + 1) * per]) for k in range(workers)]
        return [(ids[k * count // workers],) for k in range(workers)]


@dataclass(frozen=True)
class ResourceSpec:
    hosts: tuple[HostSpec, ...]
    bandwidth_gbps: float | None = None
    source: str = "<memory>"  # file name or "TF_CONFIG", used in messages
    isolation: str = "auto"   # one of ISOLATIONS
    # The cores all the job's processes share when its hosts are emulated on
    # one machine (bench/cluster.py); None: each host has cores of its own.
    # Only the planner's cost model reads it (transforms.cost).
    shared_cores: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.hosts, list):
            object.__setattr__(self, "hosts", tuple(self.hosts))
        for name in ("bandwidth_gbps", "shared_cores"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        _validate(self)

    @property
    def num_workers(self) -> int:
        return sum(h.workers for h in self.hosts)

    @property
    def num_servers(self) -> int:
        return sum(h.servers for h in self.hosts)

    def worker_hosts(self) -> list[HostSpec]:
        """Host of worker i: hosts in order, each host's workers consecutively."""
        return [h for h in self.hosts for _ in range(h.workers)]

    def server_hosts(self) -> list[HostSpec]:
        """Host of server i, numbered like `worker_hosts`."""
        return [h for h in self.hosts for _ in range(h.servers)]

    def num_hosts(self) -> int:
        return len(self.hosts)

    def to_dict(self) -> dict:
        """JSON-ready form; `from_dict(to_dict())` gives an equal spec."""
        return {
            "hosts": [_host_to_dict(h) for h in self.hosts],
            "bandwidth_gbps": self.bandwidth_gbps,
            "isolation": self.isolation,
            "shared_cores": self.shared_cores,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ResourceSpec:
        source = d.get("source", "<dict>") if isinstance(d, dict) else "<dict>"
        if not isinstance(d, dict):
            _fail(source, "top level", f"must be a mapping, got {type(d).__name__}",
                  "pass the output of ResourceSpec.to_dict()")
        _check_keys(d, _DICT_KEYS, source, "top level")
        hosts = _parse_hosts(d.get("hosts"), source)
        return cls(hosts=hosts, bandwidth_gbps=d.get("bandwidth_gbps"),
                   isolation=d.get("isolation", "auto"), shared_cores=d.get("shared_cores"),
                   source=str(source))


def _host_to_dict(h: HostSpec) -> dict:
    # The same keys the YAML format uses, so a dumped host can be pasted into a spec.
    def lst(v: tuple[int, ...] | None) -> list[int] | None:
        return None if v is None else list(v)
    ssh = None
    if h.ssh is not None:
        ssh = {k: getattr(h.ssh, k) for k in _SSH_KEYS}
    return {"address": h.address, "workers": h.workers, "servers": h.servers,
            "ports": lst(h.ports), "worker_ports": lst(h.worker_ports),
            "server_ports": lst(h.server_ports), "ssh": ssh, "slurm_node": h.slurm_node,
            "gpus": None if h.gpus is None else [list(g) if isinstance(g, tuple) else g
                                                 for g in h.gpus]}


# --------------------------------------------------------------------------- errors

def _fail(source: str, where: str, what: str, todo: str) -> NoReturn:
    raise SpecError(f"resource spec {source}: {where}: {what}; {todo}")


def _check_keys(d: dict, allowed: tuple[str, ...], source: str, where: str) -> None:
    for key in d:
        if key not in allowed:
            close = (difflib.get_close_matches(key, allowed, n=1)
                     if isinstance(key, str) and len(key) <= 100 else [])
            hint = f"did you mean '{close[0]}'? " if close else ""
            _fail(source, where, f"unknown key {shown(key)}",
                  f"{hint}allowed keys are {', '.join(allowed)}")


# --------------------------------------------------------------------------- YAML

# A spec is a few hosts: far below these bounds. Past them a file is not a
# spec but an accident or an attack (a 512-byte "billion laughs" file of
# nested aliases stands for 9**9 values).
MAX_SPEC_BYTES = 1 << 20
MAX_YAML_VALUES = 10_000


class _TooLarge(yaml.YAMLError):
    """The document's aliases expand to more than MAX_YAML_VALUES values."""

    def __init__(self) -> None:
        super().__init__(f"its aliases (*name) expand to more than {MAX_YAML_VALUES} values")


class _SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document whose aliases would expand
    into more than MAX_YAML_VALUES values, before anything expands them
    (a spec's values are walked, and shown in messages, as if expanded)."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None and _expanded_size(node, {}, set()) > MAX_YAML_VALUES:
            raise _TooLarge()
        return node


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int]) -> int:
    """How many values ``node`` stands for with every alias expanded (each
    node is counted once per reference: linear in the nodes, not in the
    expansion); anything past MAX_YAML_VALUES, or a recursive alias, counts
    as MAX_YAML_VALUES + 1."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        return MAX_YAML_VALUES + 1
    active.add(key)
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1
    for child in children:
        total += _expanded_size(child, memo, active)
        if total > MAX_YAML_VALUES:
            break
    active.discard(key)
    memo[key] = total
    return total


def _load_yaml(text: str):
    return yaml.load(text, Loader=_SpecLoader)   # noqa: S506 - a SafeLoader


def parse_yaml_spec(text: str, source: str) -> ResourceSpec:
    try:
        data = _load_yaml(text)
    except _TooLarge as exc:
        _fail(source, "YAML", str(exc), "a resource spec is a short list of hosts: write them "
              "out instead of nesting aliases")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = str(getattr(exc, "problem", None) or exc)[:200]
        _fail(source, where, f"YAML syntax error: {problem}",
              "fix the indentation/quoting there (see resource_specs/*.yaml for examples)")
    except (RecursionError, ValueError) as exc:
        # Nesting deeper than Python's stack, an integer with thousands of digits.
        _fail(source, "YAML", f"cannot be loaded ({type(exc).__name__}: {shown(str(exc), 120)})",
              "a resource spec is a short list of hosts (see resource_specs/*.yaml)")
    if data is None:
        _fail(source, "file", "is empty",
              "list hosts under a 'hosts:' key (see resource_specs/localhost_2workers.yaml)")
    return _spec_from_mapping(data, source)


def _spec_from_mapping(data: Any, source: str) -> ResourceSpec:
    if not isinstance(data, dict):
        _fail(source, "top level", f"must be a mapping with a 'hosts' list, got {type(data).__name__}",
              "start the file with 'hosts:' followed by '- address: ...' entries")
    _check_keys(data, _TOP_KEYS, source, "top level")
    hosts = _parse_hosts(data.get("hosts"), source)
    network = data.get("network")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        _fail(source, "network", f"must be a mapping, got {type(network).__name__}",
              "write 'network: {bandwidth_gbps: 10}'")
    _check_keys(network, _NETWORK_KEYS, source, "network")
    return ResourceSpec(hosts=hosts, bandwidth_gbps=network.get("bandwidth_gbps"),
                        isolation=network.get("isolation", "auto"),
                        shared_cores=network.get("shared_cores"), source=source)


def _parse_hosts(raw: Any, source: str) -> tuple[HostSpec, ...]:
    if raw is None:
        _fail(source, "hosts", "is missing", "add a 'hosts:' list with at least one '- address: ...' entry")
    if not isinstance(raw, list):
        _fail(source, "hosts", f"must be a list, got {type(raw).__name__}",
              "write each host as a '- address: ...' item under 'hosts:'")
    if not raw:
        _fail(source, "hosts", "is empty", "list at least one host")
    return tuple(_parse_host(h, source, f"hosts[{i}]") for i, h in enumerate(raw))


def _parse_host(raw: Any, source: str, where: str) -> HostSpec:
    if not isinstance(raw, dict):
        _fail(source, where, f"must be a mapping, got {type(raw).__name__}",
              "write '- address: HOST' followed by 'workers: N'")
    _check_keys(raw, _HOST_KEYS, source, where)
    for key in ("address", "workers"):
        if key not in raw:
            _fail(source, f"{where}.{key}", "is missing",
                  "every host needs 'address' (host name or IP) and 'workers' (a count)")

    def port_list(key: str) -> tuple[int, ...] | None:
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            _fail(source, f"{where}.{key}", f"must be a list of ports, got {shown(value)}",
                  f"write e.g. '{key}: [24000, 24001]'")
        return tuple(value)

    ports = port_list("ports")
    if ports is not None and len(ports) != 2:
        _fail(source, f"{where}.ports", f"must be [start, end], got {shown(list(ports))}",
              "give an inclusive range such as 'ports: [24000, 24100]'")
    ssh_raw = raw.get("ssh")
    ssh = None
    if ssh_raw is not None:
        if not isinstance(ssh_raw, dict):
            _fail(source, f"{where}.ssh", f"must be a mapping, got {type(ssh_raw).__name__}",
                  "write e.g. 'ssh: {user: alice, key_file: ~/.ssh/id_ed25519}'")
        _check_keys(ssh_raw, _SSH_KEYS, source, f"{where}.ssh")
        # `port: null` means the default, like an absent key.
        ssh = SSHSettings(**{k: v for k, v in ssh_raw.items() if not (k == "port" and v is None)})
    return HostSpec(address=raw["address"], workers=raw["workers"], servers=_default(raw.get("servers"), 0),
                    ports=ports, worker_ports=port_list("worker_ports"),
                    server_ports=port_list("server_ports"), ssh=ssh, slurm_node=raw.get("slurm_node"),
                    gpus=raw.get("gpus"))


def _default(value: Any, default: Any) -> Any:
    # `servers: null` in YAML means "not given"; anything else is validated as written.
    return default if value is None else value


# --------------------------------------------------------------------------- Parallax text

def parse_parallax_spec(text: str, source: str) -> ResourceSpec:
    """`host` or `host: 0,1` per line; each host also runs one server, as in Parallax."""
    hosts: list[HostSpec] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"line {lineno}"
        if line.startswith("["):  # IPv6 literal: [::1]: 0,1
            address, sep, rest = line[1:].partition("]")
            if not sep:
                _fail(source, where, f"unclosed '[' in {shown(line)}", "write IPv6 addresses as [addr]: ids")
            rest = rest.strip()
            if rest and not rest.startswith(":"):
                _fail(source, where, f"unexpected text after ']' in {shown(line)}", "write '[addr]: 0,1'")
            has_ids, ids_text = bool(rest), rest[1:]
        else:
            address, colon, ids_text = line.partition(":")
            has_ids = bool(colon)
        address = address.strip()
        problem = address_problem(address)
        if problem is not None:
            _fail(source, where, f"bad host name in {shown(line)}: {problem}",
                  "write one host per line as 'host' or 'host: 0,1' (IPv6 as '[addr]: 0,1'), "
                  "the host being a host name or an IP address")
        workers = 1
        if has_ids:
            ids = [part.strip() for part in ids_text.split(",")]
            if not all(part.isdigit() for part in ids):
                _fail(source, where, f"device ids must be non-negative integers separated by commas, got {shown(ids_text.strip())}",
                      "write e.g. 'host: 0,1' or just 'host' for one worker")
            if len(set(map(int, ids))) != len(ids):
                _fail(source, where, f"device id listed twice in {shown(ids_text.strip())}", "list each device once")
            workers = len(ids)
        if address.lower() in seen:
            _fail(source, where, f"host {address} already listed on line {seen[address.lower()]}",
                  "list each host once, with all its device ids")
        seen[address.lower()] = lineno
        # `host: 0,1`: one worker per listed GPU id (docs/gpus.md).
        hosts.append(HostSpec(address=address, workers=workers, servers=1,
                              gpus=tuple(map(int, ids)) if has_ids else None))
    if not hosts:
        _fail(source, "file", "is empty (no host lines)", "write one host per line as 'host' or 'host: 0,1'")
    return ResourceSpec(hosts=tuple(hosts), source=source)


# --------------------------------------------------------------------------- loading

def load_spec(resource_info: Any) -> ResourceSpec:
    """ResourceSpec (as is), a YAML-shaped dict, or a path to a YAML/Parallax file."""
    if isinstance(resource_info, ResourceSpec):
        return resource_info
    if isinstance(resource_info, dict):
        return _spec_from_mapping(resource_info, "<dict>")
    if not isinstance(resource_info, (str, os.PathLike)):
        raise SpecError(f"resource spec must be a file path, a dict or a ResourceSpec, "
                        f"got {type(resource_info).__name__}; pass e.g. 'resource_specs/localhost_2workers.yaml'")
    source = os.fspath(resource_info)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read(MAX_SPEC_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        _fail(source, "file", f"cannot be read ({shown(str(exc), 200)})",
              "check the path and that it is a readable text file")
    if len(text) > MAX_SPEC_BYTES:
        _fail(source, "file", f"is larger than {MAX_SPEC_BYTES} characters",
              "a resource spec is a short list of hosts; check the path")
    if not any(line.split("#", 1)[0].strip() for line in text.splitlines()):
        _fail(source, "file", "is empty",
              "list hosts under 'hosts:' (YAML) or one 'host: ids' per line (Parallax format)")
    if source.lower().endswith((".yaml", ".yml")):
        spec = parse_yaml_spec(text, source)
    elif _looks_like_yaml_spec(text):
        spec = parse_yaml_spec(text, source)
    else:
        spec = parse_parallax_spec(text, source)
    logger.info("loaded %s: %s, %s, %s", source, plural(spec.num_hosts(), "host"),
                plural(spec.num_workers, "worker"), plural(spec.num_servers, "server"))
    return spec


def _looks_like_yaml_spec(text: str) -> bool:
    try:
        data = _load_yaml(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return False
    return isinstance(data, dict) and "hosts" in data


# --------------------------------------------------------------------------- TF_CONFIG

def spec_from_tf_config(tf_config: str | dict) -> tuple[ResourceSpec, str, int]:
    """(spec, task_type, task_index) with chief as worker 0 and ps as servers."""
    src = "TF_CONFIG"
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as exc:
            _fail(src, "JSON", f"not valid JSON ({exc})", "set TF_CONFIG to a JSON object with 'cluster' and 'task'")
    if not isinstance(tf_config, dict):
        _fail(src, "top level", "must be a JSON object", "set TF_CONFIG to {\"cluster\": ..., \"task\": ...}")
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict):
        _fail(src, "cluster", "is missing or not an object", "add \"cluster\": {\"worker\": [\"host:port\", ...]}")
    _check_keys(cluster, (CHIEF_JOB, WORKER_JOB, SERVER_JOB), src, "cluster")
    jobs: dict[str, list[tuple[str, int]]] = {}
    for job in (CHIEF_JOB, WORKER_JOB, SERVER_JOB):
        entries = cluster.get(job) or []
        if not isinstance(entries, list):
            _fail(src, f"cluster.{job}", "must be a list of \"host:port\" strings", "fix the cluster definition")
        jobs[job] = [_split_endpoint(e, f"cluster.{job}[{i}]") for i, e in enumerate(entries)]
    if len(jobs[CHIEF_JOB]) > 1:
        _fail(src, "cluster.chief", "lists more than one task", "keep a single chief; put the others under 'worker'")

    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        _fail(src, "task", "is missing or has no 'type'", "set \"task\": {\"type\": \"worker\", \"index\": 0}")
    ttype, tindex = task["type"], task.get("index", 0)
    if not isinstance(tindex, int) or isinstance(tindex, bool) or tindex < 0:
        _fail(src, "task.index", f"must be a non-negative integer, got {shown(tindex)}", "fix task.index")
    if ttype not in jobs:
        _fail(src, "task.type", f"unsupported task type {shown(ttype)}", "use 'chief', 'worker' or 'ps'")
    if tindex >= len(jobs[ttype]):
        _fail(src, "task.index", f"{tindex} but cluster.{ttype} has {len(jobs[ttype])} entries",
              "make task.index point into the cluster list")
    role, index = {CHIEF_JOB: (WORKER_ROLE, tindex), WORKER_JOB: (WORKER_ROLE, tindex + len(jobs[CHIEF_JOB])),
                   SERVER_JOB: (SERVER_ROLE, tindex)}[ttype]

    groups = _group_endpoints(jobs[CHIEF_JOB] + jobs[WORKER_JOB], jobs[SERVER_JOB])
    hosts = tuple(HostSpec(address=g["address"], workers=len(g["w"]), servers=len(g["s"]),
                           worker_ports=tuple(g["w"]) or None, server_ports=tuple(g["s"]) or None)
                  for g in groups)
    return ResourceSpec(hosts=hosts, source=src), role, index


def _split_endpoint(entry: Any, where: str) -> tuple[str, int]:
    if isinstance(entry, str):
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if sep and host and port.isdigit():
            problem = address_problem(host)
            if problem is not None:
                _fail("TF_CONFIG", where, f"bad host in {shown(entry)}: {problem}",
                      "write entries like \"10.0.0.1:2222\" or \"node1:2222\"")
            return host, int(port)
    _fail("TF_CONFIG", where, f"expected \"host:port\", got {shown(entry)}", "write entries like \"10.0.0.1:2222\"")


def _group_endpoints(workers: list[tuple[str, int]], servers: list[tuple[str, int]]) -> list[dict]:
    # Group by address, but only where that keeps the numbering: worker i must
    # stay the i-th TF_CONFIG worker, so a process may join an earlier group only
    # if no later group already holds a process of the same role.
    groups: list[dict] = []
    for role, endpoints in (("w", workers), ("s", servers)):
        last = 0
        for address, port in endpoints:
            target = next((i for i in range(last, len(groups)) if groups[i]["address"] == address), None)
            if target is None:
                groups.append({"address": address, "w": [], "s": []})
                target = len(groups) - 1
            groups[target][role].append(port)
            last = target
    return groups


# --------------------------------------------------------------------------- validation

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(spec: ResourceSpec) -> None:
    src = spec.source
    if not spec.hosts:
        _fail(src, "hosts", "is empty", "list at least one host")
    if len(spec.hosts) > MAX_HOSTS:
        _fail(src, "hosts", f"lists {len(spec.hosts)} hosts, more than the {MAX_HOSTS} a job can "
              "have", "check the spec (or the host list it was made from)")
    for i, h in enumerate(spec.hosts):
        _validate_host(h, src, f"hosts[{i}]")
    if spec.num_workers == 0:
        _fail(src, "hosts", "no host runs a worker (zero workers in total)",
              "give at least one host 'workers: 1' or more")
    for what, count, limit in (("workers", spec.num_workers, MAX_WORKERS),
                               ("servers", spec.num_servers, MAX_SERVERS)):
        if count > limit:
            _fail(src, "hosts", f"{count} {what} in all, more than the {limit} a job can have",
                  f"check the hosts' '{what}' counts")
    bw = spec.bandwidth_gbps
    if bw is not None and (not isinstance(bw, float) or not 0 < bw < math.inf):
        _fail(src, "network.bandwidth_gbps", f"must be a positive finite number, got {shown(bw)}",
              "give the link speed in Gbit/s, e.g. 'bandwidth_gbps: 10', or remove it")
    cores = spec.shared_cores
    if cores is not None and (not isinstance(cores, float) or not cores > 0):
        _fail(src, "network.shared_cores", f"must be a positive number, got {shown(cores)}",
              "give the cores of the one machine emulating every host, or remove it")
    if spec.isolation not in ISOLATIONS:
        _fail(src, "network.isolation", f"must be one of {', '.join(ISOLATIONS)}, got "
              f"{shown(spec.isolation)}", "remove it to let autopar choose ('auto')")
    if spec.isolation == "namespace" and not is_loopback_job(spec):
        _fail(src, "network.isolation", "'namespace' needs every host on a loopback address "
              "(127.x.x.x, ::1, localhost): a private namespace has no other interface",
              "use 'firewall' for a job on other addresses")
    _check_port_clashes(spec)
    _check_gpus_everywhere(spec)


def _check_gpus_everywhere(spec: ResourceSpec) -> None:
    """GPUs for every host with workers, or for none: TensorFlow's
    collectives need one device type over a group of workers."""
    with_workers = [(i, h) for i, h in enumerate(spec.hosts) if h.workers]
    given = [i for i, h in with_workers if h.gpus]
    if given and len(given) != len(with_workers):
        missing = next(i for i, h in with_workers if not h.gpus)
        _fail(spec.source, f"hosts[{missing}].gpus", f"is missing while hosts[{given[0]}] gives "
              "GPUs", "give every host that runs workers its GPU ids (workers on GPUs and on "
              "CPUs cannot sum gradients together), or none")


def _validate_gpus(h: HostSpec, src: str, where: str) -> None:
    ids = h.gpus
    if not isinstance(ids, tuple) or not ids:
        _fail(src, where, f"must be a non-empty list of GPU ids, got {shown(ids)}",
              "write e.g. 'gpus: [0, 1]' (ids dealt out to the workers in order) or one list "
              "per worker, 'gpus: [[0], [1]]'")
    if h.workers == 0:
        _fail(src, where, "is given for a host that runs no worker", "remove it")
    per_worker = isinstance(ids[0], tuple)
    for group in (ids if per_worker else (ids,)):
        if not isinstance(group, tuple) or not group or not all(
                _is_int(i) and 0 <= i < 1024 for i in group):
            _fail(src, where, f"must hold GPU ids (integers from 0 to 1023), got {shown(list(ids))}",
                  "write e.g. 'gpus: [0, 1]' or 'gpus: [[0], [1]]'")
        if len(set(group)) != len(group):
            _fail(src, where, f"lists an id twice in {shown(list(group))}", "list each GPU once")
    if per_worker and len(ids) != h.workers:
        _fail(src, where, f"has {len(ids)} lists for {h.workers} workers",
              "give one list of ids per worker, or one flat list the workers share out")
    if not per_worker and len(ids) % h.workers and h.workers % len(ids):
        _fail(src, where, f"has {len(ids)} ids for {h.workers} workers, which share them out "
              "unevenly", "give a multiple of the workers' count (each its own ids) or a "
              "divisor of it (workers sharing a GPU), or one list per worker")


def is_loopback_job(spec: ResourceSpec) -> bool:
    """Every host of the job is a loopback address of this machine whose
    processes the launcher starts itself (srun starts a Slurm node's, outside
    any namespace of the launcher's)."""
    return all(is_loopback_address(h.address) and h.slurm_node is None for h in spec.hosts)


def _validate_host(h: HostSpec, src: str, where: str) -> None:
    _check_address(h.address, src, f"{where}.address")
    for field in ("workers", "servers"):
        n = getattr(h, field)
        if not _is_int(n):
            _fail(src, f"{where}.{field}", f"must be an integer count, got {shown(n)}", f"write e.g. '{field}: 2'")
        if n < 0:
            _fail(src, f"{where}.{field}", f"must not be negative, got {shown(n)}", "use 0 or a positive count")
    if h.workers + h.servers > MAX_PROCESSES_PER_HOST:
        _fail(src, where, f"host {h.address} runs {h.workers} workers and {h.servers} servers, "
              f"more than the {MAX_PROCESSES_PER_HOST} processes one host can have",
              "check its 'workers' and 'servers' counts")
    if h.workers == 0 and h.servers == 0:
        _fail(src, where, f"host {h.address} runs no process (workers: 0, servers: 0)",
              "give it workers or servers, or remove it")
    for field, count in (("worker_ports", h.workers), ("server_ports", h.servers)):
        ports = getattr(h, field)
        if ports is None:
            continue
        for j, p in enumerate(ports):
            _check_port(p, src, f"{where}.{field}[{j}]")
        if len(ports) != count:
            _fail(src, f"{where}.{field}", f"has {len(ports)} ports for {count} {field.split('_')[0]}s",
                  "give exactly one port per process, or remove it to let autopar choose")
    if h.ports is not None:
        start, end = h.ports
        _check_port(start, src, f"{where}.ports[0]")
        _check_port(end, src, f"{where}.ports[1]")
        if start > end:
            _fail(src, f"{where}.ports", f"range start {start} is greater than end {end}",
                  "write the range as [low, high]")
        need = (h.workers if h.worker_ports is None else 0) + (h.servers if h.server_ports is None else 0)
        if end - start + 1 < need:
            _fail(src, f"{where}.ports", f"range {start}-{end} has {end - start + 1} ports but the host "
                  f"needs {need}", "widen the range to at least one port per worker and server")
    if h.ssh is not None:
        _validate_ssh(h.ssh, src, f"{where}.ssh")
    if h.gpus is not None:
        _validate_gpus(h, src, f"{where}.gpus")
    if h.slurm_node is not None:
        if not isinstance(h.slurm_node, str) or not _NODE_RE.fullmatch(h.slurm_node):
            _fail(src, f"{where}.slurm_node", f"must be a Slurm node name, got {shown(h.slurm_node)}",
                  "give the node's name as Slurm lists it, or remove it")
        if h.ssh is not None:
            _fail(src, where, "has both 'ssh' and 'slurm_node'", "a host is reached by srun or by "
                  "ssh, not both: remove one")


def _validate_ssh(s: SSHSettings, src: str, where: str) -> None:
    if not isinstance(s, SSHSettings):
        _fail(src, where, f"must be SSHSettings, got {type(s).__name__}", "use SSHSettings(...)")
    if not _is_int(s.port) or not MIN_PORT <= s.port <= MAX_PORT:
        _fail(src, f"{where}.port", f"must be a port number 1..65535, got {shown(s.port)}", "use 22 unless sshd listens elsewhere")
    for field in ("user", "key_file", "known_hosts", "python", "workdir"):
        v = getattr(s, field)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            _fail(src, f"{where}.{field}", f"must be a non-empty string, got {shown(v)}", "fix or remove it")
    if s.user is not None and not _USER_RE.fullmatch(s.user):
        _fail(src, f"{where}.user", f"{shown(s.user)} is not a valid user name",
              "use a portable user name: at most 32 letters, digits, '.', '_' or '-', "
              "not starting with '-'")
    for field in ("key_file", "known_hosts", "python", "workdir"):
        v = getattr(s, field)
        if v is None:
            continue
        # These reach ssh's argv (key_file, as the value of -i) or the remote
        # shell (quoted): a leading '-' could still be read as an option by
        # ssh or env, and control characters have no place in a path.
        if v.startswith("-"):
            _fail(src, f"{where}.{field}", f"{shown(v)} starts with '-'",
                  "give a path (prefix a relative one with './')")
        if any(ord(c) < 32 or ord(c) == 127 for c in v):
            _fail(src, f"{where}.{field}", f"{shown(v)} contains a control character", "remove it")
    if s.known_hosts is not None and any(c.isspace() or c in "\"'" for c in s.known_hosts):
        # The value of an `-o UserKnownHostsFile=` option, which ssh splits on
        # whitespace and quotes.
        _fail(src, f"{where}.known_hosts", f"{shown(s.known_hosts)} contains a space or a quote",
              "give a path without spaces or quotes")


def _check_port(p: Any, src: str, where: str) -> None:
    if not _is_int(p):
        _fail(src, where, f"must be an integer port, got {shown(p)}", "write ports as plain numbers")
    if not MIN_PORT <= p <= MAX_PORT:
        _fail(src, where, f"port {shown(p)} is out of range {MIN_PORT}..{MAX_PORT}",
              "choose a port in 1024..65535 that is free on that host")


def _is_ip(address: str) -> bool:
    # An IPv6 literal may carry a zone ("fe80::1%eth0"), which ipaddress
    # accepts only for IPv6; the zone must be an interface name.
    base, sep, zone = address.partition("%")
    if sep and not _ZONE_RE.fullmatch(zone):
        return False
    try:
        ip = ipaddress.ip_address(base)
    except ValueError:
        return False
    return not sep or ip.version == 6


def address_problem(address: Any) -> str | None:
    """Why ``address`` is not a host name (RFC 1123), an IPv4 address or an
    IPv6 literal, or None if it is one.

    The address reaches ssh's command line and TensorFlow's cluster
    definition, so only these forms are accepted: in particular nothing that
    starts with '-' (ssh would read it as an option), and no whitespace or
    shell metacharacters.
    """
    if not isinstance(address, str) or not address.strip():
        return f"must be a non-empty host name or IP, got {shown(address)}"
    if _is_ip(address):
        return None
    if address.startswith("-"):
        return f"{shown(address)} starts with '-'"
    if any(c.isspace() for c in address):
        return f"contains whitespace: {shown(address)}"
    if address.startswith("[") and _is_ip(address.strip("[]")):
        return f"{shown(address)} is an IPv6 literal in brackets; write it without the brackets"
    if ":" in address:
        return f"{shown(address)} looks like host:port"
    if len(address.rstrip(".")) > 253 or not all(_LABEL_RE.fullmatch(label)
                                                for label in address.removesuffix(".").split(".")):
        return f"{shown(address)} is not a valid host name"
    if all(c.isdigit() or c == "." for c in address):
        # RFC 1123 2.1: a name never has the dotted-decimal form.
        return f"{shown(address)} is neither a valid IPv4 address nor a host name"
    return None


def _check_address(address: Any, src: str, where: str) -> None:
    problem = address_problem(address)
    if problem is None:
        return
    if "host:port" in problem:
        todo = "give only the host here and ports in 'ports' or 'worker_ports'/'server_ports'"
    else:
        todo = ("write a host name (letters, digits and '-' in dot-separated labels), "
                "an IPv4 address or an IPv6 literal, e.g. 'address: 10.0.0.1'")
    _fail(src, where, problem, todo)


def _address_keys(address: str) -> tuple[str, ...]:
    """The addresses a spec address stands for, written one way each: an IP
    literal normalised (``::0001`` is ``::1``), ``localhost`` both loopback
    addresses, a host name itself (lower case). Two hosts sharing a key are
    one address to a port."""
    bare = address.lower()
    if bare.rstrip(".") == "localhost":
        return ("127.0.0.1", "::1")
    base, sep, zone = bare.partition("%")
    try:
        return (str(ipaddress.ip_address(base)) + sep + zone,)
    except ValueError:
        return (bare,)


def _check_port_clashes(spec: ResourceSpec) -> None:
    """Two processes on one address must never be given the same port, also
    when two names of the address (``localhost``, ``127.0.0.1``) list it."""
    src = spec.source
    explicit: dict[tuple[str, int], tuple[str, str]] = {}
    ranges: dict[str, list[tuple[int, int, str, str]]] = {}
    for i, h in enumerate(spec.hosts):
        keys = _address_keys(h.address)
        for field in ("worker_ports", "server_ports"):
            for j, p in enumerate(getattr(h, field) or ()):
                where = f"hosts[{i}].{field}[{j}]"
                for key in keys:
                    if (key, p) in explicit:
                        other, name = explicit[(key, p)]
                        also = f"also {other}" + (f", as {name}" if name != h.address else "")
                        _fail(src, where, f"duplicate address:port {h.address}:{p} ({also})",
                              "give every process on one address its own port")
                for key in keys:
                    explicit[(key, p)] = (where, h.address)
        if h.ports is not None:
            start, end = h.ports
            for key in keys:
                for other_start, other_end, other, name in ranges.get(key, []):
                    if start <= other_end and other_start <= end:
                        _fail(src, f"hosts[{i}].ports",
                              f"duplicate address:port: range {start}-{end} on {h.address} "
                              f"overlaps {other} ({other_start}-{other_end} on {name})",
                              "use disjoint port ranges when an address is listed more than "
                              "once, or merge the entries")
            for key in keys:
                ranges.setdefault(key, []).append((start, end, f"hosts[{i}].ports", h.address))
