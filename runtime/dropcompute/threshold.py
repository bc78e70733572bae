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

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

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
