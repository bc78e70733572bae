"""Gradient accumulation and DropCompute on real clusters (Config(micro_batches,
compute_threshold), transforms/accumulate.py, runtime/dropcompute/).

Worker i feeds its rows of the global batch (train_model.py); the Runner
splits them into M micro-batches, so with no threshold N workers x M
micro-batches of b rows are one device's step on the global batch N*M*b.
"""
import csv
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.integration.cluster import (REPO, assert_same_parameters, load_worker, run_script,
                                       run_training, single_device_runs, write_spec)

tf1 = tf.compat.v1

STEPS = 3
BATCH = 16   # 2 workers x 4 micro-batches x 2 rows
M = 4


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


CASES = [
    # dense model, every gradient by all-reduce
    ("mlp_adam_clip_ema", "allreduce", 0),
    # sparse embedding on a parameter server (pushed as accumulated rows),
    # dense head by all-reduce; clipping by the global norm of both
    ("emb_adam_clip", "hybrid", 1),
]


@pytest.mark.parametrize("model,run_option,servers", CASES, ids=[f"{m}-{r}" for m, r, _ in CASES])
def test_accumulation_matches_single_device(model, run_option, servers, tmp_path, single_device):
    expected = single_device(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_spec(tmp_path, 2, servers)), "--run-option", run_option,
                       "--micro-batches", str(M))
    assert f"computed {STEPS * M} of {STEPS * M} micro-batches" in log
    for i in range(2):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} M={M} worker {i}")


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_threshold_drops_only_the_delayed_worker(tmp_path):
    """Worker 1 sleeps 4 s after each micro-batch, tau is 3 s: it computes one
    micro-batch per step and drops three; worker 0 computes all four. The
    update is Algorithm 1's: the sum of the computed micro-batches' gradients
    over N*M, here recomputed on one device from the same rows. The sparse
    embedding goes through all-gather, the dense head through all-reduce."""
    model, steps, lr = "emb_sgd", 2, 0.3      # tests/models.py: SGD(0.3)
    out, logs = tmp_path / "dist", tmp_path / "csv"
    run_training(model, out, "--steps", str(steps), "--batch", str(BATCH),
                 "--spec", str(write_spec(tmp_path, 2)), "--run-option", "allreduce",
                 "--micro-batches", str(M), "--threshold", "3.0", "--delay-worker", "1",
                 "--delay", "4.0", "--dropcompute-log", str(logs))
    rows = [_csv(logs / f"dropcompute_worker{i}.csv") for i in range(2)]
    assert [[int(r["computed"]) for r in w] for w in rows] == [[M] * steps, [1] * steps]
    assert [[int(r["dropped"]) for r in w] for w in rows] == [[0] * steps, [M - 1] * steps]
    assert {r["tau"] for w in rows for r in w} == {"3.000000"}   # one tau everywhere

    # The formula on one device: theta -= lr * sum_{computed (n, m)} g_nm / (N * M).
    built = models.build(model)
    with built.graph.as_default():
        variables = tf1.trainable_variables()
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(built.loss, variables)]
        placeholders = [tf1.placeholder(v.dtype.base_dtype, v.shape) for v in variables]
        update = tf.group(*[v.assign_sub(lr * g) for v, g in zip(variables, placeholders)])
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=built.graph) as sess:
        sess.run(init)
        per = BATCH // 2
        for step in range(steps):
            x, y = models.global_batch(model, step, BATCH)
            total = [np.zeros(v.shape, v.dtype.as_numpy_dtype) for v in variables]
            for n in range(2):
                for m in range(int(rows[n][step]["computed"])):
                    rows_m = slice(n * per + m * per // M, n * per + (m + 1) * per // M)
                    for t, g in zip(total, sess.run(grads, models.feed(built, x[rows_m], y[rows_m]))):
                        t += g
            sess.run(update, dict(zip(placeholders, [t / (2 * M) for t in total])))
        expected = sess.run({v.op.name: v for v in variables})
    for i in range(2):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == steps
        assert_same_parameters(expected, {k: actual[k] for k in expected},
                               what=f"DropCompute worker {i}")


def test_tf_data_micro_batches_match_single_device(tmp_path):
    """Each accumulate run pulls one element of the worker's tf.data pipeline;
    the update pulls none (else the workers' shards would drift apart from
    the single-device order)."""
    script = str(REPO / "tests" / "integration" / "scripts" / "tfdata_accumulate.py")
    b, n = 2, 2
    single, dist = tmp_path / "single", tmp_path / "dist"
    for args in ([str(single), str(n * M * b)],
                 [str(dist), str(b), str(write_spec(tmp_path, n)), str(M)]):
        run_script([sys.executable, script, *args])
    expected = load_worker(single, 0)
    for i in range(n):
        assert_same_parameters(expected, load_worker(dist, i), what=f"tf.data worker {i}")


def test_auto_threshold_is_agreed_by_every_worker(tmp_path):
    """compute_threshold="auto": after the warm-up (steps 1-2) the chief picks
    tau from both workers' micro-batch latencies (worker 1 has a log-normal
    delay) and logs it with the expected drop rate and speedup; both workers
    then hold that same tau."""
    logs = tmp_path / "csv"
    log = run_training("mlp_sgd", tmp_path / "dist", "--steps", "5", "--batch", str(BATCH),
                       "--spec", str(write_spec(tmp_path, 2)), "--micro-batches", str(M),
                       "--threshold", "auto", "--warmup", "1,3", "--delay-worker", "1",
                       "--delay", "0.2", "--delay-sigma", "1.0", "--dropcompute-log", str(logs))
    assert "[worker 0] DropCompute: " in log
    assert "expected drop rate" in log or "not dropping" in log
    taus = [{r["tau"] for r in _csv(logs / f"dropcompute_worker{i}.csv")[3:]} for i in range(2)]
    assert taus[0] == taus[1] and len(taus[0]) == 1
    assert all(f"worker {i}: DropCompute threshold" in log for i in range(2))
    assert "[worker 0] DropCompute job: 2 workers computed" in log
