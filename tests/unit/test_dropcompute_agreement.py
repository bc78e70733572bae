"""runtime.dropcompute.worker_state.DropCompute across workers: the warm-up agreement on
tau through a real job coordinator (gRPC on loopback, one thread per
worker), the stopping rule, compensation and the CSV."""
import csv
import threading

import numpy as np
import pytest

from autopar import Config
from autopar.common.errors import AutoparError
from autopar.runtime.dropcompute import agreement, records, threshold, worker_state
from autopar.runtime.coordinator import Coordinator
from autopar.runtime.coordinator_client import CoordinatorClient

N, M = 3, 4


def _latencies(worker: int, step: int) -> list[float]:
    rng = np.random.default_rng(10 * step + worker)
    # Worker 2 straggles now and then: a heavy log-normal tail.
    tail = rng.lognormal(np.log(0.02), 1.5, M) if worker == 2 else np.zeros(M)
    return list(0.01 + rng.normal(0.0, 0.001, M) ** 2 + tail)


def _run_workers(config: Config, steps: int, tmp_path):
    coordinator = Coordinator("127.0.0.1", num_workers=N, num_servers=0)
    coordinator.start()
    controllers, errors = {}, []

    def worker(i):
        client = CoordinatorClient(coordinator.address, coordinator.token, "worker", i)
        try:
            d = worker_state.DropCompute(config, i, N, agreement.Agreement(client, i, N, timeout_s=30))
            for step in range(steps):
                lat = _latencies(i, step)
                computed = sum(d.may_compute(k, sum(lat[:k])) for k in range(d.micro_batches))
                d.record(records.StepRecord(step, computed, d.micro_batches - computed,
                                       sum(lat[:computed]), sum(lat) + 0.005, 0.005 + 0.001 * i,
                                       lat[:computed]))
            d.close()
            controllers[i] = d
        except Exception as e:   # noqa: BLE001 - reported by the test thread below
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    coordinator.stop()
    assert not errors, errors
    return controllers


def test_auto_threshold_is_the_chiefs_choice_on_everybodys_warmup(tmp_path, caplog):
    caplog.set_level("INFO", logger="autopar.dropcompute")
    config = Config(micro_batches=M, compute_threshold="auto", dropcompute_warmup=(1, 4),
                    drop_compensation="batch", dropcompute_log_dir=str(tmp_path))
    controllers = _run_workers(config, 6, tmp_path)
    lat = np.array([[_latencies(i, s) for i in range(N)] for s in (1, 2, 3)])
    expected = threshold.choose_threshold(lat, threshold.serial_latency([[0.005 + 0.001 * i for i in range(N)]] * 3))
    assert expected.tau is not None and expected.drop_rate > 0
    assert {c.tau for c in controllers.values()} == {expected.tau}
    # The chief's job summary counts every worker's micro-batches.
    computed = sum(c._computed for c in controllers.values())
    possible = sum(c._possible for c in controllers.values())
    assert f"DropCompute job: {N} workers computed {computed} of {possible} micro-batches" in caplog.text
    assert computed < possible
    m = threshold.compensated_micro_batches(M, expected.computed_fraction)
    assert m > M and {c.micro_batches for c in controllers.values()} == {m}
    for i in range(N):
        with open(tmp_path / f"dropcompute_worker{i}.csv") as f:
            rows = list(csv.DictReader(f))
        assert [r["step"] for r in rows] == [str(s) for s in range(6)]
        # No threshold during the warm-up, the agreed one after it.
        assert [r["tau"] for r in rows[:4]] == [""] * 4
        assert [float(r["tau"]) for r in rows[4:]] == [pytest.approx(expected.tau, abs=1e-6)] * 2


def test_fixed_threshold_with_step_compensation(tmp_path):
    config = Config(micro_batches=M, compute_threshold=0.035, dropcompute_warmup=(0, 2),
                    drop_compensation="steps")
    controllers = _run_workers(config, 3, tmp_path)
    assert {c.tau for c in controllers.values()} == {0.035}
    assert {c.micro_batches for c in controllers.values()} == {M}
    slow = controllers[2]
    assert 0 < slow.computed_fraction < 1 and controllers[0].computed_fraction == 1
    # Every worker adds the same steps, from the fraction of the whole job's warm-up.
    warm = [controllers[i]._warm for i in range(N)]
    fraction = np.mean([r.computed / M for w in warm for r in w])
    assert {c.extra_steps(100) for c in controllers.values()} == {threshold.extra_steps(100, fraction)}
    assert threshold.extra_steps(100, fraction) > 0


def test_stopping_rule():
    d = worker_state.DropCompute(Config(micro_batches=3, compute_threshold=1.0), 0, 1)
    assert d.may_compute(0, 5.0)               # the first micro-batch always runs
    assert d.may_compute(1, 0.99) and not d.may_compute(1, 1.0)
    assert not d.may_compute(3, 0.0)           # never more than micro_batches


def test_auto_without_a_way_to_agree_is_refused():
    with pytest.raises(AutoparError, match="need the workers to agree on tau"):
        worker_state.DropCompute(Config(micro_batches=2, compute_threshold="auto"), 0, 2, None)


def test_collective_agreement_moves_every_workers_bytes_exactly():
    """CollectiveAgreement over a stand-in for the all-reduce (threads adding
    their vectors behind a barrier, round by round): payloads of different
    lengths, an empty one, every byte value, and the chief's share arrive
    unchanged on every worker."""
    n = 3
    barrier = threading.Barrier(n, timeout=30)
    parts: list = [None] * n

    def sum_for(i):
        def sum_over_workers(local):
            parts[i] = local
            barrier.wait()                     # every worker posted this round
            total = np.sum(parts, axis=0)
            barrier.wait()                     # every worker read it before the next round
            return total
        return sum_over_workers

    payloads = [bytes(range(256)) * 3, b"", b"\x00\xff" * 7]
    results: list = [None] * n

    def run(i):
        collective = agreement.CollectiveAgreement(i, n)
        collective.sum_over_workers = sum_for(i)
        results[i] = (collective.gather("k", payloads[i]),
                      collective.share("d", b"chief's decision" if i == 0 else None))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [(payloads, b"chief's decision")] * n
