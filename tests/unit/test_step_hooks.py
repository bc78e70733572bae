"""The Runner's step loop (runtime/step/): every hook hears each run, in
order before it and in the reverse order after it; a training step is told
apart from other runs and counts the global step; a stop request is carried
out at a step's boundary; a worker's hooks come in their order."""
from __future__ import annotations

import signal

import numpy as np
import pytest
import tensorflow as tf

from autopar.runtime.runner import Runner
from autopar.runtime.step import hooks as step_hooks_module
from autopar.runtime.step.hook import RunHook
from autopar.runtime.step.stop import StopHook, TrainingStopped
from autopar.transforms.analysis import analyze_graph

tf1 = tf.compat.v1


class Recording(RunHook):
    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def begin(self, runner):
        self.calls.append(("begin", self.name))

    def after_create_session(self, session):
        self.calls.append(("after_create_session", self.name))

    def after_start(self, first_step):
        self.calls.append(("after_start", self.name, first_step))

    def before_run(self, run):
        self.calls.append(("before_run", self.name, run.is_step, run.step))

    def after_run(self, run):
        self.calls.append(("after_run", self.name, run.is_step, run.step, run.examples,
                           "loss" in run.got))

    def end(self, session):
        self.calls.append(("end", self.name))

    def closed(self):
        self.calls.append(("closed", self.name))


def _model():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
        loss = tf.reduce_mean(tf.matmul(x, w))
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        init = tf1.global_variables_initializer()
    return graph, x, loss, train, init


def _runner(hooks):
    graph, x, loss, train, init = _model()
    runner = Runner(tf1.Session(graph=graph), graph, analyze_graph(graph), hooks=hooks)
    runner.start(init)
    return runner, x, loss, train


def test_hooks_hear_every_run_in_order_before_and_in_reverse_after():
    calls: list = []
    runner, x, loss, train = _runner([Recording("a", calls), Recording("b", calls)])
    feed = {x: np.ones([4, 3], np.float32)}
    runner.run(loss, feed)
    runner.run(train, feed)
    runner.run(train, feed)
    runner.close()
    assert calls == [
        ("begin", "a"), ("begin", "b"),
        ("after_create_session", "a"), ("after_create_session", "b"),
        ("after_start", "a", 0), ("after_start", "b", 0),
        # a run that updates nothing: the global step reached
        ("before_run", "a", False, 0), ("before_run", "b", False, 0),
        ("after_run", "b", False, 0, None, False), ("after_run", "a", False, 0, None, False),
        # training steps: the global step each makes, its examples, its loss
        ("before_run", "a", True, 1), ("before_run", "b", True, 1),
        ("after_run", "b", True, 1, 4, True), ("after_run", "a", True, 1, 4, True),
        ("before_run", "a", True, 2), ("before_run", "b", True, 2),
        ("after_run", "b", True, 2, 4, True), ("after_run", "a", True, 2, 4, True),
        ("end", "b"), ("end", "a"), ("closed", "b"), ("closed", "a")]


def test_a_requested_stop_ends_training_at_the_next_step():
    stop = StopHook(worker_index=1)           # (no signal handler of its own to install)
    runner, x, loss, train = _runner([stop])
    feed = {x: np.ones([4, 3], np.float32)}
    runner.run(train, feed)
    stop._request(signal.SIGTERM)
    assert runner.stop_requested
    assert np.isfinite(runner.run(loss, feed))   # not a step: runs
    with pytest.raises(TrainingStopped) as stopped:
        runner.run(train, feed)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert runner.global_step == 1
    runner.close()


def test_a_workers_hooks_come_in_their_order():
    names = lambda hooks: [type(h).__name__ for h in hooks]   # noqa: E731
    every = step_hooks_module.step_hooks(0, reports=object(), checkpointer=object(),
                                         progress=object(), timeline=object(), meter=object())
    assert names(every) == ["CoordinatorReportHook", "StopHook", "UnequalBatchHook",
                            "CheckpointHook", "ProgressLogHook", "TimelineHook", "MeterHook"]
    # An accumulated step: DropCompute's record, no measured bytes, no unequal-batch check.
    accumulated = step_hooks_module.step_hooks(1, meter=object(), dropcompute=object())
    assert names(accumulated) == ["StopHook", "DropComputeHook"]
