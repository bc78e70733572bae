"""ResNet-20 of tf_cnn_benchmarks (ported under tests/programs/tf_cnn_benchmarks,
driven by scripts/cnn_benchmarks_resnet.py: Nesterov momentum, L2 weight
decay, 19 training-mode batch-norm layers, moving statistics, global step)
with Config's defaults (batch_norm_group "auto") on 3 workers equals one device on the
global batch, in float64 (where every layer is of the tf.nn.moments form:
TensorFlow has no float64 FusedBatchNorm kernel, so the port builds what
tf.layers builds for such a dtype).

In float64 the comparison is exact up to float64 summation order: every
element of every variable, momentum slot and moving statistic within a
relative 1e-9 (absolute 1e-12 near 0; the measured difference is ~1e-14; 10 steps of 32x32 images, batch 48, stay at
~1e-10, the difference two single-device runs with the batch's rows in
another order have). Float32 cannot be held to a tight tolerance: a rounding
difference that moves a normalised activation across 0 flips a ReLU, and
training amplifies it (issue 27, item 7). Per-worker statistics
(batch_norm_group=None) miss by orders of magnitude, and so would a float32
stage in a float64 gradient (3e-8: tf.losses' float32 cast, which the port avoids
in float64).

8x8 images (the three stages run at 8x8, 4x4 and 2x2) and a batch of 6
(2 rows a worker) keep both runs to a few seconds each.
"""
import os

import numpy as np
import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, legacy_keras_env,
                                       load_worker, python_as, reference_of, run_fresh_beside,
                                       write_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "cnn_benchmarks_resnet.py"
STEPS = 3
ARGS = ["--dtype", "float64", "--image-size", "8", "--batch", "6", "--steps", str(STEPS)]
LAYERS = 19   # batch-norm layers of ResNet-20


# As a TF1-era script runs, after tf.compat.v1.disable_v2_behavior()
# (reference variables, V1 control flow); AUTOPAR_TEST_MATRIX=full (`make
# test-matrix`): with the variables on servers too (herring keeps float64
# gradients on the ring: allreduce's case), and in TensorFlow 2's behaviour.
CASES = ([(o, b) for o in ("allreduce", "ps") for b in ("v2", "v1")]
         if os.environ.get("AUTOPAR_TEST_MATRIX") == "full" else [("allreduce", "v1")])


@pytest.mark.parametrize("run_option,behavior", CASES, ids=[f"{o}-{b}" for o, b in CASES])
def test_resnet20_through_tf_compat_v1_layers_legacy_keras(run_option, behavior, tmp_path):
    """The model built the way tf_cnn_benchmarks builds it by default,
    with tf.compat.v1.layers (conv2d, batch_normalization, dense), which
    under TensorFlow 2.21 need legacy Keras: the tf-keras package (installed
    by `make` next to the virtualenv, .venv/legacy-keras, without its
    dependency on the full tensorflow package) and TF_USE_LEGACY_KERAS=1.
    Fresh interpreters (not the tests' fork server, which imported
    TensorFlow without tf-keras on its path) on 3 workers, batch-norm
    statistics over all of them by default, equal one device. Behaviour "v1": both
    runs through a wrapper that disables V2 behaviour first and runs the
    script with runpy (the launcher re-runs the wrapper)."""
    def command(out, *extra, behavior=behavior):
        return [*python_as(behavior), str(SCRIPT), *ARGS, "--use-tf-layers", "--out", str(out),
                *extra]
    _, log = run_fresh_beside(
        command(tmp_path / "single", behavior=reference_of(behavior)),
        command(tmp_path / "dist", "--spec", str(write_spec(
            tmp_path, 3, servers=2 if run_option == "ps" else 0)), "--run-option", run_option),
        legacy_keras_env())
    expected = load_worker(tmp_path / "single", 0)
    assert log.count("(moments): statistics over all 3 workers") == LAYERS, log[-3000:]
    assert int(expected["global_step"]) == STEPS
    # weights, batch-norm scales and offsets, the affine layer, a momentum
    # slot for each, moving means and variances, the global step
    assert len(expected) == 1 + 2 * (LAYERS + 2 * LAYERS + 2) + 2 * LAYERS
    assert not np.allclose(expected["cg/conv18/batchnorm18/moving_variance"], 1.0)
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i), rtol=1e-9,
                               atol=1e-12, what=f"tf.layers worker {i}")
