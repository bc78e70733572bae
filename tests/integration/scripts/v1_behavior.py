"""Runs a training script as a TF1-era program runs: tf.compat.v1.
disable_v2_behavior() first (reference variables, V1 control flow and
shapes, graph mode), then the script itself, through runpy as a user's
wrapper would:

    python v1_behavior.py SCRIPT [ARGS...]

The V1-behaviour lane of the integration corpus (`make test-matrix`) runs
the examples and the ported TF1 programs through it; autopar's launcher
re-runs this wrapper, not the inner script, in every process it starts."""
import runpy
import sys

import tensorflow as tf

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: v1_behavior.py SCRIPT [ARGS...]")
    tf.compat.v1.disable_v2_behavior()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
