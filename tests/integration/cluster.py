"""Helpers for integration tests: write a local spec, run tests/integration/
train_model.py single-device or under the real launcher, load what it saved."""
from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from autopar.common.procs import pid_alive  # noqa: F401 - the tests' check, re-exported
from autopar.runtime.forkserver import ForkedProcess, ForkServer

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "integration" / "train_model.py"


def python_as(behavior: str) -> list[str]:
    """The interpreter's command for a script run as a program of
    `behavior`: "v1" runs it through scripts/v1_behavior.py, which calls
    tf.compat.v1.disable_v2_behavior() first, as TF1-era scripts do;
    "v1-resource" also keeps resource variables on: the one-device
    reference of a V1 program (see v1_behavior.py)."""
    wrapper = REPO / "tests" / "integration" / "scripts" / "v1_behavior.py"
    flags = {"v2": [], "v1": [str(wrapper)],
             "v1-resource": [str(wrapper), "--resource-variables"]}[behavior]
    return [sys.executable, *flags]


def legacy_keras_env() -> dict[str, str]:
    """The environment of a fresh interpreter whose tf.compat.v1.layers work
    under TensorFlow 2.21: the tf-keras package (installed by `make` next to
    the virtualenv, .venv/legacy-keras, without its dependency on the full
    tensorflow package) and TF_USE_LEGACY_KERAS=1. (Not the tests' fork
    server, which imported TensorFlow without tf-keras on its path.)"""
    legacy = REPO / ".venv" / "legacy-keras"
    assert (legacy / "tf_keras").is_dir(), f"{legacy} is missing: run `make install`"
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=os.pathsep.join([str(REPO), str(legacy)]))


def run_fresh_beside(reference: list[str], job: list[str], env: dict[str, str]
                     ) -> tuple[str, str]:
    """run_beside in fresh interpreters with `env` (legacy_keras_env: not
    forked from the tests' fork server)."""
    procs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for command in (reference, job)]

    def output(proc) -> str:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-6000:]
        return out
    try:
        log = output(procs[1])   # the job first: the reference is done by then
        return output(procs[0]), log
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def reference_of(behavior: str) -> str:
    """The behaviour of a program's one-device reference run."""
    return "v1-resource" if behavior == "v1" else behavior


def write_spec(directory: Path, workers: int, servers: int = 0,
               address: str = "127.0.0.1", isolation: str | None = None) -> Path:
    """``isolation``: the spec's network.isolation (runtime/launcher.py
    ``isolate``); a loopback job runs in a private network namespace unless
    it says "firewall" or "none"."""
    path = directory / f"spec_{workers}w{servers}s.yaml"
    network = f"network:\n  isolation: {isolation}\n" if isolation else ""
    path.write_text(f"hosts:\n  - address: {address}\n    workers: {workers}\n"
                    f"    servers: {servers}\n{network}")
    return path


def write_two_host_spec(directory: Path, workers=(2, 1), servers=(1, 1)) -> Path:
    """Hosts on this machine, one per entry of `workers` and `servers` (two by
    default): 127.0.0.1, 127.0.0.2, ... count as different addresses, so
    local aggregation groups workers by them."""
    path = directory / "spec_two_hosts.yaml"
    path.write_text("hosts:\n" + "".join(
        f"  - address: 127.0.0.{i + 1}\n    workers: {w}\n    servers: {s}\n"
        for i, (w, s) in enumerate(zip(workers, servers))))
    return path


def free_ports(n: int) -> list[int]:
    """n loopback ports free at this moment (for specs and TF_CONFIG that
    name their ports: nothing reserves them after)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def train_command(model: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAIN), "--model", model, "--out", str(out), *extra]


def run_training(model: str, out: Path, *extra: str, timeout: float = 240) -> str:
    """Run to completion; fail the test with the output if it did not exit 0."""
    return run_script(train_command(model, out, *extra), timeout=timeout)


def run_to_end(command: list[str], *, env: dict[str, str] | None = None,
               timeout: float = 240, cwd: Path | None = None) -> tuple[int, str]:
    """``python script args`` (or ``-m module``) run to completion, forked from
    the tests' fork server (in `cwd`, default the repository), as the same
    command started anew would run: its exit status and its merged stdout
    and stderr."""
    with LineReader(start_job(command, env, cwd)) as reader:
        output = reader.rest(timeout=timeout)
    return reader.proc.returncode, output


def run_script(command: list[str], *, env: dict[str, str] | None = None,
               timeout: float = 240, cwd: Path | None = None) -> str:
    """run_to_end's output; fails the test with the output's tail unless the
    script exited 0."""
    returncode, output = run_to_end(command, env=env, timeout=timeout, cwd=cwd)
    assert returncode == 0, f"{Path(command[1]).name} exited {returncode}:\n{output[-4000:]}"
    return output


def run_beside(reference: list[str], job: list[str]) -> tuple[str, str]:
    """The outputs of a one-device run `reference` and of autopar's `job`
    (both ``python script args``), run side by side: the job's processes
    mostly wait on each other, so the two take little more than the job
    alone. Each must exit 0."""
    with LineReader(start_job(reference)) as reference_run:
        log = run_script(job)
        expected_log = reference_run.rest(timeout=240)
    assert reference_run.proc.returncode == 0, expected_log[-4000:]
    return expected_log, log


def run_single_device(model: str, out: Path, *extra: str) -> str:
    """A single-device run of train_model.py in this process (its output
    returned): the same code as the subprocess, without another TensorFlow
    start (a few seconds of CPU each; the reference runs are many)."""
    from tests.integration import train_model
    return run_in_process(train_model.main, ["--model", model, "--out", str(out), *extra])


def run_in_process(main: Callable[[list[str]], None], argv: list[str]) -> str:
    """A script's main(argv) run single-device in this process (its output
    returned): the same code as a subprocess, without another TensorFlow
    start."""
    assert "--spec" not in argv, "a distributed run needs its own processes: use run_script"
    # get_runner gives the "autopar" logger its stdout handler (and stops it
    # propagating) in this process: put it back as it was for later tests.
    logger = logging.getLogger("autopar")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            main(argv)
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    return captured.getvalue()


def single_device_runs(tmp_path_factory, *extra: str) -> Callable[[str], dict[str, np.ndarray]]:
    """model -> its parameters after a single-device run with ``extra``
    arguments; each model runs once per fixture (a module-scoped one shares
    the reference run among a module's cases); its output in `.logs[model]`."""
    cache: dict[str, dict[str, np.ndarray]] = {}

    def get(model: str) -> dict[str, np.ndarray]:
        if model not in cache:
            out = tmp_path_factory.mktemp(f"single_{model}")
            get.logs[model] = run_single_device(model, out, *extra)
            cache[model] = load_worker(out, 0)
        return cache[model]
    get.logs = {}
    return get


def load_worker(out: Path, index: int) -> dict[str, np.ndarray]:
    with np.load(out / f"worker{index}.npz") as data:
        return {k: data[k] for k in data.files}


def assert_same_parameters(expected: dict, actual: dict, rtol=1e-5, atol=1e-6, what="") -> None:
    """Every variable equal to float32 summation tolerance. Models whose
    optimizer divides by sqrt(v) are built in float64 so that Adam's
    amplification of last-bit summation-order differences cannot reach this
    tolerance on any CPU (the arithmetic: tests.models.model_dtype)."""
    assert set(expected) == set(actual), f"{what}: variables differ: {set(expected) ^ set(actual)}"
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol,
                                   err_msg=f"{what}: variable {name}")


_fork_server: ForkServer | None = None


def _tests_fork_server() -> ForkServer:
    """One fork server (runtime/forkserver.py) for the test session: each
    job's launcher process is forked from it instead of importing TensorFlow
    anew (several CPU-seconds per job), with a spare that becomes its job's
    fork server. Started with the bind shim loaded, as a job's own fork
    server is (its spare is adoptable only then). It also preloads the
    libraries a job's fork server preloads when its script imported them
    (Keras 3 with scikit-learn, ~3 CPU-seconds): a Keras job's launcher, its
    spare and its one-device reference would each import them otherwise.
    It dies with the test process."""
    global _fork_server
    if _fork_server is None or _fork_server.popen.poll() is not None:
        from autopar.common import env as envvars
        from autopar.runtime.commands import preload_value
        from autopar.runtime.forkserver import PRELOAD_IF_IMPORTED
        _fork_server = ForkServer({**child_env(), "LD_PRELOAD": preload_value(),
                                   envvars.FORK_PRELOAD: ",".join(PRELOAD_IF_IMPORTED)},
                                  cwd=str(REPO))
        atexit.register(_fork_server.stop)
    return _fork_server


def start_job(cmd: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> ForkedProcess:
    """Start a job (``python script args``) in its own session, so it can be
    stopped as a group, output merged into one text pipe for a LineReader.
    ``env``: its environment (default child_env()); ``cwd``: its directory
    (default the repository)."""
    proc = _tests_fork_server().start(cmd, child_env() if env is None else env,
                                      str(cwd or REPO), spare=True)
    assert proc.stdout is not None
    proc.stdout = io.TextIOWrapper(proc.stdout, encoding="utf-8", errors="replace")
    return proc


class LineReader:
    """Reads a process's output on a thread, so waiting for a line can time
    out and no line is lost to buffering. As a context manager, it kills the
    process's group on the way out if the process still runs (a failed test
    leaves nothing behind)."""

    def __init__(self, proc):
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def __enter__(self) -> "LineReader":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

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
        """Wait for the process to exit; the output not read yet. A process
        still running after `timeout` s fails the test with the output it
        wrote (where it hung), not a bare TimeoutExpired."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self._thread.join(timeout=10)
            while not self._queue.empty():
                line = self._queue.get()
                if line is not None:
                    self.lines.append(line)
            raise AssertionError(f"still running after {timeout} s (killed); its output:\n"
                                 f"{self.text[-6000:]}") from None
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

    def lines_so_far(self) -> list[str]:
        """Every line read by now, without waiting."""
        while not self._queue.empty():
            line = self._queue.get()
            if line is None:
                self._queue.put(None)    # the end stays for wait_for and rest
                break
            self.lines.append(line)
        return self.lines


PORT_RESTART = "restarting every process on fresh ports"


def latest_attempt(text: str) -> str:
    """A launcher's output since it last started every process anew (a port
    it allocated was taken by another program before its process bound it),
    so the processes and addresses read from it are those now running."""
    return text.rpartition(PORT_RESTART)[2]


def job_processes(launcher: int) -> set[int]:
    """The launcher and every process under it now (namespace anchor, fork
    server, workers, servers), from /proc."""
    found, todo = set(), [launcher]
    while todo:
        pid = todo.pop()
        found.add(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return found


def survivors(pids, timeout: float = 30) -> list[int]:
    """The pids still running after waiting up to ``timeout`` s for all of them
    to exit (a bound on waiting, not a claim about speed)."""
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A tmpfs of ``size`` ("12k") mounted at ``path`` (created), unmounted on
    the way out: a disk that fills up. Needs root."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)
