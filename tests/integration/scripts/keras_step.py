"""Train a tests/programs/keras_step.py model with its custom tf.function
step: --reference calls the tf.function itself (one device, no autopar);
otherwise the step's ConcreteFunction runs through autopar.get_runner (with
--spec on every worker, each feeding rows [i*B/N, (i+1)*B/N) of the step's
global batch; --uneven-last: the last step's global batch is one larger,
split 3/2/2 over 3 workers, as a dataset's last batch is). Saves the Keras
model's and optimizer's variables as the Python objects hold them
afterwards."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402

import autopar  # noqa: E402
from tests.programs import keras_step  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="emb_mlp")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=6, help="global batch")
    p.add_argument("--out", required=True)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--reference", action="store_true")
    p.add_argument("--batch-norm-group", default="auto",
                   help="Config.batch_norm_group ('auto', 'all' or a size)")
    p.add_argument("--micro-batches", type=int, default=1, help="Config.micro_batches")
    p.add_argument("--aggregation-group", type=int, help="Config.aggregation_group")
    p.add_argument("--partitions", default="", help="Config.partitions: NAME=N,...")
    p.add_argument("--uneven-last", action="store_true",
                   help="the last step's global batch is --batch + 1, split unevenly")
    p.add_argument("--decay-lr", action="store_true",
                   help="assign the learning rate from Python before each step, lr0 / (k + 1)")
    args = p.parse_args(argv)
    program = keras_step.build(args.model, args.optimizer, args.dtype)
    lr0 = float(program.optimizer.learning_rate.numpy()) if args.decay_lr else None

    def decay(k: int) -> None:   # as a custom loop decays its learning rate
        if args.decay_lr:
            program.optimizer.learning_rate.assign(lr0 / (k + 1))
    def global_batch(k: int) -> int:
        return args.batch + 1 if args.uneven_last and k == args.steps - 1 else args.batch
    if args.reference:
        for k in range(args.steps):
            decay(k)
            program.train_step(*program.batch(k, global_batch(k)))
        index = 0
    else:
        runner = autopar.get_runner(program.concrete, args.spec,
                                    autopar.Config(run_option=args.run_option, log_every_steps=1,
                                                   batch_norm_group=_group(args.batch_norm_group),
                                                   micro_batches=args.micro_batches,
                                                   aggregation_group=args.aggregation_group,
                                                   partitions={k: int(n) for k, n in (
                                                       kv.split("=")
                                                       for kv in args.partitions.split(",")
                                                       if kv)},
                                                   **program.config))
        n, index = runner.num_workers, runner.worker_index
        for k in range(args.steps):
            decay(k)
            x, y = program.batch(k, global_batch(k))
            rows = np.array_split(np.arange(global_batch(k)), n)[index]
            runner.call(x[rows], y[rows])
        runner.close()   # gives the Python variables the trained values
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"worker{index}.npz"),
             **{path: v.numpy() for path, v in program.variables().items()})
    print(f"worker {index} done", flush=True)


def _group(value: str | None):
    return int(value) if value and value.isdigit() else value


if __name__ == "__main__":
    main()
