"""Programs written the way users write them, used by the tests as they are."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import tensorflow as tf


@dataclass
class FedProgram:
    """A tf.compat.v1 program of one train op, fed a global batch a step:
    `batch(k, size)` gives step k's values of `inputs`, a worker feeds its
    rows of them. `config`: the autopar.Config fields it needs."""
    graph: tf.Graph
    train: tf.Operation
    inputs: tuple
    batch: Callable
    config: dict = field(default_factory=dict)

    def step(self, k: int, rows, batch: int):
        """(fetch, feed) of step k for the rows `rows` of its global batch."""
        return self.train, {t: v[rows] for t, v in zip(self.inputs, self.batch(k, batch))}
