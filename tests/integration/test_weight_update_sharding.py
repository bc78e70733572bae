"""Weight-update sharding (Config(shard_weight_update=True)), 3 workers on 2
hosts, Adam with clipping by global norm, in one job that also covers the
checkpoint round trip: it starts from a plain tf.compat.v1.train.Saver
checkpoint written single-device after 3 steps (the slots restored onto
their owners), trains to step 6 and ends equal to 6 single-device steps on
the same global batches; its own final checkpoint (slots saved whole by the
chief from their owners) restores into the plain Saver graph with every
value, slots included, equal to the job's."""
import re
import sys

import numpy as np

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.wus import slot_bytes_per_worker
from tests import models
from tests.integration.cluster import (REPO, assert_same_parameters, load_worker, run_script,
                                       run_training, write_two_host_spec)

MODEL = "mlp_adam_clip"
SCRIPT = REPO / "tests" / "integration" / "saver_compat.py"


def _saver(mode, ckpt, out):
    run_script([sys.executable, str(SCRIPT), mode, str(ckpt), str(out), MODEL], timeout=120)
    with np.load(out) as data:
        return {k: data[k] for k in data.files if k != "__loss__"}


def _resident_slots(log: str, worker: int) -> dict[str, int]:
    line = re.search(rf"worker {worker} resident: (\S*)", log).group(1)
    pairs = (item.split("=") for item in line.split(",") if item)
    return {name: int(size) for name, size in pairs if "/Adam" in name}


def test_sharded_adam_clip_matches_single_device_and_checkpoints_round_trip(tmp_path):
    run_training(MODEL, tmp_path / "single", "--steps", "6", "--batch", "12")
    expected = load_worker(tmp_path / "single", 0)
    ckpt = tmp_path / "ckpt"
    _saver("save", ckpt, tmp_path / "saved.npz")     # plain Saver, 3 steps
    log = run_training(MODEL, tmp_path / "dist", "--steps", "6", "--batch", "12",
                       "--spec", str(write_two_host_spec(tmp_path, servers=(0, 0))),
                       "--run-option", "allreduce", "--shard-weight-update",
                       "--checkpoint-dir", str(ckpt), "--save-every", "2", "--resident")
    assert re.search(r"restored .*model\.ckpt-3 \(global step 3\)", log), log[-3000:]
    owners = {int(w) for w in re.findall(r"updated by worker (\d)", log)}
    assert owners == {0, 1, 2}, log[-3000:]
    assert re.search(r"worker 2: updates \d variable\(s\), holds [\d.]+ \w+ of optimizer slots", log)
    # Slot memory, measured: the Adam slots allocated on each worker's device
    # are those of the variables it owns, each slot exists once in the job.
    slots = [_resident_slots(log, i) for i in range(3)]
    analysis = analyze_graph(models.build(MODEL).graph)
    plan = make_plan(analysis, 3, options=PlanOptions(run_option="allreduce",
                                                      shard_weight_update=True))
    assert [sum(s.values()) for s in slots] == slot_bytes_per_worker(analysis, plan)
    every = {s for v in analysis.variables for s in v.slots}
    assert sorted(n for s in slots for n in s) == sorted(every)
    assert max(sum(s.values()) for s in slots) < 0.7 * sum(sum(s.values()) for s in slots)
    for i in range(3):
        actual = load_worker(tmp_path / "dist", i)
        assert int(actual["global_step"]) == 6
        assert_same_parameters(expected, actual, what=f"sharded worker {i}")
    trained = load_worker(tmp_path / "dist", 0)
    restored = _saver("restore", ckpt, tmp_path / "restored.npz")
    assert set(restored) == set(trained)
    assert any(name.endswith("/Adam_1") for name in restored)
    for name, value in trained.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)

