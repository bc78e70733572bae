"""TensorFlow's quickstart loop (tests/programs/quickstart.py) over 2
epochs whose metrics are never reset: one device runs the step itself on
each global batch (no --spec); under autopar (--spec) each worker runs its
rows w, w+N, ... of it and combines the metrics over the workers after
each epoch (Runner.combine_metrics). Prints each epoch's results, and
the results read after the loop (the runner closed)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402
from tests.programs import quickstart  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    args = p.parse_args()
    step, metrics, _ = quickstart.build("float64")
    batches = quickstart.batches(4, 7, "float64")   # 3/2/2 rows a batch on 3 workers
    results = []
    if args.spec is None:
        for _ in range(2):
            for x, y in batches:
                step(x, y)
            results.append([float(m.result()) for m in metrics])
    else:
        runner = autopar.get_runner(step.get_concrete_function(
            tf.TensorSpec([None, quickstart.FEATURES], tf.float64),
            tf.TensorSpec([None], tf.int64)), args.spec, autopar.Config(log_every_steps=0))
        n, w = runner.num_workers, runner.worker_index
        with runner:
            for _ in range(2):
                for x, y in batches:
                    runner.call(x[w::n], y[w::n])
                runner.combine_metrics(metrics)
                results.append([float(m.result()) for m in metrics])
    # read after the runner closed: the last combine, the last thing inside
    # the block, holds
    results.append([float(m.result()) for m in metrics])
    print("results " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
