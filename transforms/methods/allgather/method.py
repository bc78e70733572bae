"""Sparse gradients (IndexedSlices) shared by all-gather of the touched rows;
the variable is replicated on every worker (Parallax §5)."""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.comm import row_gather_keys
from autopar.transforms.methods.base import Edits, RewriteContext, SyncMethod, VariablePlan
from autopar.transforms.sparse_rows import combine_rows, split_shared_rows


class AllGather(SyncMethod):
    name = "allgather"

    def reason(self, v, options):
        return "sparse gradient (IndexedSlices): all-gather of the touched rows"

    def variable_plan(self, v, reason, state, key):
        keys, key = row_gather_keys(key, "")
        if v.shared_rows:
            keys["shared_rows"], key = key, key + 1
        return VariablePlan(v.name, self.name, "replicated on every worker", reason,
                            keys=keys), key

    def bytes_per_worker(self, nbytes, num_workers):
        # Its rows to each of the N-1 others (ring all-gather).
        return (num_workers - 1) * nbytes if num_workers > 1 else 0.0

    def hops(self, num_workers):
        return num_workers - 1

    def rewrite(self, ctx: RewriteContext) -> Edits:
        graph, analysis, plan, backend = ctx.graph, ctx.analysis, ctx.plan, ctx.backend
        edits = Edits()
        with tf.name_scope("autopar/average/"):
            for vp in plan.variables:
                if vp.method != self.name:
                    continue
                info = analysis.variable(vp.name)
                values = graph.get_tensor_by_name(info.grad_values)
                indices = graph.get_tensor_by_name(info.grad_indices)
                keys = (vp.keys["count"], vp.keys["values"], vp.keys["indices"])
                if info.shared_rows:
                    all_values, all_indices = _gather_then_add_shared(
                        backend, values, indices, info.shared_rows, keys,
                        vp.keys["shared_rows"])
                else:
                    # Row counts differ by worker and step: see
                    # CollectiveOpsBackend.allgather_rows.
                    all_values, all_indices = backend.allgather_rows(values, indices, keys)
                # The single-device gradient over the global batch (mean or sum).
                all_values = all_values * tf.constant(plan.gradient_scale("sparse"), dtype=values.dtype)
                if info.dedup:
                    # One device has one row per distinct id of the global batch:
                    # rows of an id several workers touched become one, so the
                    # global norm and the optimizer see what one device sees.
                    all_values, all_indices = combine_rows(all_values, all_indices)
                edits.replaced[values.name] = all_values.name
                edits.replaced[indices.name] = tf.cast(all_indices, indices.dtype).name
        return edits


def _gather_then_add_shared(backend, values, indices, shared: int, keys, add_key: int):
    """One device's rows: every worker's rows of its examples, gathered, then
    the shared ids' rows added over workers position by position (each a
    worker's share of the batch's sum)."""
    (head, head_ids), (tail, tail_ids) = split_shared_rows(values, indices, shared)
    rows, ids = backend.allgather_rows(head, head_ids, keys)
    summed = backend.allreduce_sum(tail, add_key)
    return tf.concat([rows, summed], 0), tf.concat([tf.cast(ids, tf.int64), tail_ids], 0)
