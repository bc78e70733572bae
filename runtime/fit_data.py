"""Where autopar.fit's global batches come from: x and y (arrays, or a
list or dict of arrays for a model with several inputs or outputs) and the
examples' weights, shuffled and batched as Keras's fit does, or a
tf.data.Dataset of batches, as `model.fit(dataset)` takes it.

Every worker builds the same global batches and trains on its rows w, w+N,
w+2N, ... of each (transforms.random_draws: a dropout mask per example is
then one device's). For a dataset that means every worker reads the whole
dataset, each epoch, in the same order: a shuffle without a seed (none given
and no global seed set) or a map that may reorder its results would give
workers different batches, and is refused by name.
"""
from __future__ import annotations

import numpy as np

from autopar.common.errors import AutoparError


def rows(structure, index):
    """`index` (rows, a slice) of every array of a structure of arrays."""
    import tensorflow as tf
    return tf.nest.map_structure(lambda a: a[index], structure)


def size(structure) -> int:
    """The examples of a structure of arrays (its first array's rows)."""
    import tensorflow as tf
    return len(tf.nest.flatten(structure)[0])


def flat(structure) -> list:
    import tensorflow as tf
    return tf.nest.flatten(structure)


def _specs(structure) -> list:
    """A TensorSpec of any batch size for each array of the structure
    (NumPy's strings as tf.string)."""
    import tensorflow as tf
    return [tf.TensorSpec([None, *a.shape[1:]],
                          tf.string if a.dtype.kind in "USO" else tf.as_dtype(a.dtype))
            for a in flat(structure)]


class ArrayBatches:
    """Batches of `batch_size` of the arrays, the last one smaller when the
    batch size does not divide the examples (as Keras's fit batches them),
    in Keras's fit's order (`keras_order`) or, with an int `seed`, in a
    permutation seeded by `seed` and the epoch. `chief_order(draw, n)`
    gives every worker the n indices `draw()` gives on the chief (Keras's
    shuffle draws from each process's own random state)."""

    def __init__(self, x, y, weights, batch_size: int, shuffle, seed: int | None) -> None:
        self.x, self.y, self.weights = x, y, weights
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.chief_order = lambda draw, n: draw()

    @staticmethod
    def data(x, y, weights):
        """What Keras's fit hands a model's train_step for a batch of x, y
        (() when fit was given x alone) and weights (or None)."""
        from keras.src.trainers.data_adapters.data_adapter_utils import pack_x_y_sample_weight
        return pack_x_y_sample_weight(x, None if isinstance(y, tuple) and not y else y,
                                      weights)

    def structure(self):
        """(x, y) as structures, whose arrays `specs` lists in order."""
        return self.x, self.y

    def specs(self):
        out = _specs(self.x) + _specs(self.y)
        if self.weights is not None:
            out += _specs(self.weights)
        return out

    def check(self, parts: int, what: str, any_of: int | None = None) -> None:
        """Refuse, before any step, a batch that one device trains on and the
        workers could not: with `any_of` (the step trains shares of any
        size), a first or last batch of fewer rows than `any_of` workers
        (each needs one: a worker without rows would add a mean over none);
        else a batch that does not split into `parts` equal shares (`what`
        names them: the workers, and their micro-batches)."""
        n = size(self.x)
        last = n % self.batch_size or min(self.batch_size, n)
        if any_of is not None:
            # (the last batch is the smallest; fewer examples than a batch: the first)
            if last < any_of:
                raise AutoparError(
                    f"autopar.fit: batch_size={self.batch_size} is the global batch, and "
                    f"{n} examples make a {'first' if n < self.batch_size else 'last'} batch "
                    f"of {last}: each of the {any_of} workers needs a row of every batch "
                    f"(one device trains on it). Choose a batch_size that leaves a last batch "
                    f"of at least {any_of} examples (or none), or leave {last} examples out")
            return
        if self.batch_size % parts:
            raise AutoparError(f"autopar.fit: batch_size={self.batch_size} is the global batch "
                               f"and must divide by {what}")
        if last % parts:
            raise AutoparError(f"autopar.fit: {n} examples make a last batch of {last}, which "
                               f"does not divide by {what} (one device trains on it): choose "
                               f"a batch_size that divides {n}, or leave {last} examples out")

    def num_batches(self) -> int:
        """The batches of an epoch (Keras's callbacks' params["steps"])."""
        return -(-size(self.x) // self.batch_size)

    @staticmethod
    def read_past_end() -> bool:
        """Whether Keras's fit reads past an epoch's last batch (`DatasetBatches`)."""
        return False

    def order(self, epoch: int) -> np.ndarray:
        """The order of the examples in epoch `epoch`, the same on every worker."""
        n = size(self.x)
        if not self.shuffle:
            return np.arange(n)
        if self.seed is None:
            return self.chief_order(lambda: keras_order(n, self.batch_size, self.shuffle), n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def epoch(self, epoch: int):
        """(x, y, weights or None) of each global batch of epoch `epoch`."""
        order = self.order(epoch)
        for step in range(-(-len(order) // self.batch_size)):
            batch = order[step * self.batch_size:(step + 1) * self.batch_size]
            yield (rows(self.x, batch), rows(self.y, batch),
                   None if self.weights is None else self.weights[batch])


def keras_order(n: int, batch_size: int, shuffle) -> np.ndarray:
    """The order in which Keras's fit takes n examples given as arrays:
    its own array data adapter (a tf.random.shuffle of the indices, or of
    each batch's with shuffle="batch") run on the indices. Drawn from the
    TensorFlow global seed (keras.utils.set_random_seed): with one set, the
    order model.fit takes in the same program, each epoch alike, as fit
    takes it; without, a random one, as fit's."""
    import tensorflow as tf
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    dataset = ArrayDataAdapter(np.arange(n), batch_size=batch_size,
                               shuffle=shuffle).get_tf_dataset()
    return np.concatenate([tf.nest.flatten(batch)[0].numpy() for batch in dataset])


class DatasetBatches:
    """The batches of a tf.data.Dataset of (x, y) or (x, y, sample_weight),
    iterated afresh each epoch as Keras's fit iterates it (a dataset
    shuffled with a seed and reshuffle_each_iteration gives each epoch its
    own order, Keras's, the same on every worker). `weigh(y)`: each
    example's weight from class weights, or None. `input_rank`: the model
    input's rank, batch included, when known. `steps` (steps_per_epoch,
    validation_steps): batches per pass, of a dataset that repeats
    forever; `persistent`: each pass goes on where the last ended (fit's
    training, where evaluation starts afresh); `per_call`: the batches a
    call of Keras's train (test) function reads (compile()'s
    steps_per_execution), so that a pass of `steps` reads whole calls."""

    def __init__(self, dataset, what: str, weigh=None, input_rank: int | None = None,
                 steps: int | None = None, persistent: bool = False,
                 x_only: bool = False, per_call: int = 1) -> None:
        import tensorflow as tf
        refuse_nondeterministic(dataset, what)
        spec = dataset.element_spec
        # A model's own train_step (x_only) takes any element, as Keras's
        # fit hands it over: one that is not (x, y) or (x, y, weights) is x.
        self.x_only = x_only and not (isinstance(spec, tuple) and len(spec) in (2, 3))
        if self.x_only:
            spec = (spec, ())
        if not isinstance(spec, tuple) or len(spec) not in (2, 3) or not all(
                isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)) or not isinstance(
                    spec[-1], tf.TensorSpec if len(spec) == 3 else object):
            raise AutoparError(
                f"autopar.fit: {what} yields {spec}; it takes a dataset of batches (x, y) or "
                "(x, y, sample_weight), x and y each a tensor (or a list or dict of them), "
                "sample_weight a tensor")
        first = tf.nest.flatten(spec[0])[0]
        if first.shape.rank == 0 or (input_rank is not None
                                     and first.shape.rank == input_rank - 1):
            raise AutoparError(f"autopar.fit: {what} yields single examples; batch it "
                               "(dataset.batch(global batch size))")
        if len(spec) == 3 and weigh is not None:
            raise AutoparError(f"autopar.fit: {what} yields sample weights and class_weight is "
                               "given; give one of them (as fit)")
        if self.x_only and weigh is not None:
            raise AutoparError(f"autopar.fit: class_weight weighs examples by their class, and "
                               f"{what} yields no targets (as fit)")
        self.dataset, self.what, self.weigh = dataset, what, weigh
        self.element = spec
        self.steps, self.persistent, self._iterator = steps, persistent, None
        self.per_call = per_call
        infinite = dataset.cardinality() == -1          # tf.data.INFINITE_CARDINALITY
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)
                                  or steps < 1):
            raise AutoparError(f"autopar.fit: the steps of {what} are a positive int, "
                               f"got {steps!r}")
        if infinite and steps is None:
            raise AutoparError(f"autopar.fit: {what} repeats forever; give its steps per "
                               "pass (steps_per_epoch, validation_steps)")
        if steps is not None and not infinite:
            raise AutoparError(f"autopar.fit: steps per pass over {what}, which ends: autopar."
                               "fit takes steps_per_epoch / validation_steps with a dataset "
                               "that repeats (dataset.repeat()), or none")

    def structure(self):
        return self.element[0], self.element[1]

    def specs(self):
        import tensorflow as tf
        out = [tf.TensorSpec([None, *s.shape[1:]], s.dtype) for s in flat(self.element[:2])]
        if len(self.element) == 3:
            # one weight per example, or per position of a sequence's
            out.append(tf.TensorSpec([None, *self.element[2].shape[1:]], self.element[2].dtype))
        elif self.weigh is not None:
            out.append(_weights_spec(self.weigh))
        return out

    def check(self, parts: int, what: str, any_of: int | None = None) -> None:
        del parts, what, any_of   # known when read: a batch that does not split fails then

    def read_past_end(self) -> bool:
        """Whether Keras's fit reads past an epoch's last batch: it calls its
        train function until one fails to read a batch of a dataset of
        unknown length (steps_per_epoch not given)."""
        import tensorflow as tf
        return self.steps is None and int(self.dataset.cardinality()) == int(
            tf.data.UNKNOWN_CARDINALITY)

    def num_batches(self) -> int | None:
        """The batches of a pass, as Keras's fit counts them: its steps, the
        dataset's length, or None when unknown."""
        if self.steps is not None:
            return self.steps
        count = int(self.dataset.cardinality())
        return count if count >= 0 else None

    def data(self, x, y, weights):
        """What Keras's fit hands a model's train_step for a batch: the
        dataset's element, with weights from class weights added."""
        if self.x_only:
            return x
        return (x, y) if weights is None else (x, y, weights)

    def epoch(self, epoch: int):
        del epoch   # the dataset's own iteration gives each epoch its order
        if self.steps is None:
            elements = self.dataset.as_numpy_iterator()
        else:
            # steps of an endless dataset: fit's training goes on where the
            # last epoch ended, evaluation starts afresh (as Keras's
            # epoch iterator with steps_per_epoch / validation steps)
            if self._iterator is None or not self.persistent:
                self._iterator = self.dataset.as_numpy_iterator()
            # (a call of several steps runs them all: a pass of 10 steps,
            # 4 a call, reads 12 batches, where the callbacks count 10)
            read = -(-self.steps // self.per_call) * self.per_call
            elements = (next(self._iterator) for _ in range(read))
        for element in elements:
            if self.x_only:
                element = (element, ())
            weights = element[2] if len(element) == 3 else (
                None if self.weigh is None else self.weigh(element[1]))
            yield element[0], element[1], weights
        if self.steps is None and self.dataset.cardinality() >= 0:
            # Keras's epoch iterator (keras/src/trainers/epoch_iterator.py)
            # makes an iterator at the end of a pass over a dataset of known
            # size, unused, and a new one at the start of the next: a
            # reshuffling dataset's k-th epoch under fit() is its (2k-1)-th
            # iteration. As many here, so that fit()'s order is one device's.
            iter(self.dataset)


def _weights_spec(weigh):
    """The TensorSpec of the weights `weigh` gives a batch's examples."""
    import tensorflow as tf
    return tf.TensorSpec([None], tf.as_dtype(weigh(np.zeros(1)).dtype))


def refuse_nondeterministic(dataset, what: str) -> None:
    """Refuse a dataset whose order may differ between workers: a shuffle
    without a seed, or an op told it need not keep its order."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    from autopar.transforms.graph_utils import op_name_of
    serialized = dataset._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)
    graph = graph_pb2.GraphDef.FromString(serialized.numpy())
    nodes = {n.name: n for n in graph.node}
    for node in list(graph.node) + [n for f in graph.library.function for n in f.node_def]:
        if "deterministic" in node.attr and node.attr["deterministic"].s == b"false":
            raise AutoparError(
                f"autopar.fit: {what} runs '{node.name}' ({node.op}) with deterministic=False: "
                "its order may differ between workers, which must all read the same batches")
        if node.op == "RandomShuffle" and all(node.attr[k].i == 0 for k in ("seed", "seed2")):
            # tf.random.shuffle in a map (of each batch, or of the indices a
            # pipeline gathers by): seeded by neither it nor a global seed
            raise AutoparError(
                f"autopar.fit: {what} shuffles without a seed ('{node.name}', {node.op}, "
                "tf.random.shuffle in one of its functions): each worker would shuffle "
                "differently, and every worker must read the same batches; give it a seed "
                "(tf.random.shuffle(t, seed=...)) or set one (keras.utils.set_random_seed)")
        if "Shuffle" in node.op and len(node.input) >= 4:
            seeds = [nodes.get(op_name_of(i)) for i in node.input[2:4]]
            if all(s is not None and s.op == "Const"
                   and int(tf.make_ndarray(s.attr["value"].tensor)) == 0 for s in seeds):
                raise AutoparError(
                    f"autopar.fit: {what} shuffles without a seed ('{node.name}', {node.op}): "
                    "each worker would shuffle differently, and every worker must read the "
                    "same batches; give shuffle a seed (dataset.shuffle(n, seed=...)) or set "
                    "one (keras.utils.set_random_seed)")


class PyDatasetBatches:
    """The batches of a keras.utils.PyDataset, read as Keras's fit reads
    them (keras/src/trainers/data_adapters/py_dataset_adapter.py): its
    on_epoch_end once before training, then each epoch on_epoch_begin, the
    batches `dataset[i]` in order or, with shuffle, in an order Python's
    random.shuffle draws (on the chief: `chief_order`, for every worker),
    and on_epoch_end. A batch is x alone, (x,), (x, y) or (x, y,
    sample_weight) (a list as a tuple, a dict as x); `weigh(y)`: each
    example's weight from class weights, or None. Every worker reads every
    batch and trains on its rows w, w+N, ...: a PyDataset is the program's
    own Python code, run by each worker, so a batch that depends on a
    process's random state (an on_epoch_end that shuffles without a seed)
    would differ between workers; autopar.fit compares each epoch's first
    batch over the workers (`digest`)."""

    def __init__(self, dataset, what: str, weigh=None, x_only: bool = False,
                 shuffle: bool = False) -> None:
        try:
            count = dataset.num_batches
        except NotImplementedError:
            count = None
        if count is None:
            raise AutoparError(f"autopar.fit: {what} (a PyDataset) has no length: give it "
                               "__len__ (or num_batches), the batches of an epoch")
        self.dataset, self.what, self.weigh = dataset, what, weigh
        self.count, self.shuffle = int(count), shuffle
        self.chief_order = lambda draw, n: draw()
        x, y, w = self._batch(0)
        if y is None and not x_only:
            raise AutoparError(f"autopar.fit: {what} yields batches of inputs alone; the "
                               "compiled loss takes (x, y) or (x, y, sample_weight) batches")
        if w is not None and weigh is not None:
            raise AutoparError(f"autopar.fit: {what} yields sample weights and class_weight is "
                               "given; give one of them (as fit)")
        self.first = (x, () if y is None else y, w)
        self.single = y is None
        # Keras's fit resets the dataset's epoch before training starts
        dataset.on_epoch_end()

    def _batch(self, index: int):
        """(x, y or None, weights or None) of batch `index`, as Keras's
        adapter standardizes it."""
        import tensorflow as tf
        batch = self.dataset[index]
        if isinstance(batch, dict):
            return batch, None, None
        if isinstance(batch, np.ndarray):
            batch = (batch,)
        if isinstance(batch, list):
            batch = tuple(batch)
        if not isinstance(batch, tuple) or len(batch) not in (1, 2, 3):
            raise AutoparError(f"autopar.fit: {self.what}[{index}] is a "
                               f"{type(batch).__name__}; a PyDataset's batch is (x,), (x, y) "
                               "or (x, y, sample_weight), or a dict")
        x = tf.nest.map_structure(np.asarray, batch[0])
        y = tf.nest.map_structure(np.asarray, batch[1]) if len(batch) > 1 else None
        w = np.asarray(batch[2]) if len(batch) > 2 else None
        return x, y, w

    def structure(self):
        return self.first[0], self.first[1]

    def specs(self):
        x, y, w = self.first
        out = _specs(x) + _specs(y)
        if w is not None:
            out += _specs(w)
        elif self.weigh is not None:
            out.append(_weights_spec(self.weigh))
        return out

    def check(self, parts: int, what: str, any_of: int | None = None) -> None:
        del parts, what, any_of   # known when read: a batch that does not split fails then

    def num_batches(self) -> int:
        return self.count

    @staticmethod
    def read_past_end() -> bool:
        return False

    def data(self, x, y, weights):
        """What Keras's fit hands a model's train_step: the batch as the
        dataset gives it ((x,) for inputs alone), with weights from class
        weights added."""
        if self.single:
            return x if isinstance(x, dict) else (x,)
        return (x, y) if weights is None else (x, y, weights)

    def epoch(self, epoch: int):
        """(x, y, weights or None) of each batch of an epoch."""
        del epoch
        import random
        self.dataset.on_epoch_begin()
        order = list(range(self.count))
        if self.shuffle:
            def draw():
                random.shuffle(order)
                return np.array(order)
            order = [int(i) for i in self.chief_order(draw, self.count)]
        for index in order:
            x, y, w = self._batch(index)
            if w is None and self.weigh is not None and y is not None:
                w = self.weigh(y)
            yield x, () if y is None else y, w
        self.dataset.on_epoch_end()


def digest(x, y, weights) -> float:
    """A batch's contents as a number a float64 holds exactly (52 bits of
    their hash): equal on every worker that read the same batch."""
    import hashlib

    import tensorflow as tf
    h = hashlib.blake2b(digest_size=8)
    for a in tf.nest.flatten((x, y, () if weights is None else weights)):
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes() if a.dtype.kind != "O" else repr(a.tolist()).encode())
    return float(int.from_bytes(h.digest(), "little") >> 12)
