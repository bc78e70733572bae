"""Metrics a model's own test_step feeds one value per batch, each worker's
addition weighed by its share of the batch.

autopar.fit validates with a model's own test_step, each worker on its rows
of each validation batch, and sums the metrics' state over workers
(keras_fit._Metrics.own_step_result). A metric fed a value per example adds
up over workers to one device's. A `Mean` fed one value per batch does not:
a tracker of the batch's loss (Keras's guide to customizing fit() writes
`metric.update_state(loss)` in its test_step) adds the mean over the
worker's rows to its total and 1 to its count, so the workers' sum weighs
their means alike, where one device adds the global batch's mean once; a
tracker of a loss summed over the batch counts N times where one device
counts once. A validation batch seldom splits evenly (26 examples in
batches of 12 on 3 workers: 4/4/4, 4/4/4, 1/1/0).

Which metrics those are is read from the traced test step's data flow, as
for a training step (transforms.batch_weights): an addition to a variable
of a mean over a batch of unknown size, and an addition of a sum over the
batch, fed as one value, to a total divided by a count. After each batch,
this worker's additions to such a metric are weighed by its share of the
batch's rows, s = b / B: a mean's total and count both (the workers' shares
add up to one device's mean, counted once), a sum's count alone (its
totals add up already), and the total of a metric with no count (Keras's
`Sum`) fed a mean over the batch (one device adds the global batch's mean
once; before, each worker added its own). A worker with no rows of a batch
runs no step; the others' shares add up to 1.
"""
from __future__ import annotations

import logging

import numpy as np

from autopar.common.errors import UnsupportedGraphError

log = logging.getLogger("autopar")


class BatchValueMetrics:
    """The Keras metrics of `model` its own traced `test_step` feeds one
    value per batch, found from the step's graph on the structure of `data`
    (its argument for a batch), with the batch's size left unknown."""

    def __init__(self, model, test_step, data) -> None:
        self.weighed: list[tuple[object, bool]] = []   # (a Mean, fed a mean over the batch)
        try:
            found = _found(test_step, data)
        except (UnsupportedGraphError, TypeError, ValueError) as e:   # (what the lift cannot read)
            log.warning("autopar.fit: the model's test_step could not be read for the metrics "
                        "it feeds one value per batch (%s): their validation logs are the "
                        "workers' state summed, one device's only when every validation batch "
                        "splits evenly over the workers", e)
            return
        for metric in _totals(model):
            # (the lift holds a Keras variable's TensorFlow variable, its .value)
            kind = found.get(id(metric.total), found.get(id(getattr(metric.total, "value", None))))
            if kind is not None:
                self.weighed.append((metric, kind == "mean"))

    def step(self, run, rows: int, batch_rows: int):
        """`run()` (the test step on this worker's `rows` of a batch of
        `batch_rows`) with each weighed metric's addition weighed by the
        worker's share; its logs, a weighed metric's named for it (and equal
        to its result) replaced by its result after the weighing."""
        before = [(m, float(m.total.numpy()), _count(m), mean) for m, mean in self.weighed]
        logs = run()
        if not before:
            return logs
        share = rows / batch_rows
        results = {}
        for m, total, count, mean in before:
            was = float(np.asarray(m.result()))
            added = float(m.total.numpy()) - total
            m.total.assign(total + added * (share if mean else 1.0))
            if count is not None:
                m.count.assign(count + (_count(m) - count) * share)
            results[m.name] = (was, m.result())
        if isinstance(logs, dict):
            logs = dict(logs)
            for name, (was, now) in results.items():
                value = logs.get(name)
                if value is not None and np.ndim(value) == 0 and np.isclose(
                        float(value), was, rtol=1e-6, atol=1e-12):
                    logs[name] = now
        return logs


def _totals(model) -> list:
    """The model's metrics that keep one total (Keras's Mean, with a count,
    and Sum, without)."""
    return [m for m in model.metrics if hasattr(m, "total") and np.ndim(m.total.numpy()) == 0]


def _count(metric) -> float | None:
    """A metric's count of additions (a Mean's), None for one without (a Sum)."""
    count = getattr(metric, "count", None)
    return None if count is None else float(count.numpy())


def _found(test_step, data) -> dict[int, str]:
    """{id of a TensorFlow variable: "mean" | "sum"} for the totals the traced
    step adds a mean over the batch to, or a sum over it fed as one value
    (transforms.batch_weights' find_batch_mean_increments and
    find_batch_sum_increments)."""
    import tensorflow as tf

    from autopar.transforms.analysis import writers_by_variable
    from autopar.transforms.batch_weights import (find_batch_mean_increments,
                                                  find_batch_sum_increments)
    from autopar.transforms.graph_index import GraphIndex
    from autopar.transforms.lift import lift

    def unknown_batch(a):
        if a is None:
            return None
        a = tf.convert_to_tensor(a)   # (a NumPy array of strings: a tf.string tensor)
        return tf.TensorSpec([None, *a.shape[1:]], a.dtype)
    lifted = lift(test_step.get_concrete_function(tf.nest.map_structure(unknown_batch, data)))
    index = GraphIndex(lifted.graph)
    writers = writers_by_variable(index)
    batch_local = index.batch_local(set())
    found = {}
    for kind, increments in (
            ("mean", find_batch_mean_increments(lifted.graph, writers, batch_local, batch_local)),
            ("sum", find_batch_sum_increments(lifted.graph, writers, batch_local, batch_local))):
        for variable, *_ in increments.values():
            if variable in lifted.python_variables:
                found[id(lifted.python_variables[variable])] = kind
    return found


class OwnTestStep:
    """A model's own test_step, traced as Keras's evaluate traces it, run on
    a worker's rows of a batch, the metrics it feeds one value per batch
    weighed by the worker's share (BatchValueMetrics, found at the first
    call)."""

    def __init__(self, model) -> None:
        import tensorflow as tf
        self.model = model
        self.traced = tf.function(model.test_step, jit_compile=False, reduce_retracing=True)
        self.metrics: BatchValueMetrics | None = None

    def __call__(self, data, rows: int, batch_rows: int):
        if self.metrics is None:
            self.metrics = BatchValueMetrics(self.model, self.traced, data)
        return self.metrics.step(lambda: self.traced(data), rows, batch_rows)
