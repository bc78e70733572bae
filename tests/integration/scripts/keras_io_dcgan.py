"""
Title: GAN overriding `Model.train_step`
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2019/04/29
Last modified: 2020/04/29
Description: A simple DCGAN trained using `fit()` by overriding `train_step`.

Ported from keras-io (examples/generative/dcgan_overriding_train_step.py,
Apache License 2.0) with the smallest change, each marked "autopar port":
synthetic 8x8 images in place of MNIST's 28x28, small layers, float64,
fixed seeds, no image files, and fit by Keras's own model.fit (--keras, one
device) or autopar.fit (on every worker of --spec). Batches of 32 on 3
workers split 11/11/10. Saves every variable of both models and both
optimizers and prints the per-epoch logs.
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

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402  autopar port: Keras 3 by its name (from tensorflow import keras)
from keras import layers  # noqa: E402  autopar port: (from tensorflow.keras import layers)
import numpy as np  # noqa: E402

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
## Prepare MNIST data
"""

# We use both the training & test MNIST digits.
batch_size = 32
# autopar port: 64 synthetic 8x8 images in place of MNIST's digits
all_digits = np.random.default_rng(0).uniform(size=(64, 8, 8)) * 255
all_digits = all_digits.astype("float64") / 255  # autopar port: float64
all_digits = np.reshape(all_digits, (-1, 8, 8, 1))
dataset = tf.data.Dataset.from_tensor_slices(all_digits)
dataset = dataset.shuffle(buffer_size=1024).batch(batch_size).prefetch(32)

"""
## Create the discriminator

It maps 28x28 digits to a binary classification score.
"""

discriminator = keras.Sequential(
    [
        keras.Input(shape=(8, 8, 1)),  # autopar port: (28, 28, 1)
        layers.Conv2D(4, (3, 3), strides=(2, 2), padding="same"),  # autopar port: 64
        layers.LeakyReLU(negative_slope=0.2),  # autopar port: alpha=
        layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),  # autopar port: 128
        layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(),
        layers.Dense(1),
    ],
    name="discriminator",
)

"""
## Create the generator

It mirrors the discriminator, replacing `Conv2D` layers with `Conv2DTranspose` layers.
"""

latent_dim = 4  # autopar port: 128

generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        # We want to generate 128 coefficients to reshape into a 7x7x128 map
        layers.Dense(2 * 2 * 8),  # autopar port: 7 * 7 * 128
        layers.LeakyReLU(negative_slope=0.2),
        layers.Reshape((2, 2, 8)),  # autopar port: (7, 7, 128)
        layers.Conv2DTranspose(8, (4, 4), strides=(2, 2), padding="same"),  # autopar port: 128
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(8, (4, 4), strides=(2, 2), padding="same"),  # autopar port: 128
        layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, (3, 3), padding="same", activation="sigmoid"),  # autopar port: (7, 7)
    ],
    name="generator",
)

"""
## Override `train_step`
"""


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super(GAN, self).__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super(GAN, self).compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        # Sample random points in the latent space
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))

        # Decode them to fake images
        generated_images = self.generator(random_latent_vectors)

        # Combine them with real images
        combined_images = tf.concat([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = tf.concat(
            [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
        )
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.random.uniform(tf.shape(labels))

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        # Sample random points in the latent space
        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))

        # Assemble labels that say "all real images"
        misleading_labels = tf.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


"""
## Train the end-to-end model
"""

epochs = 2  # autopar port: 30

gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)

# autopar port: by Keras on one device or by autopar on every worker, without
# the image-saving callback; the logs and every variable saved
if args.keras:
    history, worker = gan.fit(dataset, epochs=epochs, verbose=0).history, 0
else:
    result = autopar.fit(gan, dataset, None, args.spec,
                         autopar.Config(log_every_steps=0, run_option=args.run_option),
                         epochs=epochs, verbose=0)
    history, worker = result.history, result.worker_index
print("history " + json.dumps(history, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker),
         **{v.path: v.numpy() for v in gan.variables + gan.d_optimizer.variables
            + gan.g_optimizer.variables})
