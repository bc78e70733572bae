"""The core promise: N workers with per-worker batch B/N end with the same
parameters, slots, moving averages and global step as one device with batch B.

Every run here is real: the launcher re-executes the training script per
worker, each with its own TensorFlow server, talking over loopback.
"""
import re

import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       single_device_runs, write_spec)

STEPS = 6
BATCH = 12   # divisible by 2 and 3

CASES = [
    # 2 workers: the small-bucket CNN test below (and test_compile_once.py); 3 here.
    ("cnn_momentum", 3),           # float32, momentum slots
    ("mlp_adam_clip_ema", 3),      # float64 Adam, clipping, moving averages
    ("emb_adam_clip", 3),          # sparse gradients through all-gather, with clipping
]


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


@pytest.mark.parametrize("model,workers", CASES, ids=[f"{m}-{n}w" for m, n in CASES])
def test_matches_single_device(model, workers, tmp_path, single_device):
    expected = single_device(model)
    out = tmp_path / "dist"
    spec = write_spec(tmp_path, workers)
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH), "--spec", str(spec))
    for i in range(workers):
        assert f"[worker {i}] worker {i} done at global step {STEPS}" in log
        actual = load_worker(out, i)
        # Global step advanced exactly once per step, on every replica.
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} worker {i}/{workers}")


def test_small_fusion_buckets_match(tmp_path, single_device):
    """Gradients split over many fused buckets (one per variable here) still
    average to the single-device result."""
    expected = single_device("cnn_momentum")
    out = tmp_path / "dist"
    log = run_training("cnn_momentum", out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_spec(tmp_path, 2)), "--fusion-bytes", "100")
    # the report: one bucket per variable, all five all-reduced
    assert sorted(set(re.findall(r"bucket #(\d+): float32", log))) == list("01234"), log
    assert "5 variables (5 allreduce)" in log
    assert_same_parameters(expected, load_worker(out, 1), what="cnn small buckets")
