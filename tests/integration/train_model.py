"""Train one of tests/models.py for a number of global steps, single-device or
(with --spec) under autopar, and save every global variable of every worker.

Worker i of N feeds rows [i*B/N, (i+1)*B/N) of the global batch of the step
it is at, so the N workers together see exactly the single-device batch.
"""
import argparse
import ast
import dataclasses
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import autopar  # noqa: E402 - first: TensorFlow then starts quiet (common/quiet.py)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import models  # noqa: E402

tf1 = tf.compat.v1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=12, help="global batch")
    p.add_argument("--out", required=True)
    p.add_argument("--spec")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--stall-at", type=int, default=-1,
                   help="a worker sleeps at this global step (for kill and stall tests)")
    p.add_argument("--stall-worker", type=int, default=1, help="which worker --stall-at stalls")
    p.add_argument("--stall-for", type=float, default=3600.0,
                   help="seconds --stall-at sleeps (default: for good)")
    p.add_argument("--stall-how", choices=("sleep", "stop"), default="sleep",
                   help="--stall-at sleeps (busy: the process still reports) or stops itself "
                        "(SIGSTOP: it stops reporting, as a hung or cut-off process)")
    p.add_argument("--chief-busy-at", type=int, default=-1,
                   help="the chief evaluates (forward passes, not training steps) for "
                        "--chief-busy-for seconds after this global step")
    p.add_argument("--chief-busy-for", type=float, default=0.0)
    p.add_argument("--raise-at", type=int, default=-1,
                   help="worker --stall-worker raises an exception at this global step "
                        "(for failure-report tests)")
    p.add_argument("--fewer-steps", choices=("exit", "sleep"),
                   help="worker 1 runs one step fewer, then exits 0, or closes its Runner and "
                        "sleeps (for step-count mismatch tests)")
    p.add_argument("--stall-timeout", type=float, default=60.0, help="Config.stall_timeout_s")
    p.add_argument("--busy-timeout", type=float, default=3600.0, help="Config.busy_timeout_s")
    p.add_argument("--keep", type=int, default=5, help="checkpoints to keep")
    p.add_argument("--pause-at", type=int, default=-1,
                   help="the chief waits at this global step until a stop is requested "
                        "(for Ctrl-C tests)")
    p.add_argument("--fusion-bytes", type=int, default=64 << 20)
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--no-la", action="store_true", help="turn local aggregation off")
    p.add_argument("--aggregation-group", type=int, default=None, help="Config.aggregation_group")
    p.add_argument("--chief-forward-alone", action="store_true",
                   help="after training the chief runs the forward pass while the others wait")
    p.add_argument("--partitions", default="", help="NAME=N,... partition overrides")
    p.add_argument("--sync-local-state", default="none")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--threshold", type=lambda v: v if v == "auto" else float(v), default=None,
                   help="Config.compute_threshold (seconds or auto)")
    p.add_argument("--warmup", default="5,50", help="Config.dropcompute_warmup FIRST,LAST")
    p.add_argument("--delay-sigma", type=float, default=0.0,
                   help="log-normal sigma of the simulated delay (0: fixed --delay)")
    p.add_argument("--delay-worker", type=int, default=-1,
                   help="this worker sleeps --delay s after each micro-batch (-1: every worker)")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--dropcompute-log")
    p.add_argument("--batch-norm-group", default="auto",
                   help="'auto' (Config's default), 'all', a group size or 'none'")
    p.add_argument("--shard-weight-update", action="store_true")
    p.add_argument("--hierarchical", choices=("auto", "on", "off"), default="auto",
                   help="Config.hierarchical_allreduce: None, True or False")
    p.add_argument("--allreduce-group", type=int, default=None, help="Config.allreduce_group")
    p.add_argument("--resident", action="store_true",
                   help="print the bytes of the variables allocated on this worker's device")
    p.add_argument("--eval-size", type=int, default=0,
                   help="evaluate the model (Runner.evaluate) on a sharded eval set of this "
                        "many examples before and after training, and print the totals")
    p.add_argument("--eval-metrics", default="accuracy,loss",
                   help="the metrics --eval-size evaluates (comma-separated)")
    p.add_argument("--wire-dtype", default="float32", help="Config.wire_dtype (herring)")
    p.add_argument("--tensorboard-dir", help="Config.tensorboard_dir")
    p.add_argument("--measure-steps", type=int, default=10, help="Config.measure_steps")
    p.add_argument("--max-restarts", type=int, default=0, help="Config.max_restarts")
    p.add_argument("--min-workers", type=int, default=0, help="Config.min_workers")
    p.add_argument("--timeline", help="Config.timeline")
    p.add_argument("--timeline-steps", type=int, default=10, help="Config.timeline_steps")
    p.add_argument("--timeline-every", type=int, default=10, help="Config.timeline_every")
    p.add_argument("--kill-at", type=int, default=-1,
                   help="worker --stall-worker kills itself (SIGKILL) at this global step, once "
                        "(a marker file beside --out keeps a restarted job from doing it again)")
    p.add_argument("--config-on-worker", default="",
                   help="I:OPTION=VALUE: worker I alone builds its Config with OPTION=VALUE "
                        "(a script whose Config depends on the process)")
    args = p.parse_args(argv)
    # Eager execution stays on (TF2 default): graphs are built in their own
    # tf.Graph context, as many graph-mode scripts do.

    model = models.build(args.model)
    if "unseeded" in args.model and not args.spec:
        # one device given the seeds autopar gives the workers' draws that
        # have none (transforms.random_draws): the job is compared with it
        from autopar.transforms.analysis import analyze_graph
        for name, seeds in analyze_graph(model.graph).shared_draws.items():
            for attr, value in zip(("seed", "seed2"), seeds):
                model.graph.get_operation_by_name(name)._set_attr(attr, tf1.AttrValue(i=value))
    evaluation = (_eval_metrics(model, args.eval_size, args.eval_metrics.split(","))
                  if args.eval_size else None)
    config = autopar.Config(checkpoint_dir=args.checkpoint_dir, save_every_steps=args.save_every,
                            keep_checkpoints=args.keep,
                            log_every_steps=1, fusion_bytes=args.fusion_bytes,
                            stall_timeout_s=args.stall_timeout,
                            busy_timeout_s=args.busy_timeout,
                            run_option=args.run_option, local_aggregation=not args.no_la,
                            aggregation_group=args.aggregation_group,
                            sync_local_state=args.sync_local_state, wire_dtype=args.wire_dtype,
                            micro_batches=args.micro_batches, compute_threshold=args.threshold,
                            dropcompute_log_dir=args.dropcompute_log,
                            tensorboard_dir=args.tensorboard_dir,
                            measure_steps=args.measure_steps,
                            max_restarts=args.max_restarts, min_workers=args.min_workers,
                            timeline=args.timeline, timeline_steps=args.timeline_steps,
                            timeline_every=args.timeline_every,
                            dropcompute_warmup=tuple(int(s) for s in args.warmup.split(",")),
                            simulated_delay=(autopar.SimulatedDelay(
                                median_s=args.delay, sigma=args.delay_sigma,
                                max_s=args.delay * (1 + 10 * args.delay_sigma),
                                workers=None if args.delay_worker < 0 else (args.delay_worker,))
                                if args.delay > 0 else None),
                            shard_weight_update=args.shard_weight_update,
                            hierarchical_allreduce={"auto": None, "on": True,
                                                    "off": False}[args.hierarchical],
                            allreduce_group=args.allreduce_group,
                            batch_norm_group=(None if args.batch_norm_group == "none" else
                                              args.batch_norm_group
                                              if args.batch_norm_group in ("all", "auto")
                                              else int(args.batch_norm_group)),
                            partitions={k: int(n) for k, n in
                                        (kv.split("=") for kv in args.partitions.split(",") if kv)})
    if args.config_on_worker:
        index, _, setting = args.config_on_worker.partition(":")
        option, _, value = setting.partition("=")
        if os.environ.get("AUTOPAR_ROLE") == "worker" and os.environ.get("AUTOPAR_TASK_INDEX") == index:
            config = dataclasses.replace(config, **{option: ast.literal_eval(value)})
    with autopar.get_runner(model.graph, args.spec, config) as runner:
        n, i = runner.num_workers, runner.worker_index
        print(f"worker {i} pid {os.getpid()}, parent {_title(os.getppid())}", flush=True)
        per = args.batch // n
        if evaluation is not None:
            _print_eval(runner, evaluation, "start")
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
            if step == args.kill_at and i == args.stall_worker and _first_time(args.out, "killed"):
                print(f"worker {i} killing itself at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.pause_at and i == 0 and _first_time(args.out, "paused"):
                print(f"worker {i} pausing at step {step}", flush=True)
                deadline = time.monotonic() + 120
                while not runner.stop_requested and time.monotonic() < deadline:
                    time.sleep(0.05)
            if step == args.raise_at and i == args.stall_worker:
                raise RuntimeError(f"injected failure at global step {step}")
            if step == args.stall_at and i == args.stall_worker:
                print(f"worker {i} stalling at step {step}", flush=True)
                if args.stall_how == "stop":
                    time.sleep(1.0)    # its state between steps reaches the coordinator first
                    os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(args.stall_for)
            if step == args.chief_busy_at and runner.is_chief:
                print(f"worker {i} evaluating after step {step}", flush=True)
                x, y = models.global_batch(args.model, 97, args.batch)
                deadline = time.monotonic() + args.chief_busy_for
                while time.monotonic() < deadline:
                    runner.run(model.loss, models.feed(model, x, y))
                    time.sleep(0.05)
            x, y = models.global_batch(args.model, step, args.batch)
            mine = slice(i * per, (i + 1) * per)
            runner.run(model.train_op, models.feed(model, x[mine], y[mine]))
        if evaluation is not None:
            _print_eval(runner, evaluation, "end")
        with model.graph.as_default():
            variables = tf1.global_variables()
        values = runner.run({v.op.name: v for v in variables})
        if runner.is_chief and args.aggregation_group is None:
            # Predictions of the trained model on a fixed batch, for comparisons.
            # (With aggregation groups the forward pass has collectives: the
            # chief cannot run it alone. Batch norm's run in training steps
            # only: alone, the chief normalises by the batch it is given.)
            x, y = models.global_batch(args.model, 99, args.batch)
            print(f"eval loss: {float(runner.run(model.loss, models.feed(model, x, y))):.9g}",
                  flush=True)
        if args.chief_forward_alone:
            if runner.is_chief:
                x, y = models.global_batch(args.model, 97, args.batch)
                runner.run(model.loss, models.feed(model, x, y))
            time.sleep(3 * args.stall_timeout)
        if args.aggregation_group is not None:
            # The group's lookups are its collectives: every worker runs the
            # forward pass (not a training step: it fetches their barriers).
            for k in (97, 98):
                x, y = models.global_batch(args.model, k, args.batch)
                print(f"worker {i} forward loss {k}: "
                      f"{float(runner.run(model.loss, models.feed(model, x, y))):.9g}", flush=True)
        if runner.is_chief and "autopar/contributions" in {op.name for op in runner.graph.get_operations()}:
            counts = runner.run("autopar/contributions:0")
            print(f"contributions per accumulator per step: {[int(c) // args.steps for c in counts]}",
                  flush=True)
        if args.resident:
            print(f"worker {i} resident: {_resident(runner, variables, i)}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker{i}.npz"), **values)
        print(f"worker {i} done at global step {int(values['global_step'])}", flush=True)


def _title(pid: int) -> str:
    """The title `ps` shows for process `pid` (its command line)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _first_time(out: str, what: str) -> bool:
    """True the first time a job writing to ``out`` asks (a marker file
    beside it), so a fault a restarted job would meet again fires once."""
    marker = f"{out.rstrip(os.sep)}.{what}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _resident(runner, variables, index: int) -> str:
    """NAME=BYTES,... of the resource variables that exist (are initialised)
    on this worker's own device: a handle with the variable's shared name in
    a separate session on the same server finds the resource only there."""
    graph = tf.Graph()
    device = f"/job:worker/replica:0/task:{index}/device:CPU:0"
    with graph.as_default(), tf.device(device):
        checks = {v.op.name: tf.raw_ops.VarIsInitializedOp(resource=tf.raw_ops.VarHandleOp(
            dtype=v.dtype.base_dtype, shape=v.shape, shared_name=v.op.name))
            for v in variables}
    config = tf1.ConfigProto(device_filters=[f"/job:worker/task:{index}"])
    with tf1.Session(runner.session.sess_str, graph=graph, config=config) as session:
        found = session.run(checks)
    return ",".join(f"{v.op.name}={v.shape.num_elements() * v.dtype.base_dtype.size}"
                    for v in variables if found[v.op.name])


EVAL_BATCH = 3   # per worker


def _eval_metrics(model, size: int, names=("accuracy", "loss")):
    """(iterator initializer, {name: (sum, count)}) of the metrics `names`
    over an eval set of `size` examples sharded with autopar.shard."""
    xs, ys = models.global_batch("mlp", 500, size)
    with model.graph.as_default():
        ds = autopar.shard(tf.data.Dataset.from_tensor_slices((xs, ys))).batch(EVAL_BATCH)
        iterator = tf1.data.make_initializable_iterator(ds)
        x, y = iterator.get_next()
        logits = model.forward(tf.cast(x, model.x.dtype))
        correct = tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.float64)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        metrics = {"accuracy": (tf.reduce_sum(correct), tf.size(y)),
                   "loss": (tf.reduce_sum(losses), tf.size(y))}
        return iterator.initializer, {name: metrics[name] for name in names}


def _print_eval(runner, evaluation, when: str) -> None:
    initializer, metrics = evaluation
    totals = runner.evaluate(metrics, initializer=initializer, totals=True)
    means = runner.evaluate(metrics, initializer=initializer)   # the set evaluated again
    print(f"eval {when}: {json.dumps(totals, sort_keys=True)} "
          f"{json.dumps(means, sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
