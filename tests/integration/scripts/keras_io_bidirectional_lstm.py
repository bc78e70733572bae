"""
Title: Bidirectional LSTM on IMDB
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2020/05/03
Last modified: 2020/05/03
Description: Train a 2-layer bidirectional LSTM on the IMDB movie review sentiment classification dataset.

Ported from keras-io (examples/nlp/bidirectional_lstm_imdb.py at
0a4be8bbc3ae126f3ca49a0bf173902866ec06f0, Apache License 2.0) with the
smallest change, each marked "autopar port": 100 training and 40
validation reviews of synthetic word ids of random lengths in place of
IMDB's, a smaller vocabulary, sequence length and layers, float64, fixed
seeds, and fit by Keras's own model.fit (--keras, one device) or
autopar.fit (on every worker of --spec). Batches of 32 make an epoch of
32/32/32/4 (split 11/11/10 and 2/1/1 over 3 workers). Prints the
per-epoch logs and saves every variable of the model and its optimizer.
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
from tensorflow import keras  # noqa: E402
from tensorflow.keras import layers  # noqa: E402

import autopar  # noqa: E402  autopar port

parser = argparse.ArgumentParser()  # autopar port
parser.add_argument("--keras", action="store_true")  # autopar port
parser.add_argument("--spec")  # autopar port
parser.add_argument("--run-option", default="hybrid")  # autopar port
parser.add_argument("--out", required=True)  # autopar port
args = parser.parse_args()  # autopar port
keras.config.set_floatx("float64")  # autopar port
keras.utils.set_random_seed(0)  # autopar port

max_features = 300  # Only consider the top 20k words  (autopar port: 300)
maxlen = 24  # Only consider the first 200 words of each movie review  (autopar port: 24)

"""
## Build the model
"""

# Input for variable-length sequences of integers
inputs = keras.Input(shape=(None,), dtype="int32")
# Embed each integer in a 128-dimensional vector  (autopar port: 16)
x = layers.Embedding(max_features, 16)(inputs)
# Add 2 bidirectional LSTMs  (autopar port: of 8 units)
x = layers.Bidirectional(layers.LSTM(8, return_sequences=True))(x)
x = layers.Bidirectional(layers.LSTM(8))(x)
# Add a classifier
outputs = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, outputs)

"""
## Load the IMDB movie review sentiment data
"""


def load_data(num_words, reviews):  # autopar port: in place of keras.datasets.imdb.load_data
    rng = np.random.default_rng(reviews)
    x = [list(rng.integers(1, num_words, rng.integers(5, 40))) for _ in range(reviews)]
    return x, rng.integers(0, 2, reviews)


(x_train, y_train), (x_val, y_val) = (load_data(max_features, 100),
                                      load_data(max_features, 40))  # autopar port
# Use pad_sequence to standardize sequence length:
# this will truncate sequences longer than 200 words and zero-pad sequences shorter than 200 words.
x_train = keras.preprocessing.sequence.pad_sequences(x_train, maxlen=maxlen)
x_val = keras.preprocessing.sequence.pad_sequences(x_val, maxlen=maxlen)

"""
## Train and evaluate the model
"""

model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
fit = dict(x=x_train, y=y_train, batch_size=32, epochs=2, validation_data=(x_val, y_val),
           verbose=0)  # autopar port
if args.keras:  # autopar port
    history, worker = model.fit(**fit), 0
else:  # autopar port
    history = autopar.fit(model, resource_info=args.spec, config=autopar.Config(
        run_option=args.run_option, log_every_steps=0), **fit)
    worker = history.worker_index
print("history " + json.dumps(history.history, sort_keys=True), flush=True)  # autopar port
np.savez(args.out.format(worker=worker), **{  # autopar port
    v.path: v.numpy() for v in model.variables + model.optimizer.variables})
