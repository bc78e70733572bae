"""2-D summation of the all-reduce buckets, by hosts
(Config(hierarchical_allreduce=True)): 3 workers on 2 hosts (2 + 1: the
second host has no host steps), Adam with clipping by global norm
(float64), gradients in several fusion buckets so the host sums, the
leaders' all-reduces and the broadcasts of consecutive buckets follow one
another; and over groups of workers (Config(allreduce_group=d)): 12
workers on hosts of their own in groups of 4 (ranks in a group that are not
the workers' order, buckets whose length 4 does not divide) with
weight-update sharding (its gather in those ranks), and a hybrid job's 12
workers in groups of 4 with its embedding in 2 partitions on the servers,
pulled and pushed by aggregation groups of the same 4 workers.
Parameters and slots after 4 steps equal a single-device run of the same
global batches on every worker."""
import re

import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       write_two_host_spec)

MODEL = "mlp_adam_clip"
ARGS = ("--steps", "4", "--batch", "12")


def _trains_as_one_device(tmp_path, model: str, workers: int, *job_args: str,
                          used: str) -> None:
    """`model` run by the job (`job_args`) on `workers` workers: its log names
    2-D summation for several buckets (the regex `used`, its group the
    buckets), and every worker holds one device's parameters after 4 steps."""
    run_training(model, tmp_path / "single", *ARGS)
    expected = load_worker(tmp_path / "single", 0)
    # A hang in the collectives ends the job after the stall timeout (the
    # test then fails with the log) instead of waiting out run_training's.
    log = run_training(model, tmp_path / "dist", *ARGS, *job_args, "--fusion-bytes", "256",
                       "--stall-timeout", "40")
    found = re.search(used, log)
    assert found, log[-3000:]
    assert len(found.group(1).split(",")) >= 2, found.group(0)   # several buckets chained
    for i in range(workers):
        actual = load_worker(tmp_path / "dist", i)
        assert int(actual["global_step"]) == 4
        assert_same_parameters(expected, actual, what=f"2-D summation worker {i}/{workers}")


def test_two_dimensional_summation_matches_single_device(tmp_path):
    _trains_as_one_device(
        tmp_path, MODEL, 3, "--run-option", "allreduce", "--hierarchical", "on",
        "--spec", str(write_two_host_spec(tmp_path, servers=(0, 0))),
        used=r"2-D summation .* for bucket\(s\) ([#\d, ]+):")


@pytest.mark.parametrize("model, run_option, workers, group, servers, extra", [
    # 3 groups of 4: tasks 10 and 11 rank before 8 and 9 in theirs; with
    # weight-update sharding, whose all-gather of the owners' new values
    # comes in those ranks too (task 2's block third)
    ("mlp_adam_clip", "allreduce", 12, 4, 0, ("--shard-weight-update",)),
    # the same ranks in the aggregation groups' lookups (the ids' gather,
    # the first worker's scatter of each member's rows)
    ("lm_adam_clip", "hybrid", 12, 4, 2, ("--aggregation-group", "4",
                                          "--partitions", "embedding=2"))])
def test_two_dimensional_summation_over_groups_matches_single_device(
        model, run_option, workers, group, servers, extra, tmp_path):
    # loopback addresses of one worker each: hosts of their own to the plan
    spec = write_two_host_spec(tmp_path, workers=(1,) * workers,
                               servers=(1,) * servers + (0,) * (workers - servers))
    _trains_as_one_device(
        tmp_path, model, workers, "--run-option", run_option, *extra,
        "--allreduce-group", str(group), "--spec", str(spec),
        used=rf"2-D summation over groups of {group} workers .* for bucket\(s\) ([#\d, ]+): "
             rf"Config\(allreduce_group={group}\)")
