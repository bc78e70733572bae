"""Single-device reference runs: the loss every distributed peer must reproduce.

For each worker count N it trains the workload on one device for the same
number of steps with the global batch (the N workers' batches of each step
concatenated), then evaluates the loss on the fixed evaluation batch. It also
trains on worker 0's batches alone (what a worker that never communicates
would compute) so the harness can show its tolerance would catch such a peer,
and, for models with an embedding, the loss when the workers' sparse gradients
are summed instead of averaged (what TensorFlow's SyncReplicasOptimizer applies).

    python bench/peers/reference.py --job JOB.json     # prints one BENCH_RESULT line per N
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import models  # noqa: E402
from bench.peers import common  # noqa: E402

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

from bench.peers import graph_model  # noqa: E402

tf1 = tf.compat.v1


def train(workload: models.Workload, num_workers: int, total_steps: int, only_worker: int | None = None,
          sparse_sum: bool = False):
    """Loss on the eval batch after `total_steps` of SGD on the global batch of
    `num_workers` workers (or on worker `only_worker`'s batch alone). With
    `sparse_sum` the embedding (IndexedSlices) gradients of the workers are
    summed instead of averaged, dense ones still averaged: what TensorFlow's
    SyncReplicasOptimizer ends up applying (see bench/README.md)."""
    n = 1 if only_worker is not None else num_workers

    def wrap(opt):
        return _SparseScaled(opt, float(num_workers)) if sparse_sum else opt
    model = graph_model.build(replace(workload, batch=workload.batch * n), wrap_optimizer=wrap)
    with tf1.Session(graph=model.graph) as sess:
        sess.run(tf1.global_variables_initializer())
        initial = float(sess.run(model.eval_loss, model.eval_feed(workload.eval_batch())))
        for k in range(total_steps):
            batch = (workload.batch_for(k, only_worker) if only_worker is not None
                     else workload.global_batch(k, num_workers))
            sess.run(model.train_op, model.feed(batch))
        final = float(sess.run(model.eval_loss, model.eval_feed(workload.eval_batch())))
    return initial, final


class _SparseScaled(tf1.train.Optimizer):
    """Wraps an optimizer, multiplying IndexedSlices gradients by `scale`."""

    def __init__(self, opt, scale: float):
        super().__init__(use_locking=False, name="SparseScaled")
        self._opt, self._scale = opt, scale

    def compute_gradients(self, *args, **kwargs):
        out = []
        for g, v in self._opt.compute_gradients(*args, **kwargs):
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(g.values * self._scale, g.indices, g.dense_shape)
            out.append((g, v))
        return out

    def apply_gradients(self, *args, **kwargs):
        return self._opt.apply_gradients(*args, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    args = p.parse_args()
    job = json.loads(Path(args.job).read_text())
    common.start_watchdog(float(job["deadline_s"]))
    tf1.disable_eager_execution()
    try:
        for item in job["workloads"]:
            workload = models.from_dict(item["workload"])
            total = int(item["warmup"]) + int(item["steps"])
            for n in item.get("num_workers", job["num_workers"]):
                t0 = time.perf_counter()
                initial, loss = train(workload, n, total)
                _, local = train(workload, n, total, only_worker=0)
                record = {"peer": "reference", "workload": workload.name, "num_workers": n,
                          "steps_trained": total, "initial_loss": initial, "loss": loss,
                          "local_only_loss": local}
                floor_total = int(item.get("floor_total", total))
                if floor_total != total:
                    # the floor peer trains more steps than the others (bench/run.py: floor_steps)
                    record["floor_steps_trained"] = floor_total
                    record["floor_local_only_loss"] = train(workload, n, floor_total, only_worker=0)[1]
                if workload.sparse_bytes:
                    record["sparse_summed_loss"] = train(workload, n, total, sparse_sum=True)[1]
                record["seconds"] = time.perf_counter() - t0
                print(f"{common.RESULT} " + json.dumps(record), flush=True)
    except BaseException as exc:   # noqa: BLE001 - report, exit non-zero
        common.emit_error(None, exc)
        common.exit_now(1)
    common.exit_now(0)


if __name__ == "__main__":
    main()
