"""DropCompute's arithmetic (runtime/dropcompute/threshold.py) against Monte-Carlo
simulation of normal micro-batch latencies, and the threshold search against
brute force."""
import numpy as np
import pytest

from autopar.runtime.dropcompute import records, threshold

MU, SIGMA, M = 1.0, 0.3, 12
TRIALS = 4000


def _latencies(rng, steps, n, m=M, mu=MU, sigma=SIGMA):
    return rng.normal(mu, sigma, size=(steps, n, m))


@pytest.mark.parametrize("n", [8, 32, 200])
def test_eq4_expected_max_matches_simulation(n):
    rng = np.random.default_rng(n)
    samples = rng.normal(0.0, 1.0, size=(TRIALS, n)).max(axis=1).mean()
    # Standardised (mu=0, sigma=1): the approximation's own error, not hidden by mu.
    assert threshold.expected_max_normal(0.0, 1.0, n) == pytest.approx(samples, rel=0.04)
    # The step compute time T = max_n sum_m t[n, m]:
    t = _latencies(rng, 2000, n).sum(axis=2).max(axis=1).mean()
    assert threshold.expected_step_compute(MU, SIGMA, n, M) == pytest.approx(t, rel=0.01)


@pytest.mark.parametrize("rule", threshold.RULES)
@pytest.mark.parametrize("tau", [6.0, 10.5, 11.5, 13.0])
def test_eq5_expected_micro_batches_matches_simulation(tau, rule):
    rng = np.random.default_rng(int(tau * 10))
    computed, _ = threshold.computed_and_time(_latencies(rng, TRIALS, 1), tau, rule)
    assert threshold.expected_micro_batches(tau, MU, SIGMA, M, rule) == pytest.approx(
        computed.mean(), rel=0.02)


@pytest.mark.parametrize("n", [8, 50, 200])
@pytest.mark.parametrize("tau_per_micro", [0.95, 1.0, 1.05])
def test_eq6_analytic_speedup_matches_simulation(n, tau_per_micro):
    rng = np.random.default_rng(n)
    lat = _latencies(rng, 600, n)
    tau, tc = tau_per_micro * M * MU, 0.5
    simulated = threshold.empirical_speedup(lat, tau, tc, rule="preempt")
    assert threshold.analytic_speedup(tau, MU, SIGMA, n, M, tc) == pytest.approx(simulated.speedup,
                                                                          rel=0.03)
    # Dropping helps more the more workers there are (E[T] grows like sqrt(log N)).
    assert simulated.speedup > 1.0


def test_empirical_speedup_counts_what_each_rule_computes():
    lat = np.array([[[1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]]])   # 1 step, 2 workers
    check = threshold.empirical_speedup(lat, 2.5, rule="check")
    # worker 0: starts micro-batches at 0,1,2 (<2.5) -> 3, done at 3; worker 1: 1, done at 3.
    assert check.computed_fraction == pytest.approx(4 / 8)
    assert check.step_time == pytest.approx(3.0)
    assert check.speedup == pytest.approx(0.5 * 12 / 3)
    preempt = threshold.empirical_speedup(lat, 2.5, rule="preempt")
    # worker 0: 2 completed before 2.5; worker 1: none; both stop at 2.5.
    assert preempt.computed_fraction == pytest.approx(2 / 8)
    assert preempt.step_time == pytest.approx(2.5)


@pytest.mark.slow
@pytest.mark.parametrize("rule", threshold.RULES)
@pytest.mark.parametrize("n", [4, 8, 64])
def test_threshold_search_returns_the_empirical_maximiser(n, rule):
    rng = np.random.default_rng(100 + n)
    # Log-normal tails, like the simulated-delay environment.
    lat = 0.05 + np.minimum(2.0, rng.lognormal(np.log(0.05), 1.0, size=(20, n, 6)))
    tc = 0.03
    best = threshold.choose_threshold(lat, tc, rule)
    cum = np.cumsum(lat, axis=2)
    grid = np.linspace(0.0, cum.max() * 1.01, 4001)
    brute = max([threshold.empirical_speedup(lat, float(t), tc, rule).speedup for t in grid]
                + [threshold.empirical_speedup(lat, None, tc, rule).speedup])
    assert best.speedup >= brute - 1e-12
    # ... and the reported value is S_eff at the returned tau.
    assert threshold.empirical_speedup(lat, best.tau, tc, rule).speedup == pytest.approx(best.speedup)
    assert best.tau is not None and best.speedup > 1.0


def test_no_threshold_when_latencies_do_not_vary():
    lat = np.full((5, 8, 4), 0.1)
    assert threshold.choose_threshold(lat, 0.01).tau is None


def test_compensation():
    assert threshold.compensated_micro_batches(12, 0.9) == 14    # ceil(13.33)
    assert threshold.compensated_micro_batches(10, 1.0) == 10
    assert threshold.extra_steps(100, 0.9) == 12                 # ceil(11.1)
    assert threshold.extra_steps(100, 1.0) == 0


def test_delay_sampler_is_bounded_seeded_lognormal():
    a = [records.DelaySampler(0.05, 1.0, 0.2, seed=3).sample() for _ in range(1)]
    s = records.DelaySampler(0.05, 1.0, 0.2, seed=3)
    draws = np.array([s.sample() for _ in range(5000)])
    assert draws[0] == a[0]
    assert draws.max() <= 0.2 and draws.min() > 0
    # The median of exp(N(log 0.05, 1)) is 0.05 (the bound is above it).
    assert np.median(draws) == pytest.approx(0.05, rel=0.1)
    assert records.DelaySampler(0.05, 0.0, 1.0, seed=1).sample() == pytest.approx(0.05)


def test_warmup_records_round_trip():
    recs = [records.StepRecord(step=s, computed=3, dropped=0, compute_s=0.3, step_s=0.4, apply_s=0.1 * s,
                          latencies=[0.1, 0.1, 0.1 + s]) for s in range(3)]
    lat, apply = records.decode_warmups([records.encode_warmup(recs), records.encode_warmup(recs[:2])])
    assert lat.shape == (2, 2, 3) and apply.shape == (2, 2)
    assert lat[1, 0, 2] == pytest.approx(1.1)
    assert threshold.serial_latency(apply) == pytest.approx(0.05)
