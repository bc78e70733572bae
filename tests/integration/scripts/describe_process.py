"""Print, as one JSON line, what a process started as `python describe_process.py
ARGS` sees of itself, then exit with the status given by `--exit N` (or raise
with `--raise`, or sleep with `--sleep S` first)."""
import json
import os
import sys

# Before any import of ours: was TensorFlow already loaded (a fork server's child)?
preloaded = "tensorflow" in sys.modules

import numpy  # noqa: E402

args = sys.argv[1:]
print(json.dumps({
    "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
    "env": dict(os.environ), "pid": os.getpid(), "ppid": os.getppid(),
    "pgid": os.getpgid(0), "sid": os.getsid(0), "preloaded": preloaded,
    "random": int(numpy.random.randint(1 << 30)), "stdin": sys.stdin.read(),
    "netns": os.stat("/proc/self/ns/net").st_ino,
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if "--sleep" in args:
    import time
    time.sleep(float(args[args.index("--sleep") + 1]))
if "--raise" in args:
    raise RuntimeError("raised on purpose")
sys.exit(int(args[args.index("--exit") + 1]) if "--exit" in args else 0)
