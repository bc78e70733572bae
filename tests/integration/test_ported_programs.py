"""Public programs nobody here wrote, ported with the smallest change (each
marked "autopar port" in tests/integration/scripts/): Horovod's two
TensorFlow 2 examples (Keras's fit with a per-batch learning-rate warm-up,
and a custom loop in autopar's form), keras-io's wide, deep and cross
networks (three models fit one after the other in one script, on
make_csv_dataset's string and number columns, batches of 265) and its
custom-training-loop guide (a metric read and reset each epoch, the add_loss
step, two jobs in one script). Each runs on 3 workers over 2 uneven hosts
with a server each and ends with every worker holding one device's
variables and slots, the logs one device's (Keras's own fit, or the
program's own loop), in float64.

Each program runs in one run option in `make test` (each a different one),
and in hybrid, ps and allreduce under AUTOPAR_TEST_MATRIX=full
(`make test-matrix`)."""
import json
import os
import sys

import numpy as np
import pytest

from tests.integration.cluster import (REPO, LineReader, assert_same_parameters, child_env,
                                       start_job, write_two_host_spec)

SCRIPTS = REPO / "tests" / "integration" / "scripts"
# program -> (its one-device reference's flags, the run option make test runs it in)
PROGRAMS = {
    "horovod_keras_mnist": (["--keras", "--size", "3"], "hybrid"),
    "horovod_mnist": (["--reference", "--size", "3"], "ps"),
    "keras_io_wide_deep": (["--keras"], "allreduce"),
    "keras_io_custom_loop": (["--reference"], "hybrid"),
}
CASES = ([(program, option) for program in PROGRAMS for option in ("hybrid", "ps", "allreduce")]
         if os.environ.get("AUTOPAR_TEST_MATRIX") == "full"
         else [(program, option) for program, (_, option) in PROGRAMS.items()])


def _run(program: str, option: str, tmp_path, status: int = 0):
    """The program on one device and on 3 workers, side by side, each in a
    directory of its own (they write files where they run), the job ending
    with `status`: (the reference's output, the job's, the reference's
    variables, each worker's)."""
    script = str(SCRIPTS / f"{program}.py")
    reference_dir, job_dir = tmp_path / "reference", tmp_path / "job"
    reference_dir.mkdir()
    job_dir.mkdir()
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    # (tf.keras is Keras 3, as these programs use it: not the suite's legacy switch, conftest.py)
    env = {k: v for k, v in child_env().items() if k != "TF_USE_LEGACY_KERAS"}
    with LineReader(start_job([sys.executable, script, *PROGRAMS[program][0],
                               "--out", str(reference_dir / "vars{worker}.npz")],
                              env, reference_dir)) as reference:
        with LineReader(start_job([sys.executable, script, "--spec", str(spec), "--run-option",
                                   option, "--out", str(job_dir / "vars{worker}.npz")],
                                  env, job_dir)) as job:
            log = job.rest(timeout=240)
        expected_log = reference.rest(timeout=240)
    assert job.proc.returncode == status, log[-4000:]
    assert reference.proc.returncode == 0, expected_log[-4000:]

    def load(path):
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    return (expected_log, log, load(reference_dir / "vars0.npz"),
            [load(job_dir / f"vars{i}.npz") for i in range(3)])


def _logged(log: str, prefix: str):
    """The JSON the program printed after `prefix` (the chief's, in a job's output)."""
    line = next(line for line in log.splitlines() if prefix + " " in line
                and ("[worker" not in line or "[worker 0]" in line))
    return json.loads(line.split(prefix + " ", 1)[1])


@pytest.mark.parametrize("program,option", CASES, ids=["-".join(c) for c in CASES])
def test_a_ported_program_trains_as_on_one_device(program, option, tmp_path):
    # the custom loop's second job, the add_loss step, is refused (below)
    expected_log, log, expected, workers = _run(
        program, option, tmp_path, status=2 if program == "keras_io_custom_loop" else 0)
    if program == "horovod_keras_mnist":
        # a per-batch warm-up from 0.001 to 0.003 over 2 epochs (before: the
        # per-batch hook never ran, and training ended at another rate)
        history, expected_history = _logged(log, "history"), _logged(expected_log, "history")
        assert expected_history["lr"] == pytest.approx([0.002, 0.003, 0.003])
        assert sorted(history) == ["accuracy", "loss", "lr"]
        for name in history:
            np.testing.assert_allclose(history[name], expected_history[name], rtol=1e-9,
                                       err_msg=name)
        # ModelCheckpoint, run by the chief alone, wrote each epoch once
        assert sorted(p.name for p in (tmp_path / "job").glob("checkpoint-*")) == [
            "checkpoint-1.h5", "checkpoint-2.h5", "checkpoint-3.h5"]
        assert "finished gradual learning rate warmup to 0.003" in log
    elif program == "keras_io_wide_deep":
        # three models, three jobs of one script; each's epoch logs Keras's
        histories, expected_histories = _logged(log, "history"), _logged(expected_log, "history")
        assert len(histories) == 3 and "not trained on" not in log
        for history, expected_history in zip(histories, expected_histories, strict=True):
            assert sorted(history) == ["loss", "sparse_categorical_accuracy"]
            for name in history:
                np.testing.assert_allclose(history[name], expected_history[name], rtol=1e-9,
                                           err_msg=name)
    elif program == "keras_io_custom_loop":
        # each epoch's training accuracy, read after combine_metrics and
        # reset in Python, and the validation's (before: the reset undone by
        # the sync before validation, the second epoch counted two)
        results = _logged(log, "results")
        assert sorted(results) == ["metrics"]
        np.testing.assert_allclose(results["metrics"], _logged(expected_log, "results")["metrics"],
                                   rtol=1e-12)
        # then the add_loss step, a second job of the script: its loss adds
        # the batch's summed activity regularizer to a mean cross-entropy,
        # which no combination of the workers' gradients makes one device's
        # (before: trained, the regularizer's gradient divided by 3)
        assert "[worker 0] autopar: " in log
        assert "adds a loss averaged over the batch to one summed over it" in log
    for i, got in enumerate(workers):
        assert_same_parameters(expected, got, rtol=1e-9, atol=1e-12,
                               what=f"{program} {option} worker {i}")
