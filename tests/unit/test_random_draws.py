"""Random draws per example (transforms.random_draws): which random ops draw
per example, and that worker w of N, fed examples w, w+N, ... of one
device's global batch, draws exactly one device's values for them."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.runtime.step.executor import step_run_options
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lower_cond import lowered_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from tests.unit.local_run import (each_worker_holds, run_locally, run_workers_together,
                                  trained_alone_and_together, variable_reads)

tf1 = tf.compat.v1
N, B = 3, 4          # workers, examples per worker


def _graph(draw, batch=None, width=5, graph_seed=7, before=None):
    """x -> draw(x) -> a trained Dense; the draw's result is 'drawn'.
    `before`: ops built first (as a chief's summaries would be)."""
    graph = tf.Graph()
    with graph.as_default():
        if graph_seed is not None:
            tf1.set_random_seed(graph_seed)
        if before is not None:
            before()
        x = tf1.placeholder(tf.float64, [batch, width], name="x")
        h = tf.identity(draw(x), name="drawn")
        w = tf1.get_variable("w", [5, 1], tf.float64)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(h, w) ** 2))
    return graph


DRAWS = {
    # TF1's dropout: a stateful RandomUniform of tf.shape(x)
    "tf1_dropout": lambda x: tf1.nn.dropout(x, rate=0.5),
    # Keras 3's: stateless, a noise shape packed from tf.shape(x)[0]
    "stateless_noise_shape": lambda x: tf.nn.experimental.stateless_dropout(
        x, 0.5, seed=[1, 2], noise_shape=tf.stack([tf.shape(x)[0], 1])),
    "gaussian_noise": lambda x: x + tf.random.normal(tf.shape(x), dtype=tf.float64),
    # a mask of a tensor tf.repeat made (Keras's UpSampling2D, a GAN's
    # generator): a Tile by a count TensorFlow cannot fold
    "after_repeat": lambda x: tf1.nn.dropout(tf.repeat(x, 2, axis=1), rate=0.5)[:, ::2],
    # a mask of a dilated convolution's output (SpaceToBatchND, the
    # convolution, BatchToSpaceND: the batch axis in blocks and back)
    "after_dilated_conv": lambda x: tf1.nn.dropout(tf.nn.convolution(
        x[:, :, None], tf.ones([2, 1, 1], tf.float64), padding="SAME", dilations=2)[:, :, 0],
        rate=0.5),
    # a mask of a softmax over another axis than the last (a transpose by a
    # permutation built from the rank)
    "after_softmax_over_axis_1": lambda x: tf1.nn.dropout(
        tf.nn.softmax(tf.stack([x, 2 * x], -1), axis=1)[:, :, 0], rate=0.5),
    # a mask of hashed features (Keras's Hashing: AsString, then a hash bucket)
    "after_hashing": lambda x: tf1.nn.dropout(tf.cast(tf.strings.to_hash_bucket_fast(
        tf.strings.as_string(x), 7), tf.float64), rate=0.5),
    # a mask of a crop that keeps every row by the batch's own count
    # (keras.ops.image.crop_images: tf.slice to tf.shape(x)[0] rows)
    "after_crop": lambda x: tf1.nn.dropout(
        tf.pad(tf.slice(x, [0, 1], tf.stack([tf.shape(x)[0], 3])), [[0, 0], [1, 1]]), rate=0.5),
    # a mask of frames of each row (tf.signal.frame, as an STFT frames a
    # signal: its shape split into outer, framed and inner dimensions)
    "after_frames": lambda x: tf1.nn.dropout(
        tf.reshape(tf.signal.frame(x, 2, 1), tf.stack([tf.shape(x)[0], 8]))[:, :5], rate=0.5),
    # a tf.random.Generator's op, whose state advances by the draw's size
    "generator": lambda x: x * tf.random.Generator.from_seed(3).uniform(tf.shape(x),
                                                                         dtype=tf.float64),
}


def _draw_ops(graph, analysis):
    return [graph.get_operation_by_name(n).type for n in analysis.batch_draws]


def _run(graph_def, xs, runs=2):
    """'drawn' for each of `runs` runs on each batch of `xs`, in one session
    on this process (devices cleared), the variables initialised."""
    return run_locally(graph_def, lambda session: [session.run("drawn:0", {"x:0": x})
                                                   for x in xs for _ in range(runs)])


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_each_worker_draws_one_devices_values_for_its_examples(name):
    graph = _graph(DRAWS[name])
    analysis = analyze_graph(graph)
    types = _draw_ops(graph, analysis)
    # the generator's state read is advanced by one device's count too
    assert len(types) - types.count("RngReadAndSkip") == 1, analysis.batch_draws
    assert types.count("RngReadAndSkip") == (name == "generator")
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    assert (f"random draws per example ('{next(iter(analysis.batch_draws))}'"
            in build_report(analysis, plan).table())
    x = np.random.default_rng(0).normal(size=(2, N * B, 5)) + 3.0
    one_device = _run(graph.as_graph_def(), x)
    for w in range(N):
        graph_def = rewrite_for_worker(graph, analysis, plan, w).meta_graph.graph_def
        mine = _run(graph_def, x[:, w::N])
        for got, expected in zip(mine, one_device):
            np.testing.assert_array_equal(got, expected[w::N])


def test_a_static_batch_size_folded_into_a_constant_shape():
    """With the batch's size in the placeholder, tf.shape(x) is a constant:
    the mask it multiplies the activations by shows it per example. Each
    worker's graph is built for its own b examples, one device's for N*b."""
    worker_graph = _graph(DRAWS["tf1_dropout"], batch=B)
    analysis = analyze_graph(worker_graph)
    assert _draw_ops(worker_graph, analysis) == ["RandomUniform"]
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    x = np.random.default_rng(1).normal(size=(2, N * B, 5)) + 3.0
    one_device = _run(_graph(DRAWS["tf1_dropout"], batch=N * B).as_graph_def(), x)
    for w in range(N):
        mine = _run(rewrite_for_worker(worker_graph, analysis, plan, w).meta_graph.graph_def,
                    x[:, w::N])
        for got, expected in zip(mine, one_device):
            np.testing.assert_array_equal(got, expected[w::N])


def _positions_graph(batch: int, length: int = 3):
    """A static batch of `batch` examples of `length` positions, flattened
    to one row per position before a dropout (BERT's layers: [b * L, d])."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        x = tf1.placeholder(tf.float64, [batch, length, 5], name="x")
        # (its scope after "gradients": the backward pass's reads of the
        # mask, which have no forms, come first in name order)
        with tf.name_scope("layer"):
            dropped = tf1.nn.dropout(tf.reshape(x, [batch * length, 5]), rate=0.5)
        h = tf.identity(dropped, name="drawn")
        w = tf1.get_variable("w", [5, 1], tf.float64)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(h, w) ** 2))
    return graph


def test_a_static_batch_of_several_rows_per_example_draws_each_examples_rows():
    """The mask's shape is the constant [b * L, 5]: each example owns L rows
    of it, so each worker keeps L rows per example of one device's draw (the
    end-to-end BERT graph of bench/transform_scale.py failed with 'indices[2]
    = 4 is not in [0, 4)' when each example was taken to own one row)."""
    length = 3
    worker_graph = _positions_graph(B, length)
    analysis = analyze_graph(worker_graph)
    assert list(analysis.batch_draws.values()) == [[1, length]]
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    x = np.random.default_rng(2).normal(size=(2, N * B, length, 5)) + 3.0
    one_device = _run(_positions_graph(N * B, length).as_graph_def(), x)
    for w in range(N):
        mine = _run(rewrite_for_worker(worker_graph, analysis, plan, w).meta_graph.graph_def,
                    x[:, w::N])
        for got, expected in zip(mine, one_device):
            np.testing.assert_array_equal(got.reshape(B, length, 5),
                                          expected.reshape(N * B, length, 5)[w::N])


@pytest.mark.parametrize("draw", [
    # a mask shared by every example of the batch: one device draws it once
    lambda x: tf.nn.experimental.stateless_dropout(x, 0.5, seed=[1, 2], noise_shape=[1, 5]),
    # noise on a weight, and a draw whose shape depends on nothing
    lambda x: tf.matmul(x, tf.ones([5, 5], tf.float64)
                        + tf.random.normal([5, 5], dtype=tf.float64)),
    # a static batch of 4 and a [4, 4] draw that only meets x through a matmul
    lambda x: tf.matmul(tf.random.uniform([4, 4], dtype=tf.float64), x),
    # a draw per feature, of x's static width: one device draws the same
    lambda x: x * tf.random.uniform([tf.shape(x)[1]], dtype=tf.float64),
], ids=["shared_mask", "weight_noise", "not_combined_with_the_batch", "per_feature"])
def test_draws_that_are_not_per_example_are_left_as_they_are(draw):
    graph = _graph(draw, batch=4)
    assert analyze_graph(graph).batch_draws == {}


@pytest.mark.parametrize("graph_seed,before", [
    (None, None),
    # the worker's script made an op first: its draw's seed2 (the graph's
    # count of ops) is not the compiling process's
    (7, lambda: tf.random.uniform([1], name="chief_only")),
], ids=["unseeded", "other_op_ids"])
@pytest.mark.parametrize("draw", [
    lambda x: tf.matmul(x, tf.ones([5, 5], tf.float64)
                        + tf.random.normal([5, 5], dtype=tf.float64)),
    lambda x: tf.matmul(tf.random.uniform([4, 4], dtype=tf.float64), x),
    lambda x: x * tf.random.uniform([tf.shape(x)[1]], dtype=tf.float64),
], ids=["weight_noise", "not_combined_with_the_batch", "per_feature"])
def test_draws_shared_over_the_batch_are_one_devices_on_every_worker(draw, graph_seed, before):
    """Such a draw is one device's only if every worker draws it alike: each
    worker's graph draws with the seeds of the process that compiled the
    plan, TensorFlow's default graph seed and a number from the name for an
    op given none."""
    graph = _graph(draw, batch=4, graph_seed=graph_seed)
    analysis = analyze_graph(graph)
    [(op, seeds)] = analysis.shared_draws.items()
    node = graph.get_operation_by_name(op)
    assert node.type in ("RandomStandardNormal", "RandomUniform")
    assert seeds == ([node.get_attr("seed"), node.get_attr("seed2")] if graph_seed else
                     [87654321, seeds[1]])
    assert graph_seed or seeds[1]   # (0, 0): the kernel would seed itself
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    assert f"random draws every worker makes alike ('{op}' (seeds {seeds[0]}, {seeds[1]})" in (
        build_report(analysis, plan).table())
    one_device = graph.as_graph_def()
    for n in one_device.node:
        if n.name == op:
            n.attr["seed"].i, n.attr["seed2"].i = seeds
    x = np.random.default_rng(0).normal(size=(2, 4, 5))
    expected = _run(one_device, x)
    for w in range(N):
        # (each worker's script built its graph itself)
        mine = _graph(draw, batch=4, graph_seed=graph_seed, before=before)
        got = _run(rewrite_for_worker(mine, analysis, plan, w).meta_graph.graph_def, x)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)


def test_an_initializers_draw_stays_unseeded():
    """It runs on the chief alone (then broadcast): nothing to make alike."""
    graph = _graph(lambda x: x + tf1.get_variable("noise", [5], tf.float64), graph_seed=None)
    assert graph.get_operation_by_name("noise/Initializer/random_uniform/RandomUniform")
    assert analyze_graph(graph).shared_draws == {}


@pytest.mark.parametrize("draw,op,why", [
    # a draw per feature of a width each worker's batch has its own of
    (lambda x: tf.matmul(x * tf.random.uniform([tf.shape(x)[1]], dtype=tf.float64),
                         tf.ones([5, 5], tf.float64)[:tf.shape(x)[1]]),
     "random_uniform/RandomUniform", "its first element is not the batch's size"),
    (lambda x: x * tf.cast(tf.random.categorical(x, 5), tf.float64),
     "categorical/Multinomial", "its inputs come from the input batch"),
    (lambda x: tf.random.shuffle(x), "RandomShuffle", "its inputs come from the input batch"),
], ids=["second_dimension", "categorical", "shuffle"])
def test_a_draw_that_depends_on_the_batch_otherwise_is_refused_by_name(draw, op, why):
    with pytest.raises(UnsupportedGraphError, match=f"random op '{op}'.*{why}"):
        analyze_graph(_graph(draw, width=None))


def test_a_dropout_under_a_training_cond_is_lowered_and_drawn_per_example():
    """tf.cond(is_training, dropout, identity), as tf.compat.v1.layers.dropout
    builds it for a `training` tensor: the mask is drawn in the cond's
    branch function, which get_runner lowers into the graph
    (transforms.lower_cond); before, the analysis did not see the draw."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        training = tf1.placeholder_with_default(True, [], name="training")
        x = tf1.placeholder(tf.float64, [None, 5], name="x")
        h = tf.identity(tf.cond(training, lambda: tf1.nn.dropout(x, rate=0.5), lambda: x),
                        name="drawn")
        w = tf1.get_variable("w", [5, 1], tf.float64)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(h, w) ** 2))
    assert any(op.type == "If" for op in graph.get_operations())
    graph = lowered_graph(graph)
    analysis = analyze_graph(graph)
    assert _draw_ops(graph, analysis) == ["RandomUniform"]
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    x = np.random.default_rng(2).normal(size=(2, N * B, 5)) + 3.0
    one_device = _run(graph.as_graph_def(), x)
    for w in range(N):
        mine = _run(rewrite_for_worker(graph, analysis, plan, w).meta_graph.graph_def, x[:, w::N])
        for got, expected in zip(mine, one_device):
            np.testing.assert_array_equal(got, expected[w::N])


def _label_noise(x):
    """The two halves of a GAN's discriminator batch, x's rows then 2x's,
    each row plus noise drawn of their shape (keras-io's DCGAN)."""
    labels = tf.concat([x, 2 * x], 0)
    noisy = labels + tf.random.uniform(tf.shape(labels), dtype=tf.float64)
    return noisy[:tf.shape(x)[0]] + noisy[tf.shape(x)[0]:]


def _run_together(graph_defs, xs, in_step: str, runs=2):
    """'drawn' of every worker's graph for each of `runs` runs on each
    step's shares `xs[step][w]`, the N graphs in one session, worker w on
    CPU:w (their collectives between local devices), each run a training
    step (the in-step flag fed True, the run options a step's)."""
    graph = tf.Graph()
    with graph.as_default():
        for w, graph_def in enumerate(graph_defs):
            graph_def = type(graph_def).FromString(graph_def.SerializeToString())
            for node in graph_def.node:
                node.device = f"/device:CPU:{w}"
            tf1.import_graph_def(graph_def, name=f"w{w}")
        config = tf1.ConfigProto(device_count={"CPU": len(graph_defs)})
        with tf1.Session(graph=graph, config=config) as sess:
            sess.run([op for op in graph.get_operations() if op.name.endswith("/Assign")])
            out = []
            for shares in xs:
                for _ in range(runs):
                    feed = {f"w{w}/x:0": x for w, x in enumerate(shares)}
                    feed.update({f"w{w}/{in_step}": True for w in range(len(shares))})
                    out.append(sess.run([f"w{w}/drawn:0" for w in range(len(shares))], feed,
                                        options=step_run_options()))
            return out


@pytest.mark.parametrize("name", ["tf1_dropout", "stateless_noise_shape", "generator",
                                  "label_noise"])
def test_unequal_shares_draw_one_devices_values_for_each_workers_examples(name):
    """7 examples on 3 workers (3/2/2), as autopar.shard splits a dataset's
    last batch and autopar.fit a batch of 7: each worker's rows of one
    device's draw. "label_noise": a GAN's labels for its fake rows then its
    real ones (2 blocks of b rows), noise drawn of their shape."""
    draws = dict(DRAWS, label_noise=lambda x: _label_noise(x))
    graph = _graph(draws[name])
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, analysis, plan, w) for w in range(N)]
    in_step = rewritten[0].in_step
    assert in_step is not None
    total = 7
    x = np.random.default_rng(3).normal(size=(2, total, 5)) + 3.0
    one_device = _run(graph.as_graph_def(), x)
    together = _run_together([r.meta_graph.graph_def for r in rewritten],
                             [[step[w::N] for w in range(N)] for step in x], in_step)
    for got, expected in zip(together, one_device):
        for w in range(N):
            np.testing.assert_array_equal(got[w], expected[w::N], err_msg=f"worker {w}")



def _padded_graph(draw):
    """Sequences of 5 features padded to a length the graph leaves unknown
    (a dataset's padded_batch) -> draw(x) -> a trained projection."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        x = tf1.placeholder(tf.float64, [None, None, 5], name="x")
        h = tf.identity(draw(x), name="drawn")
        w = tf1.get_variable("w", [5, 1], tf.float64)
        tf1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_mean(tf.tensordot(h, w, 1) ** 2))
    return graph


PADDED_DRAWS = {
    # Keras's Dropout after a Dense over each position: its shape is
    # tf.shape of a tensordot's output, reshaped from [b * L, 5] by a shape
    # gathered from tf.shape(x)
    "dropout_after_tensordot": lambda x: tf1.nn.dropout(
        tf.tensordot(x, tf.ones([5, 5], tf.float64), 1), rate=0.5),
    # a mask per position, shared by its features (Dropout's
    # noise_shape=(None, None, 1)): a noise shape of the batch's size, the
    # padded length, 1
    "per_position": lambda x: tf.nn.experimental.stateless_dropout(
        x, 0.5, seed=[1, 2], noise_shape=tf.stack([tf.shape(x)[0], tf.shape(x)[1], 1])),
    "gaussian_noise": lambda x: x + tf.random.normal(tf.shape(x), dtype=tf.float64),
}


@pytest.mark.parametrize("name", sorted(PADDED_DRAWS))
def test_a_draw_over_padded_sequences_draws_one_devices_values_for_each_workers_examples(name):
    """A mask of [b, L, d] where L is the inputs' padded length: every
    training step checks the workers padded to one device's L
    (transforms.padded_lengths), so 7 sequences of length 4 on 3 workers
    (3/2/2) each draw their rows of one device's mask (before: refused,
    "a padded length")."""
    graph = _padded_graph(PADDED_DRAWS[name])
    analysis = analyze_graph(graph)
    assert analysis.padded_inputs == {"x:0": [1]}
    assert len(analysis.batch_draws) == 1
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, analysis, plan, w) for w in range(N)]
    x = np.random.default_rng(4).normal(size=(2, 7, 4, 5)) + 3.0
    one_device = _run(graph.as_graph_def(), x)
    together = _run_together([r.meta_graph.graph_def for r in rewritten],
                             [[step[w::N] for w in range(N)] for step in x],
                             rewritten[0].in_step)
    for got, expected in zip(together, one_device):
        for w in range(N):
            np.testing.assert_array_equal(got[w], expected[w::N], err_msg=f"worker {w}")


@pytest.mark.parametrize("draw", [
    # a length computed from the ids' values: each worker's maximum, not
    # one device's
    lambda x: tf.pad(tf1.nn.dropout(x[:, :tf.cast(tf.reduce_max(x[:, 0, 0]), tf.int32)],
                                    rate=0.5), [[0, 0], [0, 1], [0, 0]])[:, :tf.shape(x)[1]],
    # a second dimension of the batch's size: each worker's b, not one device's B
    lambda x: x * tf.random.uniform(tf.stack([tf.shape(x)[0], tf.shape(x)[0]]),
                                    dtype=tf.float64)[:, :1, None],
], ids=["length_of_the_values", "length_of_the_batch"])
def test_a_draw_over_another_length_than_the_padded_inputs_is_refused(draw):
    with pytest.raises(UnsupportedGraphError, match="holds a length of the worker's batch "
                       "other than its count of examples, which one device's batch may have"):
        analyze_graph(_padded_graph(draw))


def test_a_string_lookup_keeps_each_example_to_itself():
    """keras-io's wide & deep model looks string ids up in a StringLookup's
    vocabulary (a lifted table): each key's value is its example's (before:
    no rule for LookupTableFindV2, its output of no example)."""
    import keras

    from autopar.transforms.example_rows import ExampleRows, is_rows
    from autopar.transforms.lift import lift
    words = keras.Input((), dtype="string")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"], mask_token=None,
                                       num_oov_indices=0)
    model = keras.Model(words, lookup(words))
    graph = lift(tf.function(model).get_concrete_function(
        tf.TensorSpec([None], tf.string))).graph
    (find,) = [op for op in graph.get_operations() if op.type == "LookupTableFindV2"]
    assert is_rows(ExampleRows(graph).form(find.outputs[0]))


def test_ids_of_unknown_rank_keep_their_examples_through_keras_embedding():
    """keras-io's wide & deep model: a StringLookup's ids (of unknown rank in
    the lifted graph) go through Keras's Embedding, which wraps negative ids
    (SelectV2(ids < 0, ids + n, ids)): ops of unknown rank but provably the
    ids' one shape (a scalar beside them), so the looked-up rows stay each
    example's and a dropout after them is drawn per example (before: every
    elementwise op of unknown rank was 'elems', the concatenation after it
    'mixed', and the dropout refused). The lift now gives those ops the
    shape tracing inferred (transforms.lift._with_traced_shapes); the rule
    for ops of unknown rank is test_only_what_provably_keeps_a_shape_shares_its_source's."""
    import keras

    from autopar.transforms.example_rows import ExampleRows, is_rows
    from autopar.transforms.lift import lift
    words = keras.Input((), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"], mask_token=None,
                                    num_oov_indices=0)(words)
    numbers = keras.Input((), dtype="float32")
    features = keras.layers.concatenate([keras.layers.Embedding(3, 2)(ids),
                                         keras.ops.expand_dims(numbers, -1)])
    model = keras.Model([words, numbers], keras.layers.Dense(2)(features))
    graph = lift(tf.function(model).get_concrete_function(
        [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.float32)])).graph
    rows = ExampleRows(graph)
    (select,) = [op for op in graph.get_operations() if op.type == "SelectV2"]
    assert select.outputs[0].shape.as_list() == [None]
    (matmul,) = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert is_rows(rows.form(select.outputs[0])) and is_rows(rows.form(matmul.outputs[0]))


def test_only_what_provably_keeps_a_shape_shares_its_source():
    """shape_source: elementwise ops with scalars, a lookup with a scalar
    default, keep their input's shape; two tensors of unknown shape, or a
    V1 Select (its condition may be a vector), do not."""
    from autopar.transforms.example_rows import shape_source
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.int64, None)
        y = tf1.placeholder(tf.int64, None)
        kept = tf.where(tf.less(x, 0), x + 3, tf.identity(x))
        both = x + y
        select = tf1.where(tf1.placeholder(tf.bool, None), x, x)
    memo = {}
    assert shape_source(kept, memo) is x
    assert shape_source(both, memo) is both
    assert shape_source(select, memo) is select


def test_a_string_lookups_multi_hot_rows_are_each_examples():
    """keras-io's wide & deep baseline: a StringLookup's multi-hot output
    (output_mode='binary': tf.math.bincount along the last axis, its size
    min(depth, max(depth, the batch's largest id + 1))) counts each example's
    row alone, and its size is the vocabulary's on every worker (before: no
    rule for DenseBincount, its size a value of the batch; the dropout after
    it was refused). A vector's counts are of the whole batch."""
    import keras

    from autopar.transforms.example_rows import ExampleRows, is_rows
    from autopar.transforms.lift import lift
    words = keras.Input((), dtype="string")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"], mask_token=None,
                                       num_oov_indices=0, output_mode="binary")
    model = keras.Model(words, keras.layers.Dense(2)(lookup(keras.ops.expand_dims(words, -1))))
    graph = lift(tf.function(model).get_concrete_function(
        tf.TensorSpec([None], tf.string))).graph
    rows = ExampleRows(graph)
    (count,) = [op for op in graph.get_operations() if op.type == "DenseBincount"]
    assert is_rows(rows.form(count.outputs[0])) and rows.form(count.inputs[1]) == ("shared",)

    vector = tf.Graph()
    with vector.as_default():
        ids = tf1.placeholder(tf.int32, [None])
        counts = tf.math.bincount(ids, minlength=5, maxlength=5, axis=-1)
        uneven = tf.math.bincount(ids, minlength=3, maxlength=5)
    rows = ExampleRows(vector)
    assert rows.form(counts)[0] == "reduced"
    # min(5, max(3, largest + 1)) depends on the batch's largest id
    assert rows.form(uneven.op.inputs[1]) != ("shared",)


def test_a_draw_inside_a_loops_body_is_refused_by_name():
    """TensorFlow 2's tf.while_loop keeps its body in a function (a TF1
    program's dynamic_rnn with a DropoutWrapper): every worker would draw
    the mask rows of the first examples, the same on every worker."""
    def loop(x):
        return tf.while_loop(lambda i, h: i < 2,
                             lambda i, h: (i + 1, tf1.nn.dropout(h, rate=0.5)), [0, x])[1]
    with pytest.raises(UnsupportedGraphError,
                       match="random op 'dropout/random_uniform/RandomUniform' \\(RandomUniform\\) "
                             "draws inside the function 'while_body.*', which 'while' \\(While\\)"):
        analyze_graph(_graph(loop))


class _DroppedOutputs:
    """A cell's outputs dropped out, as DropoutWrapper(output_keep_prob)
    drops them: a mask drawn in each step of the loop, or `mask`, drawn once
    before it for every step (variational_recurrent)."""

    def __init__(self, cell, mask=None):
        self.cell, self.mask = cell, mask
        self.state_size = self.output_size = cell.output_size

    def zero_state(self, batch_size, dtype):
        return self.cell.zero_state(batch_size, dtype)

    def __call__(self, x, h, scope=None):
        out, state = self.cell(x, h)
        if self.mask is None:
            return tf1.nn.dropout(out, rate=0.3, seed=3), state
        return out * self.mask, state


def _v1_rnn(dropout: str) -> tuple:
    """dynamic_rnn in TensorFlow 1's control flow (Enter, Merge, Switch: a
    program that called disable_v2_behavior()) with its outputs dropped out
    in the loop or by a mask drawn before it."""
    from tests.programs.rnn_lengths import ElmanCell   # BasicRNNCell's step, no legacy Keras
    graph = tf.Graph()
    tf1.disable_control_flow_v2()
    try:
        with graph.as_default():
            tf1.set_random_seed(1)
            x = tf1.placeholder(tf.float64, [None, 4, 3], name="x")
            y = tf1.placeholder(tf.int32, [None], name="y")
            mask = None if dropout == "in_the_loop" else tf1.nn.dropout(
                tf.ones(tf.stack([tf.shape(x)[0], 4]), tf.float64), rate=0.3, seed=3)
            outputs, _ = tf1.nn.dynamic_rnn(_DroppedOutputs(ElmanCell(4, tf.float64), mask), x,
                                            dtype=tf.float64)
            head = tf1.get_variable("head", [4, 3], tf.float64,
                                    tf1.glorot_uniform_initializer(seed=2))
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=tf.matmul(outputs[:, -1], head)))
            train = tf1.train.AdamOptimizer(0.05).minimize(loss)
    finally:
        tf1.enable_control_flow_v2()
    return graph, train


def test_a_draw_inside_a_v1_loops_body_is_refused_by_name():
    """The same refusal for a mask drawn in each step of a TensorFlow 1
    while loop (before: not refused, and the step failed when it ran, the
    rewrite's ops being outside the loop's frame: "has inputs from different
    frames")."""
    graph, _ = _v1_rnn("in_the_loop")
    with pytest.raises(UnsupportedGraphError,
                       match="random op 'rnn/while/dropout/random_uniform/RandomUniform' "
                             "\\(RandomUniform\\) draws inside the while loop "
                             "'rnn/while/while_context' \\(TensorFlow 1 control flow\\)"):
        analyze_graph(graph)


@pytest.mark.slow
def test_a_mask_drawn_before_a_v1_loop_draws_one_devices_values_for_each_workers_examples():
    """A mask drawn once before the loop for every step is a draw per
    example of the graph: 3 workers with 4/4/3 shares end with one device's
    every variable and slot."""
    from autopar.transforms.compile import compile_for_config
    import autopar
    graph, train = _v1_rnn("before_the_loop")
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(11, 4, 3)), rng.integers(0, 3, 11)) for _ in range(3)]
    compiled = compile_for_config(graph, N, autopar.Config(run_option="allreduce"))
    assert compiled.analysis.batch_draws
    rewritten = [rewrite_for_worker(graph, compiled.analysis, compiled.plan, w) for w in range(N)]
    got, expected = trained_alone_and_together(graph, rewritten, train.name, batches,
                                               ("x:0", "y:0"), variable_reads(graph))
    # float64; Adam's 1 / sqrt(v) of gradients summed in another order
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


def test_a_draw_inside_a_function_run_as_an_op_of_its_type_is_refused_by_name():
    """A function called as an op whose type is its name (a Defun of a TF1
    program) is walked as a loop's body is: a dropout inside it is refused
    (before: only functions named by an op's attributes were walked, and
    every worker drew the rows of the first examples)."""
    from tensorflow.python.framework import function

    @function.Defun(tf.float64)
    def noisy(h):
        return tf1.nn.dropout(h, rate=0.5)
    with pytest.raises(UnsupportedGraphError,
                       match="random op 'dropout/random_uniform/RandomUniform' \\(RandomUniform\\) "
                             "draws inside the function 'noisy_[^']*', which 'noisy_[^']*'"):
        analyze_graph(_graph(noisy))


def test_an_input_pipelines_draws_are_not_the_steps():
    """A tf.data map's draw (an augmentation) runs in the input pipeline, a
    function no op of the step runs: neither refused nor seeded."""
    graph = tf.Graph()
    with graph.as_default():
        data = tf.data.Dataset.from_tensor_slices(np.ones((8, 5))).map(
            lambda v: v + tf.random.uniform([5], dtype=tf.float64)).batch(4)
        x = tf1.data.make_one_shot_iterator(data).get_next()
        w = tf1.get_variable("w", [5, 1], tf.float64)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w) ** 2))
    assert analyze_graph(graph).shared_draws == {}


@pytest.mark.slow
def test_noise_added_to_the_gradients_is_drawn_once_alike():
    """Noise of a gradient's shape added to it before the update (as
    differentially private SGD adds it to the summed gradient), with no
    seed: a sum over the batch, not per example, though its first dimension
    is a constant the backward pass combines it with. Drawn per example,
    each worker kept other rows of it and the workers' parameters parted;
    every worker draws it with the seeds the plan gives it, as one device
    given them."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 5], name="x")
        w = tf1.get_variable("w", [5, 3], tf.float64,
                             initializer=tf1.glorot_uniform_initializer(seed=1))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        opt = tf1.train.GradientDescentOptimizer(0.1)
        train = opt.apply_gradients(
            [(g + tf.random.normal(tf.shape(g), stddev=0.1, dtype=g.dtype), v)
             for g, v in opt.compute_gradients(loss)])
    analysis = analyze_graph(graph)
    assert analysis.batch_draws == {}
    [(noise, seeds)] = analysis.shared_draws.items()
    plan = make_plan(analysis, N, options=PlanOptions(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, analysis, plan, i) for i in range(N)]
    xs = np.random.default_rng(0).normal(size=(3, N * B, 5))

    def train_together(session):
        for batch in xs:
            session.run([f"w{i}/{train.name}" for i in range(N)],
                        {f"w{i}/x:0": batch[i::N] for i in range(N)})
        return session.run([f"w{i}/w/Read/ReadVariableOp:0" for i in range(N)])
    got = run_workers_together(rewritten, train_together)
    one_device = graph.as_graph_def()
    for node in one_device.node:
        if node.name == noise:
            node.attr["seed"].i, node.attr["seed2"].i = seeds

    def train_alone(session):
        for batch in xs:
            session.run(train.name, {"x:0": batch})
        return session.run("w/Read/ReadVariableOp:0")
    expected = run_locally(one_device, train_alone)
    for i, value in enumerate(got):
        np.testing.assert_allclose(value, expected, rtol=1e-12, err_msg=f"worker {i}")
