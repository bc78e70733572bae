"""Keras 3 models whose class overrides train_step, as Keras's guide to
customizing fit() writes them, trained by model.fit (--keras, one device)
or autopar.fit (on every worker of --spec):

- "compiled": a functional model whose train_step differentiates the
  compiled loss (model.compute_loss, with sample weights) and updates every
  metric of model.metrics itself (the loss tracker, the compiled metrics:
  MeanAbsoluteError and R2Score, whose state is arrays), returning their
  results, and whose test_step does the same without training (Keras's
  guide's); fit on arrays with sample weights, validation data whose last
  batch has fewer examples than workers and an EarlyStopping callback
  watching a metric of the step.
- "summed": a functional model whose train_step and test_step take a loss
  summed over the batch and feed it to a Mean tracker (one value per step,
  a sum over the batch), beside a Mean of the examples' losses and one of
  the batch's mean loss, and two Sum metrics, of the batch's mean loss and
  of the summed loss; fit on arrays with validation data, in batches that
  split unevenly.
- "gan": a model of two models with a compile() of its own (an optimizer
  for each, a loss function), whose train_step takes the batch of real
  examples alone, draws the latent vectors and the labels' noise from a
  keras.random.SeedGenerator, trains the discriminator and then the
  generator, and logs two Mean trackers listed in its `metrics` property;
  fit on a tf.data.Dataset of x alone, shuffled.
- "wgan": WGAN-GP (one critic update per step): a gradient penalty on
  examples interpolated with a random weight per example, its gradient a
  tape inside the critic's tape; the step returns its losses as computed
  (no metric); fit on arrays of x alone.

Saves every variable of the models and their optimizers and prints the
per-epoch logs."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402


class CompiledLossModel(keras.Model):
    def train_step(self, data):
        x, y, sample_weight = data if len(data) == 3 else (*data, None)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class SummedLossModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trackers = [keras.metrics.Mean(name="loss"), keras.metrics.Mean(name="examples"),
                         keras.metrics.Mean(name="mean"), keras.metrics.Sum(name="summean"),
                         keras.metrics.Sum(name="sumloss")]

    @property
    def metrics(self):
        return self.trackers

    def _loss_of(self, x, y, training):
        per_example = tf.square(y - self(x, training=training))[:, 0]
        return tf.reduce_sum(per_example), per_example

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss, per_example = self._loss_of(x, y, training=True)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        return self._logged(loss, per_example)

    def test_step(self, data):
        x, y = data
        return self._logged(*self._loss_of(x, y, training=False))

    def _logged(self, loss, per_example):
        self.trackers[0].update_state(loss)
        self.trackers[1].update_state(per_example)
        self.trackers[2].update_state(tf.reduce_mean(per_example))
        self.trackers[3].update_state(tf.reduce_mean(per_example))
        self.trackers[4].update_state(loss)
        return {m.name: m.result() for m in self.metrics}


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, real):
        n = tf.shape(real)[0]
        latent = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
        combined = tf.concat([self.generator(latent), real], axis=0)
        labels = tf.concat([tf.ones((n, 1), real.dtype), tf.zeros((n, 1), real.dtype)], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        self.d_optimizer.apply(tape.gradient(d_loss, self.discriminator.trainable_weights),
                               self.discriminator.trainable_weights)
        latent = keras.random.normal((n, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((n, 1), real.dtype),
                                  self.discriminator(self.generator(latent)))
        self.g_optimizer.apply(tape.gradient(g_loss, self.generator.trainable_weights),
                               self.generator.trainable_weights)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


class WGAN(GAN):
    def compile(self, d_optimizer, g_optimizer, loss_fn=None):
        keras.Model.compile(self)
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    def gradient_penalty(self, real, fake):
        alpha = tf.random.uniform([tf.shape(real)[0], 1], 0.0, 1.0, dtype=real.dtype)
        interpolated = real + alpha * (fake - real)
        with tf.GradientTape() as tape:
            tape.watch(interpolated)
            critic = self.discriminator(interpolated, training=True)
        norm = tf.sqrt(tf.reduce_sum(tf.square(tape.gradient(critic, interpolated)), axis=1))
        return tf.reduce_mean((norm - 1.0) ** 2)

    def train_step(self, real):
        n = tf.shape(real)[0]
        latent = tf.random.normal((n, self.latent_dim), dtype=real.dtype)
        with tf.GradientTape() as tape:
            fake = self.generator(latent, training=True)
            d_loss = (tf.reduce_mean(self.discriminator(fake, training=True))
                      - tf.reduce_mean(self.discriminator(real, training=True))
                      + 10.0 * self.gradient_penalty(real, fake))
        self.d_optimizer.apply(tape.gradient(d_loss, self.discriminator.trainable_variables),
                               self.discriminator.trainable_variables)
        latent = tf.random.normal((n, self.latent_dim), dtype=real.dtype)
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(self.discriminator(self.generator(latent, training=True),
                                                        training=True))
        self.g_optimizer.apply(tape.gradient(g_loss, self.generator.trainable_variables),
                               self.generator.trainable_variables)
        return {"d_loss": d_loss, "g_loss": g_loss}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--model", choices=["compiled", "summed", "gan", "wgan"], required=True)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 6)), rng.normal(size=(48, 1))
    if args.model in ("gan", "wgan"):
        discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                                          keras.layers.LeakyReLU(negative_slope=0.2),
                                          keras.layers.Dense(1)])
        generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8),
                                      keras.layers.LeakyReLU(negative_slope=0.2),
                                      keras.layers.Dense(6)])
        model = (GAN if args.model == "gan" else WGAN)(discriminator, generator, latent_dim=3)
        model.compile(d_optimizer=keras.optimizers.Adam(3e-3),
                      g_optimizer=keras.optimizers.Adam(3e-3),
                      loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
        # shuffled without a seed of its own: keras.utils.set_random_seed's
        data = [tf.data.Dataset.from_tensor_slices(x).shuffle(48).batch(12)]
        fit = dict(epochs=3)
        if args.model == "wgan":
            data, fit = [x], dict(epochs=2, batch_size=12)
        optimizers = [model.d_optimizer, model.g_optimizer]
    elif args.model == "summed":
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(5, activation="tanh")(inputs)
        model = SummedLossModel(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.SGD(1e-3))
        data = [x, y]
        # batches of 10 and a last of 8 (4/3/3, 3/3/2 on 3 workers); of the
        # validation's, 10, 10 and 6
        fit = dict(epochs=2, batch_size=10, validation_data=(x[:26], y[:26]))
        optimizers = [model.optimizer]
    else:
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(5, activation="tanh")(inputs)
        model = CompiledLossModel(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse",
                      metrics=["mae", keras.metrics.R2Score()])
        data = [x, y]
        # EarlyStopping ends fit after epoch 2 of 4: the R2 score of epoch 2
        # does not improve on epoch 1's by 0.5
        fit = dict(epochs=4, batch_size=12, sample_weight=rng.uniform(0.5, 1.5, size=48),
                   validation_data=(x[:26], y[:26]),
                   callbacks=[keras.callbacks.EarlyStopping(monitor="r2_score", mode="max",
                                                            patience=0, min_delta=0.5)])
        optimizers = [model.optimizer]
    if args.keras:
        history, worker = model.fit(*data, verbose=0, **fit).history, 0
    else:
        if len(data) == 1:
            data.append(None)
        result = autopar.fit(model, *data, args.spec, autopar.Config(log_every_steps=0,
                                                                    run_option=args.run_option),
                             verbose=0, **fit)
        history, worker = result.history, result.worker_index
    print("history " + json.dumps(history, sort_keys=True), flush=True)
    np.savez(args.out.format(worker=worker),
             **{v.path: v.numpy() for v in model.variables + [
                 v for o in optimizers for v in o.variables]})


if __name__ == "__main__":
    main()
