"""One worker's DropCompute state across steps (used by runtime/step/:
the accumulated step and its hook)."""
from __future__ import annotations

import json
import logging
import time

import numpy as np

from autopar.transforms.keys import (DROPCOMPUTE_DECISION_KEY, DROPCOMPUTE_SUMMARY_KEY,
                                     DROPCOMPUTE_WARMUP_KEY)
from autopar.runtime.dropcompute.agreement import Agreement
from autopar.runtime.dropcompute.records import (DelaySampler, StepLog, StepRecord, decode_warmups,
                                                 encode_warmup)
from autopar.runtime.dropcompute.threshold import (SpeedupEstimate, choose_threshold,
                                                   compensated_micro_batches, describe_choice,
                                                   extra_steps, serial_latency)

log = logging.getLogger("autopar.dropcompute")


class DropCompute:
    """One worker's DropCompute state across steps (used by runtime/step/:
    the accumulated step and its hook): the threshold in force, the maximum
    number of micro-batches, the simulated delay, the warm-up records, the
    CSV and the summary.

    At the end of the warm-up window (steps [first, last) of this run), when
    the threshold is "auto" or a compensation needs the measured drop rate,
    every worker posts its records, the chief decides, every worker adopts
    the chief's decision at the same step boundary."""

    AGREE_KEY = DROPCOMPUTE_WARMUP_KEY
    DECISION_KEY = DROPCOMPUTE_DECISION_KEY
    SUMMARY_KEY = DROPCOMPUTE_SUMMARY_KEY
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
        from autopar.runtime.rpc import grpc
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
