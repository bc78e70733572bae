"""Programs written as users write them (tests/programs), trained on 3
workers over 2 uneven hosts with a server each (2 workers + 1 server on
127.0.0.1, 1 worker + 1 server on 127.0.0.2), in every run option, end
with every variable, slot, moving average and the global step equal to one
device running the same program on the same global batches.

two_trainers: two optimizers over different variables run on alternate
steps, then together (a list of both, a tf.group of both); one built inside
a variable_scope over a user-partitioned embedding (slots named
"model/model/..."), the other with an ExponentialMovingAverage over an
embedding autopar partitions and over a reference-variable embedding it is
asked to partition (kept whole).

loss_scaled: tf.compat.v1's MixedPrecisionLossScaleOptimizer in control
flow v2, whose functional conds every process lowers into its graph; some
steps skipped for gradients that overflow float32, a summed loss."""
import importlib.util
import re
import sys

import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, load_worker,
                                       run_in_process, run_script, write_two_host_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "user_program.py"
STEPS, BATCH = 6, 6
# float64 where Adam divides by sqrt(v) (tests.models.model_dtype); herring
# sums float32 only, so its case runs the float32 build (Momentum).
CASES = [("hybrid", "float64"), ("ps", "float64"), ("allreduce", "float64"),
         ("herring", "float32")]


def _script_main():
    spec = importlib.util.spec_from_file_location("user_program", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    cache = {}

    def get(program: str, dtype: str):
        if (program, dtype) not in cache:
            out = tmp_path_factory.mktemp(f"single_{program}_{dtype}")
            run_in_process(_script_main(), ["--program", program, "--dtype", dtype,
                                            "--steps", str(STEPS), "--batch", str(BATCH),
                                            "--out", str(out)])
            cache[(program, dtype)] = load_worker(out, 0)
        return cache[(program, dtype)]
    return get


@pytest.mark.parametrize("run_option,dtype", CASES, ids=[c[0] for c in CASES])
def test_two_trainers_match_single_device(run_option, dtype, tmp_path, single_device):
    expected = single_device("two_trainers", dtype)
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT),
                      "--program", "two_trainers", "--dtype", dtype, "--steps", str(STEPS),
                      "--batch", str(BATCH), "--out", str(out), "--spec", str(spec),
                      "--run-option", run_option]
                     + (["--uneven-step"] if run_option == "allreduce" else []))
    assert "2 train ops update different variables" in log
    if run_option == "allreduce":
        # one more step, after the saved ones, of 7 examples split 3/2/2: the
        # worker whose batch is not its first's size says so (mean losses)
        assert re.search(r"worker 0: training step \d+ had 3 examples where its first had 2",
                         log), log[-3000:]
        assert "worker 1: training step" not in log and "worker 2: training step" not in log
    if run_option in ("hybrid", "ps", "herring"):
        assert "whole (reference variable: not partitioned)" in log
    # Both trainers increment the global step: 8 increments in 6 steps.
    assert int(expected["global_step"]) == 8
    for i in range(3):
        assert f"worker {i} done at global step 8" in log
        assert_same_parameters(expected, load_worker(out, i),
                               what=f"two_trainers {run_option} worker {i}")


def test_a_loss_scaled_program_matches_single_device(tmp_path, single_device):
    expected = single_device("loss_scaled", "float32")
    assert 0 < int(expected["global_step"]) < STEPS   # steps applied and skipped
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--program", "loss_scaled", "--dtype",
                      "float32", "--steps", str(STEPS), "--batch", str(BATCH), "--out", str(out),
                      "--spec", str(spec), "--run-option", "hybrid", "--uneven-step"])
    # a loss summed over the batch: workers' sums add up whatever their sizes
    assert "examples where its first had" not in log
    # the embedding's sparse update would go to a server but for its condition
    assert "emb: kept off the servers: its update" in log and "runs only when" in log
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"loss_scaled worker {i}")


def test_a_gan_with_batch_norm_over_every_worker_matches_single_device(tmp_path, single_device):
    """tests/programs/gan.py with Config(batch_norm_group="all"): the
    discriminator's second call's batch-norm layers are differentiated by
    both train ops' backward passes, which run on alternate steps (before:
    refused, "differentiated more than once")."""
    expected = single_device("gan", "float64")
    assert int(expected["global_step"]) == 4   # the discriminator's steps
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--program", "gan", "--dtype", "float64",
                      "--steps", str(STEPS), "--batch", str(BATCH), "--out", str(out),
                      "--spec", str(spec), "--run-option", "ps"])
    assert "batch norm discriminator_1/bn1 (fused): statistics over all 3 workers" in log
    assert "batch norm discriminator_1/bn2 (moments): statistics over all 3 workers" in log
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"gan worker {i}")
