"""runtime/stopping.py in a real process whose main thread waits in C, as
inside a TensorFlow step: the first SIGTERM is a request (the process goes
on, and ends itself within its bound), the second ends it at once."""
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The main thread then waits in C for good, as in a TensorFlow step, where
# no Python signal handler runs: a mutex locked twice by its owner waits
# again after every signal.
SCRIPT = """
import ctypes, sys
from autopar.runtime import stopping
watch = stopping.SigtermWatch("worker 1", lambda: print("asked to stop", flush=True),
                              float(sys.argv[1]))
assert watch.install()
libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)   # zeroed: a default mutex
libc.pthread_mutex_lock(mutex)
print("ready", flush=True)
libc.pthread_mutex_lock(mutex)
"""


def _start(bound_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(bound_s)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert _line(proc) == "ready\n"
    return proc


def _line(proc: subprocess.Popen, timeout: float = 30) -> str:
    """The process's next line ("" if none came within ``timeout`` s: a bound
    on waiting; the process is then killed)."""
    if not select.select([proc.stdout], [], [], timeout)[0]:
        proc.kill()
        return ""
    return proc.stdout.readline()


@pytest.mark.slow
def test_the_first_sigterm_asks_and_the_bound_ends_the_process():
    proc = _start(bound_s=1.0)
    proc.send_signal(signal.SIGTERM)
    assert _line(proc) == "asked to stop\n"
    time.sleep(0.3)
    assert proc.poll() is None            # still running: a request, not a kill
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM     # ended by its bound
    proc.stdout.close()


@pytest.mark.slow
def test_a_second_sigterm_ends_it_at_once():
    proc = _start(bound_s=600.0)
    proc.send_signal(signal.SIGTERM)
    assert _line(proc) == "asked to stop\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM     # long before its bound
    proc.stdout.close()
