"""DropCompute (papers/dropcompute.txt §3-4): the arithmetic of a compute
threshold tau on gradient accumulation, and the per-step loop state a worker
keeps (threshold, simulated delay, warm-up latencies, CSV log).

Notation as in the paper: N workers, M micro-batches per step, t[n, m] the
compute latency of micro-batch m on worker n, T_n = sum_m t[n, m] and
T = max_n T_n the step's compute time, T^c the serial part of a step
(aggregation and update), M~ the mean number of micro-batches a worker
computes.

Two stopping rules appear below:
  "check"    what autopar's Runner does: before each micro-batch the worker
             compares its elapsed compute time with tau and stops once it is
             >= tau. The first micro-batch always runs, and the micro-batch
             that crosses tau is kept (a session.run is not interrupted), so a
             worker computes #{m : T^(m-1) < tau} micro-batches and finishes at
             T^(that many).
  "preempt"  the paper's Algorithm 1: a worker is stopped at tau, the
             micro-batch in flight is lost: #{m : T^(m) < tau} micro-batches,
             done at min(tau, T_n). Equations 4-6 are written for it.
The functions here are pure numpy/math: no processes, no TensorFlow.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

log = logging.getLogger("autopar.dropcompute")

EULER_GAMMA = 0.5772156649015329
_PHI = NormalDist()
RULES = ("check", "preempt")


# -- analytic (equations 4 and 5: mean and variance only) ----------------------
def expected_max_normal(mu: float, sigma: float, n: int) -> float:
    """Eq. 4: E[max of n i.i.d. N(mu, sigma^2)] (Bailey et al. 2014)."""
    if n <= 1:
        return mu
    return sigma * ((1 - EULER_GAMMA) * _PHI.inv_cdf(1 - 1 / n)
                    + EULER_GAMMA * _PHI.inv_cdf(1 - 1 / (math.e * n))) + mu


def expected_step_compute(mu: float, sigma: float, n: int, m: int) -> float:
    """E[T]: eq. 4 applied to T_n, a sum of m micro-batches (CLT: mean m*mu,
    variance m*sigma^2)."""
    return expected_max_normal(m * mu, math.sqrt(m) * sigma, n)


def expected_micro_batches(tau: float, mu: float, sigma: float, m: int,
                           rule: str = "preempt") -> float:
    """Eq. 5: E[M~] = sum_{k=1..M} Phi((tau - k mu) / sqrt(k sigma^2)) for the
    paper's rule. Under "check" micro-batch k runs when T^(k-1) < tau: the
    first always, so 1 + the same sum up to M-1."""
    def below(k: int) -> float:
        if sigma == 0:
            return 1.0 if k * mu < tau else 0.0
        return _PHI.cdf((tau - k * mu) / math.sqrt(k * sigma * sigma))
    if rule == "preempt":
        return sum(below(k) for k in range(1, m + 1))
    _check_rule(rule)
    return 1 + sum(below(k) for k in range(1, m))


def analytic_speedup(tau: float, mu: float, sigma: float, n: int, m: int, tc: float = 0.0) -> float:
    """Eq. 6 with eq. 4 and 5 plugged in (the paper's rule):
    E[M~](E[T] + Tc) / (M (min(tau, E[T]) + Tc))."""
    t = expected_step_compute(mu, sigma, n, m)
    return expected_micro_batches(tau, mu, sigma, m) * (t + tc) / (m * (min(tau, t) + tc))


# -- empirical (equation 6 on measured latencies) -------------------------------
def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def _as_steps(latencies) -> np.ndarray:
    t = np.asarray(latencies, dtype=np.float64)
    if t.ndim == 2:          # one step of [N, M]
        t = t[None]
    if t.ndim != 3 or t.shape[2] < 1:
        raise ValueError(f"latencies must be [steps, workers, micro-batches], got shape {t.shape}")
    return t


def computed_and_time(latencies, tau: float | None, rule: str = "check") -> tuple[np.ndarray, np.ndarray]:
    """Per step and worker: how many micro-batches are computed under tau, and
    when that worker joins the aggregation. latencies: [steps, N, M]."""
    _check_rule(rule)
    t = _as_steps(latencies)
    cum = np.cumsum(t, axis=2)
    m = t.shape[2]
    if tau is None:
        return np.full(cum.shape[:2], m), cum[..., -1]
    if rule == "preempt":
        return (cum < tau).sum(axis=2), np.minimum(tau, cum[..., -1])
    before = np.concatenate([np.zeros(cum.shape[:2] + (1,)), cum[..., :-1]], axis=2)
    computed = (before < tau).sum(axis=2)          # >= 1: before[..., 0] == 0
    done = np.take_along_axis(cum, computed[..., None] - 1, axis=2)[..., 0]
    return computed, done


@dataclass
class SpeedupEstimate:
    tau: float | None
    speedup: float               # S_eff(tau), eq. 6
    computed_fraction: float     # M~ / M
    step_time: float             # E[max_n done_n] + Tc with tau
    baseline_step_time: float    # E[T] + Tc without it

    @property
    def drop_rate(self) -> float:
        return 1.0 - self.computed_fraction


def empirical_speedup(latencies, tau: float | None, tc: float = 0.0,
                      rule: str = "check") -> SpeedupEstimate:
    """Eq. 6 on measured latencies [steps, N, M]: each step's N workers as
    they were measured together, M~ and T averaged over the steps."""
    t = _as_steps(latencies)
    m = t.shape[2]
    computed, done = computed_and_time(t, tau, rule)
    base = float(np.mean(t.sum(axis=2).max(axis=1))) + tc
    step = float(np.mean(done.max(axis=1))) + tc
    frac = float(np.mean(computed)) / m
    return SpeedupEstimate(tau, frac * base / step if step > 0 else 1.0, frac, step, base)


def candidate_thresholds(latencies, rule: str = "check") -> np.ndarray:
    """Every tau at which S_eff can change: just above each measured
    cumulative compute time T^(k) (between two of them M~ is constant and,
    under "preempt", min(tau, T) only grows, so the maximum of each piece is
    at its left end)."""
    _check_rule(rule)
    cum = np.cumsum(_as_steps(latencies), axis=2)
    values = np.unique(cum[..., :-1] if rule == "check" else cum)
    return np.nextafter(values, np.inf)


def choose_threshold(latencies, tc: float = 0.0, rule: str = "check") -> SpeedupEstimate:
    """The empirical maximiser of S_eff over candidate_thresholds; tau=None
    (never drop) when no threshold beats the baseline."""
    t = _as_steps(latencies)
    best = empirical_speedup(t, None, tc, rule)
    for tau in candidate_thresholds(t, rule):
        est = empirical_speedup(t, float(tau), tc, rule)
        if est.speedup > best.speedup:
            best = est
    return best


def serial_latency(apply_times) -> float:
    """T^c from the apply runs measured in each step [steps, N]: the worker
    that finished computing last waits for nobody, so its apply time, the
    step's smallest, is the serial part; the median over steps."""
    a = np.asarray(apply_times, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.median(a.reshape(a.shape[0], -1).min(axis=1)))


def compensated_micro_batches(m: int, computed_fraction: float) -> int:
    """§4.5 "batch": the maximum M that keeps the average computed batch at
    M micro-batches when a computed_fraction of them is kept."""
    if computed_fraction <= 0:
        return m
    return max(m, math.ceil(m / computed_fraction - 1e-9))


def extra_steps(base_steps: int, computed_fraction: float) -> int:
    """§4.5 "steps": R * I_base more steps, R = M / M~ - 1."""
    if computed_fraction <= 0:
        return 0
    return math.ceil(base_steps * (1 / computed_fraction - 1) - 1e-9)


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


# -- the per-worker loop state --------------------------------------------------
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
        os.makedirs(directory, exist_ok=True)
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


def describe_choice(est: SpeedupEstimate, latencies: np.ndarray, tc: float) -> str:
    """The log line of an automatic threshold: tau, expected drop rate and
    speedup on the measured distribution, and eq. 4-6's analytic estimate
    from the latencies' mean and variance alone."""
    _, n, m = latencies.shape
    mu, sigma = float(np.mean(latencies)), float(np.std(latencies))
    if est.tau is None:
        return (f"DropCompute: no threshold beats waiting for every worker on the measured "
                f"latencies (mean {mu * 1e3:.1f} ms, std {sigma * 1e3:.1f} ms per micro-batch, "
                f"{n} workers, M={m}); not dropping")
    analytic = analytic_speedup(est.tau, mu, sigma, n, m, tc)
    return (f"DropCompute: tau = {est.tau:.4f} s; expected drop rate {est.drop_rate:.1%}, "
            f"expected effective speedup {est.speedup:.3f}x on the measured latencies "
            f"({latencies.shape[0]} steps x {n} workers x {m} micro-batches, Tc {tc * 1e3:.1f} ms); "
            f"analytic estimate (eq. 4-6 from mean {mu * 1e3:.1f} ms, std {sigma * 1e3:.1f} ms) "
            f"{analytic:.3f}x")


def now() -> float:
    return time.perf_counter()


class Agreement:
    """How workers agree on the threshold, through the job coordinator:
    gather() posts this worker's bytes and returns every worker's (in worker
    order) once all have posted; share() is the chief's value for everyone
    (the chief publishes it, the others fetch it), so every worker holds the
    very same tau."""

    has_timeout = True   # a worker that never posts costs its peers a timeout, not a hang

    def __init__(self, client, worker_index: int, num_workers: int, timeout_s: float) -> None:
        self._client = client
        self._index = worker_index
        self._n = num_workers
        self._timeout = timeout_s

    def gather(self, key: str, payload: bytes, timeout_s: float | None = None) -> list[bytes]:
        values = self._client.exchange(key, payload, self._n,
                                       self._timeout if timeout_s is None else timeout_s)
        by_index = {int(name.rsplit(" ", 1)[1]): v for name, v in values.items()}
        return [by_index[i] for i in range(self._n)]

    def share(self, key: str, payload: bytes | None) -> bytes:
        if self._index == 0:
            self._client.publish(key, payload)
            return payload
        return self._client.fetch(key, self._timeout)


class CollectiveAgreement:
    """The same agreement without a job coordinator (a process that joined
    through TF_CONFIG): the payloads travel in all-reduces of float64 vectors
    (Runner's `sum_over_workers`, the collective distributed evaluation uses),
    each worker filling only its own slots with its bytes, 6 to a value
    (exact in float64). First the lengths, then the payloads padded to the
    longest. Every worker makes the same calls in the same order, which is
    what the collectives need. share() is a gather of which only the chief's
    payload is kept. No timeout: a collective waits for every worker (the job
    summary at close, which a worker may never reach, is left out)."""

    BYTES_PER_VALUE = 6
    has_timeout = False

    def __init__(self, worker_index: int, num_workers: int) -> None:
        self._index = worker_index
        self._n = num_workers
        self.sum_over_workers = None   # set by the Runner once its session exists

    def gather(self, key: str, payload: bytes, timeout_s: float | None = None) -> list[bytes]:
        lengths = np.zeros(self._n)
        lengths[self._index] = len(payload)
        lengths = self.sum_over_workers(lengths).astype(np.int64)
        k = self.BYTES_PER_VALUE
        width = -(-int(lengths.max()) // k) or 1
        mine = np.frombuffer(payload.ljust(width * k, b"\0"), np.uint8).reshape(width, k)
        values = np.zeros((self._n, width))
        values[self._index] = mine.astype(np.float64) @ (256.0 ** np.arange(k - 1, -1, -1))
        summed = self.sum_over_workers(values.ravel()).reshape(self._n, width).astype(np.int64)
        out = []
        for i in range(self._n):
            digits = (summed[i][:, None] // (256 ** np.arange(k - 1, -1, -1))) % 256
            out.append(digits.astype(np.uint8).tobytes()[:lengths[i]])
        return out

    def share(self, key: str, payload: bytes | None) -> bytes:
        return self.gather(key, payload if self._index == 0 else b"")[0]


class DropCompute:
    """One worker's DropCompute state across steps (used by runtime.runner):
    the threshold in force, the maximum number of micro-batches, the
    simulated delay, the warm-up records, the CSV and the summary.

    At the end of the warm-up window (steps [first, last) of this run), when
    the threshold is "auto" or a compensation needs the measured drop rate,
    every worker posts its records, the chief decides, every worker adopts
    the chief's decision at the same step boundary."""

    AGREE_KEY = "autopar/dropcompute/warmup"
    DECISION_KEY = "autopar/dropcompute/decision"
    SUMMARY_KEY = "autopar/dropcompute/summary"
    # How long a closing worker waits for the others' totals (job summary).
    SUMMARY_TIMEOUT_S = 10.0

    def __init__(self, config, worker_index: int, num_workers: int,
                 agreement: Agreement | None = None) -> None:
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.micro_batches = config.micro_batches
        self.base_micro_batches = config.micro_batches
        threshold = config.compute_threshold
        self.auto = threshold == "auto"
        self.tau: float | None = None if threshold is None or self.auto else float(threshold)
        self.warmup = tuple(config.dropcompute_warmup)
        self.compensation = config.drop_compensation
        self._agreement = agreement
        self.needs_agreement = self.auto or self.compensation != "none"
        if self.needs_agreement and agreement is None:
            from autopar.common.errors import AutoparError
            raise AutoparError("Config(compute_threshold='auto') and drop_compensation need "
                               "the workers to agree on tau: this Runner has no way to (a "
                               "single-device run); give compute_threshold in seconds with "
                               "drop_compensation='none'")
        d = config.simulated_delay
        self._delay = (DelaySampler(d.median_s, d.sigma, d.max_s, d.seed + worker_index)
                       if d is not None and (d.workers is None or worker_index in d.workers)
                       else None)
        self._log = (StepLog(config.dropcompute_log_dir, worker_index)
                     if config.dropcompute_log_dir else None)
        self._warm: list[StepRecord] = []
        self.decided = not self.needs_agreement
        self.prediction: SpeedupEstimate | None = None
        self.agreed_fraction: float | None = None   # job-wide, decided after the warm-up
        self._computed = 0
        self._possible = 0
        self._before: list[float] = []    # step times before the decision
        self._after: list[float] = []     # ... and after, with their computed fractions
        self._after_frac: list[float] = []

    # -- per micro-batch -----------------------------------------------------
    def may_compute(self, index: int, compute_s: float) -> bool:
        """Whether micro-batch `index` (0-based) runs, compute_s seconds into
        the step: before M, and while compute time is below tau (the first
        one always runs)."""
        if index >= self.micro_batches:
            return False
        return index == 0 or self.tau is None or compute_s < self.tau

    def delay(self) -> float:
        """Sleep the simulated delay (if this worker has one); its length."""
        if self._delay is None:
            return 0.0
        seconds = self._delay.sample()
        time.sleep(seconds)
        return seconds

    # -- per step ------------------------------------------------------------
    def totals(self) -> tuple[float | None, int, int]:
        """(τ in force, micro-batches computed, micro-batches possible) so far."""
        return self.tau, self._computed, self._possible

    def record(self, rec: StepRecord) -> None:
        if self._log is not None:
            self._log.write(rec, self.tau)
        self._computed += rec.computed
        self._possible += rec.computed + rec.dropped
        first, last = self.warmup
        if self.decided:
            self._after.append(rec.step_s)
            self._after_frac.append(rec.computed / max(1, rec.computed + rec.dropped))
        elif first <= rec.step < last:
            self._before.append(rec.step_s)
            self._warm.append(rec)
            if rec.step == last - 1:
                self._decide()

    @property
    def computed_fraction(self) -> float:
        """Micro-batches computed / possible, over every step so far."""
        return self._computed / self._possible if self._possible else 1.0

    def extra_steps(self, base_steps: int) -> int:
        """drop_compensation="steps" (§4.5): how many steps to add to
        base_steps to compute as many samples as base_steps without drops,
        from the job-wide computed fraction the chief decided at the end of
        the warm-up (every worker gets the same number: they must all run
        the same steps). 0 before that decision."""
        return extra_steps(base_steps, self.agreed_fraction) if self.agreed_fraction else 0

    def _decide(self) -> None:
        blobs = self._agreement.gather(self.AGREE_KEY, encode_warmup(self._warm))
        decision = None
        if self.worker_index == 0:
            fractions = [r[2] for b in blobs for r in json.loads(b)]
            decision = json.dumps(self._chief_decision(*decode_warmups(blobs), fractions)).encode()
        decision = json.loads(self._agreement.share(self.DECISION_KEY, decision))
        self.tau = decision["tau"]
        self.micro_batches = decision["micro_batches"]
        self.agreed_fraction = decision["computed_fraction"]
        if decision.get("prediction"):
            self.prediction = SpeedupEstimate(**decision["prediction"])
        self.decided = True
        log.info("worker %d: DropCompute threshold %s, up to %d micro-batches per step",
                 self.worker_index, "none" if self.tau is None else f"{self.tau:.4f} s",
                 self.micro_batches)

    def _chief_decision(self, latencies: np.ndarray, apply_times: np.ndarray,
                        computed_fractions: list[float]) -> dict:
        tc = serial_latency(apply_times)
        tau, prediction = self.tau, None
        if self.auto:
            est = choose_threshold(latencies, tc)
            log.info("%s", describe_choice(est, latencies, tc))
            tau, prediction = est.tau, est
            fraction = est.computed_fraction
        else:
            # With a fixed tau the warm-up steps already dropped: the
            # fraction every worker measured then.
            fraction = float(np.mean(computed_fractions))
        m = self.base_micro_batches
        if self.compensation == "batch":
            m = compensated_micro_batches(self.base_micro_batches, fraction)
            log.info("DropCompute compensation: up to %d micro-batches per step (was %d) "
                     "keeps the average computed batch at %d micro-batches (computed "
                     "fraction %.3f)", m, self.base_micro_batches, self.base_micro_batches,
                     fraction)
        return {"tau": tau, "micro_batches": m, "computed_fraction": fraction,
                "prediction": None if prediction is None else {
                    "tau": prediction.tau, "speedup": prediction.speedup,
                    "computed_fraction": prediction.computed_fraction,
                    "step_time": prediction.step_time,
                    "baseline_step_time": prediction.baseline_step_time}}

    def summary(self) -> str:
        parts = [f"worker {self.worker_index}: DropCompute computed {self._computed} of "
                 f"{self._possible} micro-batches (drop rate {1 - self.computed_fraction:.1%})"]
        if self._before and self._after and self.auto:
            # Throughput in computed micro-batches/s after the decision over
            # that before it (no threshold during the warm-up): eq. 6 measured.
            measured = (float(np.mean(self._after_frac)) * float(np.mean(self._before))
                        / float(np.mean(self._after)))
            parts.append(f"measured effective speedup {measured:.3f}x")
            if self.prediction is not None:
                parts.append(f"predicted {self.prediction.speedup:.3f}x")
        return "; ".join(parts)

    def close(self) -> None:
        if self._possible:
            log.info("%s", self.summary())
            if self.needs_agreement and self._agreement.has_timeout:
                self._job_summary()
        if self._log is not None:
            self._log.close()

    def _job_summary(self) -> None:
        """Every worker posts its totals; the chief logs the job's drop rate
        beside its measured and predicted effective speedup. Best effort: a
        worker that never closes its Runner only costs SUMMARY_TIMEOUT_S."""
        import grpc
        try:
            blobs = self._agreement.gather(self.SUMMARY_KEY,
                                           json.dumps([int(self._computed), int(self._possible)]).encode(),
                                           self.SUMMARY_TIMEOUT_S)
        except grpc.RpcError as e:
            log.debug("no DropCompute job summary: %s", e)
            return
        if self.worker_index != 0:
            return
        totals = np.sum([json.loads(b) for b in blobs], axis=0)
        log.info("DropCompute job: %d workers computed %d of %d micro-batches (drop rate %.1f%%)%s",
                 self.num_workers, totals[0], totals[1], 100 * (1 - totals[0] / max(1, totals[1])),
                 "" if self.prediction is None else
                 f"; predicted drop rate {self.prediction.drop_rate:.1%}")
