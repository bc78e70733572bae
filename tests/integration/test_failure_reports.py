"""A failed job's launcher names the first cause in its last line: which
process, which error, at which step, not the "mismatched step counts" its
peers' reactions used to produce; and no traceback longer than 20 lines
reaches the terminal (TensorFlow's graph-mode errors are condensed).

- an exception in worker 1 at global step 5;
- a full disk during a checkpoint save (a tmpfs of 12 KB: the save of step 2
  fits, that of step 4 does not), which keeps the previous checkpoint;
- a checkpoint of another model (float64 variables of the same names);
- a garbage ``checkpoint`` state file.
"""
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.integration.cluster import (LineReader, run_single_device, small_disk, start_job,
                                       train_command, write_spec)


def _run(tmp_path: Path, workers: int, *extra: str) -> tuple[int, list[str]]:
    spec = write_spec(tmp_path, workers=workers)
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--spec", str(spec), *extra))
    with LineReader(proc) as reader:
        reader.rest(timeout=180)
    lines = reader.text.rstrip("\n").splitlines()
    _no_long_traceback(lines)
    assert not any("mismatched step counts" in line for line in lines), reader.text[-3000:]
    return proc.returncode, lines


# The last line of a traceback: "ValueError: boom", "tensorflow...InternalError: ...".
_ERROR_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b")


def _no_long_traceback(lines: list[str]) -> None:
    """Every traceback (a worker's, prefixed, or the launcher's repeat of a
    worker's output tail) is at most 20 lines, its error line included."""
    for i, line in enumerate(lines):
        prefix, found, _ = line.partition("Traceback (most recent call last")
        if not found:
            continue
        length = 1
        for later in lines[i + 1:]:
            length += 1
            if not later.startswith(prefix) or _ERROR_LINE.match(later[len(prefix):]):
                break
        assert length <= 20, "\n".join(lines[i:i + length])


def test_an_exception_in_a_worker_is_named_not_a_step_count_mismatch(tmp_path):
    code, lines = _run(tmp_path, 2, "--steps", "10", "--raise-at", "5")
    assert code == 1, "\n".join(lines[-30:])
    assert re.fullmatch(r"job failed: worker 1 \(pid \d+\) failed after global step 5: "
                        r"RuntimeError: injected failure at global step 5 \(status 1\)",
                        lines[-1]), "\n".join(lines[-30:])
    # Worker 0's collective aborted with it: one short line, before the verdict.
    effects = [line for line in lines[:-1] if line.startswith("  then ")]
    assert all(line.startswith("  then worker 0 (pid ") for line in effects), effects


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_named_and_keeps_the_previous_checkpoint(tmp_path):
    with small_disk(tmp_path / "disk", "12k") as disk:
        ckpt = disk / "ckpt"
        code, lines = _run(tmp_path, 1, "--steps", "6", "--checkpoint-dir", str(ckpt),
                           "--save-every", "2")
        assert code == 2, "\n".join(lines[-30:])
        assert re.fullmatch(
            r"job failed: worker 0 \(pid \d+\) failed (in|after) global step 4: autopar: could "
            rf"not save checkpoint {ckpt}/model\.ckpt-4 at global step 4: no space left on device "
            rf"in {ckpt}; the previous checkpoint model\.ckpt-2 is kept\. .* \(status 2\)",
            lines[-1]), "\n".join(lines[-30:])
        assert sorted(os.listdir(ckpt)) == ["checkpoint", "model.ckpt-2.data-00000-of-00001",
                                            "model.ckpt-2.index"]


@pytest.mark.parametrize("damage", ["another model", "garbage state file"])
def test_a_checkpoint_dir_the_job_cannot_use_is_named(tmp_path, damage):
    ckpt = tmp_path / "ckpt"
    if damage == "another model":
        # The same variable names, in float64.
        run_single_device("mlp_adam_clip_ema", tmp_path / "other", "--steps", "1",
                          "--checkpoint-dir", str(ckpt), "--save-every", "1")
        expected = (rf"checkpoint {ckpt}/model\.ckpt-1 does not hold this graph's variables "
                    r"\('hidden/bias' is float64 there, float32 in this graph\)")
    else:
        ckpt.mkdir()
        (ckpt / "checkpoint").write_bytes(bytes(range(256)))
        expected = (rf"{ckpt}/checkpoint is not a TensorFlow checkpoint state file \(.*\), and "
                    "saving would overwrite it")
    code, lines = _run(tmp_path, 1, "--steps", "3", "--checkpoint-dir", str(ckpt))
    assert code == 2, "\n".join(lines[-30:])
    assert re.fullmatch(rf"job failed: worker 0 \(pid \d+\) failed while starting, before "
                        rf"training: autopar: {expected}\..* \(status 2\)",
                        lines[-1]), "\n".join(lines[-30:])


def test_ctrl_c_while_the_launcher_shuts_down_prints_no_traceback(tmp_path):
    """Ctrl-C pressed again and again while a finished job's launcher tears
    down (coordinator, port reservations, fork server, exit): it exits
    without a KeyboardInterrupt traceback."""
    spec = write_spec(tmp_path, workers=1)
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--spec", str(spec),
                                   "--steps", "2"))
    with LineReader(proc) as reader:
        reader.wait_for(r"^all 1 workers finished", 180)
        while proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        reader.rest(timeout=60)
    assert "Traceback" not in reader.text and "KeyboardInterrupt" not in reader.text, \
        reader.text[-3000:]
    assert proc.returncode in (0, 130), reader.text[-3000:]


def test_a_worker_whose_config_differs_is_refused_naming_the_option(tmp_path):
    """A script whose Config depends on the process (worker 1 alone
    accumulates micro-batches) would rewrite its graph differently from the
    job's plan and hang or train wrongly: worker 1 is refused, named, with
    the option and both values."""
    code, lines = _run(tmp_path, 2, "--steps", "3", "--config-on-worker", "1:micro_batches=2")
    assert code == 2, "\n".join(lines[-30:])
    assert re.fullmatch(r"job failed: worker 1 \(pid \d+\) failed while starting, before "
                        r"training: autopar: worker 1's Config has micro_batches=2, but the job's "
                        r"plan was compiled with micro_batches=1: every process of a job must use "
                        r"the same Config.* \(status 2\)", lines[-1]), "\n".join(lines[-30:])
