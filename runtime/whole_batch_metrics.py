"""Compiled metrics whose state does not add up over the workers' rows.

autopar.fit updates the compiled metrics on each worker's rows of a batch
and sums their state over the workers (runtime/keras_fit.py `_Metrics`):
one device's state when each update adds what each example contributes (a
Mean of per-example values: sums and counts; a confusion count). A metric
function that reduces the batch to one value (TensorFlow's Transformer
tutorial's `masked_accuracy`, the matches' sum over the mask's) is not
such: Keras's MeanMetricWrapper adds that value once per batch, so the
epoch's result is the mean of each batch's ratio, and the workers' summed
state would be the mean of each share's ratio instead, silently.

Which metric is which is read from data flow: a MeanMetricWrapper's
function is traced on the outputs' specs and its result must hold one row
per example, each computed from its own example alone
(transforms.example_rows); Keras's other metric classes add up by
construction (confusion counts). Any other metric (its function not
traceable, a result reduced over the batch or mixing its examples, a
Metric subclass of the program's own) is a whole-batch metric: the chief
alone updates it, on the whole batch, and every worker takes the chief's
state. In training the batch's predictions are the workers' rows of it,
put together (`whole_rows`: one sum over workers of each worker's rows in
their places, exact); in validation the chief predicts the whole batch
itself (inference draws nothing).
"""
from __future__ import annotations

import contextlib

import numpy as np


class WholeBatchMetrics:
    """The compiled metrics of a model that are updated on whole batches:
    `metrics`, (output index, weighted, metric) each."""

    def __init__(self, metrics: list[tuple[int, bool, object]]) -> None:
        self.metrics = metrics

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def variables(self) -> list:
        return [v for _, _, m in self.metrics for v in m.variables]

    def names(self) -> list[str]:
        return [m.name for _, _, m in self.metrics]

    def untouched(self):
        """Around an update of every compiled metric on a worker's rows:
        these keep the state they had."""
        return kept_state(self.variables())

    def update(self, compiled, y, y_pred, sample_weight=None) -> None:
        """Update each on a whole batch, as Keras's CompileMetrics updates
        it (`compiled`: the model's): the output's targets and predictions,
        the batch's weights for a weighted metric."""
        ys, predictions = compiled._flatten_y(y), compiled._flatten_y(y_pred)
        weights = [None] * len(ys)
        if sample_weight is not None:
            weights = compiled._flatten_y(sample_weight)
            if len(weights) < len(ys):   # one weight array for every output, as Keras
                weights = [weights[0]] * len(ys)
        for i, weighted, metric in self.metrics:
            metric.update_state(ys[i], predictions[i],
                                sample_weight=weights[i] if weighted else None)

    def others(self, model) -> list:
        """The model's metrics but these: the loss trackers and the compiled
        metrics that add up."""
        compiled = getattr(model, "_compile_metrics", None)
        mine = {id(m) for _, _, m in self.metrics}
        out = [m for m in model.metrics if m is not compiled]
        if compiled is not None:
            out += [m for _, _, m in _compiled_metrics(compiled) if id(m) not in mine]
        return out


@contextlib.contextmanager
def kept_state(variables):
    """Around code that updates metrics: `variables` end as they began."""
    before = [v.numpy() for v in variables]
    yield
    for variable, value in zip(variables, before):
        variable.assign(value)


def find_whole_batch_metrics(model, y, y_pred) -> WholeBatchMetrics:
    """The model's compiled metrics that do not add up over rows (the
    module's docstring), from the batch's targets `y` and predictions
    `y_pred` (their dtypes and shapes past the first: each worker passes
    its own rows, and all find the same). Builds the compiled metrics as
    Keras does at their first update."""
    compiled = getattr(model, "_compile_metrics", None)
    if compiled is None:
        return WholeBatchMetrics([])
    if not compiled.built:
        compiled.build(y, y_pred)
    ys, predictions = compiled._flatten_y(y), compiled._flatten_y(y_pred)
    return WholeBatchMetrics([
        (i, weighted, metric) for i, weighted, metric in _compiled_metrics(compiled)
        if not _adds_up(metric, ys[i], predictions[i])])


def _compiled_metrics(compiled) -> list[tuple[int, bool, object]]:
    """(output index, weighted, metric) of each compiled metric (Keras's
    CompileMetrics keeps them per output; no public API lists them so)."""
    out = []
    for weighted, lists in ((False, compiled._flat_metrics),
                            (True, compiled._flat_weighted_metrics)):
        for i, metrics in enumerate(lists):
            out += [(i, weighted, m) for m in (metrics.metrics if metrics else ())]
    return out


def _adds_up(metric, y, y_pred) -> bool:
    """Whether the metric's state is the sum of what each example adds."""
    import keras
    if not type(metric).__module__.startswith("keras."):
        return False   # the program's own Metric: nothing known of its update
    if not isinstance(metric, keras.metrics.MeanMetricWrapper):
        return True    # Keras's confusion-count metrics, its Mean, Sum...
    # (the wrapped function: no public API)
    return _per_example(lambda a, b: metric._fn(a, b, **metric._fn_kwargs), y, y_pred)


def _per_example(fn, y, y_pred) -> bool:
    """Whether fn(y, y_pred), traced on specs of any batch size, gives one
    row per example computed from that example alone."""
    import tensorflow as tf

    from autopar.common.errors import UnsupportedGraphError
    from autopar.transforms.example_rows import BATCH, ExampleRows

    def spec(a):
        a = np.asarray(a)
        return tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype))
    try:
        traced = tf.function(fn, autograph=False).get_concrete_function(spec(y), spec(y_pred))
        outputs = traced.graph.outputs
        if len(outputs) != 1:
            return False
        return ExampleRows(traced.graph).form(outputs[0]) == ("rows", 0, BATCH, 1, 1)
    except (TypeError, ValueError, UnsupportedGraphError, NotImplementedError):
        return False   # not traceable: nothing proven


def whole_rows(runner, mine: list[np.ndarray], batch_rows: int) -> list[np.ndarray]:
    """The batch's arrays from each worker's rows of them (`mine`: this
    worker's, rows w, w+N, ... of a batch of `batch_rows`; every worker has
    some, of the same shapes past the first): each worker puts its rows in
    their places among zeros and the workers' arrays are summed, exactly
    (a sum with zeros). Every worker calls it at the same point."""
    n, me = runner.num_workers, runner.worker_index
    placed = []
    for a in mine:
        a = np.asarray(a)
        whole = np.zeros((batch_rows, *a.shape[1:]), np.float64)
        whole[me::n] = a
        placed.append(whole)
    flat = np.concatenate([p.ravel() for p in placed]) if placed else np.zeros(0)
    # (sizes rounded up to a power of two: one collective per size, and
    # padded lengths make many)
    padded = np.zeros(1 << max(int(flat.size - 1).bit_length(), 0))
    padded[:flat.size] = flat
    summed = runner.sum_over_workers(padded)
    out, offset = [], 0
    for a, p in zip(mine, placed):
        dtype = np.asarray(a).dtype
        out.append(summed[offset:offset + p.size].reshape(p.shape).astype(dtype))
        offset += p.size
    return out
