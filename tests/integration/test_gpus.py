"""A job whose spec gives its workers GPUs, on this machine without any
(docs/gpus.md): each worker says it trains on its CPU, and the job, whose
graphs place every replica on its GPU (soft placement runs them on the CPU,
the collectives in their GPU twin groups, the servers' variables and the
collectives of integer dtypes on the CPU), ends equal to one device."""
from __future__ import annotations

from tests.integration.cluster import (assert_same_parameters, load_worker, run_single_device,
                                       run_training)

STEPS, BATCH = 6, 12


def test_a_job_declaring_gpus_trains_on_this_cpu_machine_equal_to_one_device(tmp_path):
    spec = tmp_path / "gpus.yaml"
    spec.write_text("hosts:\n  - address: 127.0.0.1\n    workers: 2\n    servers: 1\n"
                    "    gpus: [0, 1]\n")
    args = ("--steps", str(STEPS), "--batch", str(BATCH))
    run_single_device("emb_adam_clip", tmp_path / "single", *args)
    log = run_training("emb_adam_clip", tmp_path / "dist", *args, "--spec", str(spec))
    for worker in (0, 1):
        assert (f"worker {worker} on 127.0.0.1: GPU {worker} (CUDA_VISIBLE_DEVICES={worker})"
                in log), log[-3000:]
        assert (f"worker {worker} was given GPU 0, but TensorFlow sees no GPU in this process "
                f"(CUDA_VISIBLE_DEVICES={worker}" in log), log[-3000:]
    expected = load_worker(tmp_path / "single", 0)
    for worker in (0, 1):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", worker),
                               what=f"worker {worker}")
