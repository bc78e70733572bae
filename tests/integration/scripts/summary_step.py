"""tests/programs/summary_step.py's step under autopar on every worker of
--spec, each on its rows w, w+N, ... of each batch, each with a writer of
its own under --logdir/worker<w>. Prints each call's loss."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import autopar  # noqa: E402
from _common import INDEX  # noqa: E402
from tests.programs import summary_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--logdir", required=True)
    args = p.parse_args()
    # (the writer exists before the runner, which lifts the step using it)
    step, concrete = summary_step.build(os.path.join(args.logdir, f"worker{INDEX}"))
    runner = autopar.get_runner(concrete, args.spec, autopar.Config(log_every_steps=0))
    n, w = runner.num_workers, runner.worker_index
    with runner:
        losses = [float(runner.call(x[w::n], y[w::n], k)) for x, y, k in summary_step.batches()]
    step.writer.close()
    print(f"losses {w} " + json.dumps(losses), flush=True)


if __name__ == "__main__":
    main()
