"""The parameter-server method (Parallax §5.1, §5.3): the variable, split into
row partitions, lives on server processes; workers read the rows they need and
push their gradient; the chief applies the update once per step on the
servers. Planning (partitions and their servers) and cost are here; the
graph protocol (push/take/token) is in transforms.methods.ps.rewrite."""
from __future__ import annotations

import itertools
import math

from autopar.common.errors import AutoparError, SpecError
from autopar.transforms.comm import ROW_LADDER, row_gather_keys
from autopar.common.roles import SERVER_ROLE
from autopar.transforms.methods.base import Edits, RewriteContext, SyncMethod, VariablePlan
from autopar.transforms.methods.ps.rewrite import PsBuilder, pulls_per_group
from autopar.transforms.partition import dealt_sizes

# Parallax's cost model for a variable of b bytes in n partitions: b/n + a(n-1) + c.
# `a` is the fixed per-partition cost (one more RPC and update launch per step),
# written as the bytes the link could have moved meanwhile. Minimising gives
# n = sqrt(b/a).
PARTITION_OVERHEAD_BYTES = 4 << 20
# A dense server variable is split for balance only when it alone would carry
# this many bytes per worker and step beyond a server's share: ~1 ms at
# 1 Gbit/s, about what one more partition costs per step (a push and a take
# took <= 1 ms each in the traced steps).
SPLIT_MIN_EXCESS_BYTES = 128 << 10


class ParameterServer(SyncMethod):
    name = "ps"
    replicated = False

    def job_choice(self, topology, options, required, analysis):
        if required and topology.num_servers == 0:
            # Run on all-reduce instead, the job would not be the one asked for
            # (the report's header would still say ps).
            raise SpecError("run_option='ps' keeps every variable on server processes, but the "
                            "resource spec has none: give some hosts `servers: 1` (one per host "
                            "is a good start), or use run_option='allreduce'")
        return True, ""

    def declines(self, v, topology, options):
        if topology.num_servers == 0:
            return "the spec has no server processes for a PS path"
        if v.ps_blocker:
            return f"kept off the servers: {v.ps_blocker}"
        return ""

    def reason(self, v, options):
        if v.gradient == "sparse" and v.row_wise:
            return ("sparse gradient whose update transforms each row before rows of one id "
                    "add up: every worker's rows go to the servers unsummed, which send the "
                    "touched rows")
        if v.gradient == "sparse":
            return "sparse gradient: servers send/receive only touched rows, 2ab per worker"
        return "run_option='ps': dense variable on servers, 2b per worker"

    def processes(self, plan):
        return {SERVER_ROLE} if plan.server_variables else set()

    def default_partitions(self, v, topology):
        if not v.resource or v.partition_blocker:
            return 1
        return partition_count(v.bytes, _rows(v), topology.num_servers)

    def grouped_lookup(self, vp):
        return pulls_per_group(vp)

    def prepare(self, analysis, names, topology, options, fusion_bytes, key, job_why=""):
        overrides = dict(options.partitions)
        kept_whole = {v.name for v in analysis.variables
                      if v.name in names and (not v.resource or v.partition_blocker)
                      and overrides.get(v.name, partition_count(v.bytes, _rows(v),
                                                                topology.num_servers)) > 1}
        grouped_pulls = (options.aggregation_group or 0) > 1
        return (place_partitions(analysis, names, topology, overrides, options.sparse_servers),
                kept_whole, grouped_pulls), key

    def variable_plan(self, v, reason, state, key):
        layout, kept_whole, grouped_pulls = state
        parts, servers = layout[v.name]
        if v.name in kept_whole and v.partition_blocker:
            reason += f"; kept whole, not split into partitions: {v.partition_blocker}"
        elif v.name in kept_whole:
            reason += ("; kept whole, not split into partitions: it is a reference variable "
                       "(VariableV2), which autopar cannot partition (create it as a resource "
                       "variable, e.g. get_variable(..., use_resource=True), to split it)")
        # norm: all-reduce of this gradient's L2 terms; la_*: host-local
        # aggregation (a reduce of a dense gradient, a row gather of a
        # sparse one)
        norm = key
        if v.gradient == "sparse":
            keys, key = row_gather_keys(key + 1, "la_")
        else:
            keys, key = {"la_values": key + 1}, key + 2
        keys["norm"] = norm
        if v.dedup and v.norm_ops:
            # the global-norm term of deduplicated rows needs every worker's rows
            norm_keys, key = row_gather_keys(key, "norm_")
            keys.update(norm_keys)
        if v.shared_rows and v.norm_ops:
            # ... and that of rows every worker has alike, their sum
            keys["norm_shared"], key = key, key + 1
        if grouped_pulls and v.gradient == "sparse" and len(parts) > 1:
            # Config.aggregation_group: a group's lookups gather its ids, then
            # the first worker scatters the rows it pulled, a key per ladder rung
            # (transforms.partition, comm.scatter_rows)
            pull_keys, key = row_gather_keys(key, "pull_ids_")
            keys.update(pull_keys)
            keys["pull_rows"] = key
            key += len(ROW_LADDER)
            # a barrier per lookup (by its place in sorted(boundary_ops)),
            # fetched with it outside training steps (rewrite.WorkerGraph)
            keys["pull_barrier"] = key
            key += max(1, len(v.boundary_ops))
        where = ", ".join(f"server {s}" for s in sorted(set(servers)))
        placement = f"{len(parts)} partitions on {where}" if len(parts) > 1 else where
        if v.name in kept_whole:
            placement += (", whole (its update reads the whole variable)" if v.partition_blocker
                          else ", whole (reference variable: not partitioned)")
        return VariablePlan(v.name, self.name, placement, reason, keys=keys,
                            partitions=parts, servers=servers), key

    on_servers = True
    sparse_rows = "distinct"    # PsBuilder pushes one row per distinct id, pulls those rows

    def pushes_every_row(self, v):
        # a row-wise variable's rows go to the servers unsummed
        return v.gradient == "sparse" and v.row_wise

    def bytes_per_worker(self, nbytes, num_workers):
        # Parallax Table 3, 2ab in all: push the touched rows' gradient, read
        # the touched rows.
        return float(nbytes)

    def bytes_at_servers(self, nbytes, num_workers, contributors):
        """The rows go to every reader; every contribution comes in."""
        return num_workers * nbytes, contributors * nbytes

    def hops(self, num_workers):
        return 2

    def wire_bytes(self, v, vp, num_workers, alpha):
        """The byte model; a row-wise variable (VariableInfo.row_wise) pushes
        every row it looked up, repeats included, and pulls its distinct rows."""
        pulled = self.bytes_per_worker(alpha * v.bytes, num_workers)
        return _pushed_share(v, alpha) * v.bytes, pulled

    def server_bytes(self, v, vp, num_workers, contributors, alpha):
        """Each server's share: the byte model on its partitions' rows (read
        once per aggregation group when its lookups are grouped)."""
        rows = _rows(v)
        readers = contributors if pulls_per_group(vp) else num_workers
        out = []
        for (start, end), server in zip(vp.partitions, vp.servers):
            share = v.bytes * (end - start) / max(rows, 1)
            sent = self.bytes_at_servers(alpha * share, readers, contributors)[0]
            received = self.bytes_at_servers(_pushed_share(v, alpha) * share, readers,
                                             contributors)[1]
            out.append((server, sent, received))
        return out

    def rewrite(self, ctx: RewriteContext) -> Edits:
        return PsBuilder(ctx.graph, ctx.analysis, ctx.plan, ctx.worker_index, ctx.backend,
                         ctx.worker_device, ctx.moves, ctx.constants, ctx.nodes).build()


def _pushed_share(v, alpha: float) -> float:
    """The share of the table a worker's push carries: the rows it pulls,
    or for a row-wise variable every row it looked up (its alpha, repeats
    included, when the graph fixes it)."""
    return v.alpha if v.gradient == "sparse" and v.row_wise and v.alpha is not None else alpha


def partition_count(nbytes: int, rows: int, num_servers: int) -> int:
    """Parallax's b/n + a(n-1) + c minimised: n = sqrt(b/a), then rounded up to
    a multiple of the server count (so every server holds as many) when there
    is more than one, and never more partitions than rows."""
    n = max(1, round(math.sqrt(nbytes / PARTITION_OVERHEAD_BYTES)))
    if n > 1 and num_servers > 1:
        n = math.ceil(n / num_servers) * num_servers
    return max(1, min(n, rows))


def _step_bytes(v) -> float:
    """Bytes of a server variable one worker moves each way per step: the
    whole variable, or for a sparse gradient the touched rows (the
    analysis's alpha, at most the whole table: one row per distinct id; 1
    when unknown)."""
    if v.gradient == "sparse":
        return min(v.alpha if v.alpha is not None else 1.0, 1.0) * v.bytes
    return float(v.bytes)


def place_partitions(analysis, names: set[str], topology, overrides: dict[str, int],
                     sparse_servers: int = 0) -> dict[str, tuple[list, list]]:
    """Row partitions of every PS variable (rows dealt round-robin, see
    transforms.partition) and the server of each.

    A variable with a sparse gradient that Parallax's model (partition_count)
    would split at all gets one partition per server, partition p on server
    p: a step moves only its touched rows, which dealt rows spread evenly over
    the partitions, so every server carries the same share of them whatever
    the rows' real number turns out to be (the analysis's alpha counts a row
    per looked-up id, while the server path moves each distinct row once: on
    the Zipf LM 2x fewer). More partitions would add per-partition work (a
    row gather, a push, an accumulator and an update copy per step) without
    spreading any bytes further: on 4 workers and 2 servers on one machine,
    8 partitions per embedding cost 4 % of the LM's words/s against 2. When
    such partitions were placed greedily by their estimated bytes instead,
    two of the LM's four embedding partitions shared a server and the dense
    kernels the other two, and the busiest server carried 1.7x the mean.
    With `sparse_servers` (the planner's cost model, transforms.plan
    aggregation_structure) such a variable gets one partition on each of
    servers [0, sparse_servers) instead (its count overridden: every server).

    A dense variable moves whole every step: Parallax's cost model
    (partition_count), but split further, up to one partition per server,
    when it alone would carry more than the dense variables' share per
    server (by more than SPLIT_MIN_EXCESS_BYTES); of those counts, the one
    whose greedy placement (largest first onto the least-loaded server)
    leaves the busiest server least loaded, the fewest partitions on a tie.
    Measured on the emulated cluster (sparse LM, 4 workers, 4 servers,
    100 Mbit/s): the LM's 1 MB dense kernel, whole on one server, made that
    server's link carry 4.5 MB per step while the others carried about 1 MB
    each."""
    servers = max(topology.num_servers, 1)
    chosen = [v for v in analysis.variables if v.name in names]
    load = [0.0] * servers
    layout: dict[str, tuple[list, list]] = {}
    counts: dict[str, int] = {}      # partitions of the variables placed greedily below
    fixed: set[str] = set()          # ... whose count is not searched (overrides, small sparse)
    for v in chosen:
        spread = servers
        if not v.resource or v.partition_blocker:
            n = 1      # cannot be split (ParameterServer.prepare says why)
        elif v.name in overrides:
            n = overrides[v.name]
            if n > _rows(v):
                raise AutoparError(f"Config.partitions asks for {n} partitions of '{v.name}', "
                                   f"which has {_rows(v)} rows: give at most one partition "
                                   "per row")
        elif v.gradient == "sparse":
            spread = min(sparse_servers, servers) or servers
            n = spread if partition_count(v.bytes, _rows(v), topology.num_servers) > 1 else 1
        else:
            counts[v.name] = partition_count(v.bytes, _rows(v), topology.num_servers)
            continue
        n = max(1, min(int(n), _rows(v)))
        if v.gradient == "sparse" and n % spread == 0:
            # even by construction: every server the same number of partitions
            layout[v.name] = (_dealt_partitions(_rows(v), n), [p % spread for p in range(n)])
            for nbytes, _, p in _pieces([v], {v.name: n}):
                load[p % spread] += nbytes
        else:
            counts[v.name] = n
            fixed.add(v.name)
    greedy = [v for v in chosen if v.name in counts]
    share = sum(_step_bytes(v) for v in greedy if v.name not in fixed) / servers
    for v in sorted(greedy, key=lambda v: (-_step_bytes(v), v.name)):
        if v.name in fixed or _step_bytes(v) - share <= SPLIT_MIN_EXCESS_BYTES:
            continue
        most = min(servers, _rows(v))
        if counts[v.name] >= most:
            continue      # the cost model already gives it a partition per server or more
        least = min(most, math.ceil(_step_bytes(v) / share))
        candidates = range(max(counts[v.name], least - 1, 1), most + 1)
        counts[v.name] = min(candidates, key=lambda n: (
            max(_greedy(_pieces(greedy, {**counts, v.name: n}), load)[1]), n))
    assignment, _ = _greedy(_pieces(greedy, counts), load)
    for v in greedy:
        n = counts[v.name]
        layout[v.name] = (_dealt_partitions(_rows(v), n), [assignment[(v.name, p)] for p in range(n)])
    return layout


def _rows(v) -> int:
    """Rows of a variable (a scalar is one row)."""
    return v.shape[0] if v.shape else 1


def _dealt_partitions(rows: int, n: int) -> list[list[int]]:
    """[start, end) of each of n partitions, in positions of dealt order."""
    bounds = list(itertools.accumulate(dealt_sizes(rows, n), initial=0))
    return [[bounds[p], bounds[p + 1]] for p in range(n)]


def _pieces(variables, counts: dict[str, int]) -> list[tuple[float, str, int]]:
    """(step bytes, variable, partition) of every partition of `variables`."""
    out = []
    for v in variables:
        out += [(_step_bytes(v) * (b - a) / _rows(v), v.name, p)
                for p, (a, b) in enumerate(_dealt_partitions(_rows(v), counts[v.name]))]
    return out


def _greedy(pieces, base: list[float]) -> tuple[dict, list[float]]:
    """Largest piece first onto the least-loaded server (ties: lowest index),
    starting from the loads in `base`: (piece -> server, the loads)."""
    load = list(base)
    where = {}
    for nbytes, name, p in sorted(pieces, key=lambda x: (-x[0], x[1], x[2])):
        server = min(range(len(load)), key=lambda s: (load[s], s))
        load[server] += nbytes
        where[(name, p)] = server
    return where, load
