"""Run a program of tests/programs for its schedule of steps, single-device
(no --spec) or under autopar, and save every global variable of this worker.
Worker i of N feeds rows [i*B/N, (i+1)*B/N) of each step's global batch, so
the workers together see exactly the single-device batch. --uneven-step: one
more step before saving, of a global batch one larger, which does not split
evenly (single-device: the same step of the whole batch)."""
import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402
from tests.integration.scripts.v1_behavior import behave_as_tf1  # noqa: E402

tf1 = tf.compat.v1


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--program", required=True, help="a module of tests/programs")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=6, help="global batch")
    p.add_argument("--out", required=True)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--uneven-step", action="store_true",
                   help="one more step before saving, of a global batch one larger, split "
                        "unevenly (worker 0 one example more)")
    p.add_argument("--v1-behavior", action="store_true",
                   help="call tf.compat.v1.disable_v2_behavior() first, as TF1-era scripts do")
    p.add_argument("--resource-variables", action="store_true",
                   help="with --v1-behavior: the one-device reference (v1_behavior.py)")
    args = p.parse_args(argv)
    if args.v1_behavior:
        behave_as_tf1(args.resource_variables)
    program = importlib.import_module(f"tests.programs.{args.program}").build(args.dtype)
    config = autopar.Config(run_option=args.run_option, log_every_steps=1, **program.config)
    with autopar.get_runner(program.graph, args.spec, config) as runner:
        n, i = runner.num_workers, runner.worker_index
        per = args.batch // n
        between = getattr(program, "between_steps", None)   # what runs after each step
        for k in range(args.steps):
            fetch, feed = program.step(k, slice(i * per, (i + 1) * per), args.batch)
            runner.run(fetch, feed)
            if between is not None:
                runner.run(*between(k, slice(i * per, (i + 1) * per), args.batch))
        if args.uneven_step:
            rows = np.array_split(np.arange(args.batch + 1), n)[i]
            runner.run(*program.step(args.steps, rows, args.batch + 1))
        with program.graph.as_default():
            variables = tf1.global_variables()
        values = runner.run({v.op.name: v for v in variables})
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker{i}.npz"), **values)
        print(f"worker {i} done at global step {int(values['global_step'])}", flush=True)


if __name__ == "__main__":
    main()
