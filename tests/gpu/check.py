"""`make gpu-check`: autopar's GPU workers on a machine with GPUs (docs/gpus.md).
Not part of CI, which runs on machines without a GPU.

For run options hybrid (the embedding on a parameter server, dense
gradients NCCL all-reduced) and allreduce: 2 workers, one GPU each where
there are two (sharing one over the ring where there is one), train
tests/gpu/train.py; every variable and Adam slot must equal one device's
run of the same global batch, on GPU 0, to float64 tolerance. One line per
worker names the devices its MatMuls ran on in its last step's trace, and
each must be a GPU.

Exit status: 0 when every check passes, 1 when one fails, 77 when this
machine has no GPU TensorFlow can see (the check needs one; not a failure).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

NO_GPU = 77
TRAIN = Path(__file__).resolve().parent / "train.py"
REPO = TRAIN.parents[2]
RTOL, ATOL = 1e-9, 1e-12   # float64: summation order over 2 workers, through Adam


def visible_gpus() -> int:
    probe = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run([sys.executable, str(TRAIN), *argv], cwd=REPO, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=1800)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")


def load(folder: Path, worker: int) -> dict[str, np.ndarray]:
    with np.load(folder / f"worker{worker}.npz") as data:
        return {k: data[k] for k in data.files}


def main() -> int:
    gpus = visible_gpus()
    if gpus == 0:
        print("gpu-check: needs a machine with a GPU that TensorFlow sees (found none; "
              "a GPU build of TensorFlow, e.g. pip install 'autopar[gpu]', and a driver): "
              "nothing checked", file=sys.stderr)
        return NO_GPU
    ids = "[0, 1]" if gpus >= 2 else "[0]"
    failures = 0
    with tempfile.TemporaryDirectory(prefix="autopar-gpu-check-") as tmp:
        tmp = Path(tmp)
        run(["--out", str(tmp / "single")], env={"CUDA_VISIBLE_DEVICES": "0"})
        expected = load(tmp / "single", 0)
        for option, servers in (("hybrid", 1), ("allreduce", 0)):
            spec = tmp / f"{option}.yaml"
            spec.write_text(f"hosts:\n  - address: 127.0.0.1\n    workers: 2\n"
                            f"    servers: {servers}\n    gpus: {ids}\n")
            out = tmp / option
            run(["--spec", str(spec), "--run-option", option, "--out", str(out)])
            for worker in (0, 1):
                devices = json.loads((out / f"worker{worker}.json").read_text())["matmul_devices"]
                on_gpu = bool(devices) and all("GPU" in d for d in devices)
                actual = load(out, worker)
                worst = max(float(np.max(np.abs(actual[k] - expected[k])
                                         / (ATOL + RTOL * np.abs(expected[k]))))
                            for k in expected)
                equal = set(actual) == set(expected) and worst <= 1.0
                failures += not (on_gpu and equal)
                print(f"gpu-check: {option} worker {worker}: MatMuls ran on "
                      f"{', '.join(devices) or 'no device'}; "
                      f"{'equal to' if equal else 'DIFFERS from'} one device "
                      f"(worst difference {worst:.3g} of the tolerance)", flush=True)
    print(f"gpu-check: {'passed' if not failures else f'{failures} check(s) failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
