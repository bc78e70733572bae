"""examples/lm.py runs as documented, with a tiny model: single-device (no
--spec) and as a real 2-worker, 1-server job on loopback with the hybrid run
option (LSTM weights all-reduced, embedding and softmax weights on the
server). Each run is the script as a user runs it, in a process of its own
(forked: cluster.run_script) from the repository root. Throughput figures
are printed, never asserted."""
from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

from tests.integration.cluster import run_script

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
TINY = ["--vocab", "300", "--dim", "16", "--hidden", "16", "--seq-len", "5", "--num-sampled", "32",
        "--sequences", "400", "--batch-size", "8", "--steps", "6", "--warmup", "2", "--log-every", "0"]


def _run_lm(*args: str) -> str:
    """examples/lm.py run from the repository root as a user runs it
    (forked: cluster.run_script); its output, stdout and stderr."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return run_script([sys.executable, "examples/lm.py", *TINY, *args], env=env,
                      timeout=TIMEOUT_S, cwd=REPO_ROOT)


def _words_per_s(out: str) -> float:
    match = re.search(r"words/s: ([0-9.]+)", out)
    assert match, f"no words/s line in output:\n{out}"
    print(f"words/s: {match.group(1)}")
    return float(match.group(1))


def test_lm_single_device_prints_words_per_s_and_finite_loss():
    out = _run_lm()
    assert _words_per_s(out) > 0, out
    match = re.search(r"final loss: (\S+)", out)
    assert match, f"no final loss line in output:\n{out}"
    assert math.isfinite(float(match.group(1))), out


def test_lm_hybrid_two_workers_one_server(tmp_path):
    spec = tmp_path / "two_workers_one_server.yaml"
    spec.write_text("hosts:\n  - {address: 127.0.0.1, workers: 2, servers: 1}\n")
    out = _run_lm("--spec", str(spec), "--run-option", "hybrid")
    assert "[worker 0] words/s:" in out, out
    # The chief's measured sparse bytes stay under the plan's bound.
    found = re.search(r"ps \(sparse\): sent ([0-9.]+) KB, received ([0-9.]+) KB; the plan's "
                      r"\(an upper bound\): ([0-9.]+) KB, ([0-9.]+) KB", out)
    assert found, out
    sent, received, bound_sent, bound_received = map(float, found.groups())
    assert 0 < sent <= bound_sent and 0 < received <= bound_received, found.group(0)
    assert _words_per_s(out) > 0, out
    assert "2 workers, global batch" in out, out
