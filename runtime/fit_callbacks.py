"""Keras callbacks under autopar.fit: every hook Keras's own fit runs, at the
points it runs them (keras/src/backend/tensorflow/trainer.py: on_train_begin;
each epoch on_epoch_begin, on_train_batch_begin and on_train_batch_end around
each step, validation's on_test_begin, on_test_batch_begin/_end and
on_test_end, on_epoch_end; on_train_end), with the logs Keras gives them.

The callbacks run on the chief alone, as on one device: what they write to
files (ModelCheckpoint, CSVLogger, TensorBoard) is written once. Before a
hook the chief's model and optimizer hold the trained values (a callback
saves or reads them); what the hook changes in them (a learning rate, each
batch's under a warm-up; restored weights), model.stop_training and the
epoch to start at (BackupAndRestore's, restoring a backup) go to every
worker before the next step (Runner.take_chief_values), so every worker
trains as the chief does. The logs are the global batches',
combined over workers (a batch hook's: the epoch's so far, as Keras's
running metrics).

A per-batch hook costs an exchange between the workers at each batch (and
the chief reads its variables from training): it runs only when one of the
callbacks overrides it, as Keras itself dispatches them
(CallbackList._configure_async_dispatch); the chief's callbacks decide, at
on_train_begin, for every worker.
"""
from __future__ import annotations

import itertools

import numpy as np

# The per-batch hooks, and the Callback methods whose override asks for each
# (Keras's on_train_batch_* call on_batch_* by default).
PER_BATCH = {
    "train_begin": ("on_train_batch_begin", "on_batch_begin"),
    "train_end": ("on_train_batch_end", "on_batch_end"),
    "test_begin": ("on_test_batch_begin",),
    "test_end": ("on_test_batch_end",),
}


def executions(batches, per_call: int):
    """The batches of a pass as Keras's fit runs them: its train (test)
    function takes `per_call` of them a call (the model's
    steps_per_execution), and the per-batch hooks run once a call,
    on_*_batch_begin(begin) before it and on_*_batch_end(begin + per_call
    - 1) after it, the pass's last call too, though it may run fewer
    (keras/src/trainers/epoch_iterator.py). Yields (begin, end, batches),
    then (begin, end, []) past the last batch: where Keras's fit, reading
    data of unknown length, calls once more and finds none."""
    batches = iter(batches)
    for begin in itertools.count(0, per_call):
        taken = list(itertools.islice(batches, per_call))
        yield begin, begin + per_call - 1, taken
        if not taken:
            return


class FitCallbacks:
    """The callbacks of one autopar.fit, on every worker: the chief holds
    the Keras CallbackList (made with `params`, as Keras's fit makes it),
    the others take what it changes. Every worker calls each method at the
    same point."""

    def __init__(self, runner, model, callbacks: list, params: dict) -> None:
        import keras
        self.runner, self.model = runner, model
        self.list = (keras.callbacks.CallbackList(callbacks, model=model, **params)
                     if runner.is_chief else None)
        # What a callback reads and may change: the model's and the
        # optimizer's variables (a model with its own train_step and
        # compile() may have no optimizer)
        optimizer = getattr(model, "optimizer", None)
        self.variables = list(model.variables) + list(getattr(optimizer, "variables", []))
        self.per_batch: set[str] = set()
        self._synced = False   # the chief's variables hold training's since the last step
        self.stop_evaluating = False
        # the chief's model's epoch to start at, as a callback set it (run())
        self.initial_epoch: int | None = None

    def wants(self, hook: str) -> bool:
        """Whether the per-batch hook `hook` (a key of PER_BATCH) runs."""
        return hook in self.per_batch

    def stepped(self) -> None:
        """Training ran a step: the chief's variables no longer hold its values."""
        self._synced = False

    def run(self, call) -> bool:
        """`call(callback_list)` on the chief, its variables holding the
        trained values; what it changed in them, and model.stop_training
        (and model.stop_evaluating), given to every worker. Whether
        training stops."""
        import keras
        changed: list[int] = []
        header = np.zeros(4 + len(PER_BATCH))
        if self.list is not None:
            if not self._synced:
                self.runner.sync_python_variables(self.variables)
                self._synced = True
            before = [v.numpy() for v in self.variables]
            call(self.list)
            changed = [i for i, (b, v) in enumerate(zip(before, self.variables))
                       if not np.array_equal(b, v.numpy())]
            # The epoch Keras's fit starts at when a callback set it
            # (BackupAndRestore's on_train_begin, restoring a backup): a
            # private attribute, the only place Keras keeps it; read here alone
            initial_epoch = getattr(self.model, "_initial_epoch", None)
            header[:4] = (bool(getattr(self.model, "stop_training", False)),
                          bool(getattr(self.model, "stop_evaluating", False)), len(changed),
                          -1 if initial_epoch is None else initial_epoch)
            # (a callback's own method, or anything but Callback's: a wrapper)
            header[4:] = [any(getattr(getattr(c, name), "__func__", None)
                              is not getattr(keras.callbacks.Callback, name)
                              for c in self.list.callbacks for name in names)
                          for names in PER_BATCH.values()]
        header = chief_array(self.runner, header)
        self.per_batch = {hook for hook, on in zip(PER_BATCH, header[4:]) if on}
        self.model.stop_training = bool(header[0])
        self.stop_evaluating = self.model.stop_evaluating = bool(header[1])
        self.initial_epoch = int(header[3]) if header[3] >= 0 else None
        if header[2]:
            indices = chief_array(self.runner, np.array(changed, np.float64)
                                  if self.list is not None else np.zeros(int(header[2])))
            self.runner.take_chief_values([self.variables[int(i)] for i in indices])
        return self.model.stop_training

    def sync(self) -> None:
        """Every worker's model and optimizer take training's values (Keras's
        validation runs them in Python)."""
        self.runner.sync_python_variables(self.variables)
        self._synced = True


def chief_array(runner, local: np.ndarray) -> np.ndarray:
    """The chief's `local` (float64) on every worker: every worker passes an
    array of one shape, of which only the chief's values are read (the
    others' count as zeros in the sum over workers)."""
    if runner.num_workers == 1:
        return np.asarray(local, np.float64)
    return runner.sum_over_workers(np.asarray(local, np.float64) if runner.is_chief
                                   else np.zeros(np.shape(local)))
