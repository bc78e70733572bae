"""What the analysis decides on TensorFlow 2 steps as public programs write
them (keras-io's Transformer classifier and its custom-training-loop
guide, TensorFlow's tf.compat.v1 optimizers used in a tf.function), each
case one that trained differently from one device, or could not run,
before: ids no example owns, a loss term whose backward pass reads no
forward value, Keras's IdentityN over every gradient, a tf.compat.v1
optimizer's slots captured by handle."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers, ops

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lift import CALL_OP, lift
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from tests.programs import keras_step
from tests.unit.local_run import each_worker_holds

tf1 = tf.compat.v1
TOPOLOGY = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), 2)


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _analysed(model, optimizer, loss_fn, x_spec, y_spec, extra_losses=False):
    """(the concrete function, the analysis of its lifted graph) of the
    guide's train_step (the model and optimizer alive while it is lifted:
    Keras makes the optimizer's variables as the function is traced)."""
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if extra_losses:
                loss += sum(model.losses)
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss
    cf = train_step.get_concrete_function(x_spec, y_spec)
    return cf, analyze_graph(lift(cf).graph)


class TokenAndPositionEmbedding(layers.Layer):
    """keras-io's text_classification_with_transformer: positions from
    ops.arange of the sequence's length, looked up in their own table."""

    def __init__(self, maxlen, vocab_size, embed_dim, positions=None):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)
        self.positions = positions

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = (ops.arange(start=0, stop=maxlen, step=1) if self.positions is None
                     else ops.convert_to_tensor(self.positions))
        return self.token_emb(x) + self.pos_emb(positions)


def _positions_program(optimizer, positions=None):
    inputs = layers.Input(shape=(6,))
    x = TokenAndPositionEmbedding(6, 20, 4, positions)(inputs)
    x = layers.GlobalAveragePooling1D()(x)
    model = keras.Model(inputs, layers.Dense(2, activation="softmax")(x))
    return _analysed(model, optimizer, keras.losses.SparseCategoricalCrossentropy(),
                     tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int32))


def _by_role(analysis):
    """(the position table, the token table) of _positions_program."""
    sparse = analysis.sparse
    position = next(v for v in sparse if v.shape[0] == 6)
    token = next(v for v in sparse if v.shape[0] == 20)
    return position, token


def test_position_ids_every_worker_looks_up_are_combined_by_id():
    """Every worker's rows for positions 0..5 hold its share of the batch's
    sum; one device has one row per position. Keras's Adam squares each row
    before rows of one id add: the rows are combined by id first (as a
    deduplicated lookup's), where the token table's rows, one per
    example's id, are kept apart (before: every row kept, v got the sum of
    squares)."""
    _, analysis = _positions_program(keras.optimizers.Adam(0.01))
    position, token = _by_role(analysis)
    assert position.dedup and not token.dedup


def test_repeated_ids_no_example_owns_are_refused_under_squared_rows():
    with pytest.raises(UnsupportedGraphError,
                       match=r"ids '.*' that no example of the batch owns.*adam(_\d+)?/Square"):
        _positions_program(keras.optimizers.Adam(0.01), positions=[0, 1, 0, 2, 3, 3])


def test_repeated_ids_no_example_owns_train_where_the_update_adds_rows_first():
    """SGD adds an id's rows before anything else: every worker's rows,
    gathered, are one device's sum."""
    _, analysis = _positions_program(keras.optimizers.SGD(0.1), positions=[0, 1, 0, 2, 3, 3])
    position, _ = _by_role(analysis)
    assert not position.dedup


class ActivityRegularizationLayer(keras.layers.Layer):
    """The custom-training-loop guide's add_loss layer."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def call(self, inputs):
        if self.how == "scaled":
            self.add_loss(1e-2 * tf.reduce_sum(inputs))
        elif self.how == "summed":
            self.add_loss(tf.reduce_sum(inputs))
        else:
            self.add_loss(tf.reduce_mean(inputs))
        return inputs


@pytest.mark.parametrize("how,dtype,batch,reduction", [
    # float64: the scale's gradient reads only the constant (the Mul's
    # gradient skips the unwatched input)
    ("scaled", "float64", None, "neither"),
    # a plain sum of activations of a static shape: a tiled seed, no read
    ("summed", "float32", 8, "neither"),
    ("mean", "float32", 8, "mean"),
])
def test_a_loss_term_whose_gradient_reads_no_forward_value_is_found(how, dtype, batch,
                                                                    reduction):
    """The loss found is the whole target, regularizer included (before:
    the cross-entropy mean alone, and the term's sum over the batch was
    averaged over workers)."""
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    inputs = keras.Input(shape=(4,), dtype=dtype)
    x = keras.layers.Dense(3, activation="relu")(inputs)
    x = ActivityRegularizationLayer(how)(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    cf, analysis = _analysed(model, keras.optimizers.Adam(1e-3),
                             keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             tf.TensorSpec([batch, 4], dtype), tf.TensorSpec([batch], tf.int32),
                             extra_losses=True)
    assert analysis.loss == cf.graph.outputs[0].name   # the returned sum
    assert analysis.loss_reduction == reduction, analysis.loss_reduction_why


def test_keras_identity_n_over_every_gradient_keeps_each_variable_on_the_servers():
    """Keras's optimizer passes every gradient through one IdentityN; each
    variable's update reads its own output of it (before: every variable
    was kept off the servers, its IdentityN 'combining' it with the
    others)."""
    keras.config.set_floatx("float64")
    inputs = keras.Input(shape=(5,))
    x = keras.layers.Dense(4, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    _, analysis = _analysed(model, keras.optimizers.Adam(1e-3),
                            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            tf.TensorSpec([None, 5], "float64"), tf.TensorSpec([None], tf.int32))
    assert [v.ps_blocker for v in analysis.variables] == [""] * 4
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="ps"))
    assert {vp.method for vp in plan.variables} == {"ps"}


def test_a_tf_compat_v1_optimizer_in_a_tf_function_keeps_its_slots():
    """tf.compat.v1's Adam makes its slots outside the function, which
    captures them by handle alone (before: refused as 'not a tf.Variable').
    Lifted through their handles, they are w's slots, and three steps in a
    session equal three calls of the function."""
    w = tf.Variable(np.linspace(-1, 1, 6).reshape(3, 2), name="w")
    optimizer = tf1.train.AdamOptimizer(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return loss
    cf = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float64),
                                    tf.TensorSpec([None, 2], tf.float64))
    lifted = lift(cf)
    analysis = analyze_graph(lifted.graph)
    [info] = analysis.variables
    assert info.name == "w" and len(info.slots) == 2
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(4, 3)), rng.normal(size=(4, 2))) for _ in range(3)]
    graph = lifted.graph
    with graph.as_default():
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init, lifted.initial_feed())
    for x, y in batches:
        session.run(CALL_OP,
                    {cf.graph.inputs[0].name: x, cf.graph.inputs[1].name: y})
    got = {name: session.run(name + "/Read/ReadVariableOp:0")
           for name in lifted.python_variables}
    for x, y in batches:
        step(x, y)
    for name, variable in lifted.python_variables.items():
        np.testing.assert_allclose(got[name], variable.numpy(), rtol=1e-12, err_msg=name)


def test_a_layer_first_called_inside_a_loop_of_the_step_is_lifted():
    """A Keras layer built by its first call inside a tf.while_loop of the
    traced step makes its variables there ("while/dense/kernel", beside
    the loop's op "while"): lifted under another name, the loop keeps its
    own (before: the import renamed the loop, and lifting failed with
    KeyError "The name 'while' refers to an Operation not in the graph").
    Three steps in a session equal three calls of the function."""
    dense = layers.Dense(1, kernel_initializer="ones", dtype="float64")
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            _, loss = tf.while_loop(
                lambda i, total: i < 2,
                lambda i, total: (i + 1, total + tf.reduce_mean(dense(x) ** 2)),
                (0, tf.constant(0.0, tf.float64)))
        optimizer.apply_gradients(zip(tape.gradient(loss, dense.trainable_variables),
                                      dense.trainable_variables))
        return loss
    cf = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float64))
    lifted = lift(cf)
    assert lifted.graph.get_operation_by_name("while").type in ("While", "StatelessWhile")
    in_loop = [name for name in lifted.python_variables if name.startswith("while")]
    assert len(in_loop) == 2 and all(n.startswith("while_var/") for n in in_loop), in_loop
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, 3)) for _ in range(3)]
    with lifted.graph.as_default():
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=lifted.graph)
    session.run(init, lifted.initial_feed())
    for x in batches:
        session.run(CALL_OP, {cf.graph.inputs[0].name: x})
    got = {name: session.run(name + "/Read/ReadVariableOp:0")
           for name in lifted.python_variables}
    for x in batches:
        step(x)
    for name, variable in lifted.python_variables.items():
        np.testing.assert_allclose(got[name], variable.numpy(), rtol=1e-12, err_msg=name)


def _crossed_step(optimizer):
    """keras-io's structured-data programs' feature cross (Keras's
    HashedCrossing, as FeatureSpace.cross makes it: tf.sparse.cross_hashed
    of each example's features) looked up in an embedding."""
    embedding = layers.Embedding(8, 3, dtype="float64")
    cross = layers.HashedCrossing(num_bins=8)
    dense = layers.Dense(1, dtype="float64")
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(x, y):
        a, b = tf.cast(x[:, 0] > 0, tf.int64), tf.cast(x[:, 1] > 0.5, tf.int64)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, dense(embedding(cross((a, b)))))
        weights = embedding.trainable_weights + dense.trainable_weights
        optimizer.apply(tape.gradient(loss, weights), weights)
        return loss
    cf = step.get_concrete_function(tf.TensorSpec([None, 2], tf.float64),
                                    tf.TensorSpec([None, 1], tf.float64))
    return cf, (embedding, cross, dense, step)


def _three_workers_and_one_device(cf, batches, run_option):
    """(what each of 3 workers in one session holds of every variable and
    slot, what one device holds) after training the lifted step `cf` on
    `batches` of its inputs' arrays ((x, y), (x, y, weights)), worker w
    given examples w, w+3, ... of each."""
    import autopar
    from autopar.transforms.compile import compile_for_config
    from autopar.transforms.rewrite import rewrite_for_worker
    from tests.unit.local_run import run_workers_together
    lifted = lift(cf)
    initial = lifted.initial_feed()
    names = sorted(lifted.python_variables)
    n = 3
    compiled = compile_for_config(lifted.graph, n, autopar.Config(run_option=run_option))
    rewritten = [rewrite_for_worker(lifted.graph, compiled.analysis, compiled.plan, w)
                 for w in range(n)]

    def train_together(session):
        for batch in batches:
            feed = {f"w{w}/{name}": value[w::n] for w in range(n)
                    for name, value in zip(lifted.inputs, batch)}
            # a training step: draws per example know the global batch's size
            feed.update({f"w{w}/{r.in_step}": True for w, r in enumerate(rewritten)
                         if r.in_step})
            session.run([f"w{w}/{CALL_OP}" for w in range(n)], feed)
        return [session.run({v: f"w{w}/{v}/Read/ReadVariableOp:0" for v in names})
                for w in range(n)]
    got = run_workers_together(rewritten, train_together, init_feed=initial)
    with lifted.graph.as_default():
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=lifted.graph) as session:
        session.run(init, initial)
        for batch in batches:
            session.run(CALL_OP, dict(zip(lifted.inputs, batch)))
        expected = session.run({v: f"{v}/Read/ReadVariableOp:0" for v in names})
    return got, expected


@pytest.mark.slow
def test_crossed_features_are_each_examples_ids():
    """Row i of a cross is example i's id: under Keras's Adam, which squares
    each row of the embedding's gradient before an id's rows add up, 3
    workers in one session (hybrid) end with one device's every variable
    and slot after 4 steps of a 12-example global batch (before: refused,
    the crossed ids taken for ids no example owns)."""
    keras.utils.set_random_seed(0)
    cf, _kept = _crossed_step(keras.optimizers.Adam(0.05))
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(12, 2)), rng.normal(size=(12, 1))) for _ in range(4)]
    got, expected = _three_workers_and_one_device(cf, batches, "hybrid")
    assert any("embeddings" in v for v in expected) and any("momentum" in v for v in expected)
    # (Adam's m / sqrt(v) turns the last bits of rows added in another
    # order into differences of about 1e-9 of its lr 0.05)
    each_worker_holds(got, expected, rtol=1e-7, atol=1e-8)


class ClassToken(layers.Layer):
    """A Vision Transformer's class token and position embedding, copied
    over the batch as ViT programs copy them: tf.tile(token, [batch, 1,
    1]) or tf.repeat(token, batch, axis=0) (keras-io's masked autoencoder)."""

    def __init__(self, copy):
        super().__init__(dtype="float64")
        self.copy = copy

    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, input_shape[-1]), name="token")
        self.positions = layers.Embedding(input_shape[1] + 1, input_shape[-1], dtype="float64")

    def call(self, x):
        batch = tf.shape(x)[0]
        positions = self.positions(tf.range(tf.shape(x)[1] + 1))[tf.newaxis]
        if self.copy == "tile":
            return tf.concat([tf.tile(self.token, [batch, 1, 1]), x], 1) + \
                tf.tile(positions, [batch, 1, 1])
        return tf.concat([tf.repeat(self.token, repeats=batch, axis=0), x], 1) + \
            ops.repeat(positions, batch, axis=0)


@pytest.mark.slow
@pytest.mark.parametrize("copy", ["tile", "repeat"])
def test_a_class_token_copied_over_the_batch_trains_as_one_device(copy):
    """A value every worker holds alike, tiled (or repeated) by the batch's
    size where it has one row, is one copy per example: each worker's
    copies are its share of one device's, and the token's gradient their
    sum. 3 workers, 11 examples a step (4/4/3), Keras's Adam: every
    variable and slot equal to one device's after 3 steps (before:
    refused, the copies taken for rows of no example at the
    concatenation)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 3), dtype="float64"), ClassToken(copy),
                              layers.Dense(5, activation="tanh", dtype="float64"),
                              layers.GlobalAveragePooling1D(dtype="float64"),
                              layers.Dense(1, dtype="float64")])
    optimizer = keras.optimizers.Adam(0.05)
    cf, _ = _analysed(model, optimizer, keras.losses.MeanSquaredError(dtype="float64"),
                      tf.TensorSpec([None, 4, 3], tf.float64), tf.TensorSpec([None, 1], tf.float64))
    rng = np.random.default_rng(1)
    batches = [(rng.normal(size=(11, 4, 3)), rng.normal(size=(11, 1))) for _ in range(3)]
    got, expected = _three_workers_and_one_device(cf, batches, "allreduce")
    assert any("token" in v for v in expected) and any("velocity" in v for v in expected)
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


def test_copies_over_the_batch_are_rows_only_of_a_value_with_one_row_there():
    """tf.tile / tf.repeat of a shared value by the batch's size: one copy
    per example where the value has one row along the tiled axis (along
    axis 1 too); a value of 2 rows repeated is every example's 2 rows,
    copies of the first row first, no example's rows in order; tiled by a
    worker's padded length, no example's."""
    from autopar.transforms.example_rows import ExampleRows
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 3], name="x")
        one, two = tf.ones([1, 3], tf.float64), tf.ones([2, 3], tf.float64)
        batch = tf.shape(x)[0]
        tiled = tf.tile(one, [batch, 1])
        repeated = tf.repeat(one, batch, axis=0)
        along_1 = tf.tile(one[:, tf.newaxis], [1, batch, 1])
        two_repeated = tf.repeat(two, batch, axis=0)
        two_tiled = tf.tile(two, [batch, 1])
        ids = tf1.placeholder(tf.int64, [None, None], name="ids")   # padded per worker
        by_other = tf.tile(one, [tf.shape(ids)[1], 1])
    rows = ExampleRows(graph)
    assert rows.form(tiled) == ("rows", 0, "batch", 1, 1) == rows.form(repeated)
    assert rows.form(along_1) == ("rows", 1, "batch", 1, 1)
    for t in (two_repeated, two_tiled, by_other):
        assert rows.form(t)[0] not in ("rows", "shared"), (t.name, rows.form(t))


def test_a_cross_of_sparse_features_is_padded_to_each_workers_width():
    """tf.sparse.cross of a SparseTensor of each example's features: the
    crosses per row are the worker's largest count (a per-worker width), its
    indices and values each an example's; a cross of dense features of
    static width has that width."""
    from autopar.transforms.example_rows import ExampleRows
    graph = tf.Graph()
    with graph.as_default():
        tags = tf1.sparse_placeholder(tf.int64, [None, None], name="tags")
        x = tf1.placeholder(tf.int64, [None, 2], name="x")
        sparse = tf.sparse.cross_hashed([tags, x], num_buckets=5)
        dense = tf.sparse.cross_hashed([x, x[:, :1]], num_buckets=5)
        alone = tf.sparse.cross_hashed([tags, tags], num_buckets=5)
        fixed = tf.sparse.cross_hashed([x, tf.ones([3, 2], tf.int64)], num_buckets=5)
    forms = ExampleRows(graph).forms
    for cross in (sparse, dense, alone):
        assert forms[cross.indices.name] == ("elems",) == forms[cross.values.name]
    assert forms[sparse.dense_shape.name] == ("shape", 1, 1, ("d",))
    assert forms[dense.dense_shape.name] == ("shape", 1, 1, (2,))
    assert forms[alone.dense_shape.name] == ("dim",)
    # crossed with rows of no example: each row would cross another's
    assert forms[fixed.values.name][0] == "mixed"


def _weighted_dense_labels_step(sequence: bool):
    """keras-io's functional API guide's department head: a softmax over
    one-hot labels (CategoricalCrossentropy(from_logits=True), TensorFlow's
    softmax_cross_entropy_with_logits, which flattens the logits to [-1, C]
    and reshapes the losses back to tf.slice(tf.shape(logits), [0],
    [rank - 1])), each example's loss weighted by its sample weight, as
    fit(sample_weight=...) weighs it; `sequence`: one label per time step."""
    keras.utils.set_random_seed(0)
    shape = (3, 5) if sequence else (5,)
    model = keras.Sequential([keras.Input(shape), layers.Dense(4, dtype="float64")])
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True, dtype="float64")
    optimizer = keras.optimizers.Adam(0.05)

    @tf.function
    def step(x, y, weights):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True), sample_weight=weights)
        optimizer.apply(tape.gradient(loss, model.trainable_weights), model.trainable_weights)
        return loss
    cf = step.get_concrete_function(tf.TensorSpec([None, *shape], tf.float64),
                                    tf.TensorSpec([None, *shape[:-1], 4], tf.float64),
                                    tf.TensorSpec([None, *shape[:-1]], tf.float64))
    return cf, (model, optimizer, step)


@pytest.mark.slow
@pytest.mark.parametrize("sequence", [False, True], ids=["per_example", "per_time_step"])
def test_weighted_losses_of_one_hot_labels_train_as_one_device(sequence):
    """Each example's loss of a softmax over one-hot labels, weighted: the
    losses reshaped back to the logits' shape but the last axis are each
    example's rows (before: refused, `the loss mixes the examples of a batch
    at 'categorical_crossentropy/mul'`, the reshape's target taken for a
    shape of no example). 3 workers with 4/4/3 shares end with one device's
    every variable and slot under Adam."""
    cf, alive = _weighted_dense_labels_step(sequence)
    rng = np.random.default_rng(3)
    shape = (3, 5) if sequence else (5,)
    batches = [(rng.normal(size=(11, *shape)),
                np.eye(4)[rng.integers(0, 4, size=(11, *shape[:-1]))],
                rng.random((11, *shape[:-1]))) for _ in range(3)]
    got, expected = _three_workers_and_one_device(cf, batches, "hybrid")
    # float64; Adam's 1 / sqrt(v) of gradients summed in another order
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_mix_up_weights_drawn_per_example_from_keras_beta_train_as_one_device():
    """keras-io's mix-up, in the step: each example of one batch mixed with
    its pair of another by a weight drawn from keras.random.beta per
    example, which broadcasts its alpha and beta to the draw's shape twice
    (Keras, then tf.random.stateless_gamma: BroadcastTo(BroadcastTo(0.2,
    [b]), BroadcastArgs(shape, []))); each worker draws the global batch's
    weights from the unbroadcast values and keeps its examples' (before:
    refused, the gamma's alpha taken for a value of the batch). 3 workers
    with 4/4/3 shares end with one device's every variable and slot."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), layers.Dense(3, dtype="float64")])
    optimizer = keras.optimizers.Adam(0.05)
    seed = keras.random.SeedGenerator(3)

    @tf.function
    def step(one, two, y):
        weight = keras.random.beta((tf.shape(one)[0],), 0.2, 0.2, seed=seed, dtype="float64")
        mixed = one * weight[:, None] + two * (1 - weight[:, None])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(mixed, training=True) - y))
        optimizer.apply(tape.gradient(loss, model.trainable_weights), model.trainable_weights)
        return loss
    spec = tf.TensorSpec([None, 5], tf.float64)
    cf = step.get_concrete_function(spec, spec, tf.TensorSpec([None, 3], tf.float64))
    rng = np.random.default_rng(4)
    batches = [(rng.normal(size=(11, 5)), rng.normal(size=(11, 5)), rng.normal(size=(11, 3)))
               for _ in range(3)]
    got, expected = _three_workers_and_one_device(cf, batches, "hybrid")
    # float64; Adam's 1 / sqrt(v) of gradients summed in another order
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)
