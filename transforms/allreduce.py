"""Dense gradients averaged by ring all-reduce in fused buckets; the variable
is replicated on every worker (Parallax §3.1).

Bytes over host links (`host_link_bytes`): TensorFlow's ring visits the
group's workers in task order, so with workers placed host by host a flat
ring crosses each host link once per direction, each crossing carrying
2(N-1)b/N of a b-byte all-reduce; with interleaved placement every ring edge
crosses a link. 2-D summation (TPU-pod scaling paper §2: sum within each
host, all-reduce among one worker per host, broadcast within the host) would
send 2(H-1)b/H per host link for H hosts; the report shows both.
"""
from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from autopar.transforms.plan import Bucket, VariablePlan
from autopar.transforms.sync_method import Edits, RewriteContext, SyncMethod, reshape


class AllReduce(SyncMethod):
    name = "allreduce"

    def prepare(self, analysis, names, topology, options, fusion_bytes, key):
        """Fusion buckets, one instance key each from `key` on."""
        buckets = fusion_buckets(analysis, names, fusion_bytes)
        for b in buckets:
            b.instance_key = key
            key += 1
        return buckets, key

    def plan_fields(self, state) -> dict:
        return {"buckets": state}

    def variable_plan(self, v, reason, state, key):
        bucket = next(b.index for b in state if v.name in b.variables)
        return VariablePlan(v.name, self.name, "replicated on every worker", reason,
                            bucket=bucket), key

    def wire_bytes(self, v, vp, num_workers, alpha):
        n = num_workers
        sent = 2 * (n - 1) * v.bytes / n
        return sent, sent

    def rewrite(self, ctx: RewriteContext) -> Edits:
        """Each bucket's gradients concatenated, all-reduced, split back; every
        consumer outside the backward pass reads the reduced piece."""
        graph, analysis, plan, backend = ctx.graph, ctx.analysis, ctx.plan, ctx.backend
        edits = Edits()
        previous = None
        with tf.name_scope("autopar/average/"):
            for bucket in plan.buckets:
                grads = [graph.get_tensor_by_name(analysis.variable(n).grad_tensor)
                         for n in bucket.variables]
                # Chaining buckets fixes the order every worker launches collectives
                # in, so concurrent collectives can never wait on each other.
                with tf.control_dependencies([previous] if previous is not None else []):
                    flat = tf.concat([reshape(g, ctx.constants.get([-1])) for g in grads],
                                     axis=0)
                    # A mean loss: one device's gradient is the workers' mean; a
                    # summed loss: their sum (Plan.loss_reduction).
                    reduced = (backend.allreduce_mean(flat, bucket.instance_key)
                               if plan.loss_reduction == "mean"
                               else backend.allreduce_sum(flat, bucket.instance_key))
                previous = reduced
                sizes = [int(g.shape.num_elements()) for g in grads]
                for g, piece in zip(grads, tf.split(reduced, sizes)):
                    edits.replaced[g.name] = reshape(piece, ctx.constants.shape_of(g)).name
        return edits


def host_link_bytes(worker_hosts: Sequence[str], nbytes: float,
                    two_dimensional: bool = False) -> dict[str, float]:
    """Bytes each host sends over its link (and, by symmetry, receives) for
    one all-reduce of `nbytes`: a ring over the workers in task order (each
    edge to a worker on another host carries 2(N-1)b/N), or 2-D summation
    (only the ring of one worker per host crosses links: 2(H-1)b/H each)."""
    hosts = list(dict.fromkeys(worker_hosts))
    if two_dimensional:
        count = len(hosts)
        return {h: 2 * (count - 1) * nbytes / count if count > 1 else 0.0 for h in hosts}
    out = {h: 0.0 for h in hosts}
    n = len(worker_hosts)
    for i, h in enumerate(worker_hosts):
        if worker_hosts[(i + 1) % n] != h:
            out[h] += 2 * (n - 1) * nbytes / n
    return out


def fusion_buckets(analysis, names: set[str], fusion_bytes: int) -> list:
    """Greedy buckets of one dtype, at most fusion_bytes each (a larger variable
    gets a bucket of its own). Variables are taken last-created first, the order
    in which backpropagation produces their gradients, so early buckets can be
    reduced while later layers are still being differentiated."""
    buckets: list[Bucket] = []
    open_by_dtype: dict[str, Bucket] = {}
    for v in reversed(analysis.variables):
        if v.name not in names:
            continue
        b = open_by_dtype.get(v.dtype)
        if b is None or (b.bytes + v.bytes > fusion_bytes and b.variables):
            b = Bucket(index=len(buckets), dtype=v.dtype, variables=[], bytes=0, instance_key=0)
            buckets.append(b)
            open_by_dtype[v.dtype] = b
        b.variables.append(v.name)
        b.bytes += v.bytes
    return buckets
