"""Adopt the spare fork server this process was forked with (runtime/
forkserver.py), asking for LD_PRELOAD=argv[1], and fork describe_process.py
from it; print one JSON line: the spare's pid, whether it was adopted, what
the child described, and whether a second adoption found another spare.
With ``--leave``: only print the spare's pid and exit without adopting."""
import json
import os
import sys
from pathlib import Path

from autopar.runtime import forkserver

result = {"spare": forkserver._spare[1] if forkserver._spare else None}
if "--leave" in sys.argv:
    print(json.dumps(result), flush=True)
    sys.exit(0)
env = {**os.environ, "LD_PRELOAD": sys.argv[1]}
server = forkserver.ForkServer.adopt_spare(env)
result["adopted"] = server is not None
if server is not None:
    try:
        server.wait_ready(120)
        child = server.start([sys.executable, str(Path(__file__).parent / "describe_process.py")],
                             env, os.getcwd())
        lines = child.stdout.read().decode().splitlines()
        result["status"] = child.wait(60)
        result["child"] = json.loads(next(line for line in lines if line.startswith("{")))
        result["again"] = forkserver.ForkServer.adopt_spare(env) is not None
    finally:
        server.stop()
print(json.dumps(result), flush=True)
