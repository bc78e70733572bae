"""The plan is computed once per job and shipped: the launcher (or, under
`autopar launch`, the chief) analyses, plans and places ops once; the other
processes receive the compiled plan from the job coordinator and train with
it. tests/integration/scripts/compile_once.py makes those functions raise in
every other process."""
import sys

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, load_worker,
                                       run_script, run_single_device, write_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "compile_once.py"
ONCE = "compile calls: {'analyze_graph': 1, 'make_plan': 1, 'place_ops': 1}"


def _run(command, compiler: str) -> str:
    return run_script(command, env={**child_env(), "AUTOPAR_TEST_COMPILER": compiler})


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


def test_under_autopar_launch_the_chief_compiles_and_the_others_receive(tmp_path):
    out = tmp_path / "job"
    log = _run([sys.executable, "-m", "autopar.cli", "launch", "--spec", str(write_spec(tmp_path, 2)),
                "--", sys.executable, str(SCRIPT), "--model", "mlp_sgd", "--out", str(out),
                "--steps", "3"], "chief")
    assert log.count("compile calls:") == 1 and ONCE in log, log[-3000:]
    assert "worker 1: plan received from the chief (worker 0)" in log, log[-3000:]
    assert "autopar plan: 2 workers" in log     # the chief's report, from its compiled plan
    assert int(load_worker(out, 1)["global_step"]) == 3
