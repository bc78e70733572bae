"""Shared by the test scripts: who am I, where to record my pid, and how a
Keras fit script trains and reports."""
import json
import os

ROLE = os.environ.get("AUTOPAR_ROLE", "?")
INDEX = int(os.environ.get("AUTOPAR_TASK_INDEX", "-1"))
CLUSTER = json.loads(os.environ.get("AUTOPAR_CLUSTER", "{}"))


def write_pid() -> None:
    """Record this process's pid where the test can find it."""
    pid_dir = os.environ.get("AUTOPAR_TEST_PIDDIR")
    if pid_dir:
        path = os.path.join(pid_dir, f"{ROLE}-{INDEX}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)  # atomic: the test never reads half a pid


def fit_then_save(model, data, fit: dict, keras_own: bool, spec, out: str, y=None) -> None:
    """Train `model` on `data` (and `y`, for arrays) with `fit`'s arguments:
    by Keras's own model.fit on one device (`keras_own`), else by
    autopar.fit on every worker of `spec`. Prints the per-epoch logs
    ("history {...}") and saves the model's and optimizer's variables to
    `out` ({worker} replaced)."""
    import numpy as np

    import autopar
    if keras_own:
        history, worker = model.fit(data, y, **fit).history, 0
    else:
        result = autopar.fit(model, data, y, spec, autopar.Config(log_every_steps=0), **fit)
        history, worker = result.history, result.worker_index
    print("history " + json.dumps(history, sort_keys=True), flush=True)
    np.savez(out.format(worker=worker),
             **{v.path: v.numpy() for v in model.variables + model.optimizer.variables})
