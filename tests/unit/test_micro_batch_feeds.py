"""How the Runner splits a step's feed into micro-batches and combines the
micro-batches' fetched values (runtime/step/executor.py)."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.runtime.step.executor import combine as _combine, split_feed as _split_feed

tf1 = tf.compat.v1


@pytest.fixture
def tensors():
    g = tf.Graph()
    with g.as_default():
        return (tf1.placeholder(tf.float32, [None, 2], name="x"),
                tf1.placeholder(tf.int32, [None], name="y"),
                tf1.placeholder(tf.float32, [], name="lr"),
                tf1.sparse_placeholder(tf.float32, name="sp"))


def test_rows_split_in_order_scalars_to_every_run(tensors):
    x, y, lr, _ = tensors
    xs, ys = np.arange(16.0).reshape(8, 2), np.arange(8)
    common, parts = _split_feed({(x, y): (xs, ys), lr: 0.5}, 4)
    assert common == {lr: 0.5}
    assert len(parts) == 4
    np.testing.assert_array_equal(np.concatenate([p[x] for p in parts]), xs)
    np.testing.assert_array_equal(parts[1][y], [2, 3])


def test_no_feed_means_no_parts(tensors):
    assert _split_feed({}, 4) == ({}, [])


def test_rows_not_divisible_are_refused(tensors):
    x = tensors[0]
    with pytest.raises(AutoparError, match="6 rows: feed a multiple of 4"):
        _split_feed({x: np.zeros((6, 2))}, 4)


def test_sparse_feed_is_refused(tensors):
    sp = tensors[3]
    with pytest.raises(AutoparError, match="tf.data iterator"):
        _split_feed({sp: tf1.SparseTensorValue([[0, 0]], [1.0], [2, 2])}, 2)


def test_combine_means_floats_keeps_last_otherwise():
    assert _combine([np.float32(1.0), np.float32(2.0)]) == pytest.approx(1.5)
    assert _combine([np.float32(1.0), np.float32(2.0)]).dtype == np.float32
    np.testing.assert_allclose(_combine([np.ones(3), 3 * np.ones(3)]), 2 * np.ones(3))
    assert _combine([np.int64(4), np.int64(5)]) == 5                 # e.g. the global step
    assert _combine([np.ones(2), np.ones(3)]).shape == (3,)          # shapes differ: last
    assert _combine([None, None]) is None                            # an op's result
