"""A job on an IPv6 address: its processes listen on [::1] and reach each
other there (collectives and a parameter server), and it trains to one
device's parameters. (wait_for_peers once passed "[::1]" with its brackets to
the socket API, and every IPv6 job failed "peers ... did not come up".)"""
from tests.integration.cluster import (assert_same_parameters, load_worker, run_single_device,
                                       run_training, write_spec)

MODEL = "emb_adam_clip"   # dense gradients all-reduced, the embedding's on the server


def test_a_job_on_the_ipv6_loopback_trains_like_one_device(tmp_path):
    spec = write_spec(tmp_path, workers=2, servers=1, address="::1")
    log = run_training(MODEL, tmp_path / "job", "--spec", str(spec), "--steps", "4")
    assert "started server 0 at [::1]:" in log and "started worker 1 at [::1]:" in log, log
    # A preloaded server_main run as __main__ by the fork server used to warn at every start.
    assert "RuntimeWarning" not in log, log
    run_single_device(MODEL, tmp_path / "one", "--steps", "4")
    expected = load_worker(tmp_path / "one", 0)
    for i in range(2):
        assert_same_parameters(expected, load_worker(tmp_path / "job", i), what=f"worker {i}")
