"""Small single-device training graphs used by the tests, and their data.

Each builder returns a Model whose graph is an ordinary tf.compat.v1 training
graph (no autopar in it). Data for step k is a deterministic function of k, so
a distributed run can feed each worker its slice of the very global batch a
single-device run sees.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from autopar.optimizers import LARSOptimizer

tf1 = tf.compat.v1

FEATURES = 12
CLASSES = 5
VOCAB = 40
IMAGE = (8, 8, 3)
LM_WINDOW = 3
LM_SAMPLED = 6   # a sampled softmax's candidates per step (lmsampled)
BAG_MAX = 4    # ids per example of the "bag" models: 0 to BAG_MAX


@dataclass
class Model:
    graph: tf.Graph
    x: tf.Tensor
    y: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Operation
    global_step: tf.Variable | None
    input_kind: str    # "features", "image", "ids", "tokens" or "bag"
    segments: tf.Tensor | None = None   # "bag": the example each fed id belongs to
    # The default MLP: its logits for other inputs (e.g. an eval set), with
    # the trained variables.
    forward: object = None


def model_dtype(name: str) -> tf.DType:
    """float64 for models trained by an optimizer that divides by sqrt(v).

    Splitting the global batch over workers changes the order in which
    per-example gradients are summed, so the averaged gradient differs from
    one device's in its last bits: ~1e-7 relative in float32, but *absolute*
    to the size of the summed terms. Where those terms cancel to a gradient
    near that noise, Adam/RMSProp's m/sqrt(v) turns the last-bit difference
    into an update difference of order the learning rate, however correct the
    aggregation (seen: 1.3e-6 on one embedding element after 6 Adam steps,
    on one CPU and not another). In float64 the same noise is ~1e-16 relative,
    so even amplified it stays orders of magnitude under the comparison's
    rtol 1e-5 / atol 1e-6, on any CPU: the tolerance then tests the
    algorithm, not the summation order. SGD, momentum and Adagrad (whose
    accumulator starts at 0.1) scale a gradient difference by at most a small
    constant and stay float32, so the float32 path is covered too."""
    if name.endswith("_f32"):
        return tf.float32   # forced: for paths that carry float32 only (herring)
    return tf.float64 if name.split("_")[1] in ("adam", "rmsprop") else tf.float32


def _dense(x, units, name, activation=None):
    w = tf1.get_variable(f"{name}/kernel", [x.shape[-1], units], dtype=x.dtype,
                         initializer=tf1.glorot_uniform_initializer(seed=7))
    b = tf1.get_variable(f"{name}/bias", [units], dtype=x.dtype,
                         initializer=tf1.constant_initializer(0.01))
    out = tf.matmul(x, w) + b
    return activation(out) if activation else out


def _conv(x, filters, name, stride=1, relu=True):
    k = tf1.get_variable(f"{name}/kernel", [3, 3, x.shape[-1], filters], dtype=x.dtype,
                         initializer=tf1.glorot_uniform_initializer(seed=11))
    out = tf.nn.conv2d(x, k, strides=stride, padding="SAME")
    return tf.nn.relu(out) if relu else out


def _bn_params(x, name):
    channels = int(x.shape[-1])
    gamma = tf1.get_variable(f"{name}/gamma", [channels], dtype=x.dtype,
                             initializer=tf1.random_uniform_initializer(0.5, 1.5, seed=13))
    beta = tf1.get_variable(f"{name}/beta", [channels], dtype=x.dtype,
                            initializer=tf1.constant_initializer(0.1))
    moving = [tf1.get_variable(f"{name}/moving_{stat}", [channels], dtype=x.dtype,
                               trainable=False, initializer=init)
              for stat, init in (("mean", tf1.zeros_initializer()),
                                 ("variance", tf1.ones_initializer()))]
    return gamma, beta, moving


def _bn_moments(x, name):
    """Training-mode batch norm as tf.nn.moments + tf.nn.batch_normalization."""
    gamma, beta, moving = _bn_params(x, name)
    mean, var = tf.nn.moments(x, [0, 1, 2])
    for variable, value in zip(moving, (mean, var)):
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                              variable.assign_sub((variable - value) * 0.1))
    return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-3)


def _bn_fused(x, name):
    """Training-mode FusedBatchNormV3 whose outputs are the new moving averages."""
    gamma, beta, moving = _bn_params(x, name)
    y, new_mean, new_var = tf1.nn.fused_batch_norm(
        x, gamma, beta, mean=moving[0].read_value(), variance=moving[1].read_value(),
        epsilon=1e-3, is_training=True, exponential_avg_factor=0.1)
    for variable, value in zip(moving, (new_mean, new_var)):
        tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, variable.assign(value))
    return y


def _xent(logits, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def build(name: str) -> Model:
    graph = tf.Graph()
    dtype = model_dtype(name)
    with graph.as_default():
        tf1.set_random_seed(1)
        gs = tf1.train.get_or_create_global_step()
        y = tf1.placeholder(tf.int32, [None], name="y")
        forward = None
        if name.startswith("cnn"):
            x = tf1.placeholder(dtype, [None, *IMAGE], name="x")
            h = _conv(x, 8, "conv1")
            h = h + _conv(h, 8, "res1")                 # residual block
            h = _conv(h, 16, "conv2", stride=2)
            h = tf.reduce_mean(h, axis=[1, 2])
            logits = _dense(h, CLASSES, "head")
            kind = "image"
        elif name.startswith("lm"):
            # Next-token LSTM language model, unrolled over a short window:
            # a sparse embedding, dense LSTM and softmax weights.
            x = tf1.placeholder(tf.int32, [None, LM_WINDOW + 1], name="x")
            y = tf1.placeholder_with_default(tf.zeros([0], tf.int32), [None], name="y")  # unused
            emb = tf1.get_variable("embedding", [VOCAB, 6], dtype=dtype,
                                   initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
            inputs = tf.nn.embedding_lookup(emb, x[:, :LM_WINDOW])
            kernel = tf1.get_variable("lstm/kernel", [6 + 8, 32], dtype=dtype,
                                      initializer=tf1.glorot_uniform_initializer(seed=5))
            bias = tf1.get_variable("lstm/bias", [32], dtype=dtype,
                                    initializer=tf1.zeros_initializer())
            h = c = tf.zeros([tf.shape(x)[0], 8], dtype)
            outputs = []
            for t in range(LM_WINDOW):
                i, j, f, o = tf.split(tf.matmul(tf.concat([inputs[:, t], h], 1), kernel) + bias, 4, 1)
                c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
                h = tf.sigmoid(o) * tf.tanh(c)
                outputs.append(h)
            hidden = tf.reshape(tf.stack(outputs, 1), [-1, 8])
            targets = tf.reshape(x[:, 1:], [-1])
            if name.startswith("lmsampled"):
                # A sampled softmax (examples/lm.py's): the softmax weights'
                # gradient rows are the labels', then the sampler's
                # candidates', which every worker draws alike
                w = tf1.get_variable("softmax/w", [VOCAB, 8], dtype=dtype,
                                     initializer=tf1.glorot_uniform_initializer(seed=6))
                b = tf1.get_variable("softmax/b", [VOCAB], dtype=dtype,
                                     initializer=tf1.zeros_initializer())
                # ("unseeded": the sampler seeded by nothing, as in TensorFlow's
                # word2vec tutorial, which sets no graph seed: each process
                # would draw its own candidates)
                unseeded = "unseeded" in name
                graph.seed = None if unseeded else graph.seed
                loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
                    w, b, tf.cast(targets[:, None], tf.int64), hidden, num_sampled=LM_SAMPLED,
                    num_classes=VOCAB, seed=None if unseeded else 7))
                tf1.set_random_seed(1)
                train_op = _optimize(name, loss, gs)
                return Model(graph, x, y, loss, train_op, gs, "tokens")
            if name.startswith("lmtied"):
                # Tied weights: the embedding is also the softmax's, so its
                # gradient is dense (the output layer's) though its rows are
                # looked up (on servers: a row gather from contiguous ranges,
                # transforms.partition.RowLayout).
                proj = _dense(hidden, 6, "proj")
                logits = tf.matmul(proj, emb, transpose_b=True)
            else:
                logits = _dense(hidden, VOCAB, "softmax")
            if name.startswith("lmmask"):
                # Token 0 is padding: tf.compat.v1.losses' default reduction
                # divides by the number of kept tokens, which differs from
                # worker to worker.
                loss = tf1.losses.sparse_softmax_cross_entropy(
                    targets, logits, weights=tf.cast(tf.not_equal(targets, 0), dtype))
            else:
                loss = _xent(logits, targets)
            train_op = _optimize(name, loss, gs)
            return Model(graph, x, y, loss, train_op, gs, "tokens")
        elif name.startswith("embsparse"):
            # embedding_lookup_sparse applies tf.unique: one gradient row per
            # distinct id of the batch (a deduplicated sparse gradient).
            x = tf1.placeholder(tf.int32, [None, 3], name="x")
            # "embsparsepart": the table in 2 partitions, the batch's
            # distinct ids split over them by tf.dynamic_partition
            emb = tf1.get_variable("embedding", [VOCAB, 6], dtype=dtype,
                                   initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3),
                                   partitioner=tf1.fixed_size_partitioner(2)
                                   if name.startswith("embsparsepart") else None)
            ids = tf.SparseTensor(tf.where(tf.ones_like(x, dtype=tf.bool)), tf.reshape(x, [-1]),
                                  tf.shape(x, out_type=tf.int64))
            h = tf.nn.embedding_lookup_sparse(emb, ids, None, combiner="mean")
            logits = _dense(h, CLASSES, "head")
            kind = "ids"
        elif name.startswith("emb"):
            x = tf1.placeholder(tf.int32, [None, 3], name="x")
            emb = tf1.get_variable("embedding", [VOCAB, 6], dtype=dtype,
                                   initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
            h = tf.reduce_mean(tf.nn.embedding_lookup(emb, x), axis=1)
            logits = _dense(h, CLASSES, "head")
            kind = "ids"
        elif name.startswith("bn_"):
            # Batch normalisation written as tf.compat.v1.layers does it: batch
            # moments normalise, moving statistics (non-trainable) follow them.
            x = tf1.placeholder(dtype, [None, FEATURES], name="x")
            h = _dense(x, 16, "hidden")
            mean, var = tf.nn.moments(h, [0])
            moving = {}
            for stat, value in (("moving_mean", mean), ("moving_variance", var)):
                moving[stat] = tf1.get_variable(f"bn/{stat}", [16], dtype=dtype, trainable=False,
                                                initializer=tf1.zeros_initializer())
                tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                                      moving[stat].assign_sub((moving[stat] - value) * 0.1))
            h = tf.nn.relu(tf.nn.batch_normalization(h, mean, var, None, None, 1e-3))
            logits = _dense(h, CLASSES, "out")
            kind = "features"

            def forward(inputs):
                """Inference: normalised by the moving statistics."""
                with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
                    h = tf.nn.batch_normalization(_dense(inputs, 16, "hidden"),
                                                  moving["moving_mean"],
                                                  moving["moving_variance"], None, None, 1e-3)
                    return _dense(tf.nn.relu(h), CLASSES, "out")
        elif name.startswith("bncnn"):
            # A residual CNN with both forms of training-mode batch norm:
            # tf.nn.moments + tf.nn.batch_normalization (what Keras builds)
            # and FusedBatchNormV3 keeping its own moving averages.
            x = tf1.placeholder(dtype, [None, *IMAGE], name="x")
            h = tf.nn.relu(_bn_moments(_conv(x, 8, "conv1", relu=False), "bn1"))
            r = _bn_fused(_conv(h, 8, "res1", relu=False), "bn2")
            h = _conv(tf.nn.relu(h + r), 16, "conv2", stride=2)
            logits = _dense(tf.reduce_mean(h, axis=[1, 2]), CLASSES, "head")
            kind = "image"
        elif name.startswith("bag"):
            # A bag of a variable number of ids per example (summed embeddings),
            # fed flat: each worker's id count differs from step to step and
            # from worker to worker, and is 0 on some worker in some steps.
            x = tf1.placeholder(tf.int32, [None], name="ids")
            segments = tf1.placeholder(tf.int32, [None], name="segments")
            emb = tf1.get_variable("embedding", [VOCAB, 6], dtype=dtype,
                                   initializer=tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
            h = tf.math.unsorted_segment_sum(tf.nn.embedding_lookup(emb, x), segments,
                                             tf.shape(y)[0])
            logits = _dense(h, CLASSES, "head")
            loss = _xent(logits, y)
            train_op = _optimize(name, loss, gs)
            return Model(graph, x, y, loss, train_op, gs, "bag", segments)
        else:
            def forward(inputs):
                with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
                    return _dense(_dense(inputs, 16, "hidden", tf.nn.relu), CLASSES, "out")
            x = tf1.placeholder(dtype, [None, FEATURES], name="x")
            logits = forward(x)
            kind = "features"
        if name.startswith("embsum"):
            # Per-example losses summed over the batch: one device's gradient
            # is the sum over the global batch.
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        elif name.startswith("embglobal"):
            # Averaged over a global batch size given as a constant (12, the
            # global batch of the tests that train it), as TensorFlow's
            # distributed custom loops write it: each worker divides its own
            # sum by 12, so one device's loss is the workers' sum.
            loss = tf.nn.compute_average_loss(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                global_batch_size=12)
        else:
            loss = _xent(logits, y)
        train_op = _optimize(name, loss, gs)
    return Model(graph, x, y, loss, train_op, gs, kind,
                 forward=forward)


def _optimize(name: str, loss, gs):
    opt = {
        "sgd": lambda: tf1.train.GradientDescentOptimizer(0.3),
        "momentum": lambda: tf1.train.MomentumOptimizer(0.05, 0.9),
        "adam": lambda: tf1.train.AdamOptimizer(0.01),
        "adagrad": lambda: tf1.train.AdagradOptimizer(0.2),
        "rmsprop": lambda: tf1.train.RMSPropOptimizer(0.01, momentum=0.5,
                                                      centered="centered" in name),
        # Trust ratios ~0.1-1 here; biases take plain momentum.
        "lars": lambda: LARSOptimizer(0.3, momentum=0.9, weight_decay=1e-3, eta=0.05,
                                      scaled_momentum="unscaled" not in name,
                                      exclude_from_adaptation=("bias",)),
    }[name.split("_")[1]]()
    if "clip" not in name:
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = opt.minimize(loss, global_step=gs)
    else:
        grads, variables = zip(*opt.compute_gradients(loss))
        # embsparse's global norm is ~0.3: clip below it so the norm matters.
        clipped, _ = tf.clip_by_global_norm(grads, 0.1 if name.startswith("embsparse") else 0.5)
        train = opt.apply_gradients(zip(clipped, variables), global_step=gs)
    if "ema" in name:
        ema = tf1.train.ExponentialMovingAverage(0.9)
        with tf.control_dependencies([train]):
            train = ema.apply(tf1.trainable_variables())
    return train


def global_batch(model_name: str, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    if model_name.startswith(("cnn", "bncnn")):
        x = rng.normal(size=(batch, *IMAGE)).astype(np.float32)
    elif model_name.startswith("lm"):
        x = np.minimum(rng.zipf(1.3, size=(batch, LM_WINDOW + 1)) - 1, VOCAB - 1).astype(np.int32)
    elif model_name.startswith("emb"):
        # Zipf-like ids: some rows touched by several workers, many untouched.
        x = np.minimum(rng.zipf(1.5, size=(batch, 3)) - 1, VOCAB - 1).astype(np.int32)
    elif model_name.startswith("bag"):
        # Rows padded with -1 to BAG_MAX ids (feed() drops the padding).
        lengths = rng.integers(0, BAG_MAX + 1, size=batch)
        if step > 0:
            # A run of batch/3 examples without ids: on 3 workers, worker
            # step % 3 feeds no id at all in this step.
            third = batch // 3
            lengths[third * (step % 3):third * (step % 3 + 1)] = 0
        ids = np.minimum(rng.zipf(1.5, size=(batch, BAG_MAX)) - 1, VOCAB - 1)
        x = np.where(np.arange(BAG_MAX) < lengths[:, None], ids, -1).astype(np.int32)
    else:
        x = rng.normal(size=(batch, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=batch).astype(np.int32)
    return x, y


def feed(model: Model, x: np.ndarray, y: np.ndarray) -> dict:
    """The feed dict for examples x, y (rows of global_batch): for "bag"
    models, the ids without padding and each id's example index."""
    if model.segments is None:
        return {model.x: x, model.y: y}
    rows, cols = np.nonzero(x >= 0)
    return {model.x: x[rows, cols], model.segments: rows.astype(np.int32), model.y: y}


# --------------------------------------------------------------------------
# Graphs for the transforms/ unit tests. Unlike build(), these keep what the
# test needs to know about the graph it built: every variable, the gradients
# compute_gradients returned (dense tensors or IndexedSlices), what was passed
# to apply_gradients (after clipping), the global norm, the EMA shadows.
# Shapes are static (batch 8) so byte sizes and the sparsity of embedding
# gradients follow from arithmetic.

CASE_BATCH = 8
CASE_FEATURES = 6
CASE_IDS_PER_EXAMPLE = 3
CASE_VOCAB = 50
CASE_EMB_DIM = 5
CASE_CLASSES = 3

# One factory per tf.compat.v1 optimizer the analysis must understand, and the
# slot variables each creates for a variable "v" (names as TF makes them).
OPTIMIZERS = {
    "sgd": lambda: tf1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    "adam": lambda: tf1.train.AdamOptimizer(0.01),
    "adagrad": lambda: tf1.train.AdagradOptimizer(0.1),
    "rmsprop": lambda: tf1.train.RMSPropOptimizer(0.01, momentum=0.5),
    "lars": lambda: LARSOptimizer(0.1, momentum=0.9, weight_decay=1e-4, eta=0.01),
}
SLOT_SUFFIXES = {
    "sgd": [],
    "momentum": ["Momentum"],
    "adam": ["Adam", "Adam_1"],
    "adagrad": ["Adagrad"],
    "rmsprop": ["RMSProp", "RMSProp_1"],
    "lars": ["LARS"],
}


@dataclass
class GraphCase:
    graph: tf.Graph
    loss: tf.Tensor
    train_op: tf.Operation          # what the user runs each step
    apply_op: tf.Operation          # returned by minimize/apply_gradients
    variables: dict                 # variable op name -> tf.Variable (trainable, creation order)
    grads: dict | None              # op name -> gradient from compute_gradients (None for minimize)
    applied: dict | None            # op name -> gradient passed to apply_gradients
    global_step: tf.Variable | None
    global_norm: tf.Tensor | None = None
    ema_shadows: list | None = None


def _case_variable(name, shape, use_resource, dtype=tf.float32):
    return tf1.get_variable(name, shape, dtype=dtype, use_resource=use_resource,
                            initializer=tf1.glorot_uniform_initializer(seed=5))


def _case_layer(h, units, name, use_resource, activation=True, dtype=tf.float32):
    w = _case_variable(f"{name}/kernel", [int(h.shape[-1]), units], use_resource, dtype)
    b = _case_variable(f"{name}/bias", [units], use_resource, dtype)
    out = tf.matmul(h, w) + b
    return tf.nn.relu(out) if activation else out


def build_case(kind: str = "mlp", optimizer: str = "sgd", *, minimize: bool = False,
               clip: bool = False, ema: bool = False, use_resource: bool = True,
               global_step: bool = True) -> GraphCase:
    """kind:
    "mlp": x[8,6] -> l1 (6x4, 4) -> l2 (4x4, 4) -> l3 (4x4, 4) -> out (4x3, 3); l2/kernel and
           l3/kernel have identical shapes, and so do the three 4-element biases.
    "emb": ids[8,3] -> embedding[50,5] lookup (named "lookup"), mean over ids -> head (5x3, 3).
    "f64": x[8,6] -> l1 (6x4, 4, float32) -> cast -> wide (4x4, 4, float64) -> cast -> out (4x3, 3).
    """
    assert not (minimize and clip)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        gs = tf1.train.get_or_create_global_step() if global_step else None
        y = tf1.placeholder(tf.int32, [CASE_BATCH], name="y")
        if kind == "mlp":
            x = tf1.placeholder(tf.float32, [CASE_BATCH, CASE_FEATURES], name="x")
            h = _case_layer(x, 4, "l1", use_resource)
            h = _case_layer(h, 4, "l2", use_resource)
            h = _case_layer(h, 4, "l3", use_resource)
            logits = _case_layer(h, CASE_CLASSES, "out", use_resource, activation=False)
        elif kind == "emb":
            ids = tf1.placeholder(tf.int32, [CASE_BATCH, CASE_IDS_PER_EXAMPLE], name="ids")
            emb = _case_variable("embedding", [CASE_VOCAB, CASE_EMB_DIM], use_resource)
            h = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids, name="lookup"), axis=1)
            logits = _case_layer(h, CASE_CLASSES, "head", use_resource, activation=False)
        elif kind == "f64":
            x = tf1.placeholder(tf.float32, [CASE_BATCH, CASE_FEATURES], name="x")
            h = _case_layer(x, 4, "l1", use_resource)
            h = _case_layer(tf.cast(h, tf.float64), 4, "wide", use_resource, dtype=tf.float64)
            logits = _case_layer(tf.cast(h, tf.float32), CASE_CLASSES, "out", use_resource,
                                 activation=False)
        else:
            raise ValueError(kind)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        variables = {v.op.name: v for v in tf1.trainable_variables()}
        opt = OPTIMIZERS[optimizer]()
        grads = applied = norm = None
        if minimize:
            apply_op = opt.minimize(loss, global_step=gs)
        else:
            pairs = opt.compute_gradients(loss)
            grads = {v.op.name: g for g, v in pairs}
            gradients = [g for g, _ in pairs]
            if clip:
                gradients, norm = tf.clip_by_global_norm(gradients, 1.0)
            applied = {v.op.name: g for g, (_, v) in zip(gradients, pairs)}
            apply_op = opt.apply_gradients(zip(gradients, [v for _, v in pairs]), global_step=gs)
        train_op = apply_op
        shadows = None
        if ema:
            averager = tf1.train.ExponentialMovingAverage(0.99, num_updates=gs)
            with tf.control_dependencies([apply_op]):
                train_op = averager.apply(list(variables.values()))
            shadows = [averager.average(v).op.name for v in variables.values()]
    return GraphCase(graph, loss, train_op, apply_op, variables, grads, applied, gs, norm, shadows)


def build_shared_gradient_case() -> GraphCase:
    """h = x @ w + c with c shaped like h ([8, 4]); gradients from plain tf.gradients
    (no gating), applied by GradientDescent. TF's Add gradient hands the *same*
    tensor to c and to the MatMul backward pass, so the tensor carrying c's
    gradient is also consumed inside the gradients scope (to compute w's)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [CASE_BATCH, 4], name="x")
        w = _case_variable("w", [4, 4], True)
        c = _case_variable("c", [CASE_BATCH, 4], True)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + c), name="loss")
        gw, gc = tf.gradients(loss, [w, c])
        apply_op = tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(gw, w), (gc, c)])
    grads = {"w": gw, "c": gc}
    return GraphCase(graph, loss, apply_op, apply_op, {"w": w, "c": c}, grads, dict(grads), None)
