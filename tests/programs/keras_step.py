"""Keras 3 models trained by a custom `tf.function` step (GradientTape and a
Keras optimizer), as TensorFlow 2 users write them:

    @tf.function(jit_compile=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if model.losses:   # regularizers
                loss += tf.cast(tf.add_n(model.losses), loss.dtype)
            scaled = optimizer.scale_loss(loss)   # loss scaling, as Keras's own step
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

Models: "emb_mlp" (Embedding -> average -> Dense(relu) -> Dense, squared
error), "wide_deep" (wide & deep over categorical columns: an Embedding
table of width 1 per column summed, plus Embedding tables into an MLP;
squared error), "bn_mlp" (the same with a BatchNormalization and a
LayerNormalization after the hidden Dense: two variables of one shape each,
gamma and beta, and batch statistics; an L2 penalty on the embedding),
"shared" (one Embedding and one Dense, with an L2 kernel regularizer, each
applied to two halves of the ids: the tape adds up every weight's gradients
from its uses), "lstm"
(Embedding -> LSTM, a While loop in the traced graph -> Dense over the
vocabulary, cross-entropy: a next-token language model), "gru" (the same
with a GRU, whose step adds a bias read inside the loop), "masked"
(Embedding(mask_zero=True) over sequences padded with 0, Dense layers on
each position, cross-entropy per position: Keras weighs each kept position
by the batch's size / count of kept positions) and "module" (no
Keras layers: a tf.Module holding tf.Variables, an embedding table read by
tf.nn.embedding_lookup and a linear layer, as TensorFlow's "Introduction to
modules" guide writes models; the table's IndexedSlices gradient carries
the table's static shape as a constant dense_shape). "micro" is "emb_mlp"
trained by a step that splits its batch into two micro-batches, a tape
each, and adds up their gradients with `+`; "accum" is "emb_mlp" trained
by a step that accumulates two micro-batches' gradients, each divided by
2, into tensors of zeros.
Floating point in float64 (keras.config.set_floatx) where Adam-like
optimizers divide by sqrt(v) (tests.models.model_dtype's arithmetic).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

VOCAB, IDS, WINDOW = 24, 3, 4


def optimizer(name: str):
    import keras
    return {
        "adam": lambda: keras.optimizers.Adam(0.01, global_clipnorm=1.0),
        "adam_noclip": lambda: keras.optimizers.Adam(0.01),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01, clipnorm=1.0),
        "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        # no momentum: the embedding's rows are scattered into it (ResourceScatterSub)
        "sgd_plain": lambda: keras.optimizers.SGD(0.1),
        # AMSGrad writes the weight from v_hat, v_hat from v: v is a slot two
        # writes away; the weight decay writes each weight besides its update
        "amsgrad_wd": lambda: keras.optimizers.Adam(0.01, amsgrad=True, weight_decay=0.01),
        "sgd_wd": lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.01),
        "adagrad": lambda: keras.optimizers.Adagrad(0.1),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
        # Keras's loss scaling (the "mixed_float16" policy's optimizer): the
        # update inside a cond on every gradient being finite, the scale's
        # growth in a cond inside that. In float32 from 2**126, doubled after
        # every 2 finite steps: steps 1-4 apply (the scale grows twice, to
        # inf), step 5's gradients are not finite and only halve the scale
        "lossscale": lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), initial_scale=2.0 ** 126, dynamic_growth_steps=2),
        # a tf.compat.v1 optimizer in the tf.function: its slots are made
        # outside it, captured by handle alone
        "v1_adam": lambda: _v1_optimizer(),
    }[name]()


def _v1_optimizer():
    import tensorflow as tf
    return tf.compat.v1.train.AdamOptimizer(0.01)


@dataclass
class KerasProgram:
    model: object
    optimizer: object
    train_step: object        # the tf.function
    concrete: object          # its ConcreteFunction
    kind: str
    # autopar.Config fields the program needs: a step that cuts each share
    # into halves itself ("micro", "accum") trains as written on each
    # worker's share (batch_mixing="per_worker"), which is one device's
    # here because every piece is treated alike and the tests' shares are
    # even and equal: autopar does not prove that, and refuses it otherwise
    config: dict = field(default_factory=dict)

    def batch(self, step: int, size: int):
        rng = np.random.default_rng(700 + step)
        if self.kind in ("lstm", "gru"):
            tokens = rng.integers(0, VOCAB, size=(size, WINDOW + 1)).astype(np.int32)
            return tokens[:, :-1], tokens[:, -1]
        if self.kind == "masked":
            # sequences of 1 to IDS ids, padded with 0 (masked) at the end
            x = rng.integers(1, VOCAB, size=(size, IDS)).astype(np.int32)
            x[np.arange(IDS) >= rng.integers(1, IDS + 1, size=(size, 1))] = 0
            return x, rng.integers(0, VOCAB, size=(size, IDS)).astype(np.int32)
        x = rng.integers(0, VOCAB, size=(size, _ids(self.kind))).astype(np.int32)
        return x, rng.normal(size=(size, 1))

    def variables(self) -> dict:
        """Every variable of the model and the optimizer, by path (a
        tf.Variable's name where it has none)."""
        return {getattr(v, "path", v.name): v
                for v in list(self.model.variables) + list(_variables_of(self.optimizer))}


def _variables_of(optimizer) -> list:
    """A Keras optimizer's variables, or a tf.compat.v1 one's (a method)."""
    found = optimizer.variables
    return found() if callable(found) else found


@contextlib.contextmanager
def keras_settings_kept():
    """Keras's global floatx and dtype policy as they were, after builds in
    this process: build sets floatx, and the first layer built then fixes
    the global dtype policy from it (a later float32 graph's Keras layers
    would compute in float64)."""
    import keras
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def sequence_step(mask_zero: bool = False):
    """(model, optimizer, ConcreteFunction) of a per-position model over 3 ids in
    float64 (Embedding, then Dense(5, tanh) and Dense(10) on each position)
    trained by a Keras loss over the [batch, 3] outputs: Dense on a sequence
    multiplies through Tensordot; with `mask_zero`, Keras's loss weighs each
    position the Embedding's mask keeps by size / count. Call it inside
    keras_settings_kept(); hold the optimizer while the function is used
    (the trace references its variables, not it)."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    ids = keras.Input((3,), dtype="int32")
    h = keras.layers.Embedding(10, 4, mask_zero=mask_zero)(ids)
    model = keras.Model(ids, keras.layers.Dense(10)(keras.layers.Dense(5, activation="tanh")(h)))
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = xent(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss
    spec = tf.TensorSpec([None, 3], tf.int32)
    return model, opt, step.get_concrete_function(spec, spec)


def _ids(kind: str) -> int:
    """Ids per example (columns of x) of a model kind."""
    return {"lstm": WINDOW, "gru": WINDOW, "shared": 2 * IDS}.get(kind, IDS)


def build(kind: str = "emb_mlp", optimizer_name: str = "adam",
          dtype: str = "float64") -> KerasProgram:
    import keras
    import tensorflow as tf
    keras.config.set_floatx(dtype)
    keras.utils.set_random_seed(1)
    if kind in ("lstm", "gru"):
        recurrent = keras.layers.LSTM(6) if kind == "lstm" else keras.layers.GRU(6)
        model = keras.Sequential([keras.Input((WINDOW,), dtype="int32"),
                                  keras.layers.Embedding(VOCAB, 6), recurrent,
                                  keras.layers.Dense(VOCAB)])
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        y_spec = tf.TensorSpec([None], tf.int32)
    elif kind == "bn_mlp":
        # No bias before the batch norm: its gradient would be zero but for
        # rounding, which Adam's division by sqrt(v) turns into lr-sized steps.
        # The embedding's L2 penalty makes its gradient dense: the tape
        # densifies the rows' IndexedSlices to add the penalty's gradient.
        model = keras.Sequential([keras.Input((IDS,), dtype="int32"),
                                  keras.layers.Embedding(
                                      VOCAB, 6, embeddings_regularizer=keras.regularizers.L2(1e-3)),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(8, use_bias=False),
                                  keras.layers.BatchNormalization(),
                                  keras.layers.Activation("relu"),
                                  keras.layers.LayerNormalization(),
                                  keras.layers.Dense(1)])
        loss_fn = keras.losses.MeanSquaredError()
        y_spec = tf.TensorSpec([None, 1], dtype)
    elif kind == "shared":
        ids = keras.Input((2 * IDS,), dtype="int32")
        embed = keras.layers.Embedding(VOCAB, 6)
        dense = keras.layers.Dense(5, activation="tanh",
                                   kernel_regularizer=keras.regularizers.L2(0.01))
        halves = [keras.layers.GlobalAveragePooling1D()(embed(part))
                  for part in (ids[:, :IDS], ids[:, IDS:])]
        model = keras.Model(ids, keras.layers.Dense(1)(
            keras.layers.Concatenate()([dense(h) for h in halves])))
        loss_fn = keras.losses.MeanSquaredError()
        y_spec = tf.TensorSpec([None, 1], dtype)
    elif kind == "masked":
        # Dense layers on each position carry the Embedding's mask to the
        # loss, which Keras weighs by size / count of the kept positions
        model = keras.Sequential([keras.Input((IDS,), dtype="int32"),
                                  keras.layers.Embedding(VOCAB, 6, mask_zero=True),
                                  keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(VOCAB)])
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        y_spec = tf.TensorSpec([None, IDS], tf.int32)
    elif kind == "wide_deep":
        model = _wide_and_deep(keras)
        loss_fn = keras.losses.MeanSquaredError()
        y_spec = tf.TensorSpec([None, 1], dtype)
    elif kind == "module":
        model = _linear_over_embedding(tf, dtype)
        loss_fn = keras.losses.MeanSquaredError()
        y_spec = tf.TensorSpec([None, 1], dtype)
    else:
        model = keras.Sequential([keras.Input((IDS,), dtype="int32"),
                                  keras.layers.Embedding(VOCAB, 6),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        loss_fn = keras.losses.MeanSquaredError()
        y_spec = tf.TensorSpec([None, 1], dtype)
    opt = optimizer(optimizer_name)

    @tf.function(jit_compile=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if getattr(model, "losses", None):   # regularizers
                loss += tf.cast(tf.add_n(model.losses), loss.dtype)
            # the loss itself but for loss scaling (a tf.compat.v1 optimizer has none)
            scaled = opt.scale_loss(loss) if hasattr(opt, "scale_loss") else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function(jit_compile=False)
    def micro_batch_step(x, y):
        # Two halves of the batch, a tape each, their mean gradients
        # averaged (the embedding's IndexedSlices made dense to add them).
        half = tf.shape(x)[0] // 2
        losses, grads = [], []
        for part in (slice(None, half), slice(half, None)):
            with tf.GradientTape() as tape:
                losses.append(loss_fn(y[part], model(x[part], training=True)))
            grads.append([tf.convert_to_tensor(g)
                          for g in tape.gradient(losses[-1], model.trainable_variables)])
        opt.apply_gradients(zip([(a + b) / 2 for a, b in zip(*grads)],
                                model.trainable_variables))
        return (losses[0] + losses[1]) / 2

    @tf.function(jit_compile=False)
    def accumulating_step(x, y):
        # Gradient accumulation as custom loops write it: an accumulator
        # from zeros, each micro-batch's gradient divided by their number
        # and added in.
        half = tf.shape(x)[0] // 2
        accumulated = [tf.zeros_like(v) for v in model.trainable_variables]
        losses = []
        for part in (slice(None, half), slice(half, None)):
            with tf.GradientTape() as tape:
                losses.append(loss_fn(y[part], model(x[part], training=True)))
            grads = tape.gradient(losses[-1], model.trainable_variables)
            accumulated = [a + tf.convert_to_tensor(g) / 2 for a, g in zip(accumulated, grads)]
        opt.apply_gradients(zip(accumulated, model.trainable_variables))
        return (losses[0] + losses[1]) / 2

    step = {"micro": micro_batch_step, "accum": accumulating_step}.get(kind, train_step)
    x_spec = tf.TensorSpec([None, _ids(kind)], tf.int32)
    return KerasProgram(model, opt, step, step.get_concrete_function(x_spec, y_spec), kind,
                        {"batch_mixing": "per_worker"} if kind in ("micro", "accum") else {})


def _wide_and_deep(keras):
    """Wide & deep over IDS categorical columns of ids: the wide part a
    linear model of the columns (an Embedding of width 1 per column, a
    weight per id, summed), the deep part an Embedding per column, the
    rows concatenated into Dense(8, relu) -> Dense(1); the two logits
    added. Each column's ids repeat within a batch and across workers."""
    ids = keras.Input((IDS,), dtype="int32")
    columns = [keras.layers.Lambda(lambda x, c=c: x[:, c])(ids) for c in range(IDS)]
    wide = keras.layers.Add()([keras.layers.Embedding(VOCAB, 1, name=f"wide_{c}")(col)
                               for c, col in enumerate(columns)])
    deep = keras.layers.Concatenate()([keras.layers.Embedding(VOCAB, 4, name=f"deep_{c}")(col)
                                       for c, col in enumerate(columns[:2])])
    deep = keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(deep))
    return keras.Model(ids, keras.layers.Add()([wide, deep]))


def _linear_over_embedding(tf, dtype: str):
    """A tf.Module: the mean of each example's embedding rows, then a
    linear layer; variables named as a user names them."""
    rng = np.random.default_rng(1)

    class LinearOverEmbedding(tf.Module):
        def __init__(self):
            super().__init__(name="linear_over_embedding")
            self.table = tf.Variable(rng.normal(size=(VOCAB, 6)), dtype=dtype, name="table")
            self.w = tf.Variable(0.3 * rng.normal(size=(6, 1)), dtype=dtype, name="w")
            self.b = tf.Variable(tf.zeros([1], dtype), name="b")

        def __call__(self, x, training=False):
            h = tf.reduce_mean(tf.nn.embedding_lookup(self.table, x), 1)
            return tf.matmul(h, self.w) + self.b

    return LinearOverEmbedding()
