"""
Title: Text classification with Transformer
Author: [Apoorv Nandan](https://twitter.com/NandanApoorv)
Date created: 2020/05/10
Last modified: 2024/01/18
Description: Implement a Transformer block as a Keras layer and use it for text classification.
Accelerator: GPU
Converted to Keras 3 by: [Sitam Meur](https://github.com/sitamgithub-MSIT)

Ported from keras-io (examples/nlp/text_classification_with_transformer.py,
Apache License 2.0) with the smallest change, each marked "autopar port":
synthetic data in place of IMDB, small sizes, float64, fixed seeds, and
fit by Keras's own model.fit (--keras, one device) or autopar.fit (on every
worker of --spec). Saves every variable of the model and its optimizer and
prints the per-epoch logs.
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

import keras  # noqa: E402
import numpy as np  # noqa: E402  autopar port
from keras import layers  # noqa: E402
from keras import ops  # noqa: E402

import autopar  # noqa: E402  autopar port

"""
## Implement a Transformer block as a layer
"""


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [
                layers.Dense(ff_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


"""
## Implement embedding layer

Two separate embedding layers, one for tokens, one for token index (positions).
"""


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


# autopar port: the program's arguments
p = argparse.ArgumentParser()
p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
p.add_argument("--spec")
p.add_argument("--run-option", default="hybrid")
p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)

"""
## Download and prepare dataset
"""

vocab_size = 30  # autopar port: 20000
maxlen = 6  # autopar port: 200
# autopar port: synthetic sequences of ids (0 pads), a label from their sum
rng = np.random.default_rng(0)
x_train = rng.integers(0, vocab_size, size=(48, maxlen))
y_train = (x_train.sum(axis=1) % 2).astype("int32")
x_val = rng.integers(0, vocab_size, size=(12, maxlen))
y_val = (x_val.sum(axis=1) % 2).astype("int32")

"""
## Create classifier model using transformer layer

Transformer layer outputs one vector for each time step of our input sequence.
Here, we take the mean across all time steps and
use a feed forward network on top of it to classify text.
"""


embed_dim = 4  # autopar port: 32
num_heads = 2  # Number of attention heads
ff_dim = 4  # autopar port: 32

inputs = layers.Input(shape=(maxlen,))
embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
x = embedding_layer(inputs)
transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
x = transformer_block(x)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dropout(0.1)(x)
x = layers.Dense(20, activation="relu")(x)
x = layers.Dropout(0.1)(x)
outputs = layers.Dense(2, activation="softmax")(x)

model = keras.Model(inputs=inputs, outputs=outputs)


"""
## Train and Evaluate
"""

model.compile(
    optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
)
# autopar port: batch 12 (32), 2 epochs, by Keras on one device or by autopar
# on every worker; the logs and every variable saved
fit = dict(batch_size=12, epochs=2, verbose=0, validation_data=(x_val, y_val))
if args.keras:
    history, worker = model.fit(x_train, y_train, **fit).history, 0
else:
    result = autopar.fit(model, x_train, y_train, args.spec,
                         autopar.Config(log_every_steps=0, run_option=args.run_option), **fit)
    history, worker = result.history, result.worker_index
print("history " + json.dumps(history, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker),
         **{v.path: v.numpy() for v in model.variables + model.optimizer.variables})
