"""Scripts shaped as users shape them. The launcher re-runs a script as it
was started, whatever it did before get_runner: changed directory (the
command is resolved where the script started, which is where every worker
starts), or ran the training script through runpy.run_path (the wrapper is
re-run, not the inner file, whose path runpy puts in sys.argv[0]): a job of
2 workers of tests/integration/scripts/small_job.py each. A script holds
several jobs in sequence: two models fit one after the other."""
import json
import os
import sys

import numpy as np
import pytest

from tests.integration.cluster import (REPO, run_beside, run_script, run_to_end, write_spec,
                                       write_two_host_spec)
from tests.integration.test_keras_programs import _assert_workers_hold

SCRIPTS = REPO / "tests" / "integration" / "scripts"
# Each script says who runs it, changes directory, then trains.
PREAMBLE = f"""import os, sys
print("started as " + os.environ.get("AUTOPAR_ROLE", "launcher"), flush=True)
os.chdir("elsewhere")
sys.path.insert(0, {str(SCRIPTS)!r})
"""
SCRIPTS_OF = {
    # the training script itself, started by a path relative to where it
    # started (before: the launcher re-ran it from "elsewhere", where no
    # worker could start: "failed while starting ... no error in its output")
    "chdir": PREAMBLE + "import small_job\nsmall_job.main()\n",
    # a wrapper running the training script through runpy (before: the
    # workers ran small_job.py itself, the wrapper's work undone)
    "runpy": PREAMBLE + f"import runpy\nrunpy.run_path({str(SCRIPTS / 'small_job.py')!r}, "
                        "run_name='__main__')\n",
}


@pytest.mark.parametrize("shape", sorted(SCRIPTS_OF))
def test_a_script_is_rerun_as_it_was_started(shape, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "train.py").write_text(SCRIPTS_OF[shape])
    spec = write_spec(tmp_path, 2)
    log = run_script([sys.executable, "train.py", "--spec", str(spec), "--steps", "2"],
                     cwd=tmp_path)
    assert log.count("started as launcher") == 1
    for index in range(2):
        assert f"[worker {index}] started as worker" in log, log[-3000:]
    assert "step 2" in log, log[-3000:]


TWO_MODELS = str(SCRIPTS / "keras_fit_two_models.py")
# ps: each job's variables on the servers, which outlive the first job
TWO_MODELS_OPTIONS = (["hybrid", "ps", "allreduce"]
                      if os.environ.get("AUTOPAR_TEST_MATRIX") == "full" else ["ps"])


@pytest.mark.parametrize("run_option", TWO_MODELS_OPTIONS)
def test_two_models_fit_one_after_the_other_in_one_script(run_option, tmp_path):
    """Each autopar.fit call of a script is a job of its own on the
    processes the first one started: the chief compiles and publishes each
    later job's plan, every worker keeps its server and its link to the
    launcher, and a later job's resources are its own (the servers keep an
    earlier job's). Before: the second call was refused in every worker,
    'this process built another graph than the one the job's plan was
    compiled from'. 3 workers on 2 uneven hosts end with Keras's own fit's
    logs and variables for both models."""
    def history(log: str) -> list:
        line = next(line for line in log.splitlines() if "history " in line)
        return json.loads(line.split("history ", 1)[1])
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    expected_log, log = run_beside(
        [sys.executable, TWO_MODELS, "--keras", "--out", str(tmp_path / "keras{worker}.npz")],
        [sys.executable, TWO_MODELS, "--spec", str(spec), "--run-option", run_option,
         "--out", str(tmp_path / "dist{worker}.npz")])
    expected, got = history(expected_log), history(log)
    assert len(got) == 2 and got[0].keys() == got[1].keys() == expected[0].keys()
    for model, expected_model in zip(got, expected):
        for name in expected_model:
            np.testing.assert_allclose(model[name], expected_model[name], rtol=1e-9,
                                       err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-9, atol=1e-12)


BACKUP = str(SCRIPTS / "keras_fit_backup.py")


def test_a_fit_preempted_and_run_again_resumes_where_keras_resumes(tmp_path):
    """keras.callbacks.BackupAndRestore: the first run raises after its 2nd
    of 4 epochs, the second restores the backup (on the chief: the
    callbacks run there) and trains the last 2 epochs, as Keras's fit does
    from the epoch the callback restores (model._initial_epoch). 3 workers
    on 2 uneven hosts end the second run with Keras's logs and variables
    (before: every epoch again from the restored weights, 4 logged)."""
    def history(log: str) -> dict:
        line = next(line for line in log.splitlines() if "history " in line
                    and ("[worker" not in line or "[worker 0]" in line))
        return json.loads(line.split("history ", 1)[1])
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(0, 0))
    keras_dir, job_dir = tmp_path / "keras", tmp_path / "job"
    keras_dir.mkdir()
    job_dir.mkdir()
    runs = {"keras": [sys.executable, BACKUP, "--keras", "--dir", str(keras_dir),
                      "--out", str(tmp_path / "keras{worker}.npz")],
            "job": [sys.executable, BACKUP, "--spec", str(spec), "--dir", str(job_dir),
                    "--out", str(tmp_path / "dist{worker}.npz")]}
    logs = {}
    for name, command in runs.items():
        returncode, first = run_to_end(command)
        assert returncode != 0 and "preempted after the 2nd epoch" in first, first[-3000:]
        logs[name] = run_script(command)
    expected, got = history(logs["keras"]), history(logs["job"])
    assert len(expected["loss"]) == 2 and got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-9, atol=1e-12)
