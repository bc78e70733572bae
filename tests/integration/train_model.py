"""Train one of tests/models.py for a number of global steps, single-device or
(with --spec) under autopar, and save every global variable of every worker.

Worker i of N feeds rows [i*B/N, (i+1)*B/N) of the global batch of the step
it is at, so the N workers together see exactly the single-device batch.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402
from tests import models  # noqa: E402

tf1 = tf.compat.v1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=12, help="global batch")
    p.add_argument("--out", required=True)
    p.add_argument("--spec")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--stall-at", type=int, default=-1,
                   help="a worker sleeps forever at this global step (for kill tests)")
    p.add_argument("--stall-worker", type=int, default=1, help="which worker --stall-at stalls")
    p.add_argument("--fewer-steps", choices=("exit", "sleep"),
                   help="worker 1 runs one step fewer, then exits 0, or closes its Runner and "
                        "sleeps (for step-count mismatch tests)")
    p.add_argument("--stall-timeout", type=float, default=60.0, help="Config.stall_timeout_s")
    p.add_argument("--keep", type=int, default=5, help="checkpoints to keep")
    p.add_argument("--pause-at", type=int, default=-1,
                   help="the chief waits at this global step until a stop is requested "
                        "(for Ctrl-C tests)")
    p.add_argument("--fusion-bytes", type=int, default=64 << 20)
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--no-la", action="store_true", help="turn local aggregation off")
    p.add_argument("--partitions", default="", help="NAME=N,... partition overrides")
    p.add_argument("--sync-local-state", default="none")
    p.add_argument("--wire-dtype", default="float32", help="Config.wire_dtype (herring)")
    args = p.parse_args()
    # Eager execution stays on (TF2 default): graphs are built in their own
    # tf.Graph context, as many graph-mode scripts do.

    model = models.build(args.model)
    config = autopar.Config(checkpoint_dir=args.checkpoint_dir, save_every_steps=args.save_every,
                            keep_checkpoints=args.keep,
                            log_every_steps=1, fusion_bytes=args.fusion_bytes,
                            stall_timeout_s=args.stall_timeout,
                            run_option=args.run_option, local_aggregation=not args.no_la,
                            sync_local_state=args.sync_local_state, wire_dtype=args.wire_dtype,
                            partitions={k: int(n) for k, n in
                                        (kv.split("=") for kv in args.partitions.split(",") if kv)})
    with autopar.get_runner(model.graph, args.spec, config) as runner:
        n, i = runner.num_workers, runner.worker_index
        print(f"worker {i} pid {os.getpid()}", flush=True)
        per = args.batch // n
        while True:
            step = int(runner.run(model.global_step))
            if step >= args.steps:
                break
            if args.fewer_steps and i == 1 and step >= args.steps - 1:
                print(f"worker {i} stops after {step} steps", flush=True)
                runner.close()
                if args.fewer_steps == "sleep":
                    time.sleep(3600)
                return
            if step == args.pause_at and i == 0:
                print(f"worker {i} pausing at step {step}", flush=True)
                deadline = time.monotonic() + 120
                while not runner.stop_requested and time.monotonic() < deadline:
                    time.sleep(0.05)
            if step == args.stall_at and i == args.stall_worker:
                print(f"worker {i} stalling at step {step}", flush=True)
                time.sleep(3600)
            x, y = models.global_batch(args.model, step, args.batch)
            mine = slice(i * per, (i + 1) * per)
            runner.run(model.train_op, models.feed(model, x[mine], y[mine]))
        with model.graph.as_default():
            variables = tf1.global_variables()
        values = runner.run({v.op.name: v for v in variables})
        if runner.is_chief:
            # Predictions of the trained model on a fixed batch, for comparisons.
            x, y = models.global_batch(args.model, 99, args.batch)
            print(f"eval loss: {float(runner.run(model.loss, models.feed(model, x, y))):.9g}",
                  flush=True)
        if runner.is_chief and "autopar/contributions" in {op.name for op in runner.graph.get_operations()}:
            counts = runner.run("autopar/contributions:0")
            print(f"contributions per accumulator per step: {[int(c) // args.steps for c in counts]}",
                  flush=True)
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker{i}.npz"), **values)
        print(f"worker {i} done at global step {int(values['global_step'])}", flush=True)


if __name__ == "__main__":
    main()
