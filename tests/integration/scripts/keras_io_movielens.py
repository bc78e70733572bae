"""
Title: Collaborative Filtering for Movie Recommendations
Author: [Siddhartha Banerjee](https://twitter.com/sidd2006)
Date created: 2020/05/24
Last modified: 2020/05/24
Description: Recommending movies using a model trained on Movielens dataset.

Ported from keras-io (examples/structured_data/collaborative_filtering_movielens.py at
ff6a507b2737777a8845ff9a2f1caf7f53ce3e78, Apache License 2.0) with the smallest change,
each marked "autopar port": 1000 synthetic ratings of 61 users and 97 movies in place of
the MovieLens download and its pandas preparation (pandas is not installed here), 2
epochs, float64, fixed seeds, no plots or recommendations, and fit by Keras's own
model.fit (--keras, one device) or autopar.fit (on every worker of --spec). Its model's
score is tf.tensordot(user_vector, movie_vector, 2): a sum over every example of the
batch, so each example's prediction depends on the others'. Prints the per-epoch logs
and saves every variable of the model and its optimizer.
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
## First, load the data and apply preprocessing
"""

# autopar port: synthetic ratings, users and movies already encoded as indices, in place
# of the download, pd.read_csv(ratings_file), the encoding and df.sample(frac=1)
rng = np.random.default_rng(0)
num_users, num_movies = 61, 97
x = np.stack([rng.integers(0, num_users, 1000), rng.integers(0, num_movies, 1000)], axis=1)
ratings = rng.integers(1, 11, 1000) / 2.0
# min and max ratings will be used to normalize the ratings later
min_rating = min(ratings)
max_rating = max(ratings)

"""
## Prepare training and validation data
"""
# Normalize the targets between 0 and 1. Makes it easy to train.
y = (ratings - min_rating) / (max_rating - min_rating)  # autopar port: was df["rating"].apply
# Assuming training on 90% of the data and validating on 10%.
train_indices = int(0.9 * x.shape[0])  # autopar port: df.shape[0]
x_train, x_val, y_train, y_val = (
    x[:train_indices],
    x[train_indices:],
    y[:train_indices],
    y[train_indices:],
)

"""
## Create the model
"""
EMBEDDING_SIZE = 50


class RecommenderNet(keras.Model):
    def __init__(self, num_users, num_movies, embedding_size, **kwargs):
        super(RecommenderNet, self).__init__(**kwargs)
        self.num_users = num_users
        self.num_movies = num_movies
        self.embedding_size = embedding_size
        self.user_embedding = layers.Embedding(
            num_users,
            embedding_size,
            embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6),
        )
        self.user_bias = layers.Embedding(num_users, 1)
        self.movie_embedding = layers.Embedding(
            num_movies,
            embedding_size,
            embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6),
        )
        self.movie_bias = layers.Embedding(num_movies, 1)

    def call(self, inputs):
        user_vector = self.user_embedding(inputs[:, 0])
        user_bias = self.user_bias(inputs[:, 0])
        movie_vector = self.movie_embedding(inputs[:, 1])
        movie_bias = self.movie_bias(inputs[:, 1])
        dot_user_movie = tf.tensordot(user_vector, movie_vector, 2)
        # Add all the components (including bias)
        x = dot_user_movie + user_bias + movie_bias
        # The sigmoid activation forces the rating to between 0 and 1
        return tf.nn.sigmoid(x)


model = RecommenderNet(num_users, num_movies, EMBEDDING_SIZE)
model.compile(
    loss=tf.keras.losses.BinaryCrossentropy(),
    optimizer=keras.optimizers.Adam(learning_rate=0.001),
)

"""
## Train the model based on the data split
"""
# autopar port: 2 epochs (5), by Keras on one device or by autopar on every worker; the
# logs and every variable saved
fit = dict(x=x_train, y=y_train, batch_size=64, epochs=2, verbose=0,
           validation_data=(x_val, y_val))
if args.keras:
    history, worker = model.fit(**fit).history, 0
else:
    result = autopar.fit(model, resource_info=args.spec, config=autopar.Config(
        log_every_steps=0, run_option=args.run_option), **fit)
    history, worker = result.history, result.worker_index
print("history " + json.dumps(history, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker),
         **{v.path: v.numpy() for v in model.variables + model.optimizer.variables})

# autopar port: the loss plot and the recommendations for a user deleted (no matplotlib,
# no movies.csv here)
