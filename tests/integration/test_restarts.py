"""Config(max_restarts=...): a job whose worker or server dies starts again
by itself (every process anew, on fresh ports), the chief restores the last
checkpoint, and the finished job equals an uninterrupted one: a worker
killed with SIGKILL at global step 7 of 20, checkpoints every 5 steps, then
a parameter server killed while the chief waits at step 7. A SIGTERM
between two starts stops the job: nothing starts again."""
from __future__ import annotations

import os
import re
import signal

from tests.integration.cluster import (LineReader, assert_same_parameters, latest_attempt,
                                       load_worker, run_single_device, run_training, start_job,
                                       train_command, write_spec)

MODEL, STEPS = "mlp_adam_clip_ema", 20


def _uninterrupted(tmp_path):
    # Two workers equal one device (the correctness contract): so must the
    # restarted job.
    run_single_device(MODEL, tmp_path / "one", "--steps", str(STEPS), "--batch", "12")
    return load_worker(tmp_path / "one", 0)


def _check(log: str, out, expected) -> None:
    """Restarted after global step 7 from the last checkpoint: the one saved
    every 5 steps, or the chief's own at step 7 when the failed job was
    stopped (it saves where it is, if it still can: not with its server
    gone)."""
    assert re.search(r"restart 1 of 1 after global step 7: every process starts again", log), \
        log[-3000:]
    restored = re.search(r"restored .*model\.ckpt-(\d+) \(global step \1\)", log)
    assert restored and int(restored.group(1)) in (5, 7), log[-3000:]
    step = int(restored.group(1))
    assert (f"restart 1 of 1: resumed at global step {step}, recomputing {7 - step} steps"
            in log), log[-3000:]
    for i in range(2):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"restarted worker {i}")


def test_a_killed_worker_is_restarted_from_the_last_checkpoint(tmp_path):
    out = tmp_path / "job"
    log = run_training(MODEL, out, "--steps", str(STEPS), "--batch", "12",
                       "--spec", str(write_spec(tmp_path, workers=2)),
                       "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "5",
                       "--kill-at", "7", "--max-restarts", "1")
    assert "worker 1 killing itself at step 7" in log
    assert re.search(r"job failed: worker 1 \(pid \d+\) failed .*killed by SIGKILL", log), \
        log[-3000:]
    _check(log, out, _uninterrupted(tmp_path))


def test_a_killed_server_is_restarted_from_the_last_checkpoint(tmp_path):
    out = tmp_path / "job"
    # Every variable on the server; the chief waits at step 7 (once) while
    # the test kills the server.
    proc = start_job(train_command(MODEL, out, "--steps", str(STEPS), "--batch", "12",
                                   "--run-option", "ps",
                                   "--spec", str(write_spec(tmp_path, workers=2, servers=1)),
                                   "--checkpoint-dir", str(tmp_path / "ckpt"),
                                   "--save-every", "5", "--pause-at", "7", "--max-restarts", "1"))
    with LineReader(proc) as reader:
        reader.wait_for(r"worker 0 pausing at step 7", 180)
        server = int(re.search(r"started server 0 at \S+, pid (\d+)",
                               latest_attempt(reader.text)).group(1))
        os.kill(server, signal.SIGKILL)
        log = reader.rest(timeout=240)
    assert proc.returncode == 0, log[-3000:]
    assert re.search(r"job failed: server 0 \(pid \d+\) failed", log), log[-3000:]
    _check(reader.text, out, _uninterrupted(tmp_path))


def test_sigterm_between_two_starts_stops_the_job(tmp_path):
    # Worker 1 fails at global step 2 at every start, a fault no restart gets
    # past. A SIGTERM as the launcher says the job failed, before it starts
    # the job again, was lost: the handlers it reached belonged to the start
    # that had ended, and five more starts ran (exit 1, "no restart left").
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--steps", "20",
                                   "--raise-at", "2", "--max-restarts", "5",
                                   "--spec", str(write_spec(tmp_path, workers=2))))
    with LineReader(proc) as reader:
        reader.wait_for(r"job failed: worker 1 \(pid \d+\) failed", 240)
        os.kill(proc.pid, signal.SIGTERM)
        reader.rest(timeout=120)
    log = reader.text
    assert proc.returncode == 143, log[-3000:]
    assert "restart 2 of 5" not in log and "no restart left" not in log, log[-3000:]
    # At most the start under way when the signal came: none after it.
    assert log.count("started worker 0 at") <= 2, log[-3000:]
    assert "received SIGTERM" in log, log[-3000:]
