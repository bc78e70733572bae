"""A tf.compat.v1 sequence tagger whose losses sum what tf.boolean_mask
keeps, as programs over padded sequences often write them: each tag's
cross-entropy at the positions that are no padding (a 2-D mask, which
tf.boolean_mask flattens with the batch), and a penalty on the embedding
rows of the ids a 1-D mask keeps (each sequence's second, where it has one) (tf.boolean_mask of the ids, then their
lookup: the embedding's gradient rows are those of the kept ids alone, the
same id in several examples), and one on the first tag's logits at the
positions that are no padding (logits[..., 0], an ellipsis slice). Each
worker keeps its share's positions, and
sums over them add up to one device's. Adagrad, float64 (it divides by
sqrt of its accumulator).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.programs import FedProgram

tf1 = tf.compat.v1

VOCAB, DIM, TAGS, LENGTH = 16, 4, 3, 5


def _batch(k: int, batch: int) -> tuple:
    """Step k's `batch` sequences of 1 to LENGTH ids padded with 0 at the
    end, and a tag each."""
    rng = np.random.default_rng(500 + k)
    ids = rng.integers(1, VOCAB, size=(batch, LENGTH)).astype(np.int64)
    ids[np.arange(LENGTH) >= rng.integers(1, LENGTH + 1, size=(batch, 1))] = 0
    return ids, rng.integers(0, TAGS, size=(batch, LENGTH)).astype(np.int32)


def build(dtype: str = "float64") -> FedProgram:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(6)
        global_step = tf1.train.get_or_create_global_step()
        ids = tf1.placeholder(tf.int64, [None, LENGTH], name="ids")
        tags = tf1.placeholder(tf.int32, [None, LENGTH], name="tags")
        init = tf1.random_normal_initializer(0, 0.5, seed=3)
        emb = tf1.get_variable("emb", [VOCAB, DIM], dtype, init)
        w = tf1.get_variable("w", [DIM, TAGS], dtype, init)
        logits = tf.tensordot(tf.nn.embedding_lookup(emb, ids), w, 1)
        per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tags,
                                                                      logits=logits)
        not_padding = tf.not_equal(ids, 0)
        loss = tf.reduce_sum(tf.boolean_mask(per_position, not_padding))
        # the first tag's logit at each position that is no padding, kept small
        loss += 0.01 * tf.reduce_sum(tf.square(logits[..., 0]) * tf.cast(not_padding, dtype))
        # the embedding rows of each sequence's second id, where it has one
        second_ids = tf.boolean_mask(ids[:, 1], not_padding[:, 1])
        loss += 0.05 * tf.reduce_sum(tf.square(tf.nn.embedding_lookup(emb, second_ids)))
        train = tf1.train.AdagradOptimizer(0.3).minimize(loss, global_step=global_step)
    return FedProgram(graph, train, (ids, tags), _batch)
