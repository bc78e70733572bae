"""
Title: Structured data learning with Wide, Deep, and Cross networks
Author: [Khalid Salama](https://www.linkedin.com/in/khalid-salama-24403144/)
Date created: 2020/12/31
Last modified: 2025/01/03
Description: Using Wide & Deep and Deep & Cross networks for structured data classification.
Accelerator: GPU

Ported from keras-io (examples/structured_data/wide_deep_cross_networks.py at
17ce1f3b3d3851611ca5b7ef7af781ed7fbce41e, Apache License 2.0) with the smallest change, each
marked "autopar port": its three models trained one after the other in one script, each by
Keras's own model.fit on one device (--keras) or by autopar.fit on every worker of --spec,
its batch statistics over the global batch (Config(batch_norm_group="all")); 640 synthetic
rows of the Covertype columns written to the CSV files in place of the UCI download and its
pandas preparation (pandas is not installed here), no model plots, float64, fixed seeds.
Batches of 265 (the upstream size, which 3 workers split 89/88/88) from
tf.data.experimental.make_csv_dataset: strings and numbers. Prints each model's per-epoch
logs and saves every variable of the three models and their optimizers.
"""

"""
## Setup
"""

import os

# Only the TensorFlow backend supports string inputs.
os.environ["KERAS_BACKEND"] = "tensorflow"

import argparse  # autopar port
import csv  # autopar port
import json  # autopar port
import sys  # autopar port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # autopar port

import math  # noqa: E402
import numpy as np  # noqa: E402
from tensorflow import data as tf_data  # noqa: E402
import keras  # noqa: E402
from keras import layers  # noqa: E402

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
histories, variables, worker = [], {}, 0  # autopar port

"""
## Prepare the data
"""

soil_type_values = [f"soil_type_{idx+1}" for idx in range(40)]
wilderness_area_values = [f"area_type_{idx+1}" for idx in range(4)]

CSV_HEADER = [
    "Elevation",
    "Aspect",
    "Slope",
    "Horizontal_Distance_To_Hydrology",
    "Vertical_Distance_To_Hydrology",
    "Horizontal_Distance_To_Roadways",
    "Hillshade_9am",
    "Hillshade_Noon",
    "Hillshade_3pm",
    "Horizontal_Distance_To_Fire_Points",
    "Wilderness_Area",
    "Soil_Type",
    "Cover_Type",
]

# autopar port: 640 synthetic rows of these columns (the label from 0 to 6) in place of the
# UCI download, its one-hot columns decoded with pandas and its random 85/15 split: the first
# 540 rows for training, the others for testing
rng = np.random.default_rng(0)
rows = [[int(v) for v in rng.integers(0, 100, size=10)]
        + [str(rng.choice(wilderness_area_values)), str(rng.choice(soil_type_values)),
           int(rng.integers(0, 7))] for _ in range(640)]

"""
Next, store the training and test data in separate CSV files.
"""

train_data_file = "train_data.csv"
test_data_file = "test_data.csv"

# autopar port: written with the csv module, each replaced at once (every process of the job
# runs this script in one directory: none may read another's half-written file)
for path, part in ((train_data_file, rows[:540]), (test_data_file, rows[540:])):
    with open(f"{path}.{os.getpid()}", "w", newline="") as f:
        csv.writer(f).writerows([CSV_HEADER] + part)
    os.replace(f"{path}.{os.getpid()}", path)

"""
## Define dataset metadata
"""

TARGET_FEATURE_NAME = "Cover_Type"

TARGET_FEATURE_LABELS = ["0", "1", "2", "3", "4", "5", "6"]

NUMERIC_FEATURE_NAMES = [
    "Aspect",
    "Elevation",
    "Hillshade_3pm",
    "Hillshade_9am",
    "Hillshade_Noon",
    "Horizontal_Distance_To_Fire_Points",
    "Horizontal_Distance_To_Hydrology",
    "Horizontal_Distance_To_Roadways",
    "Slope",
    "Vertical_Distance_To_Hydrology",
]

CATEGORICAL_FEATURES_WITH_VOCABULARY = {
    # autopar port: the values in the order the data holds them first (was pandas' unique())
    "Soil_Type": list(dict.fromkeys(row[11] for row in rows)),
    "Wilderness_Area": list(dict.fromkeys(row[10] for row in rows)),
}

CATEGORICAL_FEATURE_NAMES = list(CATEGORICAL_FEATURES_WITH_VOCABULARY.keys())

FEATURE_NAMES = NUMERIC_FEATURE_NAMES + CATEGORICAL_FEATURE_NAMES

COLUMN_DEFAULTS = [
    [0] if feature_name in NUMERIC_FEATURE_NAMES + [TARGET_FEATURE_NAME] else ["NA"]
    for feature_name in CSV_HEADER
]

NUM_CLASSES = len(TARGET_FEATURE_LABELS)

"""
## Experiment setup
"""


# To convert the datasets elements to from OrderedDict to Dictionary
def process(features, target):
    return dict(features), target


def get_dataset_from_csv(csv_file_path, batch_size, shuffle=False):
    dataset = tf_data.experimental.make_csv_dataset(
        csv_file_path,
        batch_size=batch_size,
        column_names=CSV_HEADER,
        column_defaults=COLUMN_DEFAULTS,
        label_name=TARGET_FEATURE_NAME,
        num_epochs=1,
        header=True,
        shuffle=shuffle,
    ).map(process)
    return dataset.cache()


"""
Here we configure the parameters and implement the procedure for running a training and
evaluation experiment given a model.
"""

learning_rate = 0.001
dropout_rate = 0.1
batch_size = 265
num_epochs = 1

hidden_units = [32, 32]


def run_experiment(model):
    global worker  # autopar port
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )

    train_dataset = get_dataset_from_csv(train_data_file, batch_size, shuffle=True)

    test_dataset = get_dataset_from_csv(test_data_file, batch_size)

    print("Start training the model...")
    # autopar port: autopar.fit, where not --keras
    if args.keras:
        history = model.fit(train_dataset, epochs=num_epochs)
    else:
        history = autopar.fit(model, train_dataset, None, args.spec, autopar.Config(
            log_every_steps=0, run_option=args.run_option, batch_norm_group="all"),
            epochs=num_epochs)
        worker = history.worker_index
    print("Model training finished")

    _, accuracy = model.evaluate(test_dataset, verbose=0)

    print(f"Test accuracy: {round(accuracy * 100, 2)}%")
    # autopar port: the logs and the variables of each model and its optimizer
    histories.append(history.history)
    variables.update({f"{model.name}/{v.path}": v.numpy()
                      for v in model.variables + model.optimizer.variables})


"""
## Create model inputs
"""


def create_model_inputs():
    inputs = {}
    for feature_name in FEATURE_NAMES:
        if feature_name in NUMERIC_FEATURE_NAMES:
            inputs[feature_name] = layers.Input(
                name=feature_name, shape=(), dtype="float32"
            )
        else:
            inputs[feature_name] = layers.Input(
                name=feature_name, shape=(), dtype="string"
            )
    return inputs


"""
## Encode features
"""


def encode_inputs(inputs, use_embedding=False):
    encoded_features = []
    for feature_name in inputs:
        if feature_name in CATEGORICAL_FEATURE_NAMES:
            vocabulary = CATEGORICAL_FEATURES_WITH_VOCABULARY[feature_name]
            # Create a lookup to convert string values to an integer indices.
            # Since we are not using a mask token nor expecting any out of vocabulary
            # (oov) token, we set mask_token to None and  num_oov_indices to 0.
            lookup = layers.StringLookup(
                vocabulary=vocabulary,
                mask_token=None,
                num_oov_indices=0,
                output_mode="int" if use_embedding else "binary",
            )
            if use_embedding:
                # Convert the string input values into integer indices.
                encoded_feature = lookup(inputs[feature_name])
                embedding_dims = int(math.sqrt(len(vocabulary)))
                # Create an embedding layer with the specified dimensions.
                embedding = layers.Embedding(
                    input_dim=len(vocabulary), output_dim=embedding_dims
                )
                # Convert the index values to embedding representations.
                encoded_feature = embedding(encoded_feature)
            else:
                # Convert the string input values into a one hot encoding.
                encoded_feature = lookup(
                    keras.ops.expand_dims(inputs[feature_name], -1)
                )
        else:
            # Use the numerical features as-is.
            encoded_feature = keras.ops.expand_dims(inputs[feature_name], -1)

        encoded_features.append(encoded_feature)

    all_features = layers.concatenate(encoded_features)
    return all_features


"""
## Experiment 1: a baseline model
"""


def create_baseline_model():
    inputs = create_model_inputs()
    features = encode_inputs(inputs)

    for units in hidden_units:
        features = layers.Dense(units)(features)
        features = layers.BatchNormalization()(features)
        features = layers.ReLU()(features)
        features = layers.Dropout(dropout_rate)(features)

    outputs = layers.Dense(units=NUM_CLASSES, activation="softmax")(features)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


baseline_model = create_baseline_model()
# autopar port: keras.utils.plot_model deleted (no pydot here)

"""
Let's run it:
"""

run_experiment(baseline_model)

"""
## Experiment 2: Wide & Deep model
"""


def create_wide_and_deep_model():
    inputs = create_model_inputs()
    wide = encode_inputs(inputs)
    wide = layers.BatchNormalization()(wide)

    deep = encode_inputs(inputs, use_embedding=True)
    for units in hidden_units:
        deep = layers.Dense(units)(deep)
        deep = layers.BatchNormalization()(deep)
        deep = layers.ReLU()(deep)
        deep = layers.Dropout(dropout_rate)(deep)

    merged = layers.concatenate([wide, deep])
    outputs = layers.Dense(units=NUM_CLASSES, activation="softmax")(merged)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


wide_and_deep_model = create_wide_and_deep_model()
# autopar port: keras.utils.plot_model deleted (no pydot here)

"""
Let's run it:
"""

run_experiment(wide_and_deep_model)

"""
## Experiment 3: Deep & Cross model
"""


def create_deep_and_cross_model():
    inputs = create_model_inputs()
    x0 = encode_inputs(inputs, use_embedding=True)

    cross = x0
    for _ in hidden_units:
        units = cross.shape[-1]
        x = layers.Dense(units)(cross)
        cross = x0 * x + cross
    cross = layers.BatchNormalization()(cross)

    deep = x0
    for units in hidden_units:
        deep = layers.Dense(units)(deep)
        deep = layers.BatchNormalization()(deep)
        deep = layers.ReLU()(deep)
        deep = layers.Dropout(dropout_rate)(deep)

    merged = layers.concatenate([cross, deep])
    outputs = layers.Dense(units=NUM_CLASSES, activation="softmax")(merged)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


deep_and_cross_model = create_deep_and_cross_model()
# autopar port: keras.utils.plot_model deleted (no pydot here)

"""
Let's run it:
"""

run_experiment(deep_and_cross_model)

# autopar port: every model's logs and variables
print("history " + json.dumps(histories, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker), **variables)
