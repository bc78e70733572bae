"""The launcher re-runs a script as it was started, whatever it did before
get_runner: changed directory (the command is resolved where the script
started, which is where every worker starts), or ran the training script
through runpy.run_path (the wrapper is re-run, not the inner file, whose
path runpy puts in sys.argv[0]). A job of 2 workers of
tests/integration/scripts/small_job.py each."""
import sys

import pytest

from tests.integration.cluster import REPO, run_script, write_spec

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
