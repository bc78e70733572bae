"""Hybrid communication (Parallax §5): sparse variables on parameter servers,
dense ones all-reduced — and the "ps" and "allreduce" run options — train to
the same parameters, slots and global step as one device.

3 workers on 2 hosts (127.0.0.1 runs two, 127.0.0.2 one) and 2 servers, so
local aggregation really combines two workers' rows before they go out.
"""
import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       single_device_runs, write_two_host_spec)

STEPS = 6
BATCH = 12

# Each run option's paths are covered elsewhere too (test_aggregation.py,
# test_sparse_varlen.py, test_correctness.py, test_compile_once.py); here the
# LM shapes: Adam with sparse rows partitioned over both servers and dense
# all-reduce, and Adagrad's server-side update of sparse and dense variables
# partitioned over both servers.
CASES = [
    ("lm_adam_clip", "hybrid", "embedding=3"),
    ("lm_adagrad_clip", "ps", "embedding=3,softmax/kernel=2"),
]


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


@pytest.mark.parametrize("model,run_option,partitions", CASES,
                         ids=[f"{m}-{r}{'-' + p if p else ''}" for m, r, p in CASES])
def test_matches_single_device(model, run_option, partitions, tmp_path, single_device):
    expected = single_device(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_two_host_spec(tmp_path)), "--run-option", run_option,
                       "--partitions", partitions)
    assert f"run_option={run_option}" in log
    if run_option != "allreduce":
        assert "on servers" in log
    for i in range(3):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} {run_option} worker {i}")
    if partitions.startswith("embedding=3") and run_option == "hybrid":
        # Local aggregation on (the default), counted on the servers: each
        # embedding partition's accumulator got one gradient per host per step.
        assert "contributions per accumulator per step: [2, 2, 2]" in log, log[-3000:]


def test_without_local_aggregation_every_worker_contributes(tmp_path):
    """LA off: each accumulator receives one gradient per worker (3), where the
    partitioned hybrid case above, LA on, shows one per host (2)."""
    log = run_training("lm_adam_clip", tmp_path / "out", "--steps", "4", "--batch", "12",
                       "--spec", str(write_two_host_spec(tmp_path)), "--run-option", "hybrid",
                       "--partitions", "embedding=2", "--no-la")
    assert "contributions per accumulator per step: [3, 3]" in log, log[-3000:]
