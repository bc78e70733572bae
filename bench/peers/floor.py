"""The compute-only floor: the N worker processes of a run, each training the
workload's single-device graph on its own batch, with the aggregation removed.

Every worker runs in its host's network namespace, like the other peers'
workers, and steps at the same barriers, so the N processes share the
machine's cores exactly as a distributed run's workers do — but they never
communicate: each applies its own gradients locally. Its step time is what a
step costs when communication is free and the CPU is shared as in the real
run; bench/metrics.py holds every system to max(this floor, bytes / link
rate). Worker w trains on worker w's batches, so worker 0's final loss is the
reference run's `local_only_loss` (the harness checks that: the floor trains
the same model the other peers do).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peers import common  # noqa: E402


def run(job: common.Job) -> None:
    common.quiet_tensorflow()
    import tensorflow as tf
    from bench.peers import graph_model

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    model = graph_model.build(job.workload)
    eval_feed = model.eval_feed(job.workload.eval_batch())
    with tf1.Session(graph=model.graph) as sess:
        sess.run(tf1.global_variables_initializer())
        common.run_training(
            job,
            step=lambda k: sess.run(model.train_op, feed_dict=model.feed(job.batch(k))),
            evaluate=lambda: sess.run(model.eval_loss, feed_dict=eval_feed),
            tensorflow=tf.__version__)


if __name__ == "__main__":
    common.main_wrapper(run)
