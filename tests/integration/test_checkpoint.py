"""Chief-only checkpointing: a job killed after 6 steps and restarted ends,
after 10 steps in all, exactly where an uninterrupted 10-step run ends."""
import os
import re
import signal

from tests.integration.cluster import (LineReader, assert_same_parameters, load_worker,
                                       run_single_device, run_training, start_job, train_command,
                                       write_spec)


def test_restart_resumes_from_checkpoint(tmp_path):
    spec = str(write_spec(tmp_path, workers=2))
    ckpt = tmp_path / "ckpt"
    common = ["--batch", "12", "--spec", spec]

    # The uninterrupted run is one device's: 2 workers equal it (the
    # correctness contract), so the resumed job must too.
    uninterrupted = tmp_path / "full"
    run_single_device("mlp_adam_clip_ema", uninterrupted, "--steps", "10", "--batch", "12")

    # First attempt: worker 1 hangs at global step 6, after the chief saved
    # step 6; then it is killed and the launcher tears the job down.
    first = start_job(train_command("mlp_adam_clip_ema", tmp_path / "first", "--steps", "10",
                                    "--stall-at", "6", "--checkpoint-dir", str(ckpt),
                                    "--save-every", "3", *common))
    with LineReader(first) as reader:
        reader.wait_for([r"saved checkpoint .*model\.ckpt-6", r"worker 1 stalling at step 6"], 180)
        pid = int(re.search(r"worker 1 pid (\d+)", reader.text).group(1))
        os.kill(pid, signal.SIGKILL)
        reader.rest(timeout=30)
    assert first.returncode != 0
    assert not (tmp_path / "first").exists()   # it never finished

    resumed = tmp_path / "resumed"
    log = run_training("mlp_adam_clip_ema", resumed, "--steps", "10", "--checkpoint-dir",
                       str(ckpt), *common)
    assert re.search(r"restored .*model\.ckpt-6 \(global step 6\)", log), log[-3000:]
    expected = load_worker(uninterrupted, 0)
    for i in range(2):
        actual = load_worker(resumed, i)
        assert int(actual["global_step"]) == 10
        assert_same_parameters(expected, actual, what=f"resumed worker {i}")
    assert (ckpt / "model.ckpt-10.index").exists()   # final save on close


def test_single_device_checkpoint_restores_into_distributed_job(tmp_path):
    """A checkpoint written by a single-device run loads into a 2-worker job
    (same variable names), and training continues to the same result."""
    ckpt = tmp_path / "ckpt"
    run_single_device("mlp_sgd", tmp_path / "a", "--steps", "4", "--checkpoint-dir", str(ckpt))
    log = run_training("mlp_sgd", tmp_path / "b", "--steps", "7", "--checkpoint-dir", str(ckpt),
                       "--spec", str(write_spec(tmp_path, workers=2)))
    assert "global step 4)" in log
    run_single_device("mlp_sgd", tmp_path / "c", "--steps", "7")
    assert_same_parameters(load_worker(tmp_path / "c", 0), load_worker(tmp_path / "b", 1),
                           what="single-device checkpoint continued on 2 workers")
