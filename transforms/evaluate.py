"""The collective behind distributed evaluation (Runner.evaluate).

Every worker evaluates its own shard of the eval set (autopar.shard), adding
up per-batch sums and counts; one all-reduce of those totals at the end
gives every worker the totals of the whole set. Nothing is exchanged per
batch, so workers may run different numbers of batches (a set whose size
does not divide by N, a worker whose shard is empty).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.comm import CollectiveOpsBackend
from autopar.transforms.keys import EVALUATION
from autopar.transforms.plan import Plan

tf1 = tf.compat.v1

# Instance keys of the totals all-reduce: one per vector length (TensorFlow
# pins a key's shape at its first use), from their range in transforms.keys.
MAX_EVAL_VALUES = EVALUATION.size - 1


def totals_allreduce(plan: Plan, device: str, length: int, backend=None) -> tuple[tf.Tensor, tf.Tensor]:
    """(placeholder, summed) in the default graph: feed a float64 vector of
    `length` totals, fetch their sum over all workers. Every worker must
    build it with the same length (the same metrics) and run it once per
    evaluation."""
    if not 0 < length <= MAX_EVAL_VALUES:
        raise ValueError(f"evaluation totals must have 1..{MAX_EVAL_VALUES} values, got {length}")
    if backend is None:
        backend = CollectiveOpsBackend(plan.num_workers, plan.group_key, plan.communication_hint)
    with tf.name_scope("autopar/evaluate/"), tf.device(device):
        totals = tf1.placeholder(tf.float64, [length], name="totals")
        summed = backend.allreduce_sum(totals, EVALUATION.key(length))
    return totals, summed
