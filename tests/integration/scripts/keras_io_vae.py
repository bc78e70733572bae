"""
Title: Variational AutoEncoder
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2020/05/03
Last modified: 2020/05/03
Description: Convolutional Variational AutoEncoder (VAE) trained on MNIST digits.

Ported from keras-io (examples/generative/vae.py at
cca4efba8e0b8514ae3817931696294039b3bfc9, Apache License 2.0) with the
smallest change, each marked "autopar port": 200 synthetic 28x28 images in
place of MNIST's, 2 epochs, float64, fixed seeds, no summaries or plots, and
fit by Keras's own model.fit (--keras, one device) or autopar.fit (on every
worker of --spec). Its own train_step feeds three Mean trackers the batch's
losses and logs their results (the total's as "loss"); batches of 128 split
43/43/42 over 3 workers. Prints the per-epoch logs and saves every variable
of the model and its optimizer.
"""

"""
## Setup
"""

import argparse  # autopar port
import json  # autopar port
import os  # autopar port
import sys  # autopar port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # autopar port
# autopar port: tf.keras is Keras 3, which this program is run with (the
# suite's processes default to legacy Keras for tf.compat.v1.layers programs)
os.environ.pop("TF_USE_LEGACY_KERAS", None)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow import keras  # noqa: E402
from tensorflow.keras import layers  # noqa: E402

import autopar  # noqa: E402  autopar port

# autopar port: the program's arguments, float64, seeds
p = argparse.ArgumentParser()
p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
p.add_argument("--spec")
p.add_argument("--run-option", default="hybrid")
p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)

"""
## Create a sampling layer
"""


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = tf.shape(z_mean)[0]
        dim = tf.shape(z_mean)[1]
        epsilon = tf.keras.backend.random_normal(shape=(batch, dim))
        return z_mean + tf.exp(0.5 * z_log_var) * epsilon


"""
## Build the encoder
"""

latent_dim = 2

encoder_inputs = keras.Input(shape=(28, 28, 1))
x = layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
x = layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(x)
x = layers.Flatten()(x)
x = layers.Dense(16, activation="relu")(x)
z_mean = layers.Dense(latent_dim, name="z_mean")(x)
z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
z = Sampling()([z_mean, z_log_var])
encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
# encoder.summary()  # autopar port

"""
## Build the decoder
"""

latent_inputs = keras.Input(shape=(latent_dim,))
x = layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
x = layers.Reshape((7, 7, 64))(x)
x = layers.Conv2DTranspose(64, 3, activation="relu", strides=2, padding="same")(x)
x = layers.Conv2DTranspose(32, 3, activation="relu", strides=2, padding="same")(x)
decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
# decoder.summary()  # autopar port

"""
## Define the VAE as a `Model` with a custom `train_step`
"""


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super(VAE, self).__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(
            name="reconstruction_loss"
        )
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [
            self.total_loss_tracker,
            self.reconstruction_loss_tracker,
            self.kl_loss_tracker,
        ]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = tf.reduce_mean(
                tf.reduce_sum(
                    keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)
                )
            )
            kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
            kl_loss = tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }


"""
## Train the VAE
"""

# autopar port: 200 synthetic images in place of
# (x_train, _), (x_test, _) = keras.datasets.mnist.load_data()
mnist_digits = np.random.default_rng(0).integers(0, 256, size=(200, 28, 28))
mnist_digits = np.expand_dims(mnist_digits, -1).astype("float32") / 255

vae = VAE(encoder, decoder)
vae.compile(optimizer=keras.optimizers.Adam())
# autopar port: 2 epochs (30), by Keras on one device or by autopar on every
# worker; the logs and every variable saved
if args.keras:
    history, worker = vae.fit(mnist_digits, epochs=2, batch_size=128, verbose=0).history, 0
else:
    result = autopar.fit(vae, mnist_digits, None, args.spec,
                         autopar.Config(log_every_steps=0, run_option=args.run_option),
                         epochs=2, batch_size=128, verbose=0)
    history, worker = result.history, result.worker_index
print("history " + json.dumps(history, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker),
         **{v.path: v.numpy() for v in vae.variables + vae.optimizer.variables})

# autopar port: the latent space's plots deleted (no matplotlib here)
