"""Fresh parameter-server jobs, one after another, must all finish: every
worker's run of a step shares one step id on the servers, and a worker that
finished its step early used to clean that id up under a peer still reading
a server variable (the moving average of it) — "Aborted: Cleanup <step id>",
about 1 job in 6, at the first steps (transforms.barrier.cover_server_work).

A race at start-up needs fresh jobs (new servers, new sessions), not more
steps of one job: REPEATS jobs of a few steps per run option with servers,
dense + sparse variables with Adam, clip_by_global_norm and an
ExponentialMovingAverage, 3 workers on 2 hosts and 2 servers. Each job must
also end equal to one device.

The same jobs with the embedding split into 2 partitions: the moving
average's initial value is guarded by cond(is_initialized(embedding), ...),
which on a non-chief raced the chief's initialisation of the partitions and
read the whole embedding, which no longer exists ("Could not find variable
embedding"; 3 of 6 hybrid jobs, 1 of 2 ps jobs before the rewrite replaced
the guard by the initial value).
"""
import os

import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_single_device,
                                       run_training, write_two_host_spec)

MODEL = "emb_adam_clip_ema"
STEPS = 2
BATCH = 12
# Jobs per run option. `make test` runs 1 of each (every job is 6 fresh
# processes, 25-80 s here, and the suite must stay well under 20 minutes); the
# soak that established the fix ran 10 of each (10 of 10 passed for hybrid and
# ps; before it, 1 job in 12 aborted): `make stress` or AUTOPAR_STRESS_REPEATS=10.
REPEATS = int(os.environ.get("AUTOPAR_STRESS_REPEATS", "1"))


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run_single_device(MODEL, out, "--steps", str(STEPS), "--batch", str(BATCH))
    return load_worker(out, 0)


# One job takes 25-80 s on a loaded 2-core machine: 10 of them need more than
# pytest.ini's per-test 300 s.
# `make test` runs two of the four (one per run option, one per form of the
# embedding); the soak, all four.
CASES = [("hybrid", ""), ("ps", "embedding=2")] + (
    [("ps", ""), ("hybrid", "embedding=2")] if REPEATS > 1 else [])


@pytest.mark.timeout(120 * REPEATS)
@pytest.mark.parametrize("run_option,partitions", CASES)
def test_fresh_jobs_all_finish(run_option, partitions, tmp_path, single_device):
    spec = str(write_two_host_spec(tmp_path))
    for job in range(REPEATS):
        out = tmp_path / f"job{job}"
        # run_training fails the test with the job's output if it did not exit 0.
        run_training(MODEL, out, "--steps", str(STEPS), "--batch", str(BATCH),
                     "--spec", spec, "--run-option", run_option, "--partitions", partitions)
        for i in range(3):
            assert_same_parameters(single_device, load_worker(out, i),
                                   what=f"{run_option} job {job} worker {i}")
