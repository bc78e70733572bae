"""How workers' gradients and batch-local state combine, against one device.

- Deduplicated lookups (embedding_lookup_sparse applies tf.unique): one
  device has one gradient row per distinct id of the *global* batch, so rows
  of an id several workers touched must be combined before the global norm
  and the optimizer see them; over a table of 2 partitions on the servers
  too (the distinct ids split over them by tf.dynamic_partition). Centered RMSProp clipped by global norm (0.1,
  below the single-device norms ~0.25-0.35, so the clip is active every step;
  without combining the rows, the allreduce case fails).
- A loss summed over the batch: one device's gradient is the sum over the
  global batch, so workers' gradients (dense and sparse) are added.
- A loss averaged over the tokens a mask keeps (tf.compat.v1.losses with
  weights): one device divides by the global batch's count of kept tokens,
  each worker holds a different share of them; every worker divides by the
  count summed over workers (transforms.loss_counts).
- Batch norm takes one device's statistics of the global batch in training
  steps by default; with Config(batch_norm_group=None) each worker computes
  them, and its moving statistics, from its own batch, and with
  sync_local_state="average" those are averaged after every step.

Each run option, 3 workers on 2 hosts with 2 servers; every variable and
optimizer slot compared with a single-device run of the same global batch.
"""
import re

import numpy as np
import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       single_device_runs, write_spec, write_two_host_spec)

STEPS = 6
BATCH = 12   # divisible by 2 and 3
# Deduplicated rows are combined differently on the all-gather path
# (allreduce) and the server path (ps; hybrid puts the sparse variable there
# too); a summed loss is scaled differently on the all-gather path and on the
# server path with dense all-reduce beside it (hybrid), there a sum divided
# by the global batch size as a constant (tf.nn.compute_average_loss).
CASES = [("embsparse_rmsprop_clip_centered", "allreduce"), ("embsparse_rmsprop_clip_centered", "ps"),
         ("embsparsepart_rmsprop_clip_centered", "hybrid"),
         ("embsum_adagrad", "allreduce"), ("embglobal_adagrad", "hybrid"),
         ("lmmask_momentum", "hybrid")]


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


@pytest.mark.parametrize("model,option", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_matches_single_device(model, option, tmp_path, single_device):
    expected = single_device(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_two_host_spec(tmp_path)), "--run-option", option)
    if model.startswith("embsparsepart"):   # (before: refused at its DynamicPartition)
        assert "embedding/part_0: deduplicated lookup" in log
        assert "embedding/part_1: deduplicated lookup" in log
    elif model.startswith("embsparse"):
        assert "embedding: deduplicated lookup" in log
    elif model.startswith("lmmask"):
        assert "loss count 'sparse_softmax_cross_entropy_loss/num_present:0'" in log
    else:
        assert "gradients: summed over workers" in log
    for i in range(3):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} {option} worker {i}")


def test_batch_norm_state_averaged(tmp_path):
    """Moving statistics are per-worker state: the report says so, and with
    sync_local_state="average" every replica holds the same values after 5
    steps. (Workers normalise by their own batch's moments, so the model is
    not one device's: batch norm over 4 examples is another function than over
    12. What must hold is that replicas agree.)"""
    steps = 5
    out = tmp_path / "dist"
    log = run_training("bn_sgd", out, "--steps", str(steps), "--batch", str(BATCH),
                       "--spec", str(write_spec(tmp_path, 3)), "--run-option", "allreduce",
                       "--sync-local-state", "average", "--batch-norm-group", "none")
    assert "state bn/moving_mean (local): per worker (from the local batch), then averaged" in log
    assert "state bn/moving_variance (local): per worker (from the local batch)" in log
    workers = [load_worker(out, i) for i in range(3)]
    for name in workers[0]:
        # Workers saw different batches: unaveraged, their moving statistics
        # would differ; every other variable is replicated anyway.
        for w in workers[1:]:
            np.testing.assert_array_equal(w[name], workers[0][name], err_msg=name)
    assert np.abs(workers[0]["bn/moving_variance"]).min() > 0


def test_batch_norm_by_default_matches_single_device(tmp_path, single_device):
    """Config's default (batch_norm_group "auto": "all" here; "all" set
    explicitly: tests/programs/gan.py, the keras-io wide & deep port), 3
    workers on 2 hosts: a residual CNN with a tf.nn.moments batch norm and a
    FusedBatchNormV3 (its own moving averages) equals one device on the
    global batch: weights, batch-norm scales and offsets, momentum slots and
    moving statistics. After training the chief runs the forward pass alone
    on a batch (not a training step: the others do not join it): it
    normalises by that batch, as one device, whose loss it prints."""
    model = "bncnn_momentum"
    expected = single_device(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_two_host_spec(tmp_path, servers=(0, 0))),
                       "--run-option", "allreduce")
    assert "batch norm bn1 (moments): statistics over all 3 workers" in log
    assert "batch norm bn2 (fused): statistics over all 3 workers" in log
    for i in range(3):
        actual = load_worker(out, i)
        assert_same_parameters(expected, actual, what=f"{model} worker {i}")
    alone = re.findall(r"^\[worker 0\] eval loss: (\S+)$", log, re.M)
    one_device = re.findall(r"^eval loss: (\S+)$", single_device.logs[model], re.M)
    assert len(alone) == 1 and len(one_device) == 1, log[-3000:]
    np.testing.assert_allclose(float(alone[0]), float(one_device[0]), rtol=1e-5)


def test_batch_norm_group_with_distributed_evaluation(tmp_path):
    """Distributed batch norm and Runner.evaluate in one job: their
    collectives share the job's group, so their instance keys must never
    meet (they did: the totals of one metric, 2 values, took the key of the
    first batch-norm layer's backward sums, 'Shape mismatch in the
    collective instance'). Parameters, moving statistics and the evaluation
    totals (inference by the moving statistics, 10 examples over 3 workers)
    equal one device's."""
    args = ("--steps", "4", "--batch", str(BATCH), "--eval-size", "10",
            "--eval-metrics", "accuracy")
    single_log = run_training("bn_sgd", tmp_path / "single", *args)
    expected = load_worker(tmp_path / "single", 0)
    log = run_training("bn_sgd", tmp_path / "dist", *args,
                       "--spec", str(write_two_host_spec(tmp_path, servers=(0, 0))),
                       "--run-option", "allreduce", "--batch-norm-group", "all")
    assert "statistics over all 3 workers" in log
    single = _eval_lines(single_log)
    assert len(single) == 2 and all(totals["accuracy"][1] == 10 for totals in single)
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i), what=f"worker {i}")
        evals = _eval_lines(log, f"[worker {i}] ")
        assert len(evals) == 2
        assert evals == single   # counts of correct predictions: exact


def _eval_lines(log: str, prefix: str = "") -> list[dict]:
    """The totals of each "eval start|end" line train_model printed."""
    import json
    import re
    return [json.loads(totals) for totals in re.findall(
        rf"^{re.escape(prefix)}eval (?:start|end): (\{{.*?\}}) \{{.*?\}}$", log, re.M)]
