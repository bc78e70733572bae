"""Running totals each worker keeps of its own batches: the local variables
of `tf.compat.v1.metrics` (accuracy, mean, auc, precision, ...).

Such a metric keeps its totals in local variables
(`tf.compat.v1.GraphKeys.LOCAL_VARIABLES`: outside the trained state and
the checkpoint) that its update op adds each batch's figures to. On N
workers each worker adds its own share's, so the metric's value op read on
a worker gives that worker's batches', not one device's global batches'.
Whether a total adds up over workers (a sum over examples, an accuracy's)
or not (a mean of each batch's mean loss, when the shares differ in size)
is more than data flow tells, so the totals stay each worker's, and the
report names them: the program reads its own share's figures unless it
sums them (`runner.sum_over_workers`) or evaluates from (sum, count) pairs
(`runner.evaluate`, docs/evaluation.md).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.features.base import GraphFeature

tf1 = tf.compat.v1


class WorkerCounters(GraphFeature):
    """Names the local variables each worker adds its own batches' figures to."""
    name = "worker_counters"
    fields = ("worker_counters",)

    def find(self, facts):
        return {"worker_counters": find_worker_counters(facts.graph, facts.writers,
                                                        facts.batch_local)}

    def report_fields(self, analysis, plan):
        return {"worker_counters": list(analysis.worker_counters)}


def find_worker_counters(graph: tf.Graph, writers: dict[str, list[str]],
                         batch_local: set[str]) -> list[str]:
    """Local variables (not global: outside the trained state) an op fed by
    the input batch writes, sorted."""
    trained = {v.op.name for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
    local = {v.op.name for v in graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)}
    return sorted(name for name in local - trained
                  if any(w in batch_local for w in writers.get(name, [])))
