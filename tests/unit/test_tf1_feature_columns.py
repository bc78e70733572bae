"""TF1 programs' sparse feature lookups: tf.compat.v1.feature_column's
embedding and indicator columns (input_layer) and
tf.compat.v1.nn.safe_embedding_lookup_sparse over a SparseTensor made from
the batch's dense ids. The lookup keeps the entries whose id is valid
(tf.sparse.retain: a gather at the places tf.where finds in a mask of the
same entries) and fills the rows left empty (SparseFillEmptyRows, one flag
per example); before, both were taken for values a mask of the batch keeps,
and every such program was refused as mixing the batch. Over a partitioned
table the lookup splits the batch's distinct ids over the partitions
(tf.dynamic_partition), which was refused too."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.transforms.compile import compile_for_config
from autopar.transforms.rewrite import rewrite_for_worker
from tests.unit.local_run import (each_worker_holds, trained_alone_and_together,
                                  variable_reads)

tf1 = tf.compat.v1
N = 3
REPO = Path(__file__).resolve().parents[2]


def _classifier(lookup: str) -> tuple:
    """(graph, train op, variable reads) of ids [b, 4] (0: no id) looked up
    by `lookup`, summed with dense features x [b, 2] into 3 classes."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)   # the columns' table: the same start in both runs
        x = tf1.placeholder(tf.float64, [None, 2], name="x")
        ids = tf1.placeholder(tf.int64, [None, 4], name="ids")
        y = tf1.placeholder(tf.int32, [None], name="y")
        if lookup == "feature_columns":   # float32, as feature columns make them
            columns = [
                tf1.feature_column.embedding_column(
                    tf1.feature_column.categorical_column_with_identity("ids", 30), 4,
                    combiner="sqrtn"),
                tf1.feature_column.indicator_column(
                    tf1.feature_column.categorical_column_with_hash_bucket("words", 7))]
            h = tf.cast(tf1.feature_column.input_layer(
                {"ids": ids, "words": tf.strings.as_string(ids)}, columns), tf.float64)
            optimizer = tf1.train.GradientDescentOptimizer(0.5)
        else:
            # "sqrtn", "mean"; "partitioned": a table of 3 partitions, its
            # lookup partitioning the batch's distinct ids by
            # tf.dynamic_partition; "unsafe": embedding_lookup_sparse alone
            table = tf1.get_variable(
                "table", [30, 4], tf.float64, tf1.random_uniform_initializer(-0.5, 0.5, seed=3),
                partitioner=tf1.fixed_size_partitioner(3) if lookup != "sqrtn" else None)
            sparse = tf.sparse.from_dense(ids)
            if lookup == "unsafe":   # every example has an id
                sparse = tf.sparse.from_dense(tf.maximum(ids, 1))
                h = tf1.nn.embedding_lookup_sparse(table, sparse, None, combiner="sqrtn")
            else:
                h = tf1.nn.safe_embedding_lookup_sparse(
                    table, sparse, combiner="mean" if lookup == "mean" else "sqrtn")
            optimizer = tf1.train.AdamOptimizer(0.05)
        head = tf1.get_variable("head", [int(h.shape[1]) + 2, 3], tf.float64,
                                tf1.glorot_uniform_initializer(seed=2))
        logits = tf.matmul(tf.concat([h, x], 1), head)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))
        train = optimizer.minimize(loss)
    return graph, train, variable_reads(graph)


def _batches() -> list:
    """3 global batches of 11 examples (4/4/3 on 3 workers), 0 to 3 ids
    each: an example with none is a row the lookup fills."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(3):
        ids = rng.integers(1, 30, size=(11, 4)) * (rng.random((11, 4)) < 0.6)
        ids[2] = 0
        out.append((rng.normal(size=(11, 2)), ids, rng.integers(0, 3, 11)))
    return out


def _trained(lookup: str) -> tuple:
    """(each worker's variables after training with 3 workers, one device's)."""
    graph, train, reads = _classifier(lookup)
    compiled = compile_for_config(graph, N, autopar.Config(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, compiled.analysis, compiled.plan, w) for w in range(N)]
    return trained_alone_and_together(graph, rewritten, train.name, _batches(),
                                      ("x:0", "ids:0", "y:0"), reads)


@pytest.mark.parametrize("lookup", ["sqrtn", "mean", "partitioned", "unsafe"])
def test_a_safe_sparse_lookup_of_dense_ids_trains_as_one_device(lookup):
    """(partitioned, unsafe: before, refused as mixing the batch at the
    lookup's DynamicPartition of the distinct ids)"""
    got, expected = _trained(lookup)
    # float64; Adam's 1 / sqrt(v) of gradients summed in another order
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


def test_feature_columns_train_as_one_device():
    got, expected = _trained("feature_columns")
    # the columns' table and lookups are float32: a sum over 11
    # examples in another order differs by a few units of its last
    # place (1.2e-7 each), carried through 3 plain SGD steps
    each_worker_holds(got, expected, rtol=2e-5, atol=1e-6)


# The same programs in a TF1-era script that calls disable_v2_behavior()
# first (reference variables, V1 tensor shapes).
_V1 = r"""
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
from tests.unit.test_tf1_feature_columns import _trained
got, expected = _trained(sys.argv[1])
print(json.dumps({"variables": sorted(expected),
                  "worst": max(float(np.max(np.abs(values[v] - expected[v]) /
                                             (np.abs(expected[v]) + 1e-3)))
                               for values in got for v in expected)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("lookup,tolerance", [("partitioned", 1e-9), ("feature_columns", 2e-5)])
def test_under_v1_behaviour_they_train_as_one_device(lookup, tolerance):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _V1, lookup], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "head" in found["variables"], found
    assert any(v.startswith(("table", "input_layer/")) for v in found["variables"]), found
    assert found["worst"] < tolerance, found
