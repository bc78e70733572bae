"""Hybrid communication (Parallax §5): sparse variables on parameter servers,
dense ones all-reduced — and the "ps" and "allreduce" run options — train to
the same parameters, slots and global step as one device.

3 workers on 2 hosts (127.0.0.1 runs two, 127.0.0.2 one) and 2 servers, so
local aggregation really combines two workers' rows before they go out; and
Config(aggregation_group), whose groups of workers replace the hosts and pull
rows together, on 5 and 4 workers.
"""
import pytest

from tests.integration.cluster import (LineReader, assert_same_parameters, load_worker,
                                       run_training, single_device_runs, start_job,
                                       train_command, write_two_host_spec)

STEPS = 6
BATCH = 12

# Each run option's paths are covered elsewhere too (test_aggregation.py,
# test_sparse_varlen.py, test_correctness.py, test_compile_once.py); here the
# LM shapes: Adam with sparse rows partitioned over both servers and dense
# all-reduce, and Adagrad's server-side update of sparse variables
# partitioned over both servers, with a sampled softmax (examples/lm.py's,
# its sampler given no seed): its weights' last rows are the sampler's
# candidates, which every worker draws alike, added over workers row by row for the global norm; and the
# LSTM's dense kernel partitioned over both servers, its global-norm term
# read from the partitions' aggregates (once the chief's own gradient: the
# clip, which engages from step 2, scaled every variable by the chief's norm);
# and an LM whose softmax is its embedding: a dense gradient (its rows are
# split into ranges, not dealt) read through row lookups, each id's row
# found in the range holding it.
CASES = [
    ("lm_adam_clip", "hybrid", "embedding=3"),
    # (its sampler given no seed: every worker draws with the seeds autopar
    # gives it, and so does the one-device reference, train_model.py)
    ("lmsampledunseeded_adagrad_clip", "ps", "embedding=3,softmax/w=2,lstm/kernel=2"),
    # tied weights: a dense gradient whose rows are looked up, from ranges
    ("lmtied_adam", "ps", "embedding=3"),
]


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


@pytest.mark.parametrize("model,run_option,partitions", CASES,
                         ids=[f"{m}-{r}{'-' + p if p else ''}" for m, r, p in CASES])
def test_matches_single_device(model, run_option, partitions, tmp_path, single_device):
    expected = single_device(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(write_two_host_spec(tmp_path)), "--run-option", run_option,
                       "--partitions", partitions)
    assert f"run_option={run_option}" in log
    if run_option != "allreduce":
        assert "on servers" in log
    for i in range(3):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} {run_option} worker {i}")
    if partitions.startswith("embedding=3") and run_option == "hybrid":
        # Local aggregation on (the default), counted on the servers: each
        # embedding partition's accumulator got one gradient per host per step.
        assert "contributions per accumulator per step: [2, 2, 2]" in log, log[-3000:]


def test_without_local_aggregation_every_worker_contributes(tmp_path):
    """LA off: each accumulator receives one gradient per worker (3), where the
    partitioned hybrid case above, LA on, shows one per host (2)."""
    log = run_training("lm_adam_clip", tmp_path / "out", "--steps", "4", "--batch", "12",
                       "--spec", str(write_two_host_spec(tmp_path)), "--run-option", "hybrid",
                       "--partitions", "embedding=2", "--no-la")
    assert "contributions per accumulator per step: [3, 3]" in log, log[-3000:]


# Config(aggregation_group=2) on 5 workers over 2 hosts (3 + 2): groups
# [0, 1], [2, 3] (across the hosts) and [4] (alone), in place of the hosts.
GROUP_CASES = [
    ("lm_adam_clip", "hybrid", "embedding=2"),
    # deduplicated lookups (embedding_lookup_sparse), RMSProp's slots on the servers
    ("embsparse_rmsprop_clip_centered", "ps", "embedding=2"),
]


@pytest.mark.parametrize("model,run_option,partitions", GROUP_CASES,
                         ids=[f"{m}-{r}" for m, r, _ in GROUP_CASES])
def test_aggregation_groups_match_single_device(model, run_option, partitions, tmp_path,
                                                tmp_path_factory):
    """A group's workers pull the partitioned embedding's rows once (its first
    worker reads the union of their ids) and push one combined gradient: every
    variable and slot equals one device's, and each accumulator receives one
    contribution per group (3), not per host (2) or worker (5)."""
    batch = 10
    expected = single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch",
                                  str(batch))(model)
    out = tmp_path / "dist"
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(batch),
                       "--spec", str(write_two_host_spec(tmp_path, workers=(3, 2))),
                       "--run-option", run_option, "--partitions", partitions,
                       "--aggregation-group", "2")
    for i in range(5):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} {run_option} worker {i}")
    assert "contributions per accumulator per step: [3, 3" in log, log[-3000:]
    # runs that are not training steps, by every worker: the same loss everywhere
    for k in (97, 98):
        losses = {line.split(": ")[1] for line in log.splitlines()
                  if f"forward loss {k}: " in line}
        assert len(losses) == 1 and sum(f"forward loss {k}: " in line
                                        for line in log.splitlines()) == 5, log[-3000:]


def test_a_grouped_lookup_run_by_one_worker_alone_fails_naming_its_collective(tmp_path):
    """The chief runs the forward pass alone while its group's other worker
    waits: the lookup's collective gives up after the peers' timeout
    (Config.peer_timeout_s: 5 s, the busy timeout set to the stall timeout)
    and the job fails naming it, instead of hanging."""
    proc = start_job(train_command(
        "lm_adam_clip", tmp_path / "out", "--steps", "2", "--batch", "8",
        "--spec", str(write_two_host_spec(tmp_path, workers=(2, 2))), "--partitions", "embedding=2",
        "--aggregation-group", "2", "--stall-timeout", "5", "--busy-timeout", "5",
        "--chief-forward-alone"))
    with LineReader(proc) as reader:
        rest = reader.rest(timeout=120)
    assert proc.returncode != 0, rest[-3000:]
    if "Mutex corrupt" in rest:
        # TensorFlow's abort of the timed-out collective itself crashes the
        # worker at times (SIGABRT, "Mutex corrupt", seen once under load)
        # before Python sees the error: the job still ends, naming the worker
        # and TensorFlow's timeout
        assert "Collective has timed out during execution" in rest \
            and "job failed: worker 0" in rest, rest[-3000:]
        return
    assert "DeadlineExceeded" in rest and "autopar/partition/CollectiveGatherV2" in rest, \
        rest[-3000:]
