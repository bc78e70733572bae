"""Dense gradients averaged by ring all-reduce in fused buckets; the variable
is replicated on every worker (Parallax §3.1).

Bytes over host links (`host_link_bytes`): TensorFlow's ring visits the
group's workers in their ranks' order (comm.rank_order: task 10 before task
2), so with workers placed host by host (and fewer than 11) a flat
ring crosses each host link once per direction, each crossing carrying
2(N-1)b/N of a b-byte all-reduce; with interleaved placement every ring edge
crosses a link.

2-D summation by hosts (TPU-pod scaling paper §2; Plan.hierarchical_why, a
bucket's host_key): each bucket is summed within each host (the host's group), the
host sums are all-reduced among the first worker of every host (the
leaders' group, LEADERS_GROUP_KEY), and each leader broadcasts the result
within its host; a host with one worker skips the host steps. Only the
leaders' ring crosses host links: 2(H-1)b/H per link for H hosts.
Every member of a group launches that group's collectives in one order
(host sums chained bucket after bucket, leaders' all-reduces chained,
broadcasts chained), every instance key is used by one op only, and a broadcast
receiver holds a control edge on its own host sum: it reads only that sum's
static shape, and without the edge the sum (a collective the leader waits
in) is pruned from the receiver's step and the leader waits forever.

2-D summation over groups of d workers (Config.allreduce_group; RingState.group),
for clusters of one worker per host whose flat ring's 2(N-1) steps bind:
workers [0,d), [d,2d), ... each cut a bucket into d pieces and exchange them
within their group (an all-to-all: CPU collectives have no reduce-scatter),
each sums the d copies of its piece it holds, the workers at place j of
every group all-reduce piece j (a ring of N/d: the group's "column"), and
the group gathers its pieces in place order. A place is a rank in the
group's collectives, which TensorFlow gives by the members' device names in
lexicographic order (task 10 before task 2: comm.collective_rank), not by
worker index. Every worker sends the flat
ring's bytes, 2(N-1)/N of the bucket (2(d-1)/d + 2(N/d-1)/N, plus the
padding of a bucket d does not divide), in 1 + 2(N/d - 1) + (d - 1) steps
instead of 2(N - 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import tensorflow as tf

from autopar.transforms.comm import collective_rank, rank_order
from autopar.transforms.keys import ALLREDUCE_COLUMNS, ALLREDUCE_GROUPS, LEADERS_GROUP_KEY
from autopar.transforms.methods.base import Edits, RewriteContext, SyncMethod, VariablePlan
from autopar.transforms.methods.wire import COLLECTIVES, wire_fraction
from autopar.transforms.ops import reshape
from autopar.transforms.topology import Topology


@dataclass
class Bucket:
    index: int
    dtype: str
    variables: list[str]
    bytes: int
    instance_key: int   # the all-reduce (with 2-D summation: the leaders' all-reduce)
    # 2-D summation: the host sum takes host_key, the broadcast host_key + 1
    # (both in the host's group; 0 when the bucket uses the flat ring).
    host_key: int = 0
    group: int = 0      # the train group of its variables (Analysis.train_groups)
    # The dtype it travels and is summed in when narrower than its own
    # (Config.wire_dtype: SyncMethod.wire_dtype); "" when it travels as it is.
    wire_dtype: str = ""

    @property
    def hierarchical(self) -> bool:
        return self.host_key != 0


@dataclass
class RingState:
    """What the compiled plan keeps: the buckets, and why they use 2-D
    summation or the flat ring."""
    buckets: list[Bucket] = field(default_factory=list)
    hierarchical_why: str = ""
    # workers per group of the 2-D summation over groups (0: by hosts, when
    # the buckets' host_key is set, or the flat ring)
    group: int = 0


class AllReduce(SyncMethod):
    name = "allreduce"
    State = RingState
    # Every worker ends the step with the whole averaged gradient, so one
    # owner can apply the update (transforms.wus).
    shards_weight_update = True
    # TensorFlow's collective ops: float16, no bfloat16 (Horovod's fp16
    # compression: a float32 or float64 bucket cast to float16, summed in
    # it and cast back, the mean taken in full precision).
    wire_dtypes = COLLECTIVES

    def reason(self, v, options):
        why = "dense gradient: ring all-reduce moves 2(N-1)/N of its bytes per worker"
        wire = self.wire_dtype(v.dtype, options)
        return f"{why}; sent as {wire} on the ring (Config.wire_dtype)" if wire else why

    def prepare(self, analysis, names, topology, options, fusion_bytes, key, job_why=""):
        """Fusion buckets, one instance key each from `key` on (three with
        2-D summation: the leaders' all-reduce, the host sum, the broadcast)."""
        buckets = fusion_buckets(analysis, names, fusion_bytes)
        for b in buckets:
            b.wire_dtype = self.wire_dtype(b.dtype, options)
        group = getattr(options, "allreduce_group", None) or 0
        if group > 1:
            two_d, why = True, getattr(options, "allreduce_why", "")
        else:
            two_d, why = (two_dimensional_choice(topology, options.hierarchical_allreduce)
                          if buckets else (False, ""))
            ring_why = getattr(options, "allreduce_why", "")
            why = f"{why}; {ring_why}" if ring_why and not two_d else why
        for b in buckets:
            b.instance_key = key
            key += 1
            if two_d:
                b.host_key = key
                key += 2
        return RingState(buckets, why, group if group > 1 else 0), key

    def variable_plan(self, v, reason, state, key):
        bucket = next(b for b in state.buckets if v.name in b.variables)
        return VariablePlan(v.name, self.name, "replicated on every worker", reason,
                            bucket=bucket.index, wire_dtype=bucket.wire_dtype or None), key

    def bytes_per_worker(self, nbytes, num_workers):
        # A ring's reduce-scatter and all-gather: 2(N-1)/N of the bytes.
        n = num_workers
        return 2.0 * (n - 1) * nbytes / n if n > 1 else 0.0

    def hops(self, num_workers):
        return 2 * (num_workers - 1)

    def wire_bytes(self, v, vp, num_workers, alpha):
        sent = self.bytes_per_worker(v.bytes * wire_fraction(v.dtype, vp.wire_dtype), num_workers)
        return sent, sent

    def report_fields(self, plan):
        buckets = self.state(plan).buckets
        nbytes = sum(b.bytes * wire_fraction(b.dtype, b.wire_dtype) for b in buckets)
        group = self.state(plan).group
        links = ({kind: host_link_bytes(plan.worker_hosts, nbytes, kind == "2d", group)
                  for kind in ("ring", "2d")} if plan.worker_hosts else {})
        return {"buckets": [{**asdict(b), "method": self.name} for b in buckets],
                "host_link_bytes": links, "hierarchical_why": self.state(plan).hierarchical_why,
                "allreduce_group": group}

    def ordered_collectives(self, plan):
        # Each bucket's all-reduce continues its train group's chain, and
        # 2-D summation chains each kind (the host sum, the broadcast).
        state = self.state(plan)
        return {k for b in (state.buckets if state else ())
                for k in (b.instance_key, *((b.host_key, b.host_key + 1) if b.hierarchical else ()))}

    def rewrite(self, ctx: RewriteContext) -> Edits:
        """Each bucket's gradients concatenated, all-reduced, split back; every
        consumer outside the backward pass reads the reduced piece."""
        graph, analysis, plan, backend = ctx.graph, ctx.analysis, ctx.plan, ctx.backend
        edits = Edits()
        state = self.state(plan)
        with tf.name_scope("autopar/average/"):
            for bucket in state.buckets:
                # The train group's chains (RewriteContext.chains): "ring",
                # the flat ring's last reduction; 2-D summation's kinds.
                chain = ctx.chains.setdefault(bucket.group, {})
                grads = [graph.get_tensor_by_name(analysis.variable(n).grad_tensor)
                         for n in bucket.variables]
                # Chaining flat-ring buckets fixes the order every worker
                # launches collectives in, so concurrent collectives can never
                # wait on each other (within a train group: a step of one
                # train op must not run another's); 2-D summation chains each
                # kind of its collectives itself (_two_dimensional_sum).
                last = [] if bucket.hierarchical else chain.get("ring", [])
                # A mean loss: one device's gradient is the workers' mean; a
                # summed loss: their sum (Plan.loss_reduction). The flat ring
                # in the gradients' own dtype averages in the collective; a sum
                # by 2-D summation or in float16 is divided in full precision.
                mean = plan.averages("dense")
                mean_in_collective = mean and not bucket.hierarchical and not bucket.wire_dtype
                with tf.control_dependencies(last):
                    flat = tf.concat([reshape(g, ctx.constants.get([-1])) for g in grads],
                                     axis=0)
                    # A narrower wire dtype (Config.wire_dtype): travels and is summed in it, cast back below.
                    sent = tf.cast(flat, bucket.wire_dtype) if bucket.wire_dtype else flat
                    if bucket.hierarchical and state.group:
                        reduced = _grouped_sum(ctx, sent, bucket, chain, state.group)
                    elif bucket.hierarchical:
                        reduced = _two_dimensional_sum(ctx, sent, bucket, chain)
                    elif mean_in_collective:
                        reduced = backend.allreduce_mean(sent, bucket.instance_key)
                    else:
                        reduced = backend.allreduce_sum(sent, bucket.instance_key)
                if not bucket.hierarchical:
                    chain["ring"] = [reduced]
                if bucket.wire_dtype:
                    reduced = tf.cast(reduced, flat.dtype)
                if mean and not mean_in_collective:
                    reduced = reduced / ctx.constants.get(float(plan.num_workers), reduced.dtype)
                # A dense gradient has its variable's shape; the gradient
                # tensor's static shape may be unknown in the imported copy
                # (shapes the backward pass set in Python are not in a GraphDef).
                shapes = [analysis.variable(n).shape for n in bucket.variables]
                sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
                for g, shape, piece in zip(grads, shapes, tf.split(reduced, sizes)):
                    target = ctx.constants.get(list(shape), tf.int32)
                    edits.replaced[g.name] = reshape(piece, target).name
        return edits


def _two_dimensional_sum(ctx: RewriteContext, flat: tf.Tensor, bucket: Bucket,
                         chains: dict[str, list]) -> tf.Tensor:
    """The sum of `flat` over all workers: host sum, leaders' all-reduce,
    broadcast within the host (hosts of one worker skip the host steps).

    Each kind of collective is chained after the previous bucket's of the
    same kind (`chains`), so every member of a group launches that group's
    collectives in one order, while bucket k+1's host sum can run during
    bucket k's leaders' all-reduce."""
    plan, backend = ctx.plan, ctx.backend
    host_key, members = plan.host_group(ctx.worker_index)
    leader = members[0] == ctx.worker_index
    num_hosts = len(plan.topology.hosts)
    timeout = plan.collective_timeout_s
    host = backend.subgroup(len(members), host_key, timeout) if len(members) > 1 else None
    summed = flat
    if host is not None:
        with tf.control_dependencies(chains.get("host", [])):
            summed = host.allreduce_sum(flat, bucket.host_key)
        chains["host"] = [summed]
    result = summed
    if leader and num_hosts > 1:
        leaders = backend.subgroup(num_hosts, LEADERS_GROUP_KEY, timeout)
        with tf.control_dependencies(chains.get("leaders", [])):
            result = leaders.allreduce_sum(summed, bucket.instance_key)
        chains["leaders"] = [result]
    if host is not None:
        # A receiver reads only the static shape of its host sum: the control
        # edge keeps that sum, which the leader waits in, in the step.
        with tf.control_dependencies(chains.get("broadcast", []) + [summed]):
            result = host.broadcast(result, bucket.host_key + 1, is_source=leader)
        chains["broadcast"] = [result]
    return result


def _grouped_sum(ctx: RewriteContext, flat: tf.Tensor, bucket: Bucket,
                 chains: dict[str, list], d: int) -> tf.Tensor:
    """The sum of the 1-D `flat` over all workers by 2-D summation over
    groups of d workers: an all-to-all of its d pieces within the group
    (bucket.host_key), each worker's piece summed and all-reduced across the
    groups (instance_key), the pieces gathered within the group
    (host_key + 1). Each kind is chained after the previous bucket's (as
    _two_dimensional_sum's), so every member of a group launches that
    group's collectives in one order."""
    plan, backend, w = ctx.plan, ctx.backend, ctx.worker_index
    timeout = plan.collective_timeout_s
    groups = plan.num_workers // d
    row = backend.subgroup(d, ALLREDUCE_GROUPS.key(w // d), timeout)
    # The all-to-all hands this worker the piece at its rank in the group,
    # which the column must share
    column_key = ALLREDUCE_COLUMNS.key(collective_rank(w, range(w - w % d, w - w % d + d)))
    # its length from the variables: the gradients' static shapes may be
    # unknown in the imported graph
    size = sum(int(np.prod(ctx.analysis.variable(n).shape, dtype=np.int64))
               for n in bucket.variables)
    piece = -(-size // d)
    padded = tf.pad(flat, ctx.constants.get([[0, piece * d - size]])) if piece * d > size else flat
    with tf.control_dependencies(chains.get("exchange", [])):
        exchanged = row.alltoall(reshape(padded, ctx.constants.get([d, piece])), bucket.host_key)
    chains["exchange"] = [exchanged]
    mine = tf.reduce_sum(exchanged, axis=0)
    if groups > 1:
        column = backend.subgroup(groups, column_key, timeout)
        with tf.control_dependencies(chains.get("across", [])):
            mine = column.allreduce_sum(mine, bucket.instance_key)
        chains["across"] = [mine]
    with tf.control_dependencies(chains.get("gather", [])):
        gathered = row.allgather(mine, bucket.host_key + 1)
    chains["gather"] = [gathered]
    return ctx.constants.rows(gathered, 0, size) if piece * d > size else gathered


def two_dimensional_choice(topology: Topology, option: bool | None) -> tuple[bool, str]:
    """Whether the all-reduce buckets use 2-D summation, and why: forced by
    Config(hierarchical_allreduce=True/False), else chosen when some host has
    several workers and the busiest host link carries fewer bytes than with
    the flat ring in worker order (host_link_bytes)."""
    if option is not None:
        return option, f"Config(hierarchical_allreduce={option})"
    hosts = topology.hosts
    most = max(len(topology.workers_on(h)) for h in hosts)
    if most < 2:
        return False, "one worker per host: nothing to sum within a host"
    if len(hosts) < 2:
        return False, "one host: no bytes cross a host link"
    ring = max(host_link_bytes(topology.worker_hosts, 1.0).values())
    two_d = max(host_link_bytes(topology.worker_hosts, 1.0, two_dimensional=True).values())
    verdict = two_d < ring
    return verdict, (f"busiest host link per all-reduced byte: flat ring {ring:.2f}, 2-D "
                     f"summation {two_d:.2f} ({len(hosts)} hosts, up to {most} workers each): "
                     f"{'2-D summation' if verdict else 'flat ring'} sends fewer")


def host_link_bytes(worker_hosts: Sequence[str], nbytes: float,
                    two_dimensional: bool = False, group: int = 0) -> dict[str, float]:
    """Bytes each host sends over its link (and, by symmetry, receives) for
    one all-reduce of `nbytes`: a ring over the workers in their ranks'
    order (comm.rank_order; each edge to a worker on another host carries
    2(N-1)b/N), 2-D summation by
    hosts (only the ring of one worker per host crosses links: 2(H-1)b/H
    each), or 2-D summation over groups of `group` workers (at most, every
    peer taken on another host: each worker sends its d - 1 pieces of b/d,
    2(G-1)/G of its piece in the ring of its G = N/d groups, and its piece
    to each of the d - 1 others of its group)."""
    hosts = list(dict.fromkeys(worker_hosts))
    if two_dimensional and group > 1:
        n = len(worker_hosts)
        piece, count = nbytes / group, n // group
        per_worker = 2 * (group - 1) * piece + (2 * (count - 1) * piece / count if count else 0.0)
        out = {h: 0.0 for h in hosts}
        for h in worker_hosts:
            out[h] += per_worker
        return out
    if two_dimensional:
        count = len(hosts)
        return {h: 2 * (count - 1) * nbytes / count if count > 1 else 0.0 for h in hosts}
    out = {h: 0.0 for h in hosts}
    n = len(worker_hosts)
    ring = [worker_hosts[w] for w in rank_order(range(n))]
    for i, h in enumerate(ring):
        if ring[(i + 1) % n] != h:
            out[h] += 2 * (n - 1) * nbytes / n
    return out


def fusion_buckets(analysis, names: set[str], fusion_bytes: int) -> list:
    """Greedy buckets of one dtype and one train group, at most fusion_bytes
    each (a larger variable gets a bucket of its own). Variables are taken
    last-created first, the order in which backpropagation produces their
    gradients, so early buckets can be reduced while later layers are still
    being differentiated. A bucket never mixes train groups: a step of one
    train op must not need another's gradients (or its inputs)."""
    buckets: list[Bucket] = []
    open_by: dict[tuple[int, str], Bucket] = {}
    for v in reversed(analysis.variables):
        if v.name not in names:
            continue
        b = open_by.get((v.group, v.dtype))
        if b is None or (b.bytes + v.bytes > fusion_bytes and b.variables):
            b = Bucket(index=len(buckets), dtype=v.dtype, variables=[], bytes=0, instance_key=0,
                       group=v.group)
            buckets.append(b)
            open_by[(v.group, v.dtype)] = b
        b.variables.append(v.name)
        b.bytes += v.bytes
    return buckets
