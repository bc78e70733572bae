"""Reads a scalar back from the real TensorBoard: started as its own
process on a log directory, on a loopback port it picks, asked over HTTP
what it serves (its scalars plugin's JSON), and killed by its pid after, in
bounded time whatever happens."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

START_S = 120      # importing TensorFlow on a loaded two-core machine
SERVE_S = 60       # its first load of the event files (reload every second)


def served_scalars(python: str, logdir: Path, tag: str, run: str = ".",
                   env: dict[str, str] | None = None) -> list[tuple[int, float]]:
    """[(step, value)] of ``tag`` as `python -m tensorboard.main --logdir
    logdir` serves it. Raises AssertionError with its output if it does not
    start or never serves the tag."""
    proc = subprocess.Popen(
        [python, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", "0", "--load_fast", "false", "--reload_interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ if env is None else env, TF_CPP_MIN_LOG_LEVEL="3"))
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    try:
        port = _port(lines, output, time.monotonic() + START_S)
        url = (f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?"
               + urllib.parse.urlencode({"run": run, "tag": tag}))
        deadline = time.monotonic() + SERVE_S
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    rows = json.loads(response.read())
                if rows:
                    return [(int(step), float(value)) for _, step, value in rows]
            except urllib.error.HTTPError as exc:
                if exc.code != 400:   # 400: the run or tag is not loaded yet
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"TensorBoard served no {tag!r} within {SERVE_S} s:\n"
                                     + "".join(output))
            time.sleep(0.5)
    finally:
        _kill(proc)


def _port(lines: queue.Queue, output: list[str], deadline: float) -> int:
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            raise AssertionError("TensorBoard exited:\n" + "".join(output))
        output.append(line)
        match = re.search(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/", line)
        if match:
            return int(match.group(1))
    raise AssertionError(f"TensorBoard did not start within {START_S} s:\n" + "".join(output))


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to its process group (it leads one), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
