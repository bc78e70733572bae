"""Distributed evaluation (Runner.evaluate) and the sum of a vector over all
workers it combines with (Runner.sum_over_workers)."""
from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.runtime.step.executor import run_plain
from autopar.runtime.step.fetch_map import FetchMapper
from autopar.runtime.step.graph_queries import reads_iterator
from autopar.runtime.step.training_step import StepFetches

log = logging.getLogger("autopar.runner")


class Evaluator:
    """`totals_allreduce(length)`: builds (placeholder, sum over workers) in
    the worker's graph for vectors of `length`, on first use; None: one
    worker, nothing to combine. `lockstep_lookups`: variables whose lookups
    are collectives of a group of workers (Config.aggregation_group), which
    evaluate() cannot run apart."""

    def __init__(self, session, mapper: FetchMapper, training: StepFetches, *,
                 worker_index: int = 0, num_workers: int = 1, totals_allreduce=None,
                 lockstep_lookups=()) -> None:
        self.session = session
        self._mapper = mapper
        self._training = training
        self.worker_index = worker_index
        self.num_workers = num_workers
        self._totals_allreduce = totals_allreduce
        self._totals_ops: dict[int, tuple] = {}
        self._lockstep_lookups = list(lockstep_lookups)

    def evaluate(self, metrics: dict, feed_dict=None, *, initializer=None,
                 max_batches: int | None = None, totals: bool = False) -> dict:
        """Evaluate `metrics` over this worker's shard of an eval set and
        combine them over all workers: the result is that of one device
        evaluating the whole set.

        `metrics`: {name: (sum, count)}, two scalar tensors per metric computed
        on one batch, e.g. ``(tf.reduce_sum(correct), tf.size(labels))`` for an
        accuracy or ``(tf.reduce_sum(losses), tf.size(losses))`` for a mean
        loss. Batches come from a tf.data iterator over a dataset sharded with
        ``autopar.shard`` (before ``.batch``): batches are run until it ends
        (OutOfRangeError), or for at most `max_batches`. `initializer`: run
        first, e.g. an initializable iterator's initializer, so the set can
        be evaluated again. `feed_dict`: fed with every batch.

        Returns {name: total sum / total count} over every worker's batches
        (sums and counts added in float64, then one all-reduce of the totals),
        or {name: (total sum, total count)} with ``totals=True``. Every worker
        must call evaluate at the same point with the same metrics (the
        all-reduce waits for all of them); evaluation is not a training step."""
        if self._lockstep_lookups:
            raise AutoparError(
                "Runner.evaluate: the plan's aggregation groups (Config.aggregation_group, or "
                "the cost model's choice when it is None: see the plan report) make each "
                f"lookup of {', '.join(self._lockstep_lookups[:3])} a collective of a group of "
                "workers, and workers evaluating their own shards run different numbers of "
                "batches; evaluate in a job with Config(aggregation_group=0) (the hosts)")
        names, fetches = self._eval_fetches(metrics)
        if max_batches is None and not reads_iterator(fetches):
            raise AutoparError(
                "Runner.evaluate runs batches until the eval set's tf.data iterator ends, but "
                f"the metrics {names} read no iterator: build them on an iterator over "
                "autopar.shard(eval_dataset).batch(b), or pass max_batches")
        if initializer is not None:
            run_plain(self.session, self._mapper.fetch(initializer), {})
        feeds, _ = self._mapper.feeds(feed_dict or {})
        local = np.zeros(2 * len(names), np.float64)
        batches = 0
        while max_batches is None or batches < max_batches:
            try:
                values = self.session.run(fetches, feed_dict=feeds or None)
            except tf.errors.OutOfRangeError:
                break
            local += np.asarray(values, np.float64)
            batches += 1
        combined = self.sum_over_workers(local)
        log.debug("worker %d evaluated %d batches: %s", self.worker_index, batches, local)
        out = {}
        for k, name in enumerate(names):
            total, count = float(combined[2 * k]), float(combined[2 * k + 1])
            if totals:
                out[name] = (total, count)
            elif count == 0:
                log.warning("evaluate: metric %r counted no examples on any worker", name)
                out[name] = float("nan")
            else:
                out[name] = total / count
        return out

    def _eval_fetches(self, metrics) -> tuple[list[str], list[tf.Tensor]]:
        """Metric names and [sum0, count0, sum1, count1, ...] in this graph."""
        if not isinstance(metrics, dict) or not metrics:
            raise AutoparError("Runner.evaluate takes a non-empty dict {name: (sum, count)} of "
                               f"scalar tensors, got {type(metrics).__name__}")
        names, fetches = [], []
        for name, pair in metrics.items():
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise AutoparError(f"Runner.evaluate: metric {name!r} must be a pair (sum, count) "
                                   "of scalar tensors computed on one batch")
            for t in pair:
                mapped = self._mapper.fetch(t)
                if not isinstance(mapped, tf.Tensor) or mapped.shape.rank not in (0, None):
                    raise AutoparError(f"Runner.evaluate: metric {name!r}: {t!r} is not a scalar "
                                       "tensor (sum or count over one batch)")
                if self._training.is_step(mapped):
                    raise AutoparError(f"Runner.evaluate: metric {name!r} runs a training step "
                                       f"({mapped.name} depends on a variable update); evaluate "
                                       "tensors that only read the model")
                fetches.append(mapped)
            names.append(str(name))
        return names, fetches

    def sum_over_workers(self, local: np.ndarray) -> np.ndarray:
        """The element-wise sum of a float64 vector over all workers (each
        passes its own; every worker must call it with the same length, in
        the same order). Distributed evaluation's collective; DropCompute's
        agreement without a job coordinator uses it too."""
        if self._totals_allreduce is None or self.num_workers == 1:
            return local
        n = len(local)
        if n not in self._totals_ops:
            self._totals_ops[n] = self._totals_allreduce(n)
        placeholder, summed = self._totals_ops[n]
        return np.asarray(self.session.run(summed, {placeholder: local}), np.float64)

