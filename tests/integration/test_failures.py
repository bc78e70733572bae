"""A dead worker stops the whole job: the launcher exits non-zero within 10 s,
names the process, shows the end of its log, and leaves nothing running."""
import os
import re
import queue
import signal
import subprocess
import threading
import time

from tests.integration.cluster import REPO, child_env, pid_alive, train_command, write_spec


def _start(cmd):
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


class LineReader:
    """Reads a process's output on a thread, so waiting for a line can time
    out and no line is lost to buffering."""

    def __init__(self, proc):
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self):
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, patterns, timeout):
        """Until every regex in `patterns` (in any order) matched a line."""
        pending = [re.compile(p) for p in ([patterns] if isinstance(patterns, str) else patterns)]
        deadline = time.monotonic() + timeout
        while pending:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no line matching {[p.pattern for p in pending]} within "
                                     f"{timeout}s:\n{self.text[-3000:]}")
            self.lines.append(line)
            pending = [p for p in pending if not p.search(line)]

    def rest(self, timeout) -> str:
        """Wait for the process to exit; the output not read yet."""
        self.proc.wait(timeout=timeout)
        self._thread.join(timeout=10)
        tail = []
        while not self._queue.empty():
            line = self._queue.get()
            if line is not None:
                tail.append(line)
        self.lines += tail
        return "".join(tail)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def test_killed_worker_stops_job(tmp_path):
    spec = write_spec(tmp_path, workers=2, servers=1)
    proc = _start(train_command("mlp_sgd", tmp_path / "out", "--steps", "1000",
                                "--stall-at", "3", "--spec", str(spec)))
    reader = LineReader(proc)
    try:
        reader.wait_for(r"worker 1 stalling at step 3", 120)
        text = reader.text
        pids = {int(p) for p in re.findall(r"worker \d pid (\d+)", text)}
        pids |= {int(p) for p in re.findall(r"server \d.*pid[ =](\d+)", text)}
        worker1 = int(re.search(r"worker 1 pid (\d+)", text).group(1))
        assert len(pids) >= 3, text   # 2 workers and the server
        os.kill(worker1, signal.SIGKILL)
        killed_at = time.monotonic()
        rest = reader.rest(timeout=30)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = reader.text
    assert proc.returncode != 0
    # The one timing bound here is the requirement itself: a dead worker ends the job within 10 s.
    assert elapsed < 10, f"launcher took {elapsed:.1f}s to stop the job"
    assert "worker 1" in rest and "stalling at step 3" in rest, rest[-2000:]
    deadline = time.monotonic() + 30   # the launcher has reaped them; a bound on waiting only
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)], output[-2000:]
