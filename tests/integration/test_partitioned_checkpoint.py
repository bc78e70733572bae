"""A checkpoint of a job whose embedding and softmax weights are split into
row partitions over two servers is an ordinary TensorFlow checkpoint of the
single-device graph, and the other way round: a plain script's
tf.compat.v1.train.Saver reads and writes it. In ps the dense LSTM and
softmax kernels are split too, into ranges of rows where the embedding's
rows are dealt (transforms.partition.RowLayout)."""
import re
import sys

import numpy as np
import pytest

from tests.integration.cluster import (REPO, load_worker, run_script, run_training,
                                       write_two_host_spec)

MODEL = "lm_adam_clip"
DISTS = {"hybrid": ["--run-option", "hybrid", "--partitions", "embedding=3,softmax/kernel=2"],
         "ps": ["--run-option", "ps", "--partitions", "embedding=3,softmax/kernel=2,lstm/kernel=2"]}
SCRIPT = REPO / "tests" / "integration" / "saver_compat.py"


def _saver(mode, ckpt, out):
    run_script([sys.executable, str(SCRIPT), mode, str(ckpt), str(out)], timeout=120)
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("run_option", sorted(DISTS))
def test_distributed_checkpoint_restores_into_single_device_graph(run_option, tmp_path):
    ckpt = tmp_path / "ckpt"
    log = run_training(MODEL, tmp_path / "out", "--steps", "4", "--batch", "12", "--save-every", "2",
                       "--checkpoint-dir", str(ckpt), "--spec", str(write_two_host_spec(tmp_path)),
                       *DISTS[run_option])
    assert "3 partitions" in log
    trained = load_worker(tmp_path / "out", 0)
    restored = _saver("restore", ckpt, tmp_path / "restored.npz")
    loss = restored.pop("__loss__")
    assert set(restored) == set(trained)
    for name, value in trained.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    # Same predictions: the loss on a fixed batch, single-device from the
    # checkpoint vs the distributed job's chief.
    job_loss = float(re.search(r"eval loss: (\S+)", log).group(1))
    np.testing.assert_allclose(float(loss), job_loss, rtol=1e-6)


@pytest.mark.parametrize("run_option", sorted(DISTS))
def test_single_device_checkpoint_restores_into_partitioned_job(run_option, tmp_path):
    ckpt = tmp_path / "ckpt"
    expected = _saver("save", ckpt, tmp_path / "single.npz")
    expected.pop("__loss__")
    # Restored by the chief, no step left to run: the workers dump what they hold.
    log = run_training(MODEL, tmp_path / "out", "--steps", "3", "--batch", "12",
                       "--checkpoint-dir", str(ckpt), "--spec", str(write_two_host_spec(tmp_path)),
                       *DISTS[run_option])
    assert "(global step 3)" in log
    for i in range(3):
        actual = load_worker(tmp_path / "out", i)
        for name, value in expected.items():
            np.testing.assert_array_equal(actual[name], value, err_msg=f"worker {i} {name}")
