"""The scripts in examples/ run as documented: single-device (no --spec) they
train and print their result line. Each runs as a user would run it, in its
own interpreter from the repository root."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.integration.cluster import python_as, run_script

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
# The V1-behaviour lane (`make test-matrix`): the TF1 examples run as
# TF1-era scripts do, tf.compat.v1.disable_v2_behavior() first, through a
# runpy wrapper (the launcher re-runs the wrapper in every process).
BEHAVIORS = ["v2", "v1"] if os.environ.get("AUTOPAR_TEST_MATRIX") == "full" else ["v2"]


def _run_example(script: str, *args: str, behavior: str = "v2") -> str:
    """examples/<script> run from the repository root as a user runs it
    (forked: cluster.run_script); its output, stdout and stderr."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return run_script([*python_as(behavior), f"examples/{script}", *args], env=env,
                      timeout=TIMEOUT_S, cwd=REPO_ROOT)


def test_digits_mlp_learns_single_device():
    # 150 steps of batch 32 reach about 0.94 on the held-out 20%; 0.85 leaves room.
    out = _run_example("digits_mlp.py", "--steps", "150")
    match = re.search(r"test accuracy: ([0-9.]+)", out)
    assert match, f"no accuracy line in output:\n{out}"
    assert float(match.group(1)) > 0.85, out


if "v1" in BEHAVIORS:
    def test_digits_mlp_learns_on_uneven_hosts_as_a_v1_behaviour_script(tmp_path):
        """examples/digits_mlp.py after disable_v2_behavior() (its variables
        reference variables) on 3 workers over 2 hosts with servers: it
        trains and reaches the accuracy it reaches on one device."""
        from tests.integration.cluster import write_two_host_spec
        spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
        out = _run_example("digits_mlp.py", "--steps", "150", "--spec", str(spec), behavior="v1")
        accuracies = re.findall(r"test accuracy: ([0-9.]+)", out)
        assert accuracies and all(float(a) > 0.85 for a in accuracies), out[-3000:]


def test_cnn_reports_throughput_single_device():
    out = _run_example("cnn.py", "--steps", "4", "--batch-size", "8")
    match = re.search(r"([0-9.]+) images/s", out)
    assert match, f"no images/s line in output:\n{out}"
    assert float(match.group(1)) > 0, out


def test_tf2_custom_loop_logs_its_metrics_over_every_worker():
    """examples/tf2_custom_loop.py on 2 workers: the step updates Keras
    metrics (TensorFlow's quickstart loop), the loop resets and reads them
    from Python each epoch, combined over the workers: the chief's epoch
    lines say what training does (before: every result read 0, the
    metrics' Python variables never changed), and it learns."""
    out = _run_example("tf2_custom_loop.py", "--spec", "resource_specs/localhost_2workers.yaml",
                       "--examples", "4096", "--epochs", "3")
    epochs = [(float(loss), float(accuracy)) for loss, accuracy in
              re.findall(r"\[worker 0\] epoch \d: loss ([0-9.]+), accuracy ([0-9.]+)", out)]
    assert len(epochs) == 3 and "[worker 1] epoch" not in out, out
    assert all(loss > 0 for loss, _ in epochs) and epochs[2][0] < epochs[0][0], out
    assert 0 < epochs[0][1] < epochs[2][1] and epochs[2][1] > 0.5, out
    tests = re.findall(r"worker (\d): test accuracy ([0-9.]+)", out)
    assert sorted(w for w, _ in tests) == ["0", "1"] and all(float(a) > 0.5 for _, a in tests), out
    # The traced step's batch size is not in its graph: the embedding's bytes
    # are an estimate, measured beside it with its error, not a "bound".
    assert re.search(r"allgather \(sparse\): sent [0-9.]+ KB, received [0-9.]+ KB; the plan's "
                     r"\(an estimate, measured [0-9.]+x it\)", out), out


LM1B_SMALL = ("--vocab_size", "50", "--emb_size", "8", "--state_size", "16", "--projected_size",
              "8", "--num_steps", "3", "--keep_prob", "0.9", "--num_sampled", "0",
              "--num_variable_shards", "2", "--max_steps", "4", "--log_frequency", "1")


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_parallax_lm1b_port_equals_one_device_with_the_global_batch(behavior, tmp_path):
    """examples/lm1b, Parallax's own LM example ported with its semantics
    (Config(loss_reduction="parallax"): sparse gradients summed over
    workers, dense ones averaged; the model scales its embedding gradient by
    the per-worker batch size). Model and optimizer are built inside
    variable_scope("model") over a user-partitioned embedding. On 3 workers
    of batch 2 (2 hosts, a server each, hybrid) every variable, Adagrad slot
    and moving average equals one device running the program with batch 6:
    the sum of 3 workers' embedding gradients scaled by 2 is one device's
    scaled by 6. The model's dropout is on: each worker takes rows i, i+3,
    ... of the global batch and draws one device's masks for them
    (transforms.random_draws; the placeholders' static batch makes the masks'
    shape a constant). The full softmax: a sampled softmax's gradient is
    sparse, summed over workers under Parallax's semantics, and the model
    scales only the embedding's. Behaviour "v1": both runs after
    disable_v2_behavior(), through a runpy wrapper."""
    import numpy as np

    from tests.integration.cluster import (assert_same_parameters, reference_of, run_script,
                                           write_two_host_spec)
    script = str(REPO_ROOT / "examples" / "lm1b" / "lm1b_distributed_driver.py")
    _run_example("lm1b/lm1b_distributed_driver.py", *LM1B_SMALL, "--batch_size", "6",
                 "--save_npz", str(tmp_path / "single.npz"), behavior=reference_of(behavior))
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([*python_as(behavior), script, *LM1B_SMALL, "--batch_size", "2",
                      "--resource_info_file", str(spec), "--run_option", "hybrid",
                      "--save_npz", str(tmp_path / "worker{worker}.npz")])
    assert "dense averaged and sparse summed over workers" in log
    # the user's embedding partitions live on the servers (their scoped slots with them)
    assert re.search(r"model/lm/emb/part_0 +sparse .* ps ", log), log[-3000:]
    with np.load(tmp_path / "single.npz") as data:
        expected = {k: data[k] for k in data.files}
    assert "model/model/lm/emb/part_0/Adagrad" in expected
    for i in range(3):
        with np.load(tmp_path / f"worker{i}.npz") as data:
            assert_same_parameters(expected, {k: data[k] for k in data.files},
                                   what=f"lm1b worker {i}")
