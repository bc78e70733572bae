"""Ports under concurrency: two launchers on one range, and a port taken by
another program between allocation and TensorFlow's bind."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.runtime import launcher, ports
from autopar.runtime.launcher import PORT_ATTEMPTS, launch
from autopar.runtime.spec import load_spec
from tests.integration.cluster import (REPO, assert_same_parameters, child_env, load_worker,
                                       run_single_device, train_command)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sockets and flock")

STEPS = 2


def _free_range(size: int) -> tuple[int, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        start = s.getsockname()[1]
    start = min(start, 65535 - size)
    return start, start + size - 1


def _spec_file(directory: Path, port_range: tuple[int, int]) -> Path:
    path = directory / "spec.yaml"
    path.write_text(f"hosts:\n  - address: 127.0.0.1\n    workers: 2\n    ports: [{port_range[0]}, {port_range[1]}]\n")
    return path


# A stand-in worker: worker 1 reports TensorFlow's bind failure (or first the
# start of training) depending on argv; worker 0 succeeds.
_FAKE_WORKER = r"""
import os, sys
index = int(os.environ["AUTOPAR_TASK_INDEX"])
mode, state = sys.argv[1], sys.argv[2]
if index == 1:
    if mode == "after-start":
        print("worker 1: initial state received from the chief", flush=True)
    if mode != "once" or not os.path.exists(state):
        open(state, "w").close()
        print("tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server", flush=True)
        sys.exit(1)
print(f"worker {index} ok", flush=True)
"""


def _fake_launch(tmp_path: Path, mode: str) -> int:
    spec = load_spec({"hosts": [{"address": "127.0.0.1", "workers": 2, "ports": list(_free_range(20))}]})
    return launch(spec, [sys.executable, "-c", _FAKE_WORKER, mode, str(tmp_path / "failed")])


def _messages(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_bind_failure_during_startup_restarts_on_fresh_ports(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    assert _fake_launch(tmp_path, "once") == 0
    messages = _messages(caplog)
    started = [m.split()[4].rstrip(",") for m in messages if m.startswith("started worker 1 at ")]
    assert len(started) == 2 and started[0] != started[1]   # the failed endpoint is avoided
    assert any(m.startswith(f"attempt 1 of {PORT_ATTEMPTS}: worker 1 ({started[0]}) could not bind its port")
               for m in messages)
    assert "[worker 1] worker 1 ok" in capsys.readouterr().out


def test_bind_failure_after_training_started_is_not_retried(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    assert _fake_launch(tmp_path, "after-start") == 1
    messages = _messages(caplog)
    assert sum(m.startswith("started worker 1 at ") for m in messages) == 1
    assert not any(m.startswith("attempt ") for m in messages)
    capsys.readouterr()


def test_restarts_are_bounded(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    assert _fake_launch(tmp_path, "always") == 1
    messages = _messages(caplog)
    assert sum(m.startswith("started worker 1 at ") for m in messages) == PORT_ATTEMPTS
    assert sum(m.startswith("attempt ") for m in messages) == PORT_ATTEMPTS - 1
    assert any(f"{PORT_ATTEMPTS} attempts in a row failed" in m for m in _messages(caplog, logging.ERROR))
    capsys.readouterr()


def test_port_taken_after_allocation_is_retried_with_real_servers(tmp_path, monkeypatch, caplog, capsys):
    """Another program binds worker 1's port right after allocation (the
    window no probe can close): worker 1's TensorFlow server fails to bind,
    the launcher restarts the job on fresh ports and training completes."""
    caplog.set_level(logging.INFO, logger="autopar.launcher")
    foreign = socket.socket()
    clusters = []

    def reserve_then_steal(spec, avoid=(), **kinds):
        reservation = ports.reserve_cluster(spec, avoid, **kinds)
        clusters.append(reservation.cluster)
        if len(clusters) == 1:
            port = int(reservation.cluster["worker"][1].rsplit(":", 1)[1])
            # The job's own address: TensorFlow's servers bind only that one
            # (runtime/libautopar_bind.so), so this is the bind that clashes.
            foreign.bind(("127.0.0.1", port))
            foreign.listen()
        return reservation

    monkeypatch.setattr(launcher, "reserve_cluster", reserve_then_steal)
    out = tmp_path / "out"
    # In this machine's network: in a private namespace (runtime/netns.py)
    # nothing of another program's can take the job's ports at all.
    spec = load_spec({"hosts": [{"address": "127.0.0.1", "workers": 2, "ports": list(_free_range(30))}],
                      "network": {"isolation": "none"}})
    try:
        status = launch(spec, train_command("mlp_sgd", out, "--steps", str(STEPS)))
    finally:
        foreign.close()
    text = capsys.readouterr().out
    assert status == 0, text[-3000:]
    assert len(clusters) == 2 and clusters[1]["worker"][1] != clusters[0]["worker"][1]
    assert any(m.startswith(f"attempt 1 of {PORT_ATTEMPTS}: worker 1 (") for m in _messages(caplog))
    for i in (0, 1):
        assert int(load_worker(out, i)["global_step"]) == STEPS


@pytest.fixture(scope="module")
def single_device(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("single")
    run_single_device("mlp_sgd", out, "--steps", str(STEPS))
    return load_worker(out, 0)


@pytest.fixture(scope="module")
def shared_spec(tmp_path_factory) -> Path:
    return _spec_file(tmp_path_factory.mktemp("spec"), _free_range(11))


# Rounds of two simultaneous jobs: 1 in `make test` (suite time), 5 in
# `make stress` (the acceptance run: 5 of 5 passed).
ROUNDS = int(os.environ.get("AUTOPAR_PORT_ROUNDS", "1"))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_two_jobs_started_together_on_one_range_both_finish(round_, tmp_path, single_device, shared_spec):
    """Two `autopar launch` processes on the same 'ports' range, started at
    the same moment; five rounds in a row (one test each, so each has the
    whole per-test time limit): both jobs train to the end, with the same
    parameters as one device."""
    outs = [tmp_path / f"job{j}" for j in (0, 1)]
    jobs = [subprocess.Popen([sys.executable, "-m", "autopar.cli", "launch", "--spec", str(shared_spec), "--",
                              *train_command("mlp_sgd", o, "--steps", str(STEPS))],
                             cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for o in outs]
    try:
        results = [job.communicate(timeout=280) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()   # the launcher's children die with it (PR_SET_PDEATHSIG)
                job.wait()
    for j, (job, (text, _)) in enumerate(zip(jobs, results)):
        assert job.returncode == 0, f"job {j}:\n{text[-3000:]}"
        assert "could not bind" not in text   # reservations, not restarts, kept them apart
        for i in (0, 1):
            assert_same_parameters(single_device, load_worker(outs[j], i), what=f"job {j} worker {i}")
