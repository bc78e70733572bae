"""The user's fetches and feeds, mapped to this worker's rewritten graph.

A fetch is anything a plain `tf.compat.v1.Session.run` accepts: a tensor, op,
variable or name; a SparseTensor or IndexedSlices (fetched as its parts);
what an assign returns; a traced function's Python variable (its lifted
counterpart). A feed key is a tensor or name, a SparseTensor or IndexedSlices
(fed a SparseTensorValue / IndexedSlicesValue or a plain tuple), or a nested
tuple of them fed the same structure of values."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.transforms.graph_utils import op_name_of
from autopar.runtime.step.graph_queries import graph_variables, initializer_ops

log = logging.getLogger("autopar.runner")


class FetchMapper:
    """`python_name`: the lifted name of a traced function's Python variable,
    or None for another object (runtime/step/python_bridge.py); None when the
    graph was not lifted."""

    def __init__(self, graph: tf.Graph, *, worker_index: int = 0, num_workers: int = 1,
                 constant_copies=None, python_name: Callable[[object], str | None] | None = None):
        self.graph = graph
        self.worker_index = worker_index
        self.num_workers = num_workers
        # a worker constant's name -> its servers' copies (WorkerGraph.constant_copies)
        self._constant_copies = dict(constant_copies or {})
        self._python_name = python_name
        self.variables = {v.name: v for v in graph_variables(graph)}
        self.init_ops = initializer_ops(graph)
        self._warned_init = False

    def fetch(self, fetch):
        """This graph's element for `fetch`; None for an initialiser autopar
        already ran (skipped)."""
        if fetch is None:
            return None
        if self._python_name is not None and not isinstance(fetch, (str, tf.Tensor, tf.Operation)):
            # A traced function's Python variable (a tf.Variable, or a Keras
            # 3 variable holding one): its lifted counterpart.
            name = self._python_name(fetch)
            if name is not None:
                return self.fetch(self.variables[name + ":0"])
        if isinstance(fetch, tf.SparseTensor):
            # Session fetches it as a SparseTensorValue of its three parts.
            with self.graph.as_default():
                return tf.SparseTensor(*(self.tensor(t) for t in
                                         (fetch.indices, fetch.values, fetch.dense_shape)))
        if isinstance(fetch, tf.IndexedSlices):
            return tf.IndexedSlices(self.tensor(fetch.values), self.tensor(fetch.indices),
                                    None if fetch.dense_shape is None
                                    else self.tensor(fetch.dense_shape))
        if isinstance(fetch, tf.Variable) and getattr(fetch, "initializer", None) is None:
            # What an assign returns (`global_step.assign_add(1)`, as
            # tf_cnn_benchmarks fetches it): the value read after the
            # assignment, the element Session.run itself fetches for it.
            return self.fetch(fetch._as_graph_element())  # pylint: disable=protected-access
        if isinstance(fetch, tf.Variable):
            # Its snapshot tensor, by name: for a variable split into partitions
            # that node computes the whole value (a Variable object would read
            # one partition through it).
            with fetch.graph.as_default():   # to_proto needs graph mode
                snapshot = fetch.to_proto().snapshot_name
            return self.graph.get_tensor_by_name(snapshot)
        name = fetch if isinstance(fetch, str) else getattr(fetch, "name", None)
        if name is None:
            raise TypeError(f"cannot fetch {fetch!r}: pass a tensor, op, variable or name")
        if name in self.variables:
            return self.variables[name]
        element = self.graph.as_graph_element(name)
        if isinstance(element, tf.Operation) and element.name in self.init_ops:
            if not self._warned_init:
                log.info("variables were initialised (and restored) by autopar; "
                         "skipping '%s' so replicas stay identical", element.name)
                self._warned_init = True
            return None
        return element

    def fetches(self, fetches):
        """`fetches` (any nesting) with every leaf mapped (`fetch`)."""
        return tf.nest.map_structure(self.fetch, fetches)

    def tensor(self, tensor) -> tf.Tensor:
        """This graph's tensor of the same name (a tensor, or its name)."""
        name = tensor if isinstance(tensor, str) else getattr(tensor, "name", None)
        if name is None:
            raise TypeError(f"cannot interpret feed_dict key {tensor!r} as a tensor: pass a "
                            "tensor, a SparseTensor, a tensor name or a tuple of them")
        try:
            return self.graph.as_graph_element(name, allow_tensor=True, allow_operation=False)
        except (KeyError, ValueError) as e:
            raise TypeError(f"cannot interpret feed_dict key {name!r} as a tensor: {e}") from e

    def feeds(self, feed_dict) -> tuple[dict, int | None]:
        """The feed for this graph's tensors, and the batch size it holds (the
        first fed leading dimension, for examples/s)."""
        feeds: dict = {}
        batch = None
        for key, value in feed_dict.items():
            for leaf, leaf_value in flatten_feed(key, value):
                if batch is None:
                    batch = _leading_dim(leaf, leaf_value)
                if isinstance(leaf, tf.SparseTensor):
                    parts = [leaf.indices, leaf.values, leaf.dense_shape]
                elif isinstance(leaf, tf.IndexedSlices):
                    parts = [leaf.values, leaf.indices] + (
                        [] if leaf.dense_shape is None else [leaf.dense_shape])
                else:
                    mapped = self.tensor(leaf)
                    self._check_feed_shape(mapped, leaf_value)
                    feeds[mapped] = leaf_value
                    # a fed constant's copies on the servers read the value fed too
                    for copy in self._constant_copies.get(mapped.name, ()):
                        feeds[self.tensor(copy)] = leaf_value
                    continue
                # As Session: a SparseTensorValue / IndexedSlicesValue or a
                # plain tuple, zipped with the component tensors.
                for part, part_value in zip(parts, leaf_value):
                    feeds[self.tensor(part)] = part_value
        return feeds, batch

    def _check_feed_shape(self, tensor, value) -> None:
        """Refuse, by name, a value whose shape the input cannot take: most
        often an input traced or declared with the global batch size, which
        each worker feeds with its own share of the batch."""
        shape = getattr(value, "shape", None)
        static = getattr(tensor, "shape", None)
        if shape is None or static is None or static.is_compatible_with(tuple(shape)):
            return
        name = op_name_of(tensor.name)
        hint = ""
        if static.rank and len(shape) == static.rank and static[0] is not None \
                and static[0] != shape[0]:
            hint = (f"; its batch dimension is fixed at {static[0]}, and each of the "
                    f"{self.num_workers} worker(s) feeds its own rows of a step's batch: "
                    "declare it None (tf.compat.v1.placeholder(dtype, [None, ...]), "
                    "tf.TensorSpec([None, ...]) for a traced step) or the per-worker batch")
        raise AutoparError(f"input '{name}' has the shape {static}, worker {self.worker_index} "
                           f"fed one of shape {tuple(shape)}{hint}")


def flatten_feed(key, value) -> Iterator[tuple]:
    """(key, value) pairs of a feed whose key may be a nested list/tuple of
    tensors fed the same structure of values (Session.run's feed_dict
    flattening); a SparseTensor or IndexedSlices key stays one leaf."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError(f"feed_dict key {key!r} is a structure of {len(key)} tensors, "
                             f"so its value must be a list or tuple of {len(key)} values, "
                             f"got {type(value).__name__}")
        for k, v in zip(key, value):
            yield from flatten_feed(k, v)
    else:
        yield key, value


def _leading_dim(key, value) -> int | None:
    try:
        if isinstance(key, tf.SparseTensor):
            return int(np.asarray(value[2])[0])      # dense_shape[0]
        shape = np.shape(value)
    except (ValueError, IndexError, TypeError):
        return None                                  # ragged lists, scalar shapes
    return int(shape[0]) if shape else None
