"""2-D summation of the all-reduce buckets (Config(hierarchical_allreduce=True)):
3 workers on 2 hosts (2 + 1: the second host has no host steps), Adam with
clipping by global norm (float64), gradients in several fusion buckets so
the host sums, the leaders' all-reduces and the broadcasts of consecutive
buckets follow one another. Parameters and slots after 4 steps equal a
single-device run of the same global batches on every worker."""
import re

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       write_two_host_spec)

MODEL = "mlp_adam_clip"
ARGS = ("--steps", "4", "--batch", "12")


def test_two_dimensional_summation_matches_single_device(tmp_path):
    run_training(MODEL, tmp_path / "single", *ARGS)
    expected = load_worker(tmp_path / "single", 0)
    # A hang in the collectives ends the job after the stall timeout (the
    # test then fails with the log) instead of waiting out run_training's.
    log = run_training(MODEL, tmp_path / "dist", *ARGS, "--run-option", "allreduce",
                       "--spec", str(write_two_host_spec(tmp_path, servers=(0, 0))),
                       "--hierarchical", "on", "--fusion-bytes", "256",
                       "--stall-timeout", "40")
    used = re.search(r"2-D summation .* for bucket\(s\) ([#\d, ]+):", log)
    assert used, log[-3000:]
    assert len(used.group(1).split(",")) >= 2, used.group(0)   # several buckets chained
    for i in range(3):
        actual = load_worker(tmp_path / "dist", i)
        assert int(actual["global_step"]) == 4
        assert_same_parameters(expected, actual, what=f"2-D summation worker {i}/3")
