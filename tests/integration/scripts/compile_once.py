"""tests/integration/train_model.py with the compile step watched.

The process named by AUTOPAR_TEST_COMPILER ("launcher": the process that
calls get_runner outside a job; "script": the run `autopar launch` makes of
the script, in the report role, to compile its plan) may analyse, plan and
place ops, and prints how often it did when it exits (and appends it to the
file AUTOPAR_TEST_COMPILE_LOG names, if any: `autopar launch` keeps that
run's output to itself). In every other process of the job each of those
functions raises.
"""
import atexit
import collections
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from autopar.runtime import worker  # noqa: E402
from autopar.transforms import analysis, compile as compiler, placement, plan  # noqa: E402

ROLE = os.environ.get("AUTOPAR_ROLE")
INDEX = int(os.environ.get("AUTOPAR_TASK_INDEX", "-1"))
ALLOWED = {"launcher": ROLE is None, "script": ROLE == "report"}[
    os.environ["AUTOPAR_TEST_COMPILER"]]
calls: collections.Counter = collections.Counter()


def watched(name, fn):
    def call(*args, **kwargs):
        if not ALLOWED:
            raise RuntimeError(f"{name} called in {ROLE} {INDEX}")
        calls[name] += 1
        return fn(*args, **kwargs)
    return call


# Every module-level reference a process could reach them through.
for module, name in ((analysis, "analyze_graph"), (compiler, "analyze_graph"),
                     (worker, "analyze_graph"),
                     (plan, "make_plan"), (compiler, "make_plan"),
                     (placement, "place_ops"), (compiler, "place_ops")):
    setattr(module, name, watched(name, getattr(module, name)))
def _say_calls():
    line = f"compile calls: {dict(sorted(calls.items()))}"
    print(line, flush=True)
    if os.environ.get("AUTOPAR_TEST_COMPILE_LOG"):
        with open(os.environ["AUTOPAR_TEST_COMPILE_LOG"], "a") as f:
            f.write(line + "\n")


if ALLOWED:
    atexit.register(_say_calls)

# Imported, not run as a path: the launcher re-executes sys.argv, this script.
from tests.integration import train_model  # noqa: E402

train_model.main()
