"""Config(tensorboard_dir=...): the chief's event file holds, at every logged
step, the loss, examples/s, seconds per step, the plan's bytes per step for
each method and DropCompute's threshold and drop rate, and the plan report
as text; read back with TensorBoard's own event reader, and served by the
real TensorBoard over HTTP."""
from __future__ import annotations

import sys

from tensorboard.backend.event_processing import event_accumulator

from tests.integration.cluster import run_training, write_spec
from tests.tensorboard_http import TensorBoard

STEPS = 6


def test_the_chief_writes_every_scalar_at_every_logged_step(tmp_path):
    board = tmp_path / "board"
    board.mkdir()
    # The real TensorBoard of this environment, started beside the job.
    tensorboard = TensorBoard(sys.executable, board)
    # Micro-batches with a fixed compute threshold: DropCompute's values too.
    with tensorboard:
        run_training("mlp_sgd", tmp_path / "out", "--steps", str(STEPS), "--micro-batches", "2",
                     "--threshold", "30", "--spec", str(write_spec(tmp_path, workers=2)),
                     "--tensorboard-dir", str(board))
        served = tensorboard.scalars("autopar/loss", at_least=STEPS)
    files = list(board.glob("events.out.tfevents.*"))
    assert len(files) == 1, files   # the chief's alone
    events = event_accumulator.EventAccumulator(
        str(board), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"autopar/loss", "autopar/examples_per_second", "autopar/seconds_per_step",
                "autopar/bytes_sent_per_step/allreduce",
                "autopar/bytes_received_per_step/allreduce",
                "autopar/dropcompute/drop_rate", "autopar/dropcompute/tau_seconds",
                "autopar/stall_warnings"}
    assert expected <= tags, tags
    for tag in expected:
        steps = [e.step for e in events.Scalars(tag)]
        assert steps == list(range(1, STEPS + 1)), (tag, steps)
    assert all(e.value > 0 for e in events.Scalars("autopar/bytes_sent_per_step/allreduce"))
    assert all(e.value == 30.0 for e in events.Scalars("autopar/dropcompute/tau_seconds"))
    assert all(e.value == 0.0 for e in events.Scalars("autopar/dropcompute/drop_rate"))
    assert all(e.value == 0.0 for e in events.Scalars("autopar/stall_warnings"))
    losses = [e.value for e in events.Scalars("autopar/loss")]
    assert all(0 < loss < 10 for loss in losses), losses
    # The plan report, as text.
    plan = events.Tensors("autopar/plan")
    assert len(plan) == 1 and b"autopar plan: 2 workers" in plan[0].tensor_proto.string_val[0]
    # The real TensorBoard served the losses over HTTP (tensorboard < 2.21
    # with setuptools >= 81 did not start: no pkg_resources).
    assert served == [(e.step, e.value) for e in events.Scalars("autopar/loss")], served


def test_a_stall_warning_is_logged_and_counted_before_the_job_would_end(tmp_path):
    board = tmp_path / "board"
    # Worker 1 sleeps 6 s before step 4 (busy: it still reports); worker 0
    # waits inside it. The launcher warns at half the 8 s stall timeout (then
    # every 8 s while it waits), and the job goes on.
    log = run_training("mlp_sgd", tmp_path / "out", "--steps", str(STEPS), "--stall-at", "3",
                       "--stall-for", "6", "--stall-timeout", "8",
                       "--spec", str(write_spec(tmp_path, workers=2)),
                       "--tensorboard-dir", str(board))
    warnings = [line for line in log.splitlines() if "inside step 4 for worker 1 to join it" in line]
    assert len(warnings) == 1, log       # once per step
    assert "worker 0 has waited" in warnings[0] and "it is busy outside a step" in warnings[0]
    events = event_accumulator.EventAccumulator(
        str(board), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    counts = {e.step: e.value for e in events.Scalars("autopar/stall_warnings")}
    assert counts == {1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1}, counts
