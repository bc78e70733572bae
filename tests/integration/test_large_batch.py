"""Large-batch techniques against one device: LARS (autopar.optimizers) and
distributed evaluation (Runner.evaluate).

3 workers on 2 hosts train the MLP with LARSOptimizer (Figure 5 update,
biases excluded from adaptation) and evaluate it on an eval set of 10
examples sharded with autopar.shard (4 + 3 + 3 examples in batches of 3),
before and after training. Parameters and momentum slots must equal a
single-device run of the same global batch; the evaluation totals must equal
single-device evaluation of the whole set (workers run 2, 1 and 1 batches,
one device 4): every example counted once, none dropped.
"""
import json
import re

import numpy as np

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       write_two_host_spec)

STEPS = 6
BATCH = 12
EVAL_SIZE = 10   # not divisible by 3


def _evals(log: str, prefix: str = "") -> dict[str, list]:
    """{"start"|"end": [(totals, means), ...]} from the eval lines of `log`."""
    out: dict[str, list] = {}
    for when, totals, means in re.findall(
            rf"^{re.escape(prefix)}eval (start|end): (\{{.*?\}}) (\{{.*?\}})$", log, re.M):
        out.setdefault(when, []).append((json.loads(totals), json.loads(means)))
    return out


def test_lars_and_evaluate_match_single_device(tmp_path):
    args = ("--steps", str(STEPS), "--batch", str(BATCH), "--eval-size", str(EVAL_SIZE))
    single_log = run_training("mlp_lars", tmp_path / "single", *args)
    expected = load_worker(tmp_path / "single", 0)
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(0, 0))
    log = run_training("mlp_lars", tmp_path / "dist", *args, "--spec", str(spec))

    assert {f"{v}/LARS" for v in ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias")} <= set(expected)
    for i in range(3):
        actual = load_worker(tmp_path / "dist", i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"mlp_lars worker {i}/3")

    [(single_start, single_start_means)] = _evals(single_log)["start"]
    [(single_end, _)] = _evals(single_log)["end"]
    for i in range(3):
        evals = _evals(log, f"[worker {i}] ")
        [(start, start_means)] = evals["start"]
        [(end, _)] = evals["end"]
        for name in ("accuracy", "loss"):
            # Every example counted exactly once, on every worker.
            assert start[name][1] == end[name][1] == single_start[name][1] == EVAL_SIZE
        # Identical parameters before training: the number of correct
        # predictions is exactly one device's; summed float32 losses differ
        # only in summation order.
        assert start["accuracy"] == single_start["accuracy"]
        assert start_means["accuracy"] == single_start_means["accuracy"]
        np.testing.assert_allclose(start["loss"][0], single_start["loss"][0], rtol=1e-6)
        # After training, parameters agree to the tolerance above.
        np.testing.assert_allclose(end["loss"][0], single_end["loss"][0], rtol=1e-5)


def test_sharded_lars_in_one_bucket_per_variable_matches_single_device(tmp_path):
    """LARS under weight-update sharding, with fusion buckets so small that
    each holds one variable's gradient. No clipping joins the gradients, so a
    worker consumes only the buckets of the variables it owns: the others'
    all-reduces must still run on it (the owners wait in them), which hung
    before the non-owners' NoOp updates kept their averaged inputs."""
    args = ("--steps", "4", "--batch", str(BATCH))
    run_training("mlp_lars", tmp_path / "single", *args)
    expected = load_worker(tmp_path / "single", 0)
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(0, 0))
    log = run_training("mlp_lars", tmp_path / "dist", *args, "--spec", str(spec),
                       "--run-option", "allreduce", "--shard-weight-update",
                       "--fusion-bytes", "64", "--stall-timeout", "10")
    assert len(set(re.findall(r"allreduce #(\d+)", log))) >= 4, log[-3000:]   # one bucket each
    assert {int(w) for w in re.findall(r"updated by worker (\d)", log)} == {0, 1, 2}
    for i in range(3):
        actual = load_worker(tmp_path / "dist", i)
        assert int(actual["global_step"]) == 4
        assert_same_parameters(expected, actual, what=f"sharded mlp_lars worker {i}/3")
