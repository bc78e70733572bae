"""Which rows each partition of a server variable holds (transforms.partition
RowLayout): a variable with a sparse gradient deals its rows round-robin (row
r is row r // n of partition r % n, so the most frequent ids of a
frequency-sorted vocabulary spread over every partition); one with a dense
gradient is cut into contiguous ranges of the same sizes."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.transforms.partition import RowLayout, dealt_sizes

LAYOUTS = [(40, 3, (6,)), (11, 4, (2, 3)), (8, 4, ()), (5, 1, (3,)), (7, 7, ()), (13, 5, (2,))]


@pytest.mark.parametrize("rows,n", [(40, 3), (40, 2), (7, 7), (5, 1), (204800, 8), (11, 4)])
def test_sizes_cover_every_row_once(rows, n):
    sizes = dealt_sizes(rows, n)
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    assert sizes == [len(range(p, rows, n)) for p in range(n)]


def test_the_gradient_decides_the_layout():
    assert RowLayout.for_gradient("sparse", 10, 3).dealt
    assert not RowLayout.for_gradient("dense", 10, 3).dealt


@pytest.mark.parametrize("dealt", [True, False], ids=["dealt", "ranges"])
@pytest.mark.parametrize("rows,n,shape", LAYOUTS)
def test_whole_inverts_piece_and_locate_finds_every_row(rows, n, shape, dealt):
    layout = RowLayout(rows, n, dealt)
    whole = np.arange(rows * int(np.prod(shape)), dtype=np.float32).reshape((rows, *shape))
    expected = [whole[p::n] if dealt else np.array_split(whole, n)[p] for p in range(n)]
    ids = np.random.default_rng(rows * n).permutation(rows).astype(np.int64)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        value = tf.constant(whole)
        pieces = [layout.piece(value, p) for p in range(n)]
        which, local = layout.locate(tf.constant(ids))
        got_pieces, got_whole, got_which, got_local = sess.run(
            [pieces, layout.whole(pieces), which, local])
    assert [len(p) for p in got_pieces] == dealt_sizes(rows, n)
    for p, piece in enumerate(got_pieces):
        np.testing.assert_array_equal(piece, expected[p])
        index = np.arange(rows)
        assert list(layout.rows_of(p)) == list(index[p::n] if dealt else np.array_split(index, n)[p])
    np.testing.assert_array_equal(got_whole, whole)
    # every id's row is row `local` of partition `which`
    for i, w, r in zip(ids, got_which, got_local):
        np.testing.assert_array_equal(expected[w][r], whole[i])


def test_head_of_a_skewed_vocabulary_is_spread():
    """Expected share of a step's lookups per partition for ids drawn from a
    Zipf law (exponent 1.1, as the benchmark's LM) over a frequency-sorted
    vocabulary: dealt rows share the load nearly evenly, contiguous ranges
    would give the first partition most of it."""
    rows, n = 204_800, 4
    weight = 1.0 / np.arange(1, rows + 1) ** 1.1
    weight /= weight.sum()
    dealt = np.bincount(np.arange(rows) % n, weights=weight, minlength=n)
    ranges = np.bincount(np.arange(rows) * n // rows, weights=weight, minlength=n)
    assert ranges[0] > 0.8                     # what contiguous ranges did
    assert dealt.max() < 0.4 and dealt.min() > 0.2, dealt
