"""The plan is computed once per job, before any process starts, and
shipped: the launcher (under `autopar launch`, one run of the script in the
report role) analyses, plans and places ops once; every worker receives the
compiled plan from the job coordinator and trains with it, and the launcher
starts exactly the processes the plan needs.
tests/integration/scripts/compile_once.py makes those functions raise in
every other process."""
import sys

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, load_worker,
                                       run_script, run_single_device, write_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "compile_once.py"
ONCE = "compile calls: {'analyze_graph': 1, 'make_plan': 1, 'place_ops': 1}"


def _run(command, compiler: str, **env) -> str:
    return run_script(command, env={**child_env(), "AUTOPAR_TEST_COMPILER": compiler, **env})


def test_launcher_compiles_once_and_workers_train_with_the_shipped_plan(tmp_path):
    # A sparse variable on the server with clipping: the plan carries OPAU moves.
    model, steps = "emb_adam_clip", "4"
    run_single_device(model, tmp_path / "single", "--steps", steps, "--batch", "12")
    log = _run([sys.executable, str(SCRIPT), "--model", model, "--out", str(tmp_path / "job"),
                "--steps", steps, "--batch", "12", "--spec", str(write_spec(tmp_path, 2, 1))],
               "launcher")
    assert log.count("compile calls:") == 1 and ONCE in log, log[-3000:]
    for i in (0, 1):
        assert f"worker {i}: plan received from the launcher" in log, log[-3000:]
    assert "1 on servers" in log, log[-3000:]
    expected = load_worker(tmp_path / "single", 0)
    for i in (0, 1):
        assert_same_parameters(expected, load_worker(tmp_path / "job", i), what=f"worker {i}")


def test_autopar_launch_compiles_the_plan_in_one_run_of_the_script(tmp_path):
    out, calls = tmp_path / "job", tmp_path / "calls.log"
    # A spec with a server, a plan without herring: no summation server starts.
    log = _run([sys.executable, "-m", "autopar.cli", "launch",
                "--spec", str(write_spec(tmp_path, 2, 1)), "--", sys.executable, str(SCRIPT),
                "--model", "mlp_sgd", "--out", str(out), "--steps", "3", "--run-option", "ps"],
               "script", AUTOPAR_TEST_COMPILE_LOG=str(calls))
    assert calls.read_text().splitlines() == [ONCE], calls.read_text()
    assert "compile calls:" not in log, log[-3000:]
    for i in (0, 1):
        assert f"worker {i}: plan received from the launcher" in log, log[-3000:]
    assert log.count("autopar plan: 2 workers") == 1, log[-3000:]   # logged by the launcher
    assert "started server 0" in log and "sumserver" not in log, log[-3000:]
    assert int(load_worker(out, 1)["global_step"]) == 3
