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

masked_sums: losses summed over what tf.boolean_mask keeps of the batch.

ctc_sequences: TensorFlow 1's and 2's CTC losses of sparse labels.

rnn_lengths: tf.compat.v1.nn.dynamic_rnn over sequences of each example's own
length (sequence_length), the loop run to the global batch's longest.

bn_classifier: batch norm under tf.compat.v1.cond(is_training, ...), its
moving statistics in UPDATE_OPS, Config at its defaults; tf_layers_bn: the
same with tf.compat.v1.layers.batch_normalization(training=is_training).

loss_scaled: tf.compat.v1's MixedPrecisionLossScaleOptimizer in control
flow v2, whose functional conds every process lowers into its graph; some
steps skipped for gradients that overflow float32, a summed loss.

Each program also runs as TF1-era scripts run it, after
tf.compat.v1.disable_v2_behavior() (reference variables, V1 control flow,
V1 tensor shapes): some run options under it in `make test`, every one in
`make test-matrix` (AUTOPAR_TEST_MATRIX=full)."""
import importlib.util
import os
import re
import sys

import numpy as np
import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, legacy_keras_env,
                                       load_worker, run_fresh_beside,
                                       run_in_process, run_script, run_to_end,
                                       write_two_host_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "user_program.py"
STEPS, BATCH = 6, 6
# float64 where Adam divides by sqrt(v) (tests.models.model_dtype); herring
# sums float32 only, so its case runs the float32 build (Momentum).
CASES = [("hybrid", "float64", "v2"), ("ps", "float64", "v1"), ("allreduce", "float64", "v2"),
         ("herring", "float32", "v1")]
# The finite tf.data program's run options and behaviours.
DATASET_CASES = [("hybrid", "v1"), ("ps", "v2"), ("allreduce", "v1")]
FULL = os.environ.get("AUTOPAR_TEST_MATRIX") == "full"
if FULL:
    CASES = [(option, dtype, b) for option, dtype, _ in CASES for b in ("v2", "v1")]
    DATASET_CASES = [(option, b) for option, _ in DATASET_CASES for b in ("v2", "v1")]
# The behaviours of the programs run in one run option.
BEHAVIORS = ["v2", "v1"] if FULL else ["v2"]


def _behavior(behavior: str) -> list[str]:
    """The script's arguments for a behaviour: "v1", a program that calls
    tf.compat.v1.disable_v2_behavior() first."""
    return ["--v1-behavior"] if behavior == "v1" else []


def _reference_behavior(behavior: str) -> list[str]:
    """The one-device reference's arguments: a "v1" program with resource
    variables, whose reads no update overtakes (scripts/v1_behavior.py)."""
    return [*_behavior(behavior), "--resource-variables"] if behavior == "v1" else []


def _script_main():
    spec = importlib.util.spec_from_file_location("user_program", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    cache = {}

    def get(program: str, dtype: str, uneven: bool = False, behavior: str = "v2"):
        key = (program, dtype, uneven, behavior)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"single_{program}_{dtype}_{behavior}")
            argv = ["--program", program, "--dtype", dtype, *_steps(uneven),
                    "--batch", str(BATCH), "--out", str(out)]
            if behavior == "v1":
                # V1 behaviour is for the whole process: a process of its own
                run_script([sys.executable, str(SCRIPT), *argv, *_reference_behavior(behavior)])
            else:
                run_in_process(_script_main(), argv)
            cache[key] = load_worker(out, 0)
        return cache[key]
    return get


def _steps(uneven: bool) -> list[str]:
    """STEPS steps; `uneven`: the last of a global batch of BATCH + 1, which
    3 workers split 3/2/2."""
    return ["--steps", str(STEPS - 1), "--uneven-step"] if uneven else ["--steps", str(STEPS)]


def _train_uneven(program: str, dtype: str, run_option: str, behavior: str, tmp_path):
    """`program` run by 3 workers over 2 hosts, a server each, its last
    step's global batch split 3/2/2: (the job's log, the workers' output)."""
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--program", program, "--dtype", dtype,
                      *_steps(True), "--batch", str(BATCH), "--out", str(out), "--spec",
                      str(spec), "--run-option", run_option, *_behavior(behavior)])
    return log, out


@pytest.mark.parametrize("run_option,dtype,behavior", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_two_trainers_match_single_device(run_option, dtype, behavior, tmp_path, single_device):
    """The last step, both train ops together, has 7 examples split 3/2/2:
    mean losses over batches whose size the graph leaves unknown, so each
    worker weighs its gradients by its share of the step's examples
    (transforms.batch_weights) and the step is one device's."""
    expected = single_device("two_trainers", dtype, uneven=True, behavior=behavior)
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT),
                      "--program", "two_trainers", "--dtype", dtype, *_steps(True),
                      "--batch", str(BATCH), "--out", str(out), "--spec", str(spec),
                      "--run-option", run_option, *_behavior(behavior)])
    assert "2 train ops update different variables" in log
    assert re.search(r"batch sizes: the loss averages '[^']+', '[^']+' over the batch", log), \
        log[-3000:]
    assert "examples where its first had" not in log
    if run_option in ("hybrid", "ps", "herring"):
        assert "whole (reference variable: not partitioned)" in log
    # Both trainers increment the global step: 8 increments in 6 steps.
    assert int(expected["global_step"]) == 8
    for i in range(3):
        assert f"worker {i} done at global step 8" in log
        assert_same_parameters(expected, load_worker(out, i),
                               what=f"two_trainers {run_option} worker {i}")


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_a_loss_scaled_program_matches_single_device(behavior, tmp_path, single_device):
    expected = single_device("loss_scaled", "float32", uneven=True, behavior=behavior)
    assert 0 < int(expected["global_step"]) < STEPS   # steps applied and skipped
    log, out = _train_uneven("loss_scaled", "float32", "hybrid", behavior, tmp_path)
    # a loss summed over the batch: workers' sums add up whatever their sizes
    assert "examples where its first had" not in log
    # the embedding's sparse update would go to a server but for its condition
    assert "emb: kept off the servers: its update" in log and "runs only when" in log
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"loss_scaled worker {i}")


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_a_gan_with_batch_norm_over_every_worker_matches_single_device(behavior, tmp_path,
                                                                       single_device):
    """tests/programs/gan.py with Config(batch_norm_group="all"): the
    discriminator's second call's batch-norm layers are differentiated by
    both train ops' backward passes, which run on alternate steps (before:
    refused, "differentiated more than once")."""
    expected = single_device("gan", "float64", behavior=behavior)
    assert int(expected["global_step"]) == 4   # the discriminator's steps
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--program", "gan", "--dtype", "float64",
                      "--steps", str(STEPS), "--batch", str(BATCH), "--out", str(out),
                      "--spec", str(spec), "--run-option", "ps", *_behavior(behavior)])
    assert "batch norm discriminator_1/bn1 (fused): statistics over all 3 workers" in log
    assert "batch norm discriminator_1/bn2 (moments): statistics over all 3 workers" in log
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"gan worker {i}")


def test_a_tf1_batch_norm_under_is_training_matches_single_device(tmp_path, single_device):
    """tests/programs/bn_classifier.py after disable_v2_behavior(), Config
    at its defaults, in hybrid: its two batch-norm layers (fused and
    moments), each under tf.compat.v1.cond(is_training, ...) with its moving
    statistics in UPDATE_OPS, take one device's statistics of the global
    batch in training steps (before: each worker's own, by default), while
    every worker's evaluation of its own rows between steps (no step: the
    flag False) runs alone; the last step's 7 examples split 3/2/2."""
    expected = single_device("bn_classifier", "float64", uneven=True, behavior="v1")
    log, out = _train_uneven("bn_classifier", "float64", "hybrid", "v1", tmp_path)
    for layer, kind in (("bn1", "fused"), ("bn2", "moments")):
        assert f"batch norm model/{layer} ({kind}): statistics over all 3 workers" in log, \
            log[-3000:]
        # its moving statistics updated in the cond's branch (before: "written by no
        # training step", their writes taking the variable through the cond's Switch)
        assert (f"state model/{layer}/moving_mean (local): batch-norm moving statistic from "
                "the statistics of all workers") in log
    assert not np.allclose(expected["model/bn2/moving_variance"], 1.0)
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"bn_classifier worker {i}")


@pytest.mark.parametrize("behavior", ["v1", "v2"])
def test_tf_compat_v1_layers_batch_norm_with_a_training_tensor_matches_single_device(
        behavior, tmp_path):
    """tests/programs/tf_layers_bn.py (legacy Keras, fresh interpreters)
    after disable_v2_behavior() ("v1") and in TensorFlow 2's control flow
    ("v2"), Config at its defaults, in hybrid: each
    tf.compat.v1.layers.batch_normalization(training=is_training) takes its
    moments outside a cond and picks them or the moving statistics through
    it (Switch and Merge; an If), which is found as the layer's (before:
    refused, "a Mean over the batch's examples, fed back into each
    example"), its moving statistics' updates under another cond as the
    layer's (before, in V1 control flow: reported "written by no training
    step"); the last step's 7 examples split 3/2/2."""
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    command = [sys.executable, str(SCRIPT), "--program", "tf_layers_bn", *_steps(True),
               "--batch", str(BATCH)]
    _, log = run_fresh_beside(
        [*command, *_reference_behavior(behavior), "--out", str(tmp_path / "single")],
        [*command, *_behavior(behavior), "--out", str(tmp_path / "dist"), "--spec", str(spec)],
        legacy_keras_env())
    expected = load_worker(tmp_path / "single", 0)
    for layer in ("batch_normalization", "batch_normalization_1"):
        assert f"batch norm {layer} (moments): statistics over all 3 workers" in log, log[-3000:]
        assert (f"state {layer}/moving_variance (local): batch-norm moving statistic from the "
                "statistics of all workers") in log
    assert not np.allclose(expected["batch_normalization_1/moving_variance"], 1.0)
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i),
                               what=f"tf_layers_bn worker {i}")


def test_a_batch_norm_in_a_functional_cond_is_refused_naming_it(tmp_path):
    """The same program in control flow v2 (TensorFlow 2's default, no
    disable_v2_behavior()): its cond is an If whose branch function takes
    the batch's statistics, which the analysis cannot take over the
    workers; refused at start, naming the op, with no traceback."""
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    code, log = run_to_end([sys.executable, str(SCRIPT), "--program", "bn_classifier",
                            "--steps", "1", "--batch", str(BATCH), "--out",
                            str(tmp_path / "dist"), "--spec", str(spec)])
    assert code == 2, log[-3000:]
    assert "autopar: the loss mixes the examples of a batch at 'FusedBatchNormV3' (an op " \
           "of a function the step runs" in log, log[-3000:]
    assert "Traceback" not in log


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_sums_of_what_a_mask_keeps_match_single_device(behavior, tmp_path, single_device):
    """tests/programs/masked_sums.py: a tagger's loss summed over the
    positions tf.boolean_mask keeps, and a penalty on the embedding rows of
    the ids a mask keeps, in hybrid (the embedding on the servers, its rows
    those of each worker's kept ids); the last step's 7 sequences split
    3/2/2 (before: refused, "a GatherV2 combining the values of several
    examples"; then, for its penalty on logits[..., 0], "a Mul combining
    the values of several examples": a slice with an ellipsis was read as
    no example's rows)."""
    expected = single_device("masked_sums", "float64", uneven=True, behavior=behavior)
    log, out = _train_uneven("masked_sums", "float64", "hybrid", behavior, tmp_path)
    # the embedding's kept rows travel to and from the servers
    assert "ps (sparse): sent" in log and "emb: a = " in log, log[-3000:]
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"masked_sums worker {i}")


@pytest.mark.parametrize("behavior", BEHAVIORS)
def test_a_ctc_loss_matches_single_device(behavior, tmp_path, single_device):
    """tests/programs/ctc_sequences.py: TensorFlow 1's and 2's CTC losses of
    sparse labels, each sequence's own count of frames, in ps; the last
    step's 7 sequences split 3/2/2 (before: refused, "a CTCLoss op, for
    which autopar has no rule", and TensorFlow 2's shift of the labels'
    values taken for a mixing of examples)."""
    expected = single_device("ctc_sequences", "float32", uneven=True, behavior=behavior)
    log, out = _train_uneven("ctc_sequences", "float32", "ps", behavior, tmp_path)
    assert "each worker weighs its gradients by N * b / B" in log, log[-3000:]
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"ctc_sequences worker {i}")


def test_a_recurrence_over_each_examples_length_matches_single_device(tmp_path, single_device):
    """tests/programs/rnn_lengths.py: dynamic_rnn runs its loop to the
    batch's longest sequence, which each training step takes of the global
    batch (one all-gather over the workers' processes), in hybrid (the
    embedding's rows all-gathered); the last step's 7 sequences split 3/2/2
    (before: refused as mixing the batch's examples in the cell). As a
    TF1-era script runs it, after disable_v2_behavior(): a V1 loop keeping
    its steps in TensorArrayV3s (before: refused, naming
    TensorArrayScatterV3)."""
    expected = single_device("rnn_lengths", "float64", uneven=True)
    log, out = _train_uneven("rnn_lengths", "float64", "hybrid", "v1", tmp_path)
    assert "statistics of the batch's values ('rnn/Max:0'" in log, log[-3000:]
    for i in range(3):
        assert_same_parameters(expected, load_worker(out, i), what=f"rnn_lengths worker {i}")


@pytest.mark.parametrize("run_option,behavior", DATASET_CASES,
                         ids=[f"{o}-{b}" for o, b in DATASET_CASES])
def test_every_batch_of_a_finite_dataset_matches_single_device(run_option, behavior, tmp_path):
    """A TF1 program trained on a tf.data pipeline (autopar.shard, then
    .batch(2)) until its iterator ends, 2 epochs of 23 examples: each
    epoch's last step has 5 examples, which the 3 workers read as 2/2/1.
    The loss is a mean over each worker's batch, whose size the graph leaves
    unknown: each worker weighs its gradients by its share of the step's
    examples, and every step, the last of each epoch too, is one device's
    with batch 6 (Adam, float64; the embedding's rows on a server in hybrid
    and ps, a replica on each worker in allreduce). The run that finds the
    iterator at its end changes
    nothing: tf.compat.v1's Adam decays a sparse gradient's m from no
    gradient, which every update op now waits for (on one device that
    decay runs in such a run or not, by chance: the reference runs the 8
    steps alone)."""
    script = str(REPO / "tests" / "integration" / "scripts" / "tfdata_epochs.py")
    run_script([sys.executable, script, "--out", str(tmp_path / "single"), "--batch", "6",
                "--steps", "8", *_reference_behavior(behavior)])
    expected = load_worker(tmp_path / "single", 0)
    assert int(expected["global_step"]) == 8   # 4 steps an epoch, the last of 5
    spec = write_two_host_spec(tmp_path, workers=(2, 1),
                               servers=(0, 0) if run_option == "allreduce" else (1, 1))
    log = run_script([sys.executable, script, "--out", str(tmp_path / "dist"), "--batch", "2",
                      "--spec", str(spec), "--run-option", run_option, *_behavior(behavior)])
    assert "each worker weighs its gradients by N * b / B" in log
    assert "examples where its first had" not in log
    for i in range(3):
        assert f"worker {i} done at global step 8" in log
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i),
                               what=f"{run_option} worker {i}")
