"""tf.summary writes inside a traced step (as TensorFlow's pix2pix tutorial
writes its losses): the lifted graph has no writer, and the Runner writes
what each write reads to the Python writer after the step. Before: refused
(`captures the resource ..., which is not a tf.Variable`)."""
import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.lift import SUMMARY_WRITES, lift
from tests.programs.summary_step import batches, build, events


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    for var in ("AUTOPAR_ROLE", "TF_CONFIG", "AUTOPAR_DEBUG"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_a_steps_summaries_are_written_as_the_function_writes_them(tmp_path):
    step, _ = build(tmp_path / "eager")
    for batch in batches():
        step(*batch)
    step.writer.close()
    expected = events(tmp_path / "eager")
    assert [(s, tag) for s, tag, _ in expected] == [
        (1, "loss"), (0, "kernel"), (2, "loss"), (10, "kernel"), (3, "loss"), (20, "kernel")]

    step, concrete = build(tmp_path / "lifted")
    assert not [op for op in lift(concrete).graph.get_operations()
                if op.type in SUMMARY_WRITES or op.type == "FlushSummaryWriter"]
    with autopar.get_runner(concrete, None, autopar.Config(log_every_steps=0)) as runner:
        losses = [runner.call(*batch) for batch in batches()]
    step.writer.close()
    got = events(tmp_path / "lifted")
    assert [(s, tag) for s, tag, _ in got] == [(s, tag) for s, tag, _ in expected]
    for (_, tag, value), (_, _, want) in zip(got, expected):
        np.testing.assert_allclose(value, want, rtol=1e-6, err_msg=tag)
    # the loss written is the one the call returns
    np.testing.assert_array_equal([v for _, tag, v in got if tag == "loss"], losses)


def test_summaries_under_a_condition_are_refused_by_name(tmp_path):
    _, concrete = build(tmp_path, record_if=lambda k: tf.equal(k % 20, 0))
    with pytest.raises(UnsupportedGraphError, match="summary writer used inside a condition"):
        lift(concrete)


def test_summaries_with_micro_batches_are_refused(tmp_path, capsys):
    """A step of several micro-batch runs has no one run whose values the
    summaries could take (a distributed run wrote them at steps 2, 5, 8)."""
    _, concrete = build(tmp_path)
    with pytest.raises(SystemExit) as ended:
        autopar.get_runner(concrete, None, autopar.Config(micro_batches=2))
    assert ended.value.code == 2
    assert "writes tf.summary records" in capsys.readouterr().err
