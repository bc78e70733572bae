"""Every Config field is validated, types first, with a message naming the
field; a bad Config ends a script (and a launched job) as `autopar: ...`,
exit status 2, without a traceback."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar.common.errors import AutoparError

REPO = Path(__file__).resolve().parents[2]

BAD = [
    ("fusion_bytes", "big"), ("fusion_bytes", 0), ("fusion_bytes", 1.5), ("fusion_bytes", True),
    ("communication_hint", "nccl"), ("communication_hint", 1),
    ("checkpoint_dir", ""), ("checkpoint_dir", 3), ("tensorboard_dir", ""), ("tensorboard_dir", 3),
    ("max_restarts", -1), ("max_restarts", 1.5), ("max_restarts", None),
    ("save_every_steps", 0), ("save_every_steps", "10"),
    ("keep_checkpoints", 0), ("keep_checkpoints", None),
    ("log_every_steps", -1), ("log_every_steps", 2.0),
    ("total_steps", 0), ("total_steps", "100"),
    ("startup_timeout_s", 0), ("startup_timeout_s", math.nan), ("startup_timeout_s", math.inf),
    ("startup_timeout_s", "60"),
    ("run_option", "nope"), ("run_option", None), ("run_option", ["ps"]),
    ("wire_dtype", "int8"),
    ("herring_buffer_bytes", 0), ("herring_buffer_bytes", "1MB"),
    ("sync_local_state", "sum"),
    ("batch_norm_group", 0), ("batch_norm_group", "some"), ("batch_norm_group", True),
    ("aggregation_group", -1), ("aggregation_group", "2"), ("aggregation_group", 2.0),
    ("shard_weight_update", "yes"), ("hierarchical_allreduce", 1),
    ("local_aggregation", None), ("opau", 0), ("opsw", "no"),
    ("partitions", ["embedding"]), ("partitions", {"embedding": 0}), ("partitions", {1: 2}),
    ("stall_timeout_s", math.nan), ("stall_timeout_s", math.inf), ("stall_timeout_s", -1),
    ("stall_timeout_s", "60"),
    ("micro_batches", 0), ("micro_batches", "4"), ("micro_batches", 2.0),
    ("micro_batches", 1_000_000_000), ("partitions", {"embedding": 1_000_000_000}),
    ("min_workers", 2),     # without max_restarts: it would never apply
    ("compute_threshold", math.nan), ("compute_threshold", 0), ("compute_threshold", "fast"),
    ("dropcompute_warmup", 5), ("dropcompute_warmup", (5, 5)), ("dropcompute_warmup", (1, 2, 3)),
    ("drop_compensation", "more"),
    ("simulated_delay", 0.5),
    ("dropcompute_log_dir", 7),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_every_bad_value_is_an_autopar_error_naming_its_field(field, value):
    with pytest.raises(AutoparError, match=rf"^Config\.{field}\b") as info:
        autopar.Config(**{field: value})
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("field, value", [
    ("median_s", math.nan), ("median_s", 0), ("sigma", -1), ("max_s", math.inf),
    ("max_s", "1"), ("seed", 1.5), ("workers", [0, -1]), ("workers", "0")])
def test_bad_simulated_delay_is_named(field, value):
    with pytest.raises(AutoparError, match=rf"^SimulatedDelay\.{field}\b"):
        autopar.SimulatedDelay(**{field: value})


def test_good_values_are_kept():
    config = autopar.Config(checkpoint_dir=Path("/tmp/x"), stall_timeout_s=0, total_steps=10,
                            compute_threshold="auto", micro_batches=2, batch_norm_group=None,
                            dropcompute_warmup=[1, 3], partitions={"embedding": 2},
                            herring_buffer_bytes=1 << 20, startup_timeout_s=5)
    assert config.checkpoint_dir == "/tmp/x" and config.dropcompute_warmup == (1, 3)
    assert autopar.Config(loss_reduction="parallax").loss_reduction == "parallax"


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import autopar\n" + body + "\nprint('not reached')\n")
    return path


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOPAR_DEBUG"}
    return {**env, "PYTHONPATH": str(REPO), **extra}


@pytest.mark.slow
def test_a_bad_config_ends_the_script_with_its_message_not_a_traceback(tmp_path):
    script = _script(tmp_path, "autopar.Config(run_option='nope')")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("autopar: Config.run_option must be 'hybrid', 'ps', 'allreduce' or "
                           "'herring', got 'nope'\n")
    debug = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=_env(AUTOPAR_DEBUG="1"), timeout=60)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


@pytest.mark.slow
def test_a_misspelled_keyword_is_named_with_the_field_it_may_mean(tmp_path):
    with pytest.raises(AutoparError, match=r"^Config has no field 'max_restart' \(did you mean "
                                           r"'max_restarts'\?\)"):
        autopar.Config(max_restart=2)
    with pytest.raises(AutoparError, match=r"^SimulatedDelay has no field 'median'"):
        autopar.SimulatedDelay(median=0.1)
    # As a script meets it: one line, exit status 2, no traceback.
    done = subprocess.run([sys.executable, str(_script(tmp_path,
                                                       "autopar.Config(no_such_option=1)"))],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("autopar: Config has no field 'no_such_option' (did you mean "), \
        done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.slow
def test_a_bad_config_under_autopar_launch_is_refused_before_any_process_starts(tmp_path):
    """`autopar launch` compiles the plan in one run of the script, which
    meets the bad Config first: the launcher says the script's message,
    starts no process, and exits 2."""
    script = _script(tmp_path, "autopar.Config(fusion_bytes='big')")
    spec = tmp_path / "spec.yaml"
    spec.write_text("hosts:\n  - address: 127.0.0.1\n    workers: 1\n")
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "launch", "--spec", str(spec),
                           "--", sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(AUTOPAR_FORK_SERVER="0"), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith("autopar: Config.fusion_bytes must be an integer >= 1, got "
                                  "'big' (in the run of the command that compiles the job's plan; "
                                  "no process of the job started)"), done.stderr
    assert "started worker" not in done.stdout, done.stdout
