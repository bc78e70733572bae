"""Slurm: a job inside an allocation (sbatch, salloc), two ways.

    autopar launch --spec slurm [--servers-per-host N] -- python train.py

run in the batch script (or the salloc shell) builds the spec from the
allocation: one host per node of SLURM_JOB_NODELIST with as many workers as
SLURM_TASKS_PER_NODE gives it and N servers, and starts every process with
`srun` on its node (`spec_from_allocation`, `srun_command`), so Slurm
places, accounts and cleans up each one. A host's address is the node's
NodeAddr as `scontrol` reports it (its name where scontrol cannot tell).

    srun python train.py

makes every task a worker that joins from the step's own variables
(`step_cluster`): task SLURM_PROCID of SLURM_STEP_NUM_TASKS, on the nodes of
SLURM_STEP_NODELIST with SLURM_STEP_TASKS_PER_NODE tasks each (srun's
default block distribution), task i listening on port base + i: distinct
on every node however many "nodes" share a machine (TensorFlow's servers
listen on every address of theirs). The base is AUTOPAR_PORT_BASE, else
one derived from the job and step ids, so that two steps of up to
PORTS_PER_STEP tasks sharing a node do not meet on one port. As under
mpirun, such a job has no servers.

Node lists are Slurm's host-list expressions (`node[01-04,7],gpu3`, also
several bracket groups in a name); tasks per node are `2(x3),1`. Anything
else is refused naming the variable and the item, before anything starts.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from autopar.common.errors import SpecError, shown
from autopar.common.roles import WORKER_JOB
from autopar.runtime.ports import explicit_cluster
from autopar.runtime.spec import MAX_HOSTS, MAX_PROCESSES_PER_HOST, HostSpec, ResourceSpec
from autopar.transforms.keys import SLURM_STEP_PORTS

PORT_BASE = "AUTOPAR_PORT_BASE"
# A derived base lies in transforms.keys.SLURM_STEP_PORTS: PORT_SLOTS slots
# of PORTS_PER_STEP ports.
FIRST_PORT, PORTS_PER_STEP = SLURM_STEP_PORTS.first, 40
PORT_SLOTS = SLURM_STEP_PORTS.size // PORTS_PER_STEP
MAX_NODES = MAX_HOSTS
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_NAME_PART = re.compile(r"^[A-Za-z0-9_.\-]*$")


def expand_nodelist(text: str, variable: str) -> list[str]:
    """The node names of a Slurm host-list expression, in order."""
    if not text.strip():
        raise SpecError(f"{variable} is empty: expected node names such as node[01-04],gpu3")
    names: list[str] = []
    for item in _top_level_items(text, variable):
        names += _expand_item(item, variable)
        if len(names) > MAX_NODES:
            raise SpecError(f"{variable}={shown(text)} expands to more than {MAX_NODES} nodes")
    return names


def tasks_per_node(text: str, variable: str) -> list[int]:
    """`2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNT.match(item.strip())
        if not match or (match.group(2) is not None and int(match.group(2)) < 1):
            raise SpecError(f"{variable}={shown(text)}: {shown(item)} is not a count such as "
                            "'2' or '2(x3)'")
        if len(match.group(1)) > 12 or int(match.group(1)) > MAX_PROCESSES_PER_HOST:
            raise SpecError(f"{variable}={shown(text)}: {shown(item)} tasks on a node, more than "
                            f"the {MAX_PROCESSES_PER_HOST} processes one host can have")
        repeat = int(match.group(2) or 1) if len(match.group(2) or "") <= 12 else MAX_NODES + 1
        if len(counts) + repeat > MAX_NODES:
            raise SpecError(f"{variable}={shown(text)} counts more than {MAX_NODES} nodes")
        counts += [int(match.group(1))] * repeat
    return counts


def _top_level_items(text: str, variable: str) -> list[str]:
    """`a[1-2,4],b` -> ['a[1-2,4]', 'b']: commas inside brackets do not split."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SpecError(f"{variable}={shown(text)}: nested '[' in a node list")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SpecError(f"{variable}={shown(text)}: ']' without its '['")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise SpecError(f"{variable}={shown(text)}: '[' without its closing ']'")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise SpecError(f"{variable}={shown(text)}: an empty item between commas")
    return [item.strip() for item in items]


def _expand_item(item: str, variable: str) -> list[str]:
    """One item: literal parts and bracket groups, the groups multiplied out
    (Slurm's multi-dimensional names, `r[1-2]n[1-3]`)."""
    parts: list[list[str]] = []
    for piece in re.split(r"(\[[^\]]*\])", item):
        if piece.startswith("["):
            parts.append(_expand_group(piece[1:-1], item, variable))
        elif _NAME_PART.match(piece):
            parts.append([piece])
        else:
            raise SpecError(f"{variable}: node list item {shown(item)} has a character a node "
                            f"name cannot have in {shown(piece)}")
    if math.prod(len(p) for p in parts) > MAX_NODES:
        raise SpecError(f"{variable}: node list item {shown(item)} names more than {MAX_NODES} "
                        "nodes")
    names = ["".join(p) for p in itertools.product(*parts)]
    if not names or not names[0] or (len(parts) == 1 and not parts[0][0]):
        raise SpecError(f"{variable}: node list item {shown(item)} names no node")
    return names


def _expand_group(group: str, item: str, variable: str) -> list[str]:
    """`01-03,7` -> ['01', '02', '03', '7']; the width of a range's lower
    bound pads its numbers (Slurm's rule)."""
    out: list[str] = []
    for part in group.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or max(len(low), len(high)) > 12:
            raise SpecError(f"{variable}: node list item {shown(item)}: {shown(part)} is not a "
                            "number or a range such as 01-04")
        if not dash:
            out.append(low)
            continue
        if int(high) < int(low):
            raise SpecError(f"{variable}: node list item {shown(item)}: range {shown(part)} runs "
                            "backwards")
        if int(high) - int(low) >= MAX_NODES:
            raise SpecError(f"{variable}: node list item {shown(item)}: range {shown(part)} "
                            f"has more than {MAX_NODES} nodes")
        width = len(low)
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _nodes_and_counts(environ: Mapping[str, str], nodes_var: str,
                      counts_var: str) -> tuple[list[str], list[int]]:
    for var in (nodes_var, counts_var):
        if not environ.get(var):
            raise SpecError(f"{var} is not set: run this inside a Slurm allocation "
                            "(an sbatch script, an salloc shell or a task srun started)")
    nodes = expand_nodelist(environ[nodes_var], nodes_var)
    counts = tasks_per_node(environ[counts_var], counts_var)
    if len(nodes) != len(counts):
        raise SpecError(f"{nodes_var} names {len(nodes)} node(s) but {counts_var}="
                        f"{shown(environ[counts_var])} gives counts for {len(counts)}")
    return nodes, counts


def node_addresses(nodes: Sequence[str], run: Callable = subprocess.run) -> dict[str, str]:
    """NodeAddr of each node as `scontrol show node` reports it; a node it
    does not report (or no scontrol) is reached by its name."""
    addresses = {n: n for n in nodes}
    if shutil.which("scontrol") is None:
        return addresses
    try:
        out = run(["scontrol", "show", "node", "--oneliner", ",".join(nodes)],
                  capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return addresses
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") in addresses and fields.get("NodeAddr"):
            addresses[fields["NodeName"]] = fields["NodeAddr"]
    return addresses


def allocation_gpus(environ: Mapping[str, str]) -> int:
    """GPUs the allocation has on each node (SLURM_GPUS_PER_NODE, `4` or
    `a100:4`, else SLURM_GPUS_ON_NODE); 0 for none."""
    for variable in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        text = environ.get(variable, "").strip()
        if text:
            count = text.rpartition(":")[2]
            if not count.isdigit():
                raise SpecError(f"{variable}={shown(text)} is not a GPU count such as 4 or a100:4")
            return int(count)
    return 0


def spec_from_allocation(environ: Mapping[str, str], servers_per_host: int = 0,
                         addresses: Callable[[Sequence[str]], dict[str, str]] = node_addresses
                         ) -> ResourceSpec:
    """`--spec slurm`: the allocation's nodes, workers = tasks per node, and
    each node's GPUs (allocation_gpus) shared out over its workers."""
    if not environ.get("SLURM_JOB_ID"):
        raise SpecError("--spec slurm needs a Slurm allocation, and SLURM_JOB_ID is not set: "
                        "run `autopar launch --spec slurm` in an sbatch script or an salloc shell")
    from autopar.runtime.hostfile import check_servers_per_host
    check_servers_per_host(servers_per_host)
    nodes, counts = _nodes_and_counts(environ, "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE")
    if not any(counts):
        raise SpecError(f"SLURM_TASKS_PER_NODE={shown(environ['SLURM_TASKS_PER_NODE'])} gives no "
                        "node a task, and tasks are the job's workers: allocate tasks "
                        "(sbatch --ntasks-per-node=N)")
    where = addresses(nodes)
    gpus = tuple(range(allocation_gpus(environ))) or None
    hosts = [HostSpec(address=where[n], workers=c, servers=servers_per_host, slurm_node=n,
                      gpus=gpus if c else None)
             for n, c in zip(nodes, counts) if c or servers_per_host]
    return ResourceSpec(hosts=tuple(hosts), source=f"Slurm job {environ['SLURM_JOB_ID']}")


def srun_command(node: str, command: Sequence[str]) -> list[str]:
    """The local argv that runs `command` as a one-task step on `node`.

    --overlap: a job's processes share the allocation's CPUs (the servers
    are not among its tasks); --cpu-bind=none: a process may use every CPU
    the allocation has on the node, as one started by ssh could; the step
    exports this process's environment (srun's default), which carries the
    job's variables and token.
    """
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            "--cpu-bind=none", "--kill-on-bad-exit=1", "--quiet", "--", *command]


def step_position(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(task, tasks) of a process `srun` started as a task of a step, else
    None (a batch script, an salloc shell, or no Slurm)."""
    step = environ.get("SLURM_STEP_ID", "")
    if not step.isdigit() or "SLURM_PROCID" not in environ:
        return None
    rank, size = environ.get("SLURM_PROCID", ""), environ.get("SLURM_STEP_NUM_TASKS", "")
    if not (rank.isdigit() and size.isdigit() and int(rank) < int(size)):
        raise SpecError(f"SLURM_PROCID={shown(rank)} and SLURM_STEP_NUM_TASKS={shown(size)} are "
                        "not a task below a count: is this process started by srun?")
    return int(rank), int(size)


def port_base(environ: Mapping[str, str], tasks: int) -> int:
    """The port of the step's task 0; task i listens on base + i (module
    docstring)."""
    given = environ.get(PORT_BASE)
    if given is not None:
        if not given.isdigit() or not 1024 <= int(given) <= 65536 - tasks:
            raise SpecError(f"{PORT_BASE}={shown(given)} is not a port from 1024 to "
                            f"{65536 - tasks} (the port of the step's task 0; task i takes "
                            "the port i above it)")
        return int(given)
    job = environ.get("SLURM_JOB_ID", "0")
    step = environ.get("SLURM_STEP_ID", "0")
    slot = (int(job) * 7 + int(step)) % PORT_SLOTS if job.isdigit() and step.isdigit() else 0
    # A step of more tasks than a slot holds overlaps the next slots.
    span = PORT_SLOTS * PORTS_PER_STEP
    return FIRST_PORT + (slot * PORTS_PER_STEP) % max(1, span - tasks)


def step_cluster(environ: Mapping[str, str], task: int, tasks: int,
                 addresses: Callable[[Sequence[str]], dict[str, str]] = node_addresses
                 ) -> dict[str, list[str]]:
    """The cluster every task of an srun step derives, workers only."""
    nodes, counts = _nodes_and_counts(environ, "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
    if sum(counts) != tasks:
        raise SpecError(f"SLURM_STEP_TASKS_PER_NODE={shown(environ['SLURM_STEP_TASKS_PER_NODE'])} "
                        f"counts {sum(counts)} tasks but SLURM_STEP_NUM_TASKS is {tasks}")
    base = port_base(environ, tasks)
    where = addresses(nodes)
    firsts = itertools.accumulate([0, *counts])
    spec = ResourceSpec(hosts=tuple(
        HostSpec(address=where[n], workers=c, worker_ports=tuple(range(base + f, base + f + c)))
        for n, c, f in zip(nodes, counts, firsts) if c), source="srun step")
    cluster = explicit_cluster(spec)
    # Worker i is the i-th task in node order (block distribution): a task
    # another distribution put elsewhere would listen where no peer looks.
    placed = [(n, local) for n, c in zip(nodes, counts) for local in range(c)]
    actual = (environ.get("SLURMD_NODENAME", placed[task][0]),
              int(environ.get("SLURM_LOCALID", placed[task][1])))
    if actual != placed[task]:
        raise SpecError(f"Slurm task {task} runs as task {actual[1]} of {actual[0]}, but block "
                        f"distribution would place it as task {placed[task][1]} of "
                        f"{placed[task][0]}: start the step with srun --distribution=block")
    return {WORKER_JOB: cluster[WORKER_JOB]}
