"""A job fed through a sparse placeholder trains exactly as one device does;
autopar errors from get_runner end a script with a message and status 2; a
job whose output reader goes away ends cleanly."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, load_worker,
                                       run_beside, write_spec)

SCRIPTS = REPO / "tests" / "integration" / "scripts"


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **{"timeout": 240, "env": child_env(), **kwargs})


def test_sparse_feed_two_workers_equal_single_device(tmp_path):
    """Also the learning rate, a constant fed each step, read by the
    updates on the server (ps): the server's copy of the constant is fed
    too (before: the server read 0.5 every step)."""
    script = [sys.executable, str(SCRIPTS / "sparse_feed.py")]
    _, log = run_beside(script + ["--out", str(tmp_path / "single")],
                        script + ["--out", str(tmp_path / "job"), "--run-option", "ps",
                                  "--spec", str(write_spec(tmp_path, 2, servers=1))])
    assert "2 on servers" in log
    expected = load_worker(tmp_path / "single", 0)
    assert int(expected["global_step"]) == 4
    for index in range(2):
        assert_same_parameters(expected, load_worker(tmp_path / "job", index),
                               what=f"worker {index}")


def _small_job(*args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / "small_job.py"), *args]


def test_bad_spec_exits_2_with_the_message_and_no_traceback(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("hosts:\n  - workers: 2\n")            # no address
    done = _run(_small_job("--spec", str(spec)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "autopar: " in done.stderr and "address" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    # AUTOPAR_DEBUG=1: the same error, raised with its traceback.
    debug = _run(_small_job("--spec", str(spec)), env={**child_env(), "AUTOPAR_DEBUG": "1"})
    assert debug.returncode not in (0, 2)
    assert "Traceback" in debug.stderr and "SpecError" in debug.stderr


def test_error_in_a_worker_is_shown_by_the_launcher_without_traceback(tmp_path):
    done = _run(_small_job("--spec", str(write_spec(tmp_path, 2)), "--unsupported-in-worker"),
                env={**child_env(), "AUTOPAR_TEST_PIDDIR": str(tmp_path)})
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    # The worker's one-line message, prefixed by the launcher, and its exit status.
    assert "] autopar: " in out and "update_" in out
    assert "exited with status 2" in out, out[-3000:]
    assert "Traceback" not in out
    _assert_all_ended(tmp_path)


def _assert_all_ended(pid_dir: Path) -> None:
    from tests.integration.cluster import pid_alive
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert pids
    assert not [pid for pid in pids if pid_alive(pid)]


def _closed_reader_run(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Start the job, read one line of its output, close the pipe, let it go
    on writing; return its exit status and stderr."""
    go = tmp_path / "go"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(_small_job("--go", str(go), *args), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=err, env={**child_env(), "AUTOPAR_TEST_PIDDIR": str(tmp_path)})
        try:
            assert proc.stdout.readline()
            proc.stdout.close()           # the reader goes away, like `| head -1`
            go.touch()
            code = proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, err_path.read_text()


def test_closed_output_single_device(tmp_path):
    code, err = _closed_reader_run(tmp_path)
    assert code == 0, err
    assert "Logging error" not in err and "BrokenPipeError" not in err, err
    _assert_all_ended(tmp_path)


def test_closed_output_launcher(tmp_path):
    code, err = _closed_reader_run(tmp_path, "--spec", str(write_spec(tmp_path, 2)))
    assert code == 0, err
    assert "Logging error" not in err and "BrokenPipeError" not in err, err
    # Launcher and both workers wrote their pids; none is left running.
    assert len(list(tmp_path.glob("*.pid"))) == 3
    _assert_all_ended(tmp_path)


def test_batches_padded_by_each_worker_to_its_own_length_fail_naming_the_input(tmp_path):
    """Sequences batched by padded_batch after autopar.shard: each worker
    pads its 4 to its own longest, one device its 12 to theirs, and a mean
    over every position sees the padding (before: trained, 5 % off one
    device, without a word). The first training step fails on every worker
    naming the input, before any update; padded to one fixed length, the
    same loop trains as one device."""
    script = [sys.executable, str(SCRIPTS / "padded_batches.py")]
    spec = str(write_spec(tmp_path, 3))
    failed = _run(script + ["--spec", spec, "--out", str(tmp_path / "dist{worker}.npz")])
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert ("failed in training step 1: InvalidArgumentError: " in output
            and "autopar: the workers padded the step's input 'x:0' to different lengths (axes "
            "[1]), where one device pads the global batch to one" in output.replace("\\'", "'")
            ), output[-3000:]
    assert not list(tmp_path.glob("dist*.npz"))
    _, log = run_beside(script + ["--fixed", "--out", str(tmp_path / "one{worker}.npz")],
                        script + ["--fixed", "--spec", spec,
                                  "--out", str(tmp_path / "fixed{worker}.npz")])
    assert "inputs of unknown lengths ('x:0'): each training step checks" in log
    expected = dict(np.load(tmp_path / "one0.npz"))
    for worker in range(3):
        assert_same_parameters(expected, dict(np.load(tmp_path / f"fixed{worker}.npz")),
                               what=f"worker {worker}")


def test_a_chief_evaluating_alone_between_steps_leaves_the_next_steps_as_they_were(tmp_path):
    """A TF1 loop whose chief alone runs a prediction between steps, through
    the padded lengths' check (a collective of training steps alone): the
    workers' next step failed ("Collective ops is aborted by: Delete called
    on non-empty BufRendezvous"), as the chief's run had moved its
    collectives' step ids on; now every worker ends with one device's
    variables. With a dropout (a draw per example), the job trains on and
    the chief says its generator moved on alone."""
    script = [sys.executable, str(SCRIPTS / "chief_evaluates_alone.py")]
    spec = str(write_spec(tmp_path, 3))
    expected_log, log = run_beside(script + ["--out", str(tmp_path / "one{worker}.npz")],
                                   script + ["--spec", spec,
                                             "--out", str(tmp_path / "dist{worker}.npz")])
    assert "held-out prediction" in expected_log and "held-out prediction" in log
    expected = dict(np.load(tmp_path / "one0.npz"))
    for worker in range(3):
        assert_same_parameters(expected, dict(np.load(tmp_path / f"dist{worker}.npz")),
                               rtol=1e-12, atol=1e-12, what=f"worker {worker}")
    dropped = _run(script + ["--dropout", "--spec", spec,
                             "--out", str(tmp_path / "drop{worker}.npz")])
    output = dropped.stdout + dropped.stderr
    assert dropped.returncode == 0, output[-3000:]
    assert ("autopar: worker 0 drew per example outside a training step (a run of no train "
            "op): its random ops per example ('dropout/random_uniform/RandomUniform') ran"
            in output), output[-3000:]
    assert len(list(tmp_path.glob("drop*.npz"))) == 3
