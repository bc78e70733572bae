"""The loop behind autopar.fit (autopar/api.py): a compiled Keras 3 model
trained as `model.fit` trains it, on every worker of a job, with one
device's result. `prepare` checks fit()'s arguments and traces the step,
the API hands the step to get_runner, `train_on` runs the epochs on the
Runner it returns.

Keras's own fit() runs its train step in a loop autopar cannot take over;
this loop runs the same computation through a traced step of our own (the
compiled loss plus the model's regularization losses, differentiated by a
GradientTape, applied by the compiled optimizer; traced with jit_compile
off) that autopar.get_runner lifts and distributes like any tf.function step
(transforms.lift). What Keras users expect of fit() holds:

- `batch_size` is the global batch: each step's batch is the one one device
  would take (Keras's fit's shuffled order, drawn by the chief for every
  worker: runtime/fit_data.keras_order; with an int `seed`, a permutation
  seeded by it and the epoch), and worker i trains on its rows
  i, i+N, i+2N, ... of it (as autopar.shard splits a dataset, so that a
  dropout mask drawn per example is one device's: transforms.random_draws).
  A batch that does not divide by N (any batch, as one device takes any:
  265 on 3 workers; an epoch's last, smaller one, as in Keras's fit) trains
  in unequal shares (3/3/2/2 of 10 rows over 4 workers), each worker
  weighing its gradients by its rows (transforms.batch_weights), so the
  step is one device's; a batch with fewer rows than workers is refused
  (every worker needs a row of it). With micro-batches b must divide by N
  times their number, and a batch that does not split into N equal shares
  and each share into its micro-batches is refused (their gradients are
  averaged with equal weights).
- x and y may be lists or dicts of arrays (several inputs or outputs), or
  x a tf.data.Dataset of batches (runtime/fit_data.py):
  every worker reads all of it, as Keras's fit does, and trains on its rows
  of each batch; a batch that does not split over the workers fails the
  job before its step, on every worker, naming it.
- Metrics and the loss are aggregated over all workers: each worker updates
  the compiled metrics on its rows, then their state variables (sums and
  counts for Mean-like and confusion-count metrics) are summed over workers,
  so the logs are the whole epoch's, as one device reports them; a metric
  whose state is no sum of its examples' (a ratio per batch) the chief
  computes from whole batches (runtime/whole_batch_metrics.py). The model
  is called as Keras's fit calls it (`_called`). Keras logs
  the mean of its batches' losses weighted by their sizes: a batch's loss is
  the workers' mean, or their sum when the loss sums over the batch.
- `validation_data` is evaluated at each epoch's end in Keras's batches,
  each worker on its rows of each, aggregated the same way ("val_" logs).
- Callbacks run on the chief only, every hook at the point Keras's fit
  runs it, with the aggregated logs and the model holding the trained
  values; the chief alone prints one line per epoch. What a hook changes
  (model.stop_training, a learning rate, restored weights) every worker
  takes before the next step (runtime/fit_callbacks.py).
  The model and its optimizer hold the trained values on every worker when
  fit returns (model.save() works anywhere).
- A model that overrides train_step trains by its own step, traced as
  Keras's fit traces it (_traced_own_step); the metrics it updates in the
  graph are reset on every worker at each epoch's start and combined over
  workers at its end (_Metrics.own_step_result). An overridden test_step
  validates, each worker on its rows, combined the same way, a Mean it
  feeds one value per batch weighed by the worker's share
  (runtime/batch_value_metrics.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

import numpy as np

from autopar.runtime.batch_value_metrics import OwnTestStep
from autopar.runtime.fit_callbacks import FitCallbacks, chief_array, executions
from autopar.runtime.fit_data import (ArrayBatches, DatasetBatches, PyDatasetBatches, digest, flat,
                                      rows, size)
from autopar.runtime.whole_batch_metrics import find_whole_batch_metrics, kept_state, whole_rows

log = logging.getLogger("autopar.fit")
# Batches read by every worker from the program's own dataset, each pass
# afresh (validation_data given as one)
BATCHES = (DatasetBatches, PyDatasetBatches)
# Logs of a model's own train_step said once to be the workers' mean.
_MEANS_NOTED: set[str] = set()
# Keras's fit() batch_size when none is given (arrays, and validation arrays).
DEFAULT_BATCH_SIZE = 32


class History:
    """What fit returns: as Keras's History, `history[name]` is the list of
    per-epoch values (the same on every worker), `epoch` the epochs
    trained, `params` the callbacks' params and `model` the model; and
    which worker of how many this is."""

    def __init__(self, worker_index: int = 0, num_workers: int = 1, params: dict | None = None,
                 model=None) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []
        self.params = params or {}
        self.model = model
        self.worker_index = worker_index
        self.num_workers = num_workers

    def add(self, epoch: int, logs: dict) -> None:
        self.epoch.append(epoch)
        for name, value in logs.items():
            self.history.setdefault(name, []).append(value)


@dataclass
class FitJob:
    """A fit() prepared (`prepare`): the model's traced step, which the API
    distributes (autopar.fit hands `step()` to get_runner), and what
    `train` runs it on."""
    model: object
    train: object                 # the training batches (runtime/fit_data.py)
    validation_data: object       # None, arrays (x, y[, weights]) or batches
    train_step: object            # the traced step (a tf.function)
    own_step: bool                # the model overrides train_step
    own_test_step: bool           # ... test_step
    # fit()'s arguments the loop reads
    epochs: int
    batch_size: int | None
    callbacks: list
    verbose: int
    validation_freq: object
    validation_batch_size: int | None
    initial_epoch: int
    steps_per_execution: int      # compile()'s: batches a call of Keras's train function runs

    def step(self):
        """The ConcreteFunction of one training step on one batch."""
        return self.train_step.get_concrete_function(*self.train.specs())

    def deferred_step(self):
        """`step`, for get_runner to trace only where its graph is needed
        (runtime/step_graph.py), with the variables a trace may capture
        as they are now, before any trace, and the optimizers it may build
        (runtime/fit_step_variables.py)."""
        from autopar.runtime.fit_step_variables import StepVariables
        from autopar.runtime.step_graph import DeferredStep
        variables = StepVariables(self.model)
        return DeferredStep(self.step, variables.variables, variables.made_by_trace,
                            variables.remake)


def prepare(model, x, y=None, *, epochs: int = 1,
            batch_size: int | None = None, validation_data=None, callbacks=(),
            shuffle: bool = True, seed: int | None = None, verbose: int = 1, sample_weight=None,
            class_weight=None, validation_split: float = 0.0, validation_freq=1,
            validation_batch_size: int | None = None, initial_epoch: int = 0,
            steps_per_epoch: int | None = None, validation_steps: int | None = None,
            **unsupported) -> FitJob:
    """fit()'s arguments checked (refused, before anything starts, naming
    the argument) and its batches and traced step made."""
    import keras
    import tensorflow as tf

    from autopar.common.errors import AutoparError

    if not isinstance(model, keras.Model):
        raise AutoparError(
            f"autopar.fit trains a Keras 3 model (keras.Model); got a "
            f"{type(model).__module__}.{type(model).__name__}"
            + (" of Keras 2 (tf.keras under TF_USE_LEGACY_KERAS=1, or tf_keras)"
               if type(model).__module__.startswith(("tf_keras", "keras.src.engine")) else "")
            + ": write its training step as a tf.function and run it with autopar.get_runner "
            "(docs/tf2-keras.md)")
    own_step, own_test_step = (type(model).train_step is not keras.Model.train_step,
                               type(model).test_step is not keras.Model.test_step)
    # a model computing its own loss (an overridden compute_loss) compiles
    # none, as does one training by its own step
    own_loss = type(model).compute_loss is not keras.Model.compute_loss
    if (not getattr(model, "compiled", False) if own_step else
            getattr(model, "optimizer", None) is None
            or (getattr(model, "loss", None) is None and not own_loss)):
        raise AutoparError("autopar.fit: compile the model first "
                           "(model.compile(optimizer=..., loss=..., metrics=...))")
    if unsupported:
        raise AutoparError(f"autopar.fit does not take fit()'s {', '.join(sorted(unsupported))} "
                           "(it takes x, y, epochs, batch_size, validation_data, callbacks, "
                           "shuffle, seed, verbose, sample_weight, class_weight, "
                           "validation_split, validation_freq, validation_batch_size, "
                           "initial_epoch, steps_per_epoch, validation_steps)")
    _should_validate(0, validation_freq)   # refused here, before any training, if malformed
    # compile()'s steps_per_execution: how Keras's fit calls the callbacks'
    # per-batch hooks and reads the data (runtime/fit_callbacks.executions)
    per_call = getattr(model, "steps_per_execution", 1)
    if per_call is None:
        raise AutoparError("autopar.fit: compile()'s steps_per_execution is a positive int, "
                           "got None")
    _refuse_unless_positive_int("compile()'s steps_per_execution", per_call)
    per_call = int(per_call)
    _refuse_unless_positive_int("validation_batch_size", validation_batch_size)
    floatx = keras.config.floatx()
    inputs = getattr(model, "inputs", None)
    input_rank = len(inputs[0].shape) if inputs else None
    if isinstance(x, tf.data.Dataset):
        for name, value in (("y", y), ("batch_size", batch_size), ("sample_weight", sample_weight),
                            ("validation_split", validation_split or None)):
            if value is not None:
                raise AutoparError(f"autopar.fit: {name} is not given with a tf.data.Dataset x "
                                   "(its batches hold the targets and weights), as fit")
        if class_weight is not None and len(tf.nest.flatten(x.element_spec[1:2])) > 1:
            raise AutoparError("autopar.fit: class_weight is for a model with one output "
                               "(as fit)")
        train = DatasetBatches(x, "the dataset x", None if class_weight is None else
                               lambda yb: _sample_weights(yb, None, class_weight, floatx),
                               input_rank, steps_per_epoch, persistent=True,
                               x_only=own_step, per_call=per_call)
    elif isinstance(x, keras.utils.PyDataset):
        for name, value in (("y", y), ("batch_size", batch_size), ("sample_weight", sample_weight),
                            ("validation_split", validation_split or None),
                            ("steps_per_epoch", steps_per_epoch)):
            if value is not None:
                raise AutoparError(f"autopar.fit: {name} is not given with a PyDataset x (its "
                                   "batches hold the targets and weights; an epoch is every "
                                   "batch)")
        train = PyDatasetBatches(x, "x", None if class_weight is None else
                                 lambda yb: _sample_weights(yb, None, class_weight, floatx),
                                 x_only=own_step, shuffle=bool(shuffle))
    else:
        if steps_per_epoch is not None:
            raise AutoparError("autopar.fit: steps_per_epoch is for a tf.data.Dataset x that "
                               "repeats; with arrays an epoch is every batch")
        train, split_off = _array_batches(x, y, batch_size, sample_weight, class_weight,
                                          validation_split, shuffle, seed, floatx, own_step)
        if validation_data is None:
            validation_data = split_off
    if isinstance(validation_data, tf.data.Dataset):
        validation_data = DatasetBatches(validation_data, "validation_data",
                                         input_rank=input_rank, steps=validation_steps,
                                         x_only=own_test_step, per_call=per_call)
    elif isinstance(validation_data, keras.utils.PyDataset):
        validation_data = PyDatasetBatches(validation_data, "validation_data",
                                           x_only=own_test_step)
    elif validation_steps is not None:
        raise AutoparError("autopar.fit: validation_steps is for validation_data given as a "
                           "tf.data.Dataset that repeats")
    if validation_data is not None and not isinstance(validation_data, BATCHES) and (
            not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3)):
        raise AutoparError("autopar.fit: validation_data is (x, y), (x, y, sample_weight), a "
                           f"tf.data.Dataset or a PyDataset, got {type(validation_data).__name__}")
    # The step takes x's and y's arrays one by one (Runner.call feeds flat
    # inputs), then the weights; a model with several inputs or outputs
    # gets them back as the list or dict it takes.
    train_step = (_traced_own_step if own_step else _compiled_step)(model, train)
    return FitJob(model, train, validation_data, train_step, own_step, own_test_step, epochs,
                  batch_size, list(callbacks), verbose, validation_freq, validation_batch_size,
                  initial_epoch, per_call)


def train_on(job: FitJob, runner) -> History:
    """Run the prepared fit on `runner` (the Runner get_runner made of
    job.step()): Keras's fit loop, every worker on its rows of each batch."""
    from autopar.common.errors import AutoparError
    model, train, validation_data = job.model, job.train, job.validation_data
    own_step, own_test_step = job.own_step, job.own_test_step
    epochs, verbose = job.epochs, job.verbose
    ny = len(flat(train.structure()[1]))
    n, me = runner.num_workers, runner.worker_index
    runner.equal_shares = True   # a batch trains only when it splits into equal shares (below)
    # The metrics are read at each epoch's end (the compiled step's in
    # Python, from its outputs: the compiled loss's trackers it updates in
    # the graph are not the logs)
    runner.sync_state_each_call = False
    sums = runner.loss_reduction == "sum"
    # Each worker's share of a batch is split again into its micro-batches
    # (Config.micro_batches): a batch trains when it splits into n * m.
    parts = n * runner.micro_batches
    shares = f"the {n} workers" + (f" times {runner.micro_batches} micro-batches"
                                   if runner.micro_batches > 1 else "")
    # A batch that does not split into equal shares (an epoch's last) trains
    # when the workers' gradients combine exactly over shares of any size;
    # every worker needs a row of it, and micro-batches equal shares of it.
    any_shares = runner.micro_batches == 1 and runner.combines_unequal_batches()
    counted = _counts_loss(runner)
    try:
        # (a batch splits over the workers in shares of any size when their
        # gradients combine exactly, as one device takes any batch)
        train.check(parts, shares, n if any_shares and n > 1 else None)
    except AutoparError:
        runner.close()
        raise
    if isinstance(train, (ArrayBatches, PyDatasetBatches)):
        # Keras's shuffle draws from each process's random state, which
        # nothing makes equal (a program without keras.utils.set_random_seed):
        # the chief draws the order, every worker takes it
        train.chief_order = lambda draw, n: chief_array(
            runner, draw() if runner.is_chief else np.zeros(n)).astype(np.int64)
    params = dict(verbose=verbose, epochs=epochs, steps=train.num_batches())
    history = History(me, n, params, model)
    test_step = OwnTestStep(model) if own_test_step else _test_step(model)
    # Last of the callbacks, as Keras's History: the epoch's logs with what
    # the others added (LearningRateScheduler's learning_rate).
    seen = _epoch_logs()
    callbacks = FitCallbacks(runner, model, job.callbacks + [seen], params)
    model.stop_training = False
    training_logs = None   # (Keras's fit, trained for no epoch, gives on_train_end None)
    whole = None   # the compiled metrics updated on whole batches, found at the first
    with runner:
        # (synced here: a restored checkpoint is not the Python values)
        callbacks.run(lambda c: c.on_train_begin())
        # As Keras's fit: from the epoch a callback restored (BackupAndRestore,
        # on the chief; FitCallbacks gives it to every worker)
        for epoch in range(callbacks.initial_epoch or job.initial_epoch, epochs):
            # Keras's fit resets the metrics before on_epoch_begin
            metrics = _Metrics(model, sums, counted, whole)
            if own_step:
                # the step's own metric updates run in the graph: each
                # worker's copies start the epoch from Keras's reset too
                runner.assign_python_values(metrics.variables())
            callbacks.run(lambda c: c.on_epoch_begin(epoch))
            step_logs, last_rows, stopping = {}, 0, False
            for begin, end, batches in executions(train.epoch(epoch), job.steps_per_execution):
                if not batches and not train.read_past_end():
                    break
                # (a callback stops training after the call, as in Keras's fit)
                stopping = callbacks.wants("train_begin") and callbacks.run(
                    lambda c: c.on_train_batch_begin(begin))
                if not batches:
                    # Keras's fit calls its train function once more, past
                    # the end of a dataset of unknown length: the call fails
                    # for want of a batch, after the step's writes that wait
                    # for none ran (its optimizer counts one more iteration,
                    # each dropout draws from its next seed); a call of
                    # several steps first asks for a batch, and runs none
                    if job.steps_per_execution == 1:
                        runner.run_input_free_writes()
                    break
                for step, (xb, yb, wb) in enumerate(batches, begin):
                    if step == 0 and isinstance(train, PyDatasetBatches):
                        _refuse_unless_read_alike(runner, (xb, yb, wb), epoch)
                    if size(xb) % parts and not (any_shares and size(xb) >= n):
                        # (every worker reads this batch, so every worker stops here)
                        raise AutoparError(
                            f"autopar.fit: epoch {epoch + 1}, batch {step + 1} has {size(xb)} "
                            f"examples, which do not split over {shares}"
                            + (": each needs a row of every batch" if any_shares else "")
                            + " (one device trains on it); batch the data so that no batch has "
                            f"fewer than {n if any_shares else parts} examples"
                            + ("" if any_shares else f" or a count that does not divide by {parts}")
                            + " (drop_remainder=True drops a last, smaller one)")
                    mine = slice(me, None, n)
                    x_mine, y_mine = rows(xb, mine), rows(yb, mine)
                    weighted = () if wb is None else (wb[mine],)
                    last_rows = size(x_mine)
                    if own_step:
                        step_logs = runner.call(*flat(x_mine), *flat(y_mine), *weighted)
                    else:
                        _train_batch(runner, model, metrics, x_mine, y_mine, weighted, size(xb),
                                     ny, sums, counted, (yb, wb))
                        if whole is None and metrics.whole and runner.is_chief:
                            log.info("metrics of whole batches (%s: a batch's value is no sum "
                                     "of its examples'): the chief computes them from each "
                                     "batch's predictions, which the workers' rows make up",
                                     ", ".join(metrics.whole.names()))
                        whole = metrics.whole
                    callbacks.stepped()
                if callbacks.wants("train_end"):
                    batch_logs = (metrics.own_step_result(runner, step_logs, rows=last_rows,
                                                          keep=True) if own_step
                                  else metrics.result(runner, keep=True))
                    stopping = callbacks.run(lambda c: c.on_train_batch_end(end, batch_logs))
                if stopping or model.stop_training:
                    break
            logs = (metrics.own_step_result(runner, step_logs, rows=last_rows) if own_step
                    else metrics.result(runner))
            validating = validation_data is not None and _should_validate(epoch, job.validation_freq)
            if validating:
                callbacks.sync()
                logs.update({f"val_{k}": v for k, v in
                             _evaluate(model, validation_data,
                                       job.validation_batch_size or job.batch_size
                                       or DEFAULT_BATCH_SIZE,
                                       runner, test_step, sums, own_test_step,
                                       callbacks, whole, job.steps_per_execution).items()})
            if runner.is_chief and verbose:
                log.info("epoch %d/%d: %s", epoch + 1, epochs,
                         "  ".join(f"{k} {v:.4f}" for k, v in logs.items()))
            # A callback may stop training (EarlyStopping sets
            # model.stop_training): callbacks run on the chief, whose
            # decision every worker follows, so all run the same steps.
            # (on_train_end gets the last epoch's logs as fit made them, not
            # what callbacks add to them: Keras's callbacks get a copy)
            training_logs = dict(logs)
            stopped = callbacks.run(lambda c: c.on_epoch_end(epoch, logs))
            # What the callbacks added to the logs (LearningRateScheduler's
            # learning_rate) is in Keras's History, which records them last.
            history.add(epoch, _chief_logs(runner, seen.logs or logs))
            if stopped:
                break
        callbacks.run(lambda c: c.on_train_end(training_logs))
    model.history = history
    return history


def _train_batch(runner, model, metrics, x, y, weighted: tuple, batch_rows: int, ny: int,
                 sums: bool, counted: bool, batch: tuple) -> None:
    """One step of the compiled step on this worker's rows x, y (and
    weights) of a batch of `batch_rows`, its loss and predictions handed to
    the epoch's metrics; `batch`: the whole batch's targets and weights
    (or None), for the metrics updated on whole batches."""
    loss, y_pred, masks = runner.call(*flat(x), *flat(y), *weighted)
    raw = (y_pred, masks)
    y_pred = _with_masks(y_pred, masks)
    if ny > 1:
        # each output's loss tracker, which the compiled loss updates (the
        # traced step's updates are the graph's)
        with metrics.output_losses(size(x), batch_rows):
            _compute_loss(model, x, y, y_pred, *weighted, training=True)
    metrics.update(y, y_pred, _tracked_loss(loss, size(x), batch_rows, sums,
                                            runner.micro_batches),
                   size(x), batch_rows, *weighted,
                   loss_count=runner.last_loss_counts[0] if counted else 0.0)
    if metrics.whole:
        # the batch's predictions, each worker's rows in their places
        import tensorflow as tf
        parts = [a for a in tf.nest.flatten(raw) if a is not None]
        wholes = iter(whole_rows(runner, parts, batch_rows))
        y_pred, masks = tf.nest.map_structure(lambda a: None if a is None else next(wholes), raw)
        if runner.is_chief:
            metrics.whole.update(model._compile_metrics, batch[0], _with_masks(y_pred, masks),
                                 batch[1])



def _tracked_loss(loss, rows: int, batch_rows: int, sums: bool, micro_batches: int = 1) -> float:
    """The figure _Metrics.update takes for this worker's `loss` of its
    `rows` of a batch of `batch_rows`. A scalar as it is: runner.call's
    loss is its micro-batches' mean, their sum this worker's when the loss
    sums over the batch. A loss of one value per example (a compiled loss
    of `reduction=None`, whose sum Keras differentiates): Keras's loss
    tracker adds each example's value, averaged over any further axes, and
    counts the batch's rows; the figure is what adds this worker's
    examples' values to the total (a micro-batch's values are their mean
    over the micro-batches, position by position)."""
    value = np.asarray(loss, dtype=np.float64)
    if value.ndim == 0:
        return float(value) * (micro_batches if sums else 1)
    total = float(np.sum(value.reshape(len(value), -1).mean(axis=1))) if value.size else 0.0
    return total * micro_batches / (batch_rows if sums else rows)

def _array_batches(x, y, batch_size, sample_weight, class_weight, validation_split: float,
                   shuffle, seed: int | None, floatx: str,
                   own_step: bool = False) -> tuple[ArrayBatches, tuple | None]:
    """The global batches of arrays x and y, or lists or dicts of arrays
    (sample or class weights), and the last `validation_split` of the
    examples split off (or None). A model's own train_step (`own_step`)
    may take x alone, as Keras's fit hands it: y is then ()."""
    import tensorflow as tf

    from autopar.common.errors import AutoparError
    if y is None and own_step:
        y = ()
    if y is None or not all(hasattr(a, "__len__") for a in (x, y)):
        raise AutoparError(
            f"autopar.fit takes the examples as arrays x and y (or lists or dicts of arrays), "
            f"a tf.data.Dataset of batches or a keras.utils.PyDataset (got x: "
            f"{type(x).__name__}, y: "
            f"{type(y).__name__}); for a generator, write the training step as a tf.function "
            "and feed it this worker's batches of autopar.shard(dataset) through "
            "autopar.get_runner (docs/tf2-keras.md)")
    x, y = (tf.nest.map_structure(np.asarray, a) for a in (x, y))
    lengths = {len(a) for a in flat(x) + flat(y)}
    if len(lengths) > 1:
        raise AutoparError(f"autopar.fit: x and y hold different numbers of examples "
                           f"({sorted(lengths)})")
    if class_weight is not None and len(flat(y)) != 1:
        raise AutoparError("autopar.fit: class_weight is for a model with one output (as fit)")
    _refuse_unless_positive_int("batch_size", batch_size)
    validation = None
    if validation_split:
        x, y, sample_weight, validation = _split_off_validation(x, y, sample_weight,
                                                                validation_split)
    return ArrayBatches(x, y, _sample_weights(y, sample_weight, class_weight, floatx),
                        DEFAULT_BATCH_SIZE if batch_size is None else batch_size, shuffle,
                        seed), validation


def _refuse_unless_positive_int(name: str, value) -> None:
    """A count fit() takes (batch_size, validation_batch_size), when given."""
    from autopar.common.errors import AutoparError
    if value is not None and (not isinstance(value, (int, np.integer))
                              or isinstance(value, bool) or value < 1):
        raise AutoparError(f"autopar.fit: {name} is a positive int, got {value!r}")


def _split_off_validation(x, y, sample_weight, fraction: float):
    """(x, y, sample_weight) of training and the validation data: the last
    `fraction` of the examples, before any shuffling, as Keras's fit splits
    them (class weights apply to training only)."""
    from autopar.common.errors import AutoparError
    split_at = int(np.floor(size(x) * (1.0 - fraction)))
    if split_at in (0, size(x)):
        raise AutoparError(f"autopar.fit: validation_split={fraction} leaves no training or no "
                           f"validation examples of the {size(x)}")
    weights = None if sample_weight is None else np.asarray(sample_weight)
    train, valid = slice(0, split_at), slice(split_at, None)
    return (rows(x, train), rows(y, train), None if weights is None else weights[train],
            (rows(x, valid), rows(y, valid), None if weights is None else weights[valid]))


def _should_validate(epoch: int, freq) -> bool:
    """Whether epoch `epoch` (from 0) ends with validation: every `freq`-th
    epoch, or those of a list (counted from 1), as Keras's fit."""
    from autopar.common.errors import AutoparError
    if isinstance(freq, int) and not isinstance(freq, bool) and freq > 0:
        return (epoch + 1) % freq == 0
    if isinstance(freq, (list, tuple)):
        return epoch + 1 in freq
    raise AutoparError(f"autopar.fit: validation_freq is a positive int or a list of epochs, "
                       f"got {freq!r}")


def _sample_weights(y, sample_weight, class_weight, floatx: str):
    """Each example's weight in the loss (and weighted metrics), as Keras's
    fit takes them: `sample_weight` one per example (or per position of a
    sequence), or `class_weight` by
    class (y's integer class, or its arg-max when one-hot; 1 for a class
    it does not list); None without either."""
    from autopar.common.errors import AutoparError
    if sample_weight is not None and class_weight is not None:
        raise AutoparError("autopar.fit: give sample_weight or class_weight, not both (as fit)")
    if class_weight is not None:
        classes = y.reshape(len(y), -1)
        classes = (np.argmax(classes, axis=-1) if classes.shape[1] > 1
                   else classes[:, 0])
        return np.array([class_weight.get(int(c), 1.0) for c in np.round(classes)], floatx)
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, floatx)
    # (a sequence's targets, [examples, length], may have one per position)
    shapes = {(size(y),)} | {tuple(np.shape(a)[:2]) for a in flat(y) if np.ndim(a) == 2}
    if weights.shape not in shapes:
        raise AutoparError(f"autopar.fit: sample_weight has shape {weights.shape}; it takes one "
                           f"weight per example, shape ({size(y)},)" +
                           ("" if len(shapes) == 1 else ", or per position of the sequence, "
                            + " or ".join(str(s) for s in sorted(shapes) if len(s) == 2)))
    return weights


def _epoch_logs():
    """A callback keeping the logs of the last epoch's end as the callbacks
    before it left them."""
    import keras

    class EpochLogs(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.logs: dict = {}

        def on_epoch_end(self, epoch, logs=None):
            self.logs = dict(logs or {})
    return EpochLogs()


def _chief_logs(runner, logs: dict) -> dict:
    """The chief's numeric logs, the same on every worker (callbacks run on
    the chief alone and may add to them)."""
    if runner.num_workers == 1:
        return logs
    mine = json.dumps({k: float(v) for k, v in logs.items()
                       if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number)})
    payload = np.frombuffer(mine.encode(), np.uint8) if runner.is_chief else np.zeros(0)
    length = int(chief_array(runner, np.array([len(payload)]))[0])
    # padded to a multiple of 1 KiB: each length is an all-reduce of its own
    local = np.zeros(-(-length // 1024) * 1024)
    local[:len(payload)] = payload
    data = chief_array(runner, local)[:length]
    return json.loads(data.astype(np.uint8).tobytes().decode())


def _refuse_unless_read_alike(runner, batch, epoch: int) -> None:
    """Refuse, on every worker, a PyDataset whose first batch of an epoch
    differs between workers: its Python code runs in each worker, and one
    whose batches depend on the process's random state would train each
    worker on batches of its own."""
    from autopar.common.errors import AutoparError
    if runner.num_workers == 1:
        return
    mine = digest(*batch)
    chief = float(chief_array(runner, np.array([mine]))[0])
    if runner.sum_over_workers(np.array([float(mine != chief)]))[0]:
        raise AutoparError(
            f"autopar.fit: the workers read different batches from the PyDataset x (the first "
            f"of epoch {epoch + 1}): it runs in every worker, and its batches depend on each "
            "process's state (an on_epoch_end that shuffles with np.random or random without a "
            "seed of its own); shuffle with a generator seeded by the epoch "
            "(np.random.default_rng([seed, epoch])), or leave the order to fit's shuffle=True")


def _flat_logs(logs) -> dict:
    """A train_step's logs as Keras's fit records them: a dict's dicts
    (the compiled metrics' result) flattened into it."""
    out = {}
    for name, value in (logs.items() if isinstance(logs, dict) else ()):
        out.update(_flat_logs(value) if isinstance(value, dict) else {name: value})
    return out


def _compute_loss(model, x, y, y_pred, sample_weight=None, training=True):
    """model.compute_loss, called as Keras's own steps call it
    (Trainer._compute_loss): an override written before Keras 3.3 (a
    distiller's loss of its student and its teacher) takes no `training`."""
    if getattr(model, "_compute_loss_has_training_arg", True):
        return model.compute_loss(x, y, y_pred, sample_weight, training=training)
    return model.compute_loss(x, y, y_pred, sample_weight)


def _unpacker(batches):
    """A traced step's inputs (x's arrays, y's, then the weights, as
    `batches.specs()` lists them) back as (x, y, weights or None), x and y
    the structures the model takes."""
    import tensorflow as tf
    x_structure, y_structure = batches.structure()
    nx, ny = len(flat(x_structure)), len(flat(y_structure))

    def unpack(arrays):
        return (tf.nest.pack_sequence_as(x_structure, list(arrays[:nx])),
                tf.nest.pack_sequence_as(y_structure, list(arrays[nx:nx + ny])),
                arrays[nx + ny] if len(arrays) > nx + ny else None)
    return unpack


def _compiled_step(model, batches):
    """The compiled loss as Keras's own train step computes it (a string or
    a loss function reduced over the batch, loss_weights applied, the
    model's regularization losses added), differentiated and applied by the
    compiled optimizer; traced on x's, y's and the weights' arrays one by
    one, returning the loss and the predictions."""
    import tensorflow as tf
    # Keras builds the model and the loss (and any state it keeps) outside
    # the traced step, from symbolic inputs of the batches' specs: no batch
    # is read (a reshuffling dataset's order stays fit's), and no value is
    # made up (a StringLookup without OOV indices rejects any string it
    # does not know)
    _build_symbolically(model, batches)
    unpack = _unpacker(batches)

    @tf.function(jit_compile=False)
    def train_step(*arrays):
        xb, yb, weights = unpack(arrays)
        weighted = () if weights is None else (weights,)
        with tf.GradientTape() as tape:
            y_pred = _called(model, xb, training=True)
            # Keras weighs each example's loss and divides by the batch's
            # size: a mean over the batch still, averaged over workers.
            loss = _compute_loss(model, xb, yb, y_pred, *weighted, training=True)
            # As Keras's train step: a LossScaleOptimizer (the "mixed_float16"
            # policy's) unscales the gradients of the loss it scaled.
            scaled = model.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, y_pred, _masks_of(y_pred)
    return train_step


def _called(model, x, training: bool):
    """The model called on x as Keras's own train and test steps call it:
    with `training` only when its call() takes that argument. Without it
    Keras sets no training mode, so its layers run in inference mode (a
    Dropout inside a subclassed model whose call() takes only its inputs
    drops nothing in Keras's fit: nor here, or the two would train
    differently)."""
    return model(x, training=training) if model._call_has_training_arg else model(x)


def _build_symbolically(model, batches) -> None:
    """Build the model and its compiled loss from KerasTensors of the
    batches' specs (x, y), as Keras's fit builds them from a batch's
    (Trainer._symbolic_build). Keras has no public call for it:
    keras.src.backend.compute_output_spec, here alone."""
    import keras
    import tensorflow as tf
    from keras.src.backend import compute_output_spec
    x_structure, y_structure = batches.structure()
    specs = batches.specs()
    nx = len(flat(x_structure))
    symbolic = [keras.KerasTensor(s.shape, s.dtype.name) for s in specs]
    x = tf.nest.pack_sequence_as(x_structure, symbolic[:nx])
    y = tf.nest.pack_sequence_as(y_structure, symbolic[nx:nx + len(flat(y_structure))])
    y_pred = compute_output_spec(model, x, training=False)
    compute_output_spec(lambda x, y, y_pred: _compute_loss(model, x, y, y_pred, training=False),
                        x, y, y_pred)


def _masks_of(y_pred):
    """The padding masks Keras attached to the predictions (an
    Embedding(mask_zero=True) upstream), None for each output without one:
    a traced step returns them beside the predictions, whose tensors leave
    it without them."""
    import tensorflow as tf
    from keras.src.backend.common.masking import get_keras_mask   # no public API
    return tf.nest.map_structure(get_keras_mask, y_pred)


def _with_masks(y_pred, masks):
    """The predictions a step returned, as tensors holding the masks it
    returned beside them (`_masks_of`): Keras's metrics and losses read a
    prediction's mask from it (y_pred._keras_mask), as in Keras's own
    train step."""
    import tensorflow as tf
    from keras.src.backend.common.masking import set_keras_mask   # no public API

    def masked(prediction, mask):
        if mask is None:
            return prediction
        prediction = tf.convert_to_tensor(prediction)
        set_keras_mask(prediction, tf.convert_to_tensor(mask))
        return prediction
    return tf.nest.map_structure(masked, y_pred, masks)


def _traced_own_step(model, batches):
    """The model's own train_step, traced as Keras's fit traces it (on
    `data`: the dataset's element as it is, or what Keras packs from
    arrays: (x, y), (x, y, sample_weight) or x alone), taking x's, y's and
    the weights' arrays one by one. It returns what train_step returns
    (Keras's logs); its metrics update in the graph, each worker's on its
    rows (_Metrics.own_step_result combines them)."""
    import tensorflow as tf
    unpack = _unpacker(batches)

    @tf.function(jit_compile=False)
    def train_step(*arrays):
        return model.train_step(batches.data(*unpack(arrays)))
    return train_step


class _Metrics:
    """The compiled metrics and the loss over this worker's rows of an
    epoch, combined over workers by summing their state.

    Keras logs the mean of its batches' losses weighted by their sizes. A
    batch's loss is its workers' mean (weighted by their rows), or, for a
    loss that sums over the batch (`sums`), their sum: each worker then
    weighs its loss by the whole batch's size. A loss divided by a count of
    the batch's values (a masked sequence's kept positions) is the workers'
    mean weighted by their counts (a term that is no part of the count's
    mean, a regularizer, stays itself), which needs the batch's count
    summed over workers: each batch's figures are kept and summed at the
    epoch's end."""

    def __init__(self, model, sums: bool, counted: bool = False, whole=None) -> None:
        self.model = model
        self.sums = sums
        # the compiled metrics updated on whole batches, by the chief alone
        # (runtime/whole_batch_metrics.py): found at the first update
        self.whole = whole
        model.reset_metrics()
        self.loss_sum = 0.0
        self.count = 0
        # with `counted`, per batch: (count x loss, count, rows x loss, rows, batch rows)
        self.counted: list[tuple[float, float, float, int, int]] | None = [] if counted else None
        self._metric_of_logs: dict[str, str] | None = None   # _computed_from's

    def variables(self) -> list:
        return [v for m in self.model.metrics for v in m.variables]

    def update(self, y, y_pred, loss: float, rows: int, batch_rows: int,
               sample_weight=None, loss_count: float = 0.0) -> None:
        """`loss`: this worker's over its `rows` of a batch of `batch_rows`;
        `loss_count`: the count of the batch's values it divides by."""
        if self.counted is not None:
            self.counted.append((loss_count * loss, loss_count, rows * loss, rows, batch_rows))
        self.loss_sum += loss * (batch_rows if self.sums else rows)
        self.count += rows
        if self.whole is None:
            self.whole = find_whole_batch_metrics(self.model, y, y_pred)
        with self.whole.untouched():
            self.model.compute_metrics(None, y, y_pred, sample_weight=sample_weight)

    def no_rows(self, batch_rows: int) -> None:
        """A batch of `batch_rows` this worker has no rows of (the others'
        figures are summed with its zeros)."""
        if self.counted is not None:
            self.counted.append((0.0, 0.0, 0.0, 0, batch_rows))

    @contextlib.contextmanager
    def output_losses(self, rows: int, batch_rows: int):
        """Around Keras's compute_loss of this worker's `rows` of a batch of
        `batch_rows`: each output's loss tracker (a Mean on the compiled
        loss, which no public attribute gives) records the share of one
        device's value for the batch this worker's rows make. Keras weighs
        those by the batch's static size, which a traced step does not
        know: every batch of fit counts once (`batch_rows` times when the
        model runs eagerly)."""
        trackers = getattr(getattr(self.model, "_compile_loss", None), "metrics", None) or []
        before = [(m, m.total.numpy(), m.count.numpy()) for m in trackers]
        yield
        share = rows / batch_rows
        weight = batch_rows if self.model.run_eagerly else 1
        for m, total, count in before:
            recorded = m.count.numpy() - count
            if recorded:
                value = (m.total.numpy() - total) / recorded
                m.total.assign(total + value * (1 if self.sums else share) * weight)
                m.count.assign(count + share * weight)

    def own_step_result(self, runner, step_logs, synced: bool = False, rows: int = 1,
                        keep: bool = False) -> dict:
        """The epoch's logs of a model's own train_step (or test_step), one
        device's: its last step's logs (`step_logs`, this worker's, of its
        `rows` of the step's batch), each the result of the model's metric
        of its name when it is (the metrics' state summed over workers, as
        `result`), else the workers' mean of their last step's values
        weighted by their rows (a loss returned as computed, a mean over
        each worker's rows: the global batch's mean). `synced`: the Python
        metrics hold this worker's state already (a test step's, which
        runs eagerly), else the graph's copies of them are read. `keep`:
        the epoch goes on (`_kept`)."""
        if not synced:
            runner.sync_python_variables(self.variables())
        with self._kept(keep):
            return self._own_step_logs(runner, step_logs, rows, traced=not synced)

    def _own_step_logs(self, runner, step_logs, rows: int, traced: bool) -> dict:
        mine = self.model.get_metrics_result()
        # Keras's fit logs its metrics' results when the step's logs have
        # their names (Trainer._get_metrics_result_or_logs), else the logs
        every_metric = isinstance(step_logs, dict) and set(step_logs) == set(mine)
        step_logs = _flat_logs(step_logs)
        names = [k for k, v in step_logs.items()
                 if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number)]
        # each log's metric: its namesake, or the metric whose state alone
        # the traced step computes it from (a tracker's result() logged as "loss")
        computed_from = self._computed_from(runner) if traced else {}
        metric_of = {k: k if k in mine else computed_from.get(k) for k in names}
        metric_of = {k: m if m in mine else None for k, m in metric_of.items()}
        is_metric = [float(metric_of[k] is not None and np.ndim(mine[metric_of[k]]) == 0 and (
            (every_metric and metric_of[k] == k) or np.isclose(
                float(mine[metric_of[k]]), float(step_logs[k]), rtol=1e-6, atol=1e-12)))
            for k in names]
        runner.combine_metrics(self.model.metrics)
        combined = self.model.get_metrics_result()
        total = runner.sum_over_workers(np.array(
            is_metric + [float(step_logs[k]) * rows for k in names] + [rows])) if names else []
        logs = {}
        for i, name in enumerate(names):
            if total[i] == runner.num_workers:
                logs[name] = float(combined[metric_of[name]])
            else:
                logs[name] = float(total[len(names) + i] / total[-1])
                if runner.is_chief and name not in _MEANS_NOTED:
                    _MEANS_NOTED.add(name)
                    log.info("autopar.fit: the model's step's log '%s' is no metric's result: "
                             "it is the workers' mean of their last step's values, weighted "
                             "by their rows", name)
        return logs

    def _computed_from(self, runner) -> dict[str, str]:
        """{a log of the model's own step: the metric whose variables alone
        it is computed from} (Runner.outputs_of_variables: data flow in the
        traced step), for the logs computed from one metric's state."""
        if self._metric_of_logs is None:
            by_metric = {m.name: {runner.lifted_name(v) for v in m.variables} - {None}
                         for m in self.model.metrics}
            outputs = runner.outputs_of_variables()
            self._metric_of_logs = {}
            for name, read in _flat_logs(outputs).items():
                owners = [m for m, own in by_metric.items() if read and own and read <= own]
                if len(owners) == 1:
                    self._metric_of_logs[name] = owners[0]
        return self._metric_of_logs

    def _counted_loss(self, runner) -> float:
        """The epoch's loss from each batch's workers' losses weighted by
        their counts (the batch's rows weigh the batches, as Keras's)."""
        figures = np.array(self.counted)
        weighted, counts, by_rows, rows = runner.sum_over_workers(
            figures[:, :4].T.ravel()).reshape(4, -1)
        # (a batch whose every value is masked: its loss is what is left,
        # the same on every worker, a regularizer's)
        per_batch = np.where(counts > 0, weighted / np.where(counts > 0, counts, 1),
                             by_rows / np.maximum(rows, 1))
        batch_rows = figures[:, 4]
        return float(np.sum(per_batch * batch_rows) / np.sum(batch_rows))

    def result(self, runner, keep: bool = False) -> dict:
        """The logs of the epoch so far, one device's. `keep`: the epoch
        goes on (`_kept`)."""
        # (every worker holds as many batches' figures: the same branch)
        if self.counted:
            logs = {"loss": self._counted_loss(runner)}
        else:
            total = runner.sum_over_workers(np.array([self.loss_sum, self.count]))
            logs = {"loss": float(total[0] / max(total[1], 1))}
        with self._kept(keep):
            if self.whole:
                runner.combine_metrics(self.whole.others(self.model))
                runner.take_chief_values(self.whole.variables())
            else:
                runner.combine_metrics(self.model.metrics)
            for name, value in self.model.get_metrics_result().items():
                if name != "loss":   # the loss tracker: the loss above is ours
                    logs[name] = float(value)
        return logs

    @contextlib.contextmanager
    def _kept(self, keep: bool):
        """With `keep` (a batch's logs, the epoch going on), the metrics'
        own state comes back after combining it over workers: each worker
        goes on counting its rows."""
        with kept_state(self.variables() if keep else []):
            yield


def _counts_loss(runner) -> bool:
    """Whether the loss divides by one count of the batch's values
    (transforms.loss_counts): its log is then the workers' mean weighted by
    their counts (_Metrics)."""
    return runner.analysis is not None and len(runner.analysis.loss_counts) == 1


def _test_step(model):
    """Keras's test step, traced as Keras traces it: a sigmoid's or
    softmax's cross-entropy is then computed from its logits, where eagerly
    Keras computes it from the probabilities (1e-8 apart)."""
    import tensorflow as tf

    @tf.function(jit_compile=False, reduce_retracing=True)
    def test_step(xb, yb, *weighted):
        y_pred = _called(model, xb, training=False)
        return (y_pred, _masks_of(y_pred),
                _compute_loss(model, xb, yb, y_pred, *weighted, training=False))
    return test_step


def _tf_values(logs):
    """A step's logs of tensors as NumPy values."""
    import tensorflow as tf
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)


def _evaluate(model, data, batch_size: int, runner, test_step, sums: bool,
              own_step: bool, callbacks: FitCallbacks, whole=None, per_call: int = 1) -> dict:
    """Loss and compiled metrics of the model (with this worker's current
    values) over the validation set `data`, (x, y) or (x, y, sample
    weights) in Keras's batches of `batch_size`, or a dataset's batches,
    each worker on its rows w, w+N, ... of each; combined over workers.
    With the model's own test step (`own_step`), the logs it gives and the
    metrics it updates. The callbacks' test hooks run as Keras's evaluate
    runs them (a batch's logs: the validation's so far; once a call of
    `per_call` batches, compile()'s steps_per_execution). `whole`: the
    compiled metrics updated on whole batches (training's), which the
    chief updates from its own predictions of each whole batch."""
    model.stop_evaluating = False
    callbacks.run(lambda c: c.on_test_begin())
    metrics = _Metrics(model, sums, _counts_loss(runner), whole)
    step_logs, last_rows = {}, 0

    def logs_so_far(keep: bool) -> dict:
        if own_step:
            return metrics.own_step_result(runner, _tf_values(step_logs), synced=True,
                                           rows=last_rows, keep=keep)
        return metrics.result(runner, keep=keep)
    unknown_length = isinstance(data, BATCHES) and data.read_past_end()
    for begin, end, batches in executions(_validation_batches(data, batch_size, runner),
                                          per_call):
        if not batches and not unknown_length:
            break
        if callbacks.wants("test_begin"):
            callbacks.run(lambda c: c.on_test_batch_begin(begin))
        if not batches:   # (Keras's evaluate calls once more, past the end of the data)
            break
        for xb, yb, wb, batch_rows, batch in batches:
            last_rows = size(xb)   # (a worker with no rows of the last batch: none)
            if size(xb) == 0:
                metrics.no_rows(batch_rows)
            elif own_step:
                step_logs = test_step((data if isinstance(data, BATCHES)
                                       else ArrayBatches).data(xb, yb, wb), size(xb), batch_rows)
            else:
                weighted = () if wb is None else (wb,)
                with metrics.output_losses(size(xb), batch_rows):
                    y_pred, masks, loss = test_step(xb, yb, *weighted)
                    y_pred = _with_masks(_tf_values(y_pred), _tf_values(masks))
                counts = runner.loss_counts_of(*flat(xb), *flat(yb), *weighted) \
                    if metrics.counted is not None else None
                metrics.update(yb, y_pred, _tracked_loss(loss, size(xb), batch_rows, sums),
                               size(xb), batch_rows, *weighted,
                               loss_count=counts[0] if counts else 0.0)
            if not own_step and metrics.whole and runner.is_chief:
                # (inference draws nothing: the chief's predictions are one
                # device's; the loss trackers the step updates keep the rows')
                xg, yg, wg = batch
                mine = {id(v) for v in metrics.whole.variables()}
                with kept_state([v for v in metrics.variables() if id(v) not in mine]):
                    y_pred, masks, _ = test_step(xg, yg, *(() if wg is None else (wg,)))
                metrics.whole.update(model._compile_metrics, yg,
                                     _with_masks(_tf_values(y_pred), _tf_values(masks)), wg)
        if callbacks.wants("test_end"):
            batch_logs = logs_so_far(keep=True)
            callbacks.run(lambda c: c.on_test_batch_end(end, batch_logs))
        if callbacks.stop_evaluating:
            break
    logs = logs_so_far(keep=False)
    callbacks.run(lambda c: c.on_test_end(logs))
    return logs


def _validation_batches(data, batch_size: int, runner):
    """This worker's rows of each batch of the validation set, as Keras's
    fit batches it: (x, y, weights or None, the batch's size, the whole
    batch's (x, y, weights or None))."""
    me, n = runner.worker_index, runner.num_workers
    mine = slice(me, None, n)
    if isinstance(data, BATCHES):
        for xb, yb, wb in data.epoch(0):
            yield (rows(xb, mine), rows(yb, mine), None if wb is None else wb[mine], size(xb),
                   (xb, yb, wb))
        return
    import tensorflow as tf
    x, y = (tf.nest.map_structure(np.asarray, a) for a in data[:2])
    weights = np.asarray(data[2]) if len(data) > 2 and data[2] is not None else None
    for start in range(0, size(x), batch_size):
        whole = np.arange(start, min(start + batch_size, size(x)))
        batch = whole[mine]
        yield (rows(x, batch), rows(y, batch), None if weights is None else weights[batch],
               len(whole), (rows(x, whole), rows(y, whole),
                            None if weights is None else weights[whole]))
