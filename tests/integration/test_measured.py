"""Config.measure_steps (runtime/measured.py): over its first steps the chief
measures the rows each sparse gradient carried, then logs and writes to
TensorBoard the bytes they moved beside the plan's estimate (an upper bound
for sparse gradients), and the bytes the job's processes really sent in its
private network namespace. The expected rows come from the batches the
chief fed, computed here."""
from __future__ import annotations

import re

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

from tests import models
from tests.integration.cluster import run_training, write_spec

MODEL, STEPS, BATCH, WORKERS, MEASURED = "emb_adam_clip", 8, 8, 2, 5


def test_the_chief_logs_measured_rows_and_bytes_beside_the_plans(tmp_path):
    board = tmp_path / "board"
    log = run_training(MODEL, tmp_path / "out", "--steps", str(STEPS), "--batch", str(BATCH),
                       "--run-option", "ps", "--measure-steps", str(MEASURED),
                       "--tensorboard-dir", str(board),
                       "--spec", str(write_spec(tmp_path, WORKERS, servers=1)))
    # The first step is not measured (it sends every process its graph):
    # steps 2..6, which train on the batches of global steps 1..5.
    assert f"measured over steps 2-{1 + MEASURED} (the chief's batches)" in log, log
    chief_ids = [models.global_batch(MODEL, step, BATCH)[0][:BATCH // WORKERS]
                 for step in range(1, 1 + MEASURED)]
    rows = np.mean([ids.size for ids in chief_ids]) / models.VOCAB
    distinct = np.mean([np.unique(ids).size for ids in chief_ids]) / models.VOCAB
    assert distinct < rows    # ids repeat in these batches: the two differ
    # The ids are fed (no static batch size): the plan assumes every row.
    match = re.search(r"embedding: a = ([0-9.]+) of its rows per step, ([0-9.]+) distinct "
                      r"\(ps moves one row per distinct id\); the plan's a unknown before "
                      r"running \(1 assumed\)", log)
    assert match, log
    assert abs(float(match[1]) - rows) < 1e-4 and abs(float(match[2]) - distinct) < 1e-4, log
    assert re.search(r"ps \(dense, sparse\): sent .*; the plan's \(an upper bound\)", log), log
    network = re.search(r"the job's network \(its private loopback, every process\): "
                        r"[0-9.]+ [KM]?B sent per step", log)
    assert network, log

    events = event_accumulator.EventAccumulator(
        str(board), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()

    def value(tag: str) -> float:
        [event] = events.Scalars(tag)
        assert event.step == 1 + MEASURED
        return event.value

    assert abs(value("autopar/measured/alpha/embedding") - rows) < 1e-6
    assert abs(value("autopar/measured/alpha_distinct/embedding") - distinct) < 1e-6
    # Every variable is on the server; only the embedding's bytes depend on
    # its rows: the plan's estimate exceeds the measured bytes by the rows
    # that did not travel.
    planned = events.Scalars("autopar/bytes_sent_per_step/ps")[0].value
    measured = value("autopar/measured/bytes_sent/ps")
    embedding_bytes = models.VOCAB * 6 * models.model_dtype(MODEL).size
    assert abs((planned - measured) - (1 - distinct) * embedding_bytes) < 1e-3 * planned
    # The wire carries at least what the plan counts, protocol on top.
    job = value("autopar/measured/job_network_bytes")
    assert job > WORKERS * measured, (job, measured)
