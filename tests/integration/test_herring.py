"""run_option="herring" against one device: 4 workers on 2 hosts (127.0.0.1
and 127.0.0.2, 2 workers each, local aggregation: one contributor per host)
and 2 summation servers; dense gradients travel in balanced fusion buffers
through the native transport, packed and unpacked before clipping, the
update and the moving averages."""
import pytest

from tests.integration.cluster import (assert_same_parameters, load_worker, run_training,
                                       single_device_runs, write_two_host_spec)

STEPS = 6
BATCH = 12
WORKERS = 4

# The float32 Adam model (herring sums float32; the float64 one would stay
# on the ring, see transforms.methods.herring.method).
CASES = ["cnn_momentum", "mlp_adam_clip_ema_f32"]

# wire_dtype="float16": every contributor's buffer (a host's sum of its 2
# workers' gradients, |h| <= 2G for G the largest gradient element of a
# worker) is rounded to float16 on the way to the servers and their sum
# (<= 4G) on the way back, each a relative error of at most 2^-11: the
# averaged gradient element is off by at most 2^-11 (2 x 2G + 4G) / 4 =
# 2^-10 G. Along this run G = 0.57 (measured on one device's trajectory),
# so 5.5e-4. Momentum (lr 0.05, momentum 0.9) over 6 steps: a slot is
# sum_j 0.9^(6-j) g_j, off by at most 4.69 x 5.5e-4 = 2.6e-3; a parameter
# adds lr x the slot each step, sum over steps 0.05 x 17.8 = 0.89, off by at
# most 4.9e-4. That is to first order: the changed parameters change later
# gradients too, so the tolerances are 4x those bounds. A wrong aggregation
# (a sum for a mean, a missing contributor) is off by the gradient itself.
FLOAT16_ATOL_PARAMETERS = 2e-3
FLOAT16_ATOL_SLOTS = 1e-2


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    return single_device_runs(tmp_path_factory, "--steps", str(STEPS), "--batch", str(BATCH))


def _run(model, tmp_path, *extra):
    out = tmp_path / "dist"
    spec = write_two_host_spec(tmp_path, workers=(2, 2), servers=(1, 1))
    log = run_training(model, out, "--steps", str(STEPS), "--batch", str(BATCH),
                       "--spec", str(spec), "--run-option", "herring", *extra)
    assert "herring buffer #0" in log   # the report: the dense gradients travel by herring
    for i in range(WORKERS):
        assert f"[worker {i}] worker {i} done at global step {STEPS}" in log
    return out


@pytest.mark.parametrize("model", CASES)
def test_matches_single_device(model, tmp_path, single_device):
    expected = single_device(model)
    out = _run(model, tmp_path)
    for i in range(WORKERS):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"{model} herring worker {i}/{WORKERS}")


def test_float16_wire_within_its_rounding(tmp_path, single_device):
    expected = single_device("cnn_momentum")
    out = _run("cnn_momentum", tmp_path, "--wire-dtype", "float16")
    slots = {name for name in expected if name.endswith("/Momentum")}
    for i in range(WORKERS):
        actual = load_worker(out, i)
        for names, atol in ((slots, FLOAT16_ATOL_SLOTS), (set(expected) - slots,
                                                          FLOAT16_ATOL_PARAMETERS)):
            assert_same_parameters({n: expected[n] for n in names},
                                   {n: actual[n] for n in names}, rtol=1e-5, atol=atol,
                                   what=f"cnn_momentum herring float16 worker {i}/{WORKERS}")
