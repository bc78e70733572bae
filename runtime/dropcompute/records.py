"""DropCompute's records: the simulated compute delay (appendix B.1), one
step's record, the per-worker CSV, and the warm-up records as the workers
exchange them."""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from autopar.runtime.outputs import writable_directory


# -- simulated delay (appendix B.1) --------------------------------------------
class DelaySampler:
    """Bounded log-normal delays min(max_s, exp(N(log median_s, sigma^2))) from
    a generator seeded per worker: reproducible compute variance."""

    def __init__(self, median_s: float, sigma: float, max_s: float, seed: int) -> None:
        self._mu = math.log(median_s)
        self._sigma = sigma
        self._max = max_s
        self._rng = np.random.default_rng(seed)

    def sample(self) -> float:
        return float(min(self._max, math.exp(self._rng.normal(self._mu, self._sigma))))


@dataclass
class StepRecord:
    step: int
    computed: int
    dropped: int
    compute_s: float
    step_s: float
    apply_s: float
    latencies: list[float] = field(default_factory=list)


class StepLog:
    """The per-worker CSV: step, micro-batches computed and dropped, compute
    time, step time, threshold in force."""
    HEADER = ("step", "computed", "dropped", "compute_s", "step_s", "tau")

    def __init__(self, directory: str, worker_index: int) -> None:
        writable_directory(directory, "dropcompute_log_dir")
        self.path = os.path.join(directory, f"dropcompute_worker{worker_index}.csv")
        self._file = open(self.path, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(self.HEADER)

    def write(self, rec: StepRecord, tau: float | None) -> None:
        self._writer.writerow((rec.step, rec.computed, rec.dropped, f"{rec.compute_s:.6f}",
                               f"{rec.step_s:.6f}", "" if tau is None else f"{tau:.6f}"))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def encode_warmup(records: list[StepRecord]) -> bytes:
    return json.dumps([[r.latencies, r.apply_s, r.computed / max(1, r.computed + r.dropped)]
                       for r in records]).encode()


def decode_warmups(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Workers' warm-up records (in worker order) as latencies [steps, N, M]
    and apply times [steps, N], over the steps every worker recorded fully."""
    per_worker = [json.loads(b) for b in blobs]
    steps = min(len(w) for w in per_worker)
    m = min((len(rec[0]) for w in per_worker for rec in w[:steps]), default=0)
    # Under a fixed tau warm-up steps may have dropped: only the micro-batch
    # positions every record has are kept.
    lat = np.array([[w[s][0][:m] for w in per_worker] for s in range(steps)], dtype=np.float64)
    apply = np.array([[w[s][1] for w in per_worker] for s in range(steps)], dtype=np.float64)
    return lat.reshape(steps, len(per_worker), m), apply.reshape(steps, len(per_worker))
