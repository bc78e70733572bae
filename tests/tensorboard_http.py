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


class TensorBoard:
    """`python -m tensorboard.main --logdir logdir` while the context is
    open: started at once (its TensorFlow import can overlap the job that
    writes the event files: it reloads them every second), killed at exit."""

    def __init__(self, python: str, logdir: Path, env: dict[str, str] | None = None):
        self._started = time.monotonic()
        self.proc = subprocess.Popen(
            [python, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", "0", "--load_fast", "false", "--reload_interval", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env=dict(os.environ if env is None else env, TF_CPP_MIN_LOG_LEVEL="3"))
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self._port: int | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def __enter__(self) -> "TensorBoard":
        return self

    def __exit__(self, *exc: object) -> None:
        _kill(self.proc)

    def scalars(self, tag: str, run: str = ".", at_least: int = 1) -> list[tuple[int, float]]:
        """[(step, value)] of ``tag`` as it serves it, once it serves at
        least ``at_least`` of them (it may have read a file still being
        written). Raises AssertionError with its output if it does not start
        or never serves them."""
        if self._port is None:
            self._port = _port(self._lines, self.output, self._started + START_S)
        url = (f"http://127.0.0.1:{self._port}/data/plugin/scalars/scalars?"
               + urllib.parse.urlencode({"run": run, "tag": tag}))
        deadline = time.monotonic() + SERVE_S
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    rows = json.loads(response.read())
                if len(rows) >= at_least:
                    return [(int(step), float(value)) for _, step, value in rows]
            except urllib.error.HTTPError as exc:
                if exc.code != 400:   # 400: the run or tag is not loaded yet
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"TensorBoard served no {at_least} {tag!r} within {SERVE_S} s:\n"
                                     + "".join(self.output))
            time.sleep(0.5)


def served_scalars(python: str, logdir: Path, tag: str, run: str = ".",
                   env: dict[str, str] | None = None) -> list[tuple[int, float]]:
    """[(step, value)] of ``tag`` in ``logdir`` (written whole) as a
    TensorBoard started now serves it."""
    with TensorBoard(python, logdir, env) as board:
        return board.scalars(tag, run)


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
