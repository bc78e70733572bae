"""Losses that mix the examples of a batch (transforms/batch_mixing.py): found
from data flow (transforms/example_rows.py) whatever the op, and refused on
several workers unless Config(batch_mixing="per_worker"), where a loss of
each example alone, batch normalisation (recognised), a masked loss's count
and the losses' own reductions are not."""
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.compile import compile_for_config
from autopar.transforms.lift import lift
from autopar.transforms.plan import make_plan
from autopar.transforms.report import build_report
from tests import models

tf1 = tf.compat.v1
F = 5
REPO = Path(__file__).resolve().parents[2]


def _dual_encoder(kind: str) -> tf.Graph:
    """Queries x and keys y, each through its own weights, into a loss of
    `kind`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, F], name="x")
        y = tf1.placeholder(tf.float64, [None, F], name="y")
        q = tf.matmul(x, tf1.get_variable("wq", [F, 4], tf.float64), name="q")
        k = tf.matmul(y, tf1.get_variable("wk", [F, 4], tf.float64), name="k")
        if kind.startswith("in_batch_negatives"):   # every query against every key of the batch
            if kind.endswith("einsum"):
                logits = tf.einsum("bd,cd->bc", q, k, name="similarity")
            elif kind.endswith("batch_matmul"):   # [1, b, d] x [1, d, b]
                logits = tf.squeeze(tf.linalg.matmul(q[None], tf.transpose(k)[None],
                                                     name="similarity"), 0)
            else:
                logits = tf.matmul(q, k, transpose_b=True, name="similarity")
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.range(tf.shape(x)[0]), logits=logits))
        elif kind == "centred":            # each query less the batch's mean query
            centred = q - tf.reduce_mean(q, axis=0, keepdims=True, name="batch_mean")
            loss = tf.reduce_mean(tf.square(centred - k))
        elif kind == "normalised_over_batch":
            loss = tf.reduce_mean(tf.square(tf.nn.l2_normalize(q, axis=0) - k))
        elif kind == "hardest_half":       # the loss of the batch's hardest examples
            per = tf.reduce_sum(tf.square(q - k), axis=1)
            hardest, _ = tf.nn.top_k(per, k=tf.shape(per)[0] // 2, name="hardest")
            loss = tf.reduce_mean(hardest)
        elif kind == "per_example":        # a mean and a masked mean of each example's losses
            per = tf.reduce_sum(tf.square(q - k), axis=1)
            mask = tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.float64)
            loss = (tf.reduce_mean(per)
                    + tf.reduce_sum(per * mask) / tf.maximum(tf.reduce_sum(mask), 1.0))
        elif kind == "rolled_negatives":   # each query against its neighbour's key
            loss = tf.reduce_mean(tf.nn.relu(
                1.0 + tf.reduce_sum(q * tf.roll(k, shift=1, axis=0, name="neighbours"), 1)
                - tf.reduce_sum(q * k, 1)))
        elif kind == "rolled_features":    # a roll within each example's row
            loss = tf.reduce_mean(tf.square(q - tf.roll(k, shift=1, axis=1)))
        elif kind == "rotated_by_concat":  # the same rotation, written with a concat
            loss = tf.reduce_mean(tf.square(tf.subtract(
                q, tf.concat([k[1:], k[:1]], 0), name="pairs")))
        elif kind == "first_example":      # the batch's first key, against every query
            loss = tf.reduce_mean(tf.square(tf.subtract(q, k[0], name="pairs")))
        elif kind == "rows_in_pairs":      # examples 2i and 2i+1 made one row
            loss = tf.reduce_mean(tf.square(tf.subtract(
                tf.reshape(q, [-1, 8])[:, :4], tf.reshape(k, [-1, 8])[:, 4:], name="pairs")))
        elif kind == "first_example_tiled":   # beside every query, in its row
            rows = tf.concat([q, tf.tile(k[:1], [tf.shape(k)[0], 1], name="copies")], 1)
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(rows), 1))
        elif kind.startswith("picked_"):   # the batch's keys taken by their place
            with tf.name_scope("picked"):
                picked = {"picked_first_two": lambda: k[:2],
                          "picked_rest": lambda: tf.slice(k, [1, 0], [-1, -1]),
                          "picked_every_other": lambda: k[::2],
                          "picked_rows": lambda: tf.gather(k, [0, 0, 1]),
                          "picked_first_broadcast": lambda: tf.broadcast_to(k[:1], tf.shape(k)),
                          "picked_appended": lambda: tf.concat([k, k[:1]], 0),
                          "picked_pieces": lambda: tf.split(k, [2, -1])[1],
                          "picked_first_count": lambda: k[:tf1.placeholder_with_default(2, [])],
                          "picked_last_two": lambda: k[tf.shape(k)[0] - 2:],
                          }[kind]()
            loss = tf.reduce_mean(tf.square(picked)) + tf.reduce_mean(tf.square(q - k))
        elif kind == "mean_of_kept":       # the mean of the examples a mask keeps
            per = tf.reduce_sum(tf.square(q - k), axis=1)
            loss = tf.reduce_mean(tf.boolean_mask(per, tf.reduce_sum(x, axis=1) > 0))
        elif kind.startswith("kept_"):     # the values a mask keeps, by tf.where's positions
            per = tf.square(q - k)
            mask = x[:, :4] > 0
            kept = tf.gather_nd(per, tf.where(mask, name="kept"))
            loss = {"kept_mean": lambda: tf.reduce_mean(kept, name="mean"),
                    "kept_over_count": lambda: tf.reduce_sum(kept) / tf.cast(
                        tf.size(kept, name="count"), tf.float64),
                    "kept_partition_mean": lambda: tf.reduce_mean(tf.dynamic_partition(
                        per, tf.cast(mask, tf.int32), 2, name="kept")[1], name="mean"),
                    "kept_sum": lambda: tf.reduce_sum(kept),
                    "kept_masked_sum": lambda: tf.reduce_sum(tf.boolean_mask(
                        tf.reduce_sum(per, 1), tf.reduce_sum(x, 1) > 0)),
                    "kept_first_two": lambda: tf.reduce_sum(kept[:2]),
                    "kept_first": lambda: tf.reduce_sum(kept) + kept[0],
                    "kept_rows": lambda: tf.reduce_sum(tf.gather(kept, [0, 1])),
                    "kept_piece": lambda: tf.reduce_sum(tf.split(kept, [1, -1])[0]),
                    "kept_masked_first_two": lambda: tf.reduce_sum(tf.boolean_mask(
                        per, tf.reduce_sum(x, 1) > 0)[:2]),
                    # values computed element by element from the kept
                    # ones, combined element by element again
                    "kept_shifted": lambda: tf.reduce_sum(tf.where(kept > 1, kept, kept - 1)),
                    "kept_against_other": lambda: tf.reduce_sum(tf.multiply(kept, tf.gather_nd(
                        per, tf.where(x[:, 1:5] > 1)), name="against")),
                    "kept_places_column": lambda: tf.reduce_sum(
                        tf.gather(per, tf.where(x[:, 0] > 0)[:, 0]))}[kind]()
        elif kind == "halves":             # each half of the share, by the share's size
            half = tf.shape(k)[0] // 2
            loss = (tf.reduce_mean(tf.square(q[:half] - k[:half]))
                    + tf.reduce_mean(tf.square(q[half:] - k[half:]))) / 2
        elif kind.startswith("cut_"):      # pieces of each share, cut by its size
            half = tf.shape(k)[0] // 2
            with tf.name_scope("cut"):
                loss = {"cut_first_half": lambda: tf.reduce_mean(tf.square(q[:half] - k[:half])),
                        # a supervised first half, a second half of its own term
                        "cut_halves_apart": lambda: tf.reduce_mean(tf.square(q[:half] - k[:half]))
                        + 0.1 * tf.reduce_mean(tf.abs(q[half:])),
                        "cut_split": lambda: tf.reduce_mean(tf.square(tf.split(q - k, 2)[0])),
                        # a cut only a value beside the loss reads
                        "cut_beside": lambda: [tf.identity(tf.reduce_mean(q[:half]),
                                                           name="reported"),
                                               tf.reduce_mean(tf.square(q - k))][1]}[kind]()
        elif kind == "ellipsis_column":    # x[..., 0]: the example axis taken whole
            loss = tf.reduce_mean(q[..., 0] * k[:, 0] + tf.reduce_sum(q[..., None] * k[:, None], 1))
        elif kind == "ellipsis_first":     # x[0, ...]: the batch's first example
            loss = tf.reduce_mean(tf.square(q - k)) + tf.reduce_mean(tf.square(q[0, ...]))
        elif kind.startswith("padded"):    # the batch's rows and a row of no example
            pad = {"padded_mean": ("CONSTANT", [[0, 1], [0, 0]], 0.0),
                   "padded_sum": ("CONSTANT", [[0, 1], [0, 0]], 1.0),
                   "padded_mirror": ("REFLECT", [[1, 0], [0, 0]], 0.0),
                   "padded_features": ("CONSTANT", [[0, 0], [0, tf.shape(q)[1]]], 0.0)}[kind]
            padded = tf.square(tf.pad(q - k, pad[1], mode=pad[0], constant_values=pad[2]))
            loss = (tf.reduce_sum(padded, name="reduced") if kind == "padded_sum"
                    else tf.reduce_mean(padded, name="reduced"))
        elif kind == "batch_variance":     # the batch's variance, as a loss term
            loss = tf.reduce_mean(tf.square(q - k)) + tf.reduce_mean(tf.nn.moments(q, [0])[1])
        elif kind == "standardised":       # each query by the batch's moments: a batch norm
            mean, variance = tf.nn.moments(q, [0])
            loss = tf.reduce_mean(tf.square(tf.nn.batch_normalization(
                q, mean, variance, None, None, 1e-3) - k))
        elif kind == "concat_learned":     # a learned row beside the batch's, summed
            loss = tf.reduce_sum(tf.square(tf.concat(
                [q - k, tf1.get_variable("extra", [1, 4], tf.float64)], 0)), name="reduced")
        elif kind.startswith("loop_to"):   # a recurrence over padded steps of 1 feature
            steps = tf1.placeholder(tf.float64, [None, None], name="steps")
            bound = (tf.reduce_max(tf.cast(tf.abs(x[:, 0]) * 2, tf.int32) % F + 1)
                     if kind == "loop_to_longest" else tf.shape(steps)[1])

            def step(t, h):
                return t + 1, tf.tanh(h + q * steps[:, t:t + 1])
            _, h = tf.while_loop(lambda t, h: t < bound, step, [0, tf.zeros_like(q)])
            loss = tf.reduce_mean(tf.square(h - k))
        elif kind == "returned_longest_bound":   # its bound also a value after it
            longest = tf.reduce_max(tf.cast(tf.abs(x[:, 0]) * 2, tf.int32) % F + 1)
            _, h, bound = tf.while_loop(lambda t, h, b: t < b,
                                        lambda t, h, b: (t + 1, tf.tanh(h + q), b),
                                        [0, tf.zeros_like(q), longest])
            loss = tf.reduce_sum(tf.square(h - k)) / tf.cast(bound, tf.float64)
        elif kind == "cond_on_longest":    # a branch chosen by the batch's longest
            longest = tf.reduce_max(tf.cast(tf.abs(x[:, 0]) * 2, tf.int32))
            loss = tf.reduce_mean(tf.square(tf.cond(longest > 2, lambda: q, lambda: 2 * q) - k))
        elif kind == "cond_on_longest_in_loop":   # the same, inside a loop's body
            def twice(t, h):
                longest = tf.reduce_max(tf.cast(tf.abs(h) * 10, tf.int32))
                return t + 1, tf.cond(longest > 2, lambda: h, lambda: 2 * h)
            _, h = tf.while_loop(lambda t, h: t < 2, twice, [0, q])
            loss = tf.reduce_mean(tf.square(h - k))
        elif kind == "rows_selected":      # TF1's where of a vector: row i of q or of k
            loss = tf.reduce_mean(tf.square(tf1.where(x[:, 0] > 0, q, k) - k))
        elif kind == "time_major":         # [time, batch, features]: axis 0 is time
            seq = tf1.placeholder(tf.float64, [None, None, F], name="seq")
            h = tf.reduce_mean(tf.tensordot(seq, tf1.get_variable("wt", [F, 4], tf.float64), 1),
                               axis=0)
            loss = tf.reduce_mean(tf.square(h - k))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


@pytest.mark.parametrize("kind,found", [
    ("in_batch_negatives", ["similarity"]),
    ("in_batch_negatives_einsum", ["similarity/Einsum"]),
    ("in_batch_negatives_batch_matmul", ["similarity"]),
    ("centred", ["batch_mean"]),
    ("normalised_over_batch", ["l2_normalize/Sum"]),
    ("hardest_half", ["hardest"]),
    ("per_example", []),
    # (before: tf.roll's shift was read for its axis, and a tensor whose
    # elements are each one example's, laid out otherwise, taken as
    # aligned with any other: accepted, each worker pairing its own share)
    ("rolled_negatives", ["neighbours"]),
    ("rolled_features", []),
    # (the rows a concat rotates, and the first example, taken by their place)
    ("rotated_by_concat", ["strided_slice", "strided_slice_1"]),
    ("first_example", ["strided_slice"]),
    ("rows_in_pairs", ["pairs"]),
    ("first_example_tiled", ["strided_slice"]),
    # (before: a selection of the batch's rows by their place reaching the
    # loss was accepted, one device taking the global batch's, each worker
    # its share's)
    ("picked_first_two", ["picked/strided_slice"]), ("picked_rest", ["picked/Slice"]),
    ("picked_every_other", ["picked/strided_slice"]), ("picked_rows", ["picked/GatherV2"]),
    ("picked_first_broadcast", ["picked/strided_slice"]),
    ("picked_appended", ["picked/strided_slice"]), ("picked_pieces", ["picked/split"]),
    ("picked_first_count", ["picked/strided_slice"]),
    ("picked_last_two", ["picked/strided_slice_1"]),   # (_0: tf.shape(k)[0])
    # halves of each share, cut by its size (a step's micro-batches): one
    # device's only where both are treated alike and every share splits as
    # the global batch does, which is not proven (before: accepted)
    ("halves", ["strided_slice_1", "strided_slice_2", "strided_slice_3",
                "strided_slice_4"]),
    # a mean of the values a mask keeps, or their sum over their count:
    # each worker would divide by its own count (before: accepted, as a mean
    # over the batch); their sum is one device's
    ("kept_mean", ["mean"]), ("kept_over_count", ["count"]),
    ("kept_partition_mean", ["mean"]), ("kept_sum", []),
    # tf.boolean_mask's sum, and a gather at the places tf.where of a mask
    # keeps, each gathered row a kept example's own (before: refused, "a
    # GatherV2 combining the values of several examples")
    ("kept_masked_sum", []), ("kept_places_column", []), ("kept_shifted", []),
    # the values another mask keeps: element i of each is another example's
    ("kept_against_other", ["against"]),
    # the first values a mask keeps, by their place: one device's are the
    # global batch's first kept, each worker's its share's (before: a
    # sum of them accepted)
    # (strided_slice: the mask's x[:, :4])
    ("kept_first_two", ["strided_slice_1"]), ("kept_first", ["strided_slice_1"]),
    ("kept_rows", ["GatherV2"]), ("kept_piece", ["split"]),
    ("kept_masked_first_two", ["strided_slice_1"]),
    # the first half of each share alone, its halves treated apart, and
    # tf.split's pieces (before: accepted: one device trains the global
    # batch's first half, each worker its share's)
    ("cut_first_half", ["cut/strided_slice", "cut/strided_slice_1"]),
    ("cut_halves_apart", ["cut/strided_slice", "cut/strided_slice_1", "cut/strided_slice_2"]),
    ("cut_split", ["cut/split"]),
    ("cut_beside", []),
    # slices with an ellipsis: the axes it spans are taken whole (before:
    # every slice with one was read as elements laid out otherwise, so
    # q[..., 0] * k[:, 0] was refused as a Mul mixing examples, and a
    # penalty on the batch's first example, q[0, ...], accepted)
    ("ellipsis_column", []), ("ellipsis_first", ["strided_slice"]),
    # a mean over the batch's rows and a row of no example (a pad, a concat
    # with other rows) divides by the share's count and that row, one
    # device's by the global batch's; a sum takes a learned row once on
    # every worker; a reflection copies the share's first example (before:
    # each trained, read as elements of examples laid out otherwise). A sum
    # over rows padded by a constant, or a pad of another axis, trains
    ("padded_mean", ["reduced"]), ("concat_learned", ["reduced"]),
    ("padded_mirror", ["MirrorPad"]), ("padded_sum", []), ("padded_features", []),
    # tf.nn.moments of the batch is a batch norm's where its variance
    # normalises the batch (transforms/batchnorm.py: statistics over the
    # workers with Config(batch_norm_group)); read as a loss term, it is the
    # batch's statistic (before: taken for a batch norm's, and trained per
    # worker)
    ("batch_variance", ["moments/mean"]), ("standardised", []),
    # a fed tensor carries its examples along axis 0: a time-major one's mean
    # over axis 0 is taken for a mean over the examples (refused; feed
    # batch-major tensors, or ask for per-worker semantics)
    ("time_major", ["Mean"]),
    # a loop run as many times as a statistic of the batch's values says
    # (the longest of lengths the program computes), a cond deciding by one:
    # each training step takes the global batch's statistic
    # (transforms.padded_lengths; before: each worker's own, accepted, and
    # trained off one device by up to 0.03); a loop to a length of the
    # batch's shape trains (the workers' padded lengths are checked alike).
    # A statistic computed inside a loop's body is each worker's: a cond
    # there deciding by it is refused
    ("loop_to_longest", []), ("cond_on_longest", []), ("loop_to_padded_length", []),
    ("cond_on_longest_in_loop", ["cond"]),
    # the bound, returned by the loop, also divides the loss: left the
    # worker's, and the loop refused (before: made the global batch's, and
    # the loss read as a mean over it, parameters off by up to 0.5)
    ("returned_longest_bound", ["while"]),
    # (before: TF1's Select of a vector picked whole rows, read as elements
    # laid out otherwise, and the square of its difference with k refused)
    ("rows_selected", []),
])
def test_ops_mixing_the_examples_of_a_batch_are_found(kind, found):
    assert list(analyze_graph(_dual_encoder(kind)).batch_mixing) == found


@pytest.mark.parametrize("model", ["bncnn_momentum", "lmmask_momentum", "lm_adam_clip",
                                   "embsparse_rmsprop_clip_centered"])
@pytest.mark.slow
def test_batch_norm_masked_means_and_lookups_mix_nothing(model):
    """Batch normalisation's moments are recognised (and made exact by
    Config(batch_norm_group)); a masked mean's count, an LSTM over time and
    embedding lookups keep each example to itself."""
    assert analyze_graph(models.build(model).graph).batch_mixing == {}


@pytest.mark.parametrize("how", ["slice", "take"])
def test_a_keras_step_whose_loss_takes_examples_by_their_place_is_refused(how):
    """A traced Keras step whose loss weighs the batch's first examples
    apart (keras.ops.take of fixed rows, or a slice): one device takes the
    global batch's, each worker its share's (before: accepted)."""
    dense = keras.layers.Dense(1)
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            error = keras.ops.square(dense(x) - y)
            first = (keras.ops.take(error, [0, 1], axis=0) if how == "take" else error[:2])
            loss = keras.ops.mean(error) + keras.ops.mean(first)
        grads = tape.gradient(loss, dense.trainable_variables)
        optimizer.apply_gradients(zip(grads, dense.trainable_variables))
        return loss
    concrete = step.get_concrete_function(tf.TensorSpec([None, F], tf.float32),
                                          tf.TensorSpec([None, 1], tf.float32))
    [(op, what)] = analyze_graph(lift(concrete).graph).batch_mixing.items()
    assert what.startswith(f"a {'GatherV2' if how == 'take' else 'StridedSlice'} taking "
                           "examples by their place in the batch"), (op, what)


def test_a_mean_of_the_values_a_mask_keeps_is_refused_naming_the_exact_form():
    """tf.boolean_mask keeps a count of values that differs between the
    workers' shares: the refusal says how to write the masked loss that
    trains exactly (transforms/loss_counts.py)."""
    [(op, what)] = analyze_graph(_dual_encoder("mean_of_kept")).batch_mixing.items()
    assert (op, what[:60]) == ("Mean", "a Mean of the values 'boolean_mask/Where' keeps by "
                                       "the batch"), what
    assert "sum(loss * mask) / sum(mask) trains exactly" in what
    [(op, what)] = analyze_graph(_dual_encoder("kept_mean")).batch_mixing.items()
    assert what.startswith("a Mean of the values 'kept' keeps by the batch's values"), what
    assert "sum(loss * mask) / sum(mask) trains exactly" in what


@pytest.mark.parametrize("how", ["matmul", "einsum"])
def test_a_keras_step_with_in_batch_negatives_is_found(how):
    queries, keys = keras.layers.Dense(4, name="queries"), keras.layers.Dense(4, name="keys")
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            if how == "einsum":
                logits = keras.ops.einsum("bd,cd->bc", queries(x), keys(y))
            else:
                logits = keras.ops.matmul(queries(x), keras.ops.transpose(keys(y)))
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
                tf.range(tf.shape(x)[0]), logits)
        variables = queries.trainable_variables + keys.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    spec = tf.TensorSpec([None, F], tf.float32)
    analysis = analyze_graph(lift(step.get_concrete_function(spec, spec)).graph)
    [(op, what)] = analysis.batch_mixing.items()   # Keras writes a 2-D einsum as a MatMul
    assert "of examples with other examples (in-batch negatives" in what


def test_a_mixing_loss_is_refused_on_several_workers_unless_per_worker_is_asked():
    graph = _dual_encoder("in_batch_negatives_einsum")
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 3, autopar.Config())
    assert ("the loss mixes the examples of a batch at 'similarity/Einsum' (an Einsum of "
            "examples with other examples" in str(refused.value))
    assert 'Config(batch_mixing="per_worker")' in str(refused.value)
    compiled = compile_for_config(graph, 3, autopar.Config(batch_mixing="per_worker"))
    text = build_report(compiled.analysis, compiled.plan).table()
    assert ("the loss mixes the examples of a batch at 'similarity/Einsum'; with "
            'Config(batch_mixing="per_worker") each of the 3 workers mixes only the examples '
            "of its own share" in text)
    compile_for_config(graph, 1, autopar.Config())   # one worker: one device's
    assert "mixes the examples" not in build_report(compiled.analysis,
                                                    make_plan(compiled.analysis, 1)).table()


def _by_places(kind: str) -> tf.Graph:
    """A classifier's loss reading each example's place in the batch,
    tf.range of its size, in the way `kind` names."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, F], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        logits = tf.matmul(x, tf1.get_variable("w", [F, 3], tf.float64))
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        size = tf.shape(x)[0]
        place = tf.range(size)
        loss = {
            # the examples' places as indices of their own rows: each
            # example's own label's log-probability
            "own_label": lambda: -tf.reduce_mean(tf.gather_nd(
                tf.nn.log_softmax(logits), tf.stack([place, y], 1))),
            # read as values: weights by parity, the first half, one-hot
            "parity": lambda: tf.reduce_mean(
                per * tf.cast(tf.equal(tf.math.floormod(place, 2, name="parity"), 0),
                              tf.float64)),
            "first_half": lambda: tf.reduce_sum(tf.boolean_mask(
                per, tf.less(place, size // 2, name="first_half"))),
            "first_four": lambda: tf.reduce_mean(per * tf.reduce_sum(tf.one_hot(
                place, 4, dtype=tf.float64, name="first_four"), 1)),
        }[kind]()
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


@pytest.mark.parametrize("kind,found", [
    ("own_label", []),
    # (before: accepted, each worker weighing its share's examples by their
    # places there, one device the global batch's)
    ("parity", ["parity"]), ("first_half", ["first_half"]), ("first_four", ["first_four"])])
def test_the_examples_places_are_indices_of_their_own_rows_or_picks(kind, found):
    mixing = analyze_graph(_by_places(kind)).batch_mixing
    assert list(mixing) == found
    assert all(what.endswith("taking examples by their place in the batch (x[0], x[:2], "
                             "fixed rows): one device takes them from the global batch, each "
                             "worker from its share") for what in mixing.values()), mixing


def _ctc(kind: str) -> tf.Graph:
    """A CTC loss of frames [batch, 6, F] and labels of each example, in the
    way `kind` names."""
    graph = tf.Graph()
    with graph.as_default():
        frames = tf1.placeholder(tf.float32, [None, 6, F], name="frames")
        labels = tf1.placeholder(tf.int32, [None, 3], name="labels")
        logits = tf.tensordot(frames, tf1.get_variable("w", [F, 4]), 1)
        lengths = tf.fill([tf.shape(frames)[0]], 6)
        sparse = tf.sparse.from_dense(labels)
        if kind == "fixed_labels":   # the same labels at the batch's first rows
            sparse = tf.SparseTensor([[0, 0], [1, 0]], [1, 2], [2, 3])
        if kind == "v2":
            per = tf.nn.ctc_loss(sparse, logits, None, lengths, logits_time_major=False,
                                 blank_index=0)
        else:
            per = tf1.nn.ctc_loss(sparse, tf.transpose(logits, [1, 0, 2]), lengths)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(per))
    return graph


@pytest.mark.parametrize("kind,found", [
    # (before: "a CTCLoss op, for which autopar has no rule"; and TensorFlow
    # 2's tf.where over the labels' values, a shift of each value by the
    # blank's place, taken for a mixing of examples)
    ("v1", []), ("v2", []),
    # labels of no example's, at the batch's first two rows
    ("fixed_labels", ["CTCLoss"])])
def test_a_ctc_loss_keeps_each_example_to_itself(kind, found):
    assert list(analyze_graph(_ctc(kind)).batch_mixing) == found


def test_a_step_cutting_its_share_in_halves_is_refused_unless_per_worker_is_asked():
    """A supervised first half and a second half of its own term: one device
    trains the global batch's halves, each worker its share's. The refusal
    names the cut and autopar's exact micro-batches; per-worker semantics,
    asked for, trains each share's halves as written."""
    graph = _dual_encoder("cut_halves_apart")
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 2, autopar.Config())
    assert ("the loss mixes the examples of a batch at 'cut/strided_slice' (a StridedSlice "
            "cutting each worker's share at a point computed from its size (its halves)"
            in str(refused.value)), str(refused.value)
    assert "Config(micro_batches=M) accumulates micro-batches exactly" in str(refused.value)
    compile_for_config(graph, 2, autopar.Config(batch_mixing="per_worker"))


@pytest.mark.parametrize("recurrent", ["GRU", "SimpleRNN", "LSTM"])
def test_a_keras_recurrent_layers_loop_keeps_each_example_to_itself(recurrent):
    """Keras's RNNs step through time in a While loop whose body reads the
    cell's weights: the lifted step keeps the shapes tracing inferred in its
    functions, so the GRU's bias, read inside the loop, is known to add to
    each example's row (before: of unknown rank there, the sum was taken
    for a mixing of examples, and naming it raised a KeyError, the op being
    the loop body's)."""
    model = keras.Sequential([keras.Input((5, 3)), getattr(keras.layers, recurrent)(4),
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    concrete = step.get_concrete_function(tf.TensorSpec([None, 5, 3], tf.float32),
                                          tf.TensorSpec([None, 1], tf.float32))
    analysis = analyze_graph(lift(concrete).graph)
    assert analysis.batch_mixing == {}
    assert len(analysis.batch_draws) == 1   # the dropout's mask, per example


def test_a_mixing_inside_a_loop_body_is_named_as_the_bodys():
    """A batch statistic fed back into each example inside a tf.while_loop:
    refused naming the body's op, without a traceback."""
    dense = keras.layers.Dense(1)
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            _, h = tf.while_loop(lambda i, h: i < 2,
                                 lambda i, h: (i + 1, h - tf.reduce_mean(h, axis=0)), (0, x))
            loss = tf.reduce_mean(dense(h) ** 2)
        grads = tape.gradient(loss, dense.trainable_variables)
        optimizer.apply_gradients(zip(grads, dense.trainable_variables))
        return loss
    concrete = step.get_concrete_function(tf.TensorSpec([None, F], tf.float32))
    analysis = analyze_graph(lift(concrete).graph)
    [(op, what)] = analysis.batch_mixing.items()
    assert op == "while/Mean", op
    assert what == "an op of a function the step runs (a loop's body, a cond's branch) " \
        "combining the values of several examples"


@pytest.mark.parametrize("how", ["first_two", "halves"])
def test_a_selection_by_place_or_a_cut_inside_a_loop_body_is_found(how):
    """Inside a tf.while_loop's body the bounds of a selection are read from
    the body's own forms: its first two examples are taken by their place,
    its halves cut by the share's size (before: read from the step's forms
    by name; and halves were accepted, each worker training the halves of
    its share where one device trains the global batch's)."""
    dense = keras.layers.Dense(1)
    dense.build((None, F))
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        def body(i, total):
            h = dense(x)
            half = tf.shape(h)[0] // 2
            first = h[:2] if how == "first_two" else h[:half]
            return i + 1, total + tf.reduce_mean(first ** 2) + tf.reduce_mean(h[half:] ** 2)
        with tf.GradientTape() as tape:
            _, loss = tf.while_loop(lambda i, total: i < 2, body, (0, tf.constant(0.0)))
        grads = tape.gradient(loss, dense.trainable_variables)
        optimizer.apply_gradients(zip(grads, dense.trainable_variables))
        return loss
    concrete = step.get_concrete_function(tf.TensorSpec([None, F], tf.float32))
    found = analyze_graph(lift(concrete).graph).batch_mixing
    cut = "a StridedSlice cutting each worker's share at a point computed from its size"
    picked = ("an op of a function the step runs (a loop's body, a cond's branch) taking "
              "examples by their place in the batch")
    kinds = [cut if what.startswith(cut) else what for what in found.values()]
    assert kinds == ([cut] if how == "halves" else [picked, cut]), found


def _loss_of_reductions(kind: str) -> tf.Graph:
    """A loss computed from means over the batch in the way `kind` names."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, F], name="x")
        y = tf1.placeholder(tf.float64, [None, 1], name="y")
        w = tf1.placeholder(tf.float64, [None], name="w")
        lengths = tf1.placeholder(tf.int32, [None], name="lengths")
        error = tf.matmul(x, tf1.get_variable("w", [F, 1], tf.float64)) - y
        mse = tf.reduce_mean(tf.square(error))
        loss = {
            "rmse": lambda: tf.sqrt(mse, name="root"),
            "mean_times_mean": lambda: tf.multiply(mse, tf.reduce_mean(tf.abs(error)),
                                                   name="product"),
            "mean_over_mean": lambda: tf.divide(mse, tf.reduce_mean(tf.abs(error)),
                                                name="ratio"),
            "largest": lambda: tf.reduce_max(tf.square(error), name="largest"),
            "clipped": lambda: tf.minimum(mse, 1.0, name="clipped"),
            "linear": lambda: 0.5 * mse + tf.reduce_mean(tf.abs(error)) / 3.0 - 1.0,
            "sum_over_weights": lambda: tf.reduce_sum(tf.square(error)[:, 0] * w)
            / tf.reduce_sum(w),
            "tf1_mean": lambda: tf1.losses.mean_squared_error(
                y, error + y, reduction=tf1.losses.Reduction.MEAN),
            "over_longest": lambda: tf.divide(tf.reduce_sum(tf.square(error)), tf.cast(
                tf.reduce_max(lengths), tf.float64), name="over_longest"),
            "over_labels_mean": lambda: tf.divide(tf.reduce_sum(tf.square(error)),
                                                  tf.reduce_mean(y), name="over_labels_mean"),
            "times_labels_max": lambda: tf.multiply(mse, tf.reduce_max(y),
                                                    name="times_labels_max"),
            "over_size": lambda: tf.reduce_sum(tf.square(error)) / tf.cast(
                tf.size(error), tf.float64),
            "over_count": lambda: tf.reduce_sum(tf.square(error)) / tf.cast(
                tf.math.count_nonzero(y), tf.float64),
        }[kind]()
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


@pytest.mark.parametrize("kind,found", [
    ("rmse", ["root"]), ("mean_times_mean", ["product"]), ("mean_over_mean", ["ratio"]),
    ("largest", ["largest"]), ("clipped", ["clipped"]),
    # sums and means of the examples' terms: scaled, added, divided by a
    # count of the batch no variable changes (the sample weights' sum,
    # tf.compat.v1.losses' count of the loss's elements)
    ("linear", []), ("sum_over_weights", []), ("tf1_mean", []),
    # a division or product by a statistic of the batch's values that is no
    # count autopar makes the global batch's (before: trained as a mean);
    # by the batch's size, or a count of its nonzero labels: trained
    ("over_longest", ["over_longest"]), ("over_labels_mean", ["over_labels_mean"]),
    ("times_labels_max", ["times_labels_max"]), ("over_size", []), ("over_count", [])])
def test_a_loss_that_is_no_sum_or_mean_of_its_examples_terms_is_found(kind, found):
    """An RMSE loss: one device takes the root of the global batch's mean
    squared error, each worker would take it of its share's, and no
    combination of the workers' gradients is one device's (before:
    accepted, "assuming a mean")."""
    assert list(analyze_graph(_loss_of_reductions(kind)).batch_mixing) == found


def test_a_keras_steps_root_mean_squared_error_is_refused_naming_the_root():
    """The regression loss people write by hand, in a traced Keras step."""
    model = keras.Sequential([keras.Input((F,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.sqrt(tf.reduce_mean(tf.square(y - model(x, training=True))))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    concrete = step.get_concrete_function(tf.TensorSpec([None, F], tf.float32),
                                          tf.TensorSpec([None, 1], tf.float32))
    graph = lift(concrete).graph
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 3, autopar.Config())
    assert "the loss mixes the examples of a batch at 'Sqrt' (a Sqrt of a reduction over " \
        "the batch's examples ('Mean'): the loss is no sum or mean of each example's terms" \
        in str(refused.value)
    compile_for_config(graph, 1, autopar.Config())   # one worker: one device's


def test_autopar_fits_step_of_a_compiled_root_mean_squared_error_is_refused():
    """A loss function compile() takes that returns the root of its batch's
    mean: Keras's fit trains the root of the global batch's mean, so the
    step autopar.fit traces is refused on several workers, naming the root
    inside Keras's compiled loss (the job then ends before it starts)."""
    from autopar.runtime import keras_fit

    def rmse(y_true, y_pred):
        return tf.sqrt(tf.reduce_mean(tf.square(y_true - y_pred)))
    model = keras.Sequential([keras.Input((F,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss=rmse)
    x, y = np.zeros((6, F), np.float32), np.zeros((6, 1), np.float32)
    graph = lift(keras_fit.prepare(model, x, y, batch_size=6).step()).graph
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 2, autopar.Config())
    assert "at 'compile_loss/rmse/Sqrt' (a Sqrt of a reduction" in str(refused.value)


def _fit_step_graph(loss, y: np.ndarray, activation=None) -> tf.Graph:
    """The lifted step autopar.fit traces for a Dense layer over F features
    compiled with `loss` (Adam), fit on 6 examples of labels `y`."""
    from autopar.runtime import keras_fit
    model = keras.Sequential([keras.Input((F,)),
                              keras.layers.Dense(y.shape[1], activation=activation)])
    model.compile(optimizer="adam", loss=loss)
    x = np.zeros((len(y), F), np.float32)
    return lift(keras_fit.prepare(model, x, y, batch_size=len(y)).step()).graph


@pytest.mark.parametrize("how,refused", [
    ("first_two", "(a StridedSlice taking examples by their place in the batch"),
    ("kept_mean", "(a Mean of the values 'compile_loss/kept/Where' keeps"),
    ("over_labels_mean", "(a division by 'compile_loss/kept/Mean', a statistic of the worker's "
                         "batch's values"),
    ("mean", None)])
def test_autopar_fits_step_of_a_compiled_loss_picking_or_counting_by_the_batch(how, refused):
    """Loss functions compile() takes, traced by autopar.fit: one weighing
    the batch's first two examples apart, one averaging what a mask of the
    labels keeps, one dividing by the labels' mean: refused on several
    workers naming the op; a plain mean trains."""
    def kept(y_true, y_pred):
        error = tf.square(y_true - y_pred)
        return {"first_two": lambda: tf.reduce_mean(error) + tf.reduce_mean(error[:2]),
                "kept_mean": lambda: tf.reduce_mean(tf.gather_nd(error, tf.where(y_true > 0))),
                "over_labels_mean": lambda: tf.reduce_sum(error) / tf.reduce_mean(y_true),
                "mean": lambda: tf.reduce_mean(error)}[how]()
    graph = _fit_step_graph(kept, np.ones((6, 1), np.float32))
    if refused is None:
        compile_for_config(graph, 2, autopar.Config())
        return
    with pytest.raises(UnsupportedGraphError) as refusal:
        compile_for_config(graph, 2, autopar.Config())
    assert refused in str(refusal.value), str(refusal.value)


@pytest.mark.parametrize("loss,refused_at", [
    # Dice and Tversky over the whole batch (axis=None): a ratio of sums
    # over every example (before: Tversky's loss was taken for the sum in
    # its denominator, whose gradient the ratio's reads, and the workers'
    # gradients were added)
    (lambda: keras.losses.Dice(), "compile_loss/dice/truediv"),
    (lambda: keras.losses.Tversky(), "compile_loss/tversky/truediv"),
    # each example's Dice: a mean of per-example terms
    (lambda: keras.losses.Dice(axis=(1,)), None)])
def test_keras_losses_over_the_whole_batch_are_refused_and_per_example_ones_trained(
        loss, refused_at):
    graph = _fit_step_graph(loss(), np.zeros((6, 3), np.float32), activation="sigmoid")
    if refused_at is None:
        compile_for_config(graph, 3, autopar.Config())
        return
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 3, autopar.Config())
    assert f"the loss mixes the examples of a batch at '{refused_at}' (a RealDiv of a " \
        "reduction over the batch's examples" in str(refused.value)


# The refusals above, in a TF1-era script that calls disable_v2_behavior()
# first (reference variables, V1 tensor shapes): the same ops are named.
_V1_LOSSES = r'''
import json, sys
import tensorflow as tf
tf1 = tf.compat.v1
if sys.argv[1] == "v1":
    tf1.disable_v2_behavior()
import autopar
from autopar.transforms.compile import compile_for_config
out = {}
for kind in ("rmse", "rolled", "mean_times_size", "first_two", "kept_mean", "over_y_mean",
             "mean", "weighted_one_hot"):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 5])
        y = tf1.placeholder(tf.float32, [None, 1])
        err = tf.matmul(x, tf1.get_variable("w", [5, 1])) - y
        loss = {"rmse": lambda: tf.sqrt(tf.reduce_mean(tf.square(err)), name="root"),
                "rolled": lambda: tf.reduce_mean(err * tf.roll(err, 1, axis=0, name="next")),
                "mean_times_size": lambda: tf.reduce_mean(tf.square(err)) * tf.cast(
                    tf.shape(err)[0], tf.float32),
                "first_two": lambda: tf.reduce_mean(tf.square(err[:2])),
                "kept_mean": lambda: tf.reduce_mean(tf.gather_nd(err, tf.where(y > 0)),
                                                    name="kept_mean"),
                "over_y_mean": lambda: tf.divide(tf.reduce_sum(tf.square(err)),
                                                 tf.reduce_mean(y), name="over_y_mean"),
                "mean": lambda: tf.reduce_mean(tf.square(err)),
                # each example's softmax loss over one-hot labels, weighted
                "weighted_one_hot": lambda: tf1.losses.softmax_cross_entropy(
                    tf.one_hot(tf.cast(y[:, 0], tf.int32), 3),
                    tf.matmul(x, tf1.get_variable("w3", [5, 3])), weights=tf.abs(y[:, 0]))
                }[kind]()
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    try:
        compile_for_config(graph, 3, autopar.Config())
        out[kind] = "trained"
    except autopar.UnsupportedGraphError as refused:
        out[kind] = str(refused)[:90]
print(json.dumps(out))
'''


# A cond deciding by a value of the whole batch, in a graph built with V1
# control flow (Switch and Merge, whose branch ops precede their Switch in
# the graph) and with V2's (If).
_CONDS = r'''
import json, sys
import tensorflow as tf
tf1 = tf.compat.v1
if sys.argv[1] == "v1":
    tf1.disable_v2_behavior()
from autopar.transforms.analysis import analyze_graph
out = {}
for kind in ("mean", "all"):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 5])
        y = tf1.placeholder(tf.float32, [None, 1])
        err = tf.matmul(x, tf1.get_variable("w", [5, 1])) - y
        decides = tf.reduce_mean(y) > 0.5 if kind == "mean" else tf.reduce_all(y >= 0)
        per = tf.cond(decides, lambda: tf.square(err), lambda: tf.abs(err))
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(per))
    analysis = analyze_graph(graph)
    out[kind] = [analysis.batch_mixing, analysis.checked_predicates]
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["v1", "v2"])
def test_a_cond_on_the_whole_batch_is_refused_or_checked_alike(behaviour):
    """The mean of the labels over a threshold may hold on every share and
    not on the global batch: refused, naming the cond (before, under V1
    behaviour: accepted, the branches' ops read before their Switch and
    taken for values of no example). Whether every label passes a test is
    the global batch's exactly when every share's is: checked alike in each
    training step."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _CONDS, behaviour], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    mixing, checked = found["mean"]
    assert mixing and checked == {}, found
    assert all(what.startswith(f"a {'Switch' if behaviour == 'v1' else 'StatelessIf'} deciding "
                               "by a value of the whole batch") for what in mixing.values())
    assert found["all"] == [{}, {"All:0": "cond"}], found


@pytest.mark.slow
def test_the_refusals_are_the_same_in_a_graph_built_under_v1_behaviour():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    found = {}
    for behaviour in ("v1", "v2"):
        proc = subprocess.run([sys.executable, "-c", _V1_LOSSES, behaviour], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found[behaviour] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["v1"] == found["v2"]
    assert found["v1"]["rmse"].startswith("the loss mixes the examples of a batch at 'root' "
                                          "(a Sqrt of a reduction")
    assert found["v1"]["rolled"].startswith("the loss mixes the examples of a batch at 'next'")
    assert found["v1"]["mean_times_size"].startswith(
        "cannot tell how the loss reduces over the batch")
    assert found["v1"]["first_two"].startswith(
        "the loss mixes the examples of a batch at 'strided_slice' (a StridedSlice taking")
    assert found["v1"]["kept_mean"].startswith(
        "the loss mixes the examples of a batch at 'kept_mean' (a Mean of the values")
    assert found["v1"]["over_y_mean"].startswith(
        "the loss mixes the examples of a batch at 'over_y_mean' (a division by 'Mean'")
    assert found["v1"]["mean"] == "trained"
    # the losses softmax_cross_entropy_with_logits reshapes back to
    # tf.slice(tf.shape(logits), [0], [rank - 1]) are each example's (before:
    # refused, "the loss mixes the examples of a batch at
    # 'softmax_cross_entropy_loss/Mul'")
    assert found["v1"]["weighted_one_hot"] == "trained"


def _inner_gradient(kind: str) -> tf.Graph:
    """A loss computed from a gradient of the batch's loss taken inside it
    (tf.gradients in the forward pass), of `kind`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, F], name="x")
        y = tf1.placeholder(tf.int64, [None], name="y")
        w = tf1.get_variable("w", [F, 3], tf.float64)

        def loss_of(inputs, weights, reduce=tf.reduce_mean):
            return reduce(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=tf.matmul(inputs, weights)))
        loss = loss_of(x, w)
        if kind == "inner_step":            # MAML's inner loop: w moved by the batch's gradient
            (g,) = tf.gradients(loss, [w])
            total = loss_of(x, w - 0.5 * g)
        elif kind == "adversarial_step":    # x moved along the gradient of the batch's mean
            (g,) = tf.gradients(loss, [x])
            total = loss + loss_of(tf.stop_gradient(x + 10.0 * g), w)
        elif kind == "input_gradient_penalty":
            (g,) = tf.gradients(loss, [x])
            total = loss + tf.reduce_mean(tf.reduce_sum(tf.square(g), 1))
        elif kind == "adversarial_sign":    # the fast gradient sign method: its sign only
            (g,) = tf.gradients(loss, [x])
            total = loss + loss_of(tf.stop_gradient(x + 0.1 * tf.sign(g)), w)
        elif kind == "adversarial_step_of_the_sum":   # each example's own gradient
            (g,) = tf.gradients(loss_of(x, w, tf.reduce_sum), [x])
            total = loss + loss_of(tf.stop_gradient(x + 0.1 * g), w)
        tf1.train.GradientDescentOptimizer(0.1).minimize(total)
    return graph


@pytest.mark.parametrize("kind,op,what", [
    ("inner_step", "gradients/MatMul_grad/MatMul_1", "with respect to a variable"),
    ("adversarial_step", "gradients/MatMul_grad/MatMul", "a loss averaged over the batch, "
                                                         "with respect to the batch's own values"),
    ("input_gradient_penalty", "gradients/MatMul_grad/MatMul", "a loss averaged over the batch"),
])
def test_a_gradient_of_the_batchs_loss_inside_the_loss_is_refused(kind, op, what):
    """One device's is a sum over the global batch (with respect to a
    variable) or each example's gradient scaled by 1 / B (with respect to
    the batch's values, of a mean); each worker's would be over its share,
    or scaled by 1 / b (3 workers: parameters off by up to 0.1 after 4
    steps, before)."""
    graph = _inner_gradient(kind)
    assert op in analyze_graph(graph).batch_mixing
    assert what in analyze_graph(graph).batch_mixing[op]
    with pytest.raises(UnsupportedGraphError, match=f"mixes the examples of a batch at '{op}'"):
        compile_for_config(graph, 3, autopar.Config())
    compile_for_config(graph, 3, autopar.Config(batch_mixing="per_worker"))
    compile_for_config(graph, 1, autopar.Config())


@pytest.mark.parametrize("kind", ["adversarial_sign", "adversarial_step_of_the_sum"])
def test_an_inner_gradient_each_example_gets_alike_is_not_refused(kind):
    """Its sign, or the gradient of the examples' sum: each example's own,
    whatever the batch's size."""
    assert analyze_graph(_inner_gradient(kind)).batch_mixing == {}
