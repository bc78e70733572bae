"""autopar pip-installed into a user's environment (conftest.py): the
user's TensorFlow distribution and every package they had stay as they
were; a herring job (the native transport, built there for that
TensorFlow) trains equal to one device; the real TensorBoard of that
environment serves the job's scalars; every example runs from a folder
outside the checkout, with a spec `autopar spec` wrote."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

from tests.install.conftest import TENSORFLOW_CPU_PIN
from tests.integration.cluster import assert_same_parameters
from tests.tensorboard_http import served_scalars

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
STEPS = 6


def test_pip_install_keeps_the_users_tensorflow_and_packages(user_env):
    before, after = user_env.before, user_env.after
    assert before["tensorflow"] == TENSORFLOW_CPU_PIN and "tensorflow-cpu" not in before
    assert after["tensorflow"] == TENSORFLOW_CPU_PIN and "tensorflow-cpu" not in after, after
    assert "autopar" in after and "autopar" not in before
    changed = {name: (version, after.get(name)) for name, version in before.items()
               if after.get(name) != version}
    assert changed == {}, changed            # numpy, protobuf, grpcio... as the user had them
    user_env.run(user_env.python, "-m", "pip", "check")


def test_a_herring_job_trains_equal_to_one_device_and_tensorboard_serves_it(user_env):
    work = user_env.work / "herring"
    work.mkdir()
    shutil.copy(HERE / "user_train.py", work)
    spec = user_env.run(str(user_env.bin / "autopar"), "spec", "--workers", "2", "--servers", "1",
                        cwd=work).stdout
    (work / "spec.yaml").write_text(spec)
    user_env.run(user_env.python, "user_train.py", "--steps", str(STEPS), "--save", "single.npz",
                 cwd=work)
    log = user_env.run(user_env.python, "user_train.py", "--steps", str(STEPS), "--spec",
                       "spec.yaml", "--run-option", "herring", "--save", "worker{worker}.npz",
                       "--board", "board", cwd=work).stdout
    assert re.search(r"^\S*w1 +dense .* herring", log, re.M), log[-3000:]
    with np.load(work / "single.npz") as data:
        expected = {k: data[k] for k in data.files}
    assert "w1/Momentum" in expected and int(expected["global_step"]) == STEPS
    for worker in (0, 1):
        with np.load(work / f"worker{worker}.npz") as data:
            assert_same_parameters(expected, {k: data[k] for k in data.files},
                                   what=f"worker {worker}")
    # That environment's own TensorBoard opens the chief's event file.
    served = served_scalars(user_env.python, work / "board", "autopar/loss", env=user_env.env)
    assert [step for step, _ in served] == list(range(1, STEPS + 1)), served


def test_every_example_runs_outside_the_checkout(user_env):
    work = user_env.work / "examples"
    shutil.copytree(EXAMPLES, work)
    spec = user_env.run(str(user_env.bin / "autopar"), "spec", "--workers", "2", cwd=work).stdout
    (work / "spec.yaml").write_text(spec)
    py = user_env.python
    runs = {
        "digits_mlp.py": ([py, "digits_mlp.py", "--steps", "60"], r"test accuracy: 0\.\d+"),
        "cnn.py": ([py, "cnn.py", "--steps", "3", "--batch-size", "8"], r"[0-9.]+ images/s"),
        "keras_fit.py": ([py, "keras_fit.py", "--epochs", "1"], r"test accuracy: 0\.\d+"),
        "tf2_custom_loop.py": ([py, "tf2_custom_loop.py", "--examples", "512", "--epochs", "1"],
                               r"worker 1: test accuracy 0\.\d+"),
        "lm.py": ([py, "lm.py", "--vocab", "500", "--dim", "16", "--hidden", "16",
                   "--num-sampled", "0", "--steps", "3", "--warmup", "1", "--sequences", "400"],
                  r"words/s: [0-9.]+"),
        "lm1b/lm1b_distributed_driver.py": (
            [py, "lm1b/lm1b_distributed_driver.py", "--vocab_size", "50", "--emb_size", "8",
             "--state_size", "16", "--projected_size", "8", "--num_steps", "3",
             "--num_sampled", "0", "--batch_size", "2", "--max_steps", "2",
             "--log_frequency", "1", "--logdir", str(work / "lm1b-logs")],
            r"Iteration \d+"),
    }
    assert set(runs) == {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.py")
                         if p.name not in ("language_model.py", "language_model_graph.py")}
    for script, (argv, expected) in runs.items():
        spec_flag = ("--resource_info_file" if script.startswith("lm1b") else "--spec")
        out = user_env.run(*argv, spec_flag, "spec.yaml", cwd=work).stdout
        assert re.search(expected, out), f"{script}:\n{out[-3000:]}"
