"""Ctrl-C loses no work, and a damaged checkpoint costs only the steps since
the previous one.

- Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it) at
  global step 22 with save_every_steps=100: the chief saves step 22, the
  launcher exits 130 naming the checkpoint, nothing is left running, and a
  restart ends where an uninterrupted run ends.
- SIGTERM to every process of the job at once (a cluster's stop) while the
  chief is inside global step 12 (ps and herring): every process stays up
  for that step, the chief saves step 13 and the job ends with 143 within
  the 30 s clusters give before SIGKILL.
- A second Ctrl-C while the chief cannot reach a step boundary stops the job
  at once.
- A launcher started with SIGINT ignored (nohup from a script) still stops
  its chief after the current step, with a checkpoint.
- Empty-index, truncated, bit-flipped and missing-.data checkpoints are
  reported by name, with the file that is empty or missing, and skipped; training resumes from the newest intact one; temporary files
  of killed saves are removed; only keep_checkpoints are kept.
"""
import logging
import os
import re
import signal
import time
from pathlib import Path

import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import AutoparError
from autopar.runtime.checkpoint import Checkpointer
from autopar.runtime.stopping import GRACE_S
from autopar.runtime.worker import single_device_runner
from tests import models

from tests.integration.cluster import (LineReader, assert_same_parameters, job_processes,
                                       load_worker, run_training, start_job, survivors,
                                       train_command, write_spec)

MODEL = "mlp_adam_clip_ema"   # float64: Adam, clipping and EMA slots all checkpointed


def _pids(text: str) -> set[int]:
    """Workers' pids (they print them) and servers' (the launcher logs them)."""
    return ({int(p) for p in re.findall(r"worker \d pid (\d+)", text)}
            | {int(p) for p in re.findall(r"started server \d.*pid (\d+)", text)})


def _checkpoint_steps(directory: Path) -> set[int]:
    return {int(m.group(1)) for f in os.listdir(directory)
            if (m := re.fullmatch(r"model\.ckpt-(\d+)\.index", f))}


def _no_temporaries(directory: Path) -> None:
    left = [f for f in os.listdir(directory) if "tempstate" in f or f.startswith(".autopar-saving")]
    assert not left, left


def _interrupt_when_paused(proc, step: int, interrupt, timeout: float) -> tuple[str, set[int]]:
    """Wait for worker 0 to pause at ``step``, call ``interrupt(proc.pid)``,
    then read the job's output to its end: (the output, the pids it named)."""
    with LineReader(proc) as reader:
        reader.wait_for([rf"\] step {step} ", rf"worker 0 pausing at step {step}"], 240)
        pids = _pids(reader.text)
        interrupt(proc.pid)
        reader.rest(timeout=timeout)
    return reader.text, pids


def _assert_stopped_with_checkpoint(proc, text: str, pids: set[int], processes: int,
                                    ckpt: Path, step: int) -> None:
    """The launcher exited 130 naming the chief's checkpoint of ``step``, the
    only one saved, and none of the job's ``processes`` is left."""
    assert proc.returncode == 130, text[-3000:]
    assert re.search(rf"job stopped on SIGINT: the chief stopped at global step {step}; "
                     rf"checkpoint \S*model\.ckpt-{step}", text), text[-3000:]
    assert len(pids) == processes and not survivors(pids), text[-3000:]
    assert _checkpoint_steps(ckpt) == {step}


def test_ctrl_c_saves_the_current_step_and_resumes(tmp_path):
    # Every variable on the server: the chief's final save reads it from there,
    # so the server must outlive the save.
    spec = str(write_spec(tmp_path, workers=2, servers=1))
    ckpt = tmp_path / "ckpt"
    proc = start_job(train_command(MODEL, tmp_path / "first", "--steps", "30", "--spec", spec,
                                   "--run-option", "ps", "--checkpoint-dir", str(ckpt),
                                   "--save-every", "100", "--pause-at", "22"))
    # what a Ctrl-C at the terminal does: SIGINT to the launcher's group
    text, pids = _interrupt_when_paused(proc, 22, lambda pid: os.killpg(pid, signal.SIGINT), 120)
    _assert_stopped_with_checkpoint(proc, text, pids, 3, ckpt, 22)
    _no_temporaries(ckpt)
    assert not (tmp_path / "first").exists()   # it never finished

    log = run_training(MODEL, tmp_path / "resumed", "--steps", "30", "--spec", spec,
                       "--run-option", "ps", "--checkpoint-dir", str(ckpt), "--save-every", "100")
    assert re.search(r"restored \S*model\.ckpt-22 \(global step 22\)", log), log[-3000:]
    expected = _train(None, 30)   # single-device, in this process
    for i in range(2):
        assert_same_parameters(expected, load_worker(tmp_path / "resumed", i),
                               what=f"resumed worker {i}")


@pytest.mark.parametrize("run_option, model", [("ps", MODEL), ("herring", MODEL + "_f32")])
def test_sigterm_to_every_process_saves_the_step_the_chief_is_in(tmp_path, run_option, model):
    """What Slurm (time limit, scancel), systemd and Kubernetes send: SIGTERM
    to every process of the job at once, SIGKILL 30 s later. The chief is
    inside global step 12's run, waiting for worker 1 (asleep in its script
    for 3 s); every process stays up for that step (in ps mode the server
    holds the variables, with herring the summation server sums the
    gradients), the chief saves step 13 and the job has ended with 143 within
    the 30 s (before: the fork server died of it and took the chief along,
    nothing was saved)."""
    spec = str(write_spec(tmp_path, workers=2, servers=1))
    ckpt = tmp_path / "ckpt"
    proc = start_job(train_command(model, tmp_path / "out", "--steps", "30", "--spec", spec,
                                   "--run-option", run_option, "--checkpoint-dir", str(ckpt),
                                   "--save-every", "100", "--stall-at", "12", "--stall-for", "3"))
    everyone: set[int] = set()
    with LineReader(proc) as reader:
        reader.wait_for(r"worker 1 stalling at step 12", 240)
        time.sleep(1.0)      # the chief enters step 12's run meanwhile, and waits there
        everyone.update(job_processes(proc.pid))
        for pid in sorted(everyone):
            os.kill(pid, signal.SIGTERM)
        reader.rest(timeout=GRACE_S)     # within the clusters' grace period before SIGKILL
    text = reader.text
    # launcher, namespace anchor, fork server, 2 workers, a server or summation server
    assert len(everyone) >= 6, everyone
    assert proc.returncode == 143, text[-3000:]
    assert re.search(r"job stopped on SIGTERM: the chief stopped at global step 13; "
                     r"checkpoint \S*model\.ckpt-13", text), text[-3000:]
    assert _checkpoint_steps(ckpt) == {13}
    assert not survivors(everyone), text[-3000:]
    # Every process left at a SIGTERM: none had to be killed.
    assert "did not stop within" not in text, text[-3000:]


def test_second_ctrl_c_stops_at_once(tmp_path):
    # The chief's own code hangs between steps 3 and 4, so it never reaches
    # the step boundary where it would stop.
    proc = start_job(train_command(MODEL, tmp_path / "out", "--steps", "30", "--stall-at", "3",
                                   "--stall-worker", "0",
                                   "--spec", str(write_spec(tmp_path, workers=2)),
                                   "--checkpoint-dir", str(tmp_path / "ckpt")))
    with LineReader(proc) as reader:
        reader.wait_for(r"worker 0 stalling at step 3", 240)
        pids = _pids(reader.text)
        os.killpg(proc.pid, signal.SIGINT)
        reader.wait_for(r"the chief stops after its current step", 30)
        os.killpg(proc.pid, signal.SIGINT)
        reader.rest(timeout=60)
    text = reader.text
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted again: stopping all processes now" in text, text[-3000:]
    assert len(pids) == 2 and not survivors(pids), text[-3000:]


def test_stop_reaches_a_chief_started_with_sigint_ignored(tmp_path):
    # `nohup autopar launch ... &` from a script starts the launcher with
    # SIGINT ignored, and fork and exec pass the ignore on: the chief must
    # still hear the launcher's stop and save before it ends.
    ignoring = tmp_path / "sigint_ignored.py"
    ignoring.write_text("import os, signal, sys\n"
                        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    ckpt = tmp_path / "ckpt"
    command = train_command(MODEL, tmp_path / "out", "--steps", "30", "--pause-at", "7",
                            "--spec", str(write_spec(tmp_path, workers=2)),
                            "--checkpoint-dir", str(ckpt), "--save-every", "100")
    proc = start_job([command[0], str(ignoring), *command[1:]])
    # the launcher only: `kill -INT <pid>`
    text, pids = _interrupt_when_paused(proc, 7, lambda pid: os.kill(pid, signal.SIGINT), 60)
    _assert_stopped_with_checkpoint(proc, text, pids, 2, ckpt, 7)


def _train(ckpt: Path | None, steps: int, caplog=None, keep: int = 4) -> dict:
    """Single-device training in this process (the checkpoint logic is the
    same Checkpointer the chief uses); every variable after ``steps``."""
    model = models.build(MODEL)
    config = autopar.Config(checkpoint_dir=str(ckpt) if ckpt else None, save_every_steps=1,
                            keep_checkpoints=keep, log_every_steps=0)
    logger = logging.getLogger("autopar.checkpoint")
    if caplog is not None:
        logger.addHandler(caplog.handler)
    try:
        with single_device_runner(model.graph, config) as runner:
            while (step := int(runner.run(model.global_step))) < steps:
                x, y = models.global_batch(MODEL, step, 12)
                runner.run(model.train_op, {model.x: x, model.y: y})
            with model.graph.as_default():
                return runner.run({v.op.name: v for v in tf.compat.v1.global_variables()})
    finally:
        if caplog is not None:
            logger.removeHandler(caplog.handler)


def test_damaged_checkpoints_are_named_and_skipped(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    _train(ckpt, 6, keep=5)
    assert _checkpoint_steps(ckpt) == {2, 3, 4, 5, 6}   # keep_checkpoints=5

    data = "model.ckpt-{}.data-00000-of-00001"
    # An empty index: TensorFlow's reader raises its base OpError ("file is
    # too short to be an sstable"), which failed the job instead.
    (ckpt / "model.ckpt-6.index").write_bytes(b"")
    flipped = bytearray((ckpt / data.format(5)).read_bytes())
    flipped[len(flipped) // 2] ^= 0x04
    (ckpt / data.format(5)).write_bytes(bytes(flipped))
    with open(ckpt / data.format(4), "r+b") as f:
        f.truncate(os.path.getsize(ckpt / data.format(4)) // 2)
    (ckpt / data.format(3)).unlink()
    # What a save killed half-way leaves behind.
    (ckpt / (data.format(7) + ".tempstate8812345")).write_bytes(b"\0" * 1000)
    (ckpt / ".autopar-saving-x1y2").mkdir()
    (ckpt / ".autopar-saving-x1y2" / "model.ckpt-7.index").write_bytes(b"\0")

    with caplog.at_level(logging.INFO, logger="autopar.checkpoint"):
        resumed = _train(ckpt, 7, caplog, keep=5)
    log = caplog.text
    for step, error in ((6, r"OpError: file is too short to be an sstable; "
                            r"model\.ckpt-6\.index is empty"),
                        (5, "DataLossError"), (4, "OutOfRangeError"),
                        (3, r"NotFoundError: .*; model\.ckpt-3\.data-\* is missing")):
        assert re.search(rf"checkpoint \S*model\.ckpt-{step} is corrupt or incomplete \({error}",
                         log), log
    assert re.search(r"deleted the damaged checkpoint\(s\) model\.ckpt-6, model\.ckpt-5, "
                     r"model\.ckpt-4, model\.ckpt-3; resuming from model\.ckpt-2 \(global "
                     r"step 2\)", log), log
    assert re.search(r"restored \S*model\.ckpt-2 \(global step 2\)", log), log
    _no_temporaries(ckpt)
    assert _checkpoint_steps(ckpt) == {3, 4, 5, 6, 7}   # saved again, intact, by the resumed run
    assert_same_parameters(_train(None, 7), resumed, what="resumed from step 2")


def test_checkpoint_of_another_model_is_refused_not_deleted(tmp_path):
    ckpt = tmp_path / "ckpt"
    _train(ckpt, 1)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("not_in_that_checkpoint", [3])
        checkpointer = Checkpointer(graph, str(ckpt), 1)
    with tf.compat.v1.Session(graph=graph) as session:
        with pytest.raises(AutoparError, match=r"model\.ckpt-1 does not hold this graph's variables"):
            checkpointer.restore(session)
    assert _checkpoint_steps(ckpt) == {1}
