"""Runs a training script as a TF1-era program runs: tf.compat.v1.
disable_v2_behavior() first (reference variables, V1 control flow and
shapes, graph mode), then the script itself, through runpy as a user's
wrapper would:

    python v1_behavior.py [--resource-variables] SCRIPT [ARGS...]

The V1-behaviour lane of the integration corpus (`make test-matrix`) runs
the examples and the ported TF1 programs through it; autopar's launcher
re-runs this wrapper, not the inner script, in every process it starts.

--resource-variables: the one-device reference of such a program. A
reference variable's update may overwrite its buffer while the backward
pass still reads it (transforms/update_order.py), so on one device a TF1
program's result is decided by thread timing; with resource variables
(every other part of V1 behaviour kept) it is the gradient at the step's
weights, which autopar's workers compute from reference variables."""
import runpy
import sys

import tensorflow as tf


def behave_as_tf1(resource_variables: bool = False) -> None:
    tf.compat.v1.disable_v2_behavior()
    if resource_variables:
        tf.compat.v1.enable_resource_variables()


if __name__ == "__main__":
    args = sys.argv[1:]
    resource_variables = bool(args) and args[0] == "--resource-variables"
    args = args[1:] if resource_variables else args
    if not args:
        sys.exit("usage: v1_behavior.py [--resource-variables] SCRIPT [ARGS...]")
    behave_as_tf1(resource_variables)
    sys.argv = args
    runpy.run_path(sys.argv[0], run_name="__main__")
