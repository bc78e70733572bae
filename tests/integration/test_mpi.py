"""A job started by a real `mpirun` (OpenMPI, from Debian's openmpi-bin):
every rank joins from OMPI_COMM_WORLD_RANK/SIZE as the worker of that index
in the spec's cluster (runtime/join.py), spawns nothing, and the job equals
one device; a spec that does not match the ranks is refused before any
TensorFlow server starts; autopar.shard slices by rank."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, free_ports,
                                       load_worker, run_single_device, train_command)

STEPS = 4
BATCH = 12


@pytest.fixture(scope="module")
def mpirun():
    """The real mpirun: installed by `make install` (system-packages) as root;
    installed here with apt if a run skipped that."""
    if shutil.which("mpirun") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "openmpi-bin"], capture_output=True,
                       timeout=600)
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("mpirun is not installed and cannot be (needs root and apt-get: "
                    "apt-get install openmpi-bin)")
    return path


def _mpirun(mpirun, ranks: int, command: list[str], timeout: float = 180):
    env = child_env()
    argv = [mpirun, "--oversubscribe", "-np", str(ranks), "-x", "PYTHONPATH",
            "-x", "TF_CPP_MIN_LOG_LEVEL", *command]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    return subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def _spec(tmp_path, workers: int, servers: int = 0):
    ports = free_ports(workers)
    path = tmp_path / "mpi.yaml"
    path.write_text(f"hosts:\n  - address: 127.0.0.1\n    workers: {workers}\n"
                    f"    servers: {servers}\n    worker_ports: {ports}\n")
    return path


def test_mpirun_ranks_train_as_one_device(mpirun, tmp_path):
    """Two ranks, sparse embedding (all-gather: an MPI job has no servers)
    with clipped float64 Adam: every variable and slot equals one device."""
    out = tmp_path / "mpi"
    proc = _mpirun(mpirun, 2, train_command("emb_adam_clip", out, "--steps", str(STEPS),
                                            "--batch", str(BATCH), "--spec",
                                            str(_spec(tmp_path, 2))))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "MPI rank 0 of 2: worker 0" in proc.stdout and "MPI rank 1 of 2: worker 1" in proc.stdout
    single = tmp_path / "single"
    run_single_device("emb_adam_clip", single, "--steps", str(STEPS), "--batch", str(BATCH))
    expected = load_worker(single, 0)
    for i in range(2):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"mpirun rank {i}")


def test_ranks_not_matching_the_spec_are_refused(mpirun, tmp_path):
    proc = _mpirun(mpirun, 2, train_command("mlp_sgd", tmp_path / "out", "--steps", "1",
                                            "--spec", str(_spec(tmp_path, 3))), timeout=120)
    assert proc.returncode != 0
    assert ("autopar: the MPI launcher started 2 process(es), but the spec lists 3 worker(s)"
            in proc.stdout), proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    assert not (tmp_path / "out").exists()


def test_shard_slices_by_rank(mpirun, tmp_path):
    probe = ("import os, autopar, tensorflow as tf\n"
             "ds = autopar.shard(tf.data.Dataset.range(10))\n"
             "print('rank', os.environ['OMPI_COMM_WORLD_RANK'], "
             "sorted(int(x) for x in ds.as_numpy_iterator()), flush=True)\n")
    proc = _mpirun(mpirun, 2, [sys.executable, "-c", probe], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "rank 0 [0, 2, 4, 6, 8]" in proc.stdout and "rank 1 [1, 3, 5, 7, 9]" in proc.stdout
