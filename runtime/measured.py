"""Measured against predicted, on the chief (Config.measure_steps).

The report's bytes per step are a prediction: exact for dense gradients,
an upper bound for sparse ones, whose rows the analysis counts as one per
looked-up id of the batch (``a`` = those rows / the table's rows), or, where
the graph leaves the batch size open (a traced step's inputs), an estimate
at a = 1, which this log shows beside the measured figure with its error. Over its
first training steps the chief fetches, with each step, how many rows each
sparse gradient of the step had and how many distinct ids they were; then it
logs, per synchronisation method, the bytes the step's gradients carried
(the method's byte model on the rows that really travelled: every row for an
all-gather, one per distinct id for the servers' push and pull) beside the
plan's figure, and the ``a`` it observed. Where the job has a network of its
own (a loopback job in its private network namespace, which has nothing but
loopback), it also counts the bytes every process of the job really sent
there, protocol overhead included, beside the plan's total for the job.

The rows are the chief's own batches': the other workers' are alike when
the input is sharded from one distribution.
"""
from __future__ import annotations

import logging
from collections import defaultdict

import tensorflow as tf

from autopar.transforms.methods.registry import METHODS
from autopar.transforms.report import Report, build_report, human_bytes

log = logging.getLogger("autopar.measured")


def loopback_only_sent_bytes(path: str = "/proc/self/net/dev") -> int | None:
    """Bytes sent on this network namespace's interfaces, when its only
    interface is loopback (then every byte is a process's of the namespace);
    None otherwise or where it cannot be read."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()[2:]
    except OSError:
        return None
    interfaces = {}
    for line in lines:
        name, _, counters = line.partition(":")
        fields = counters.split()
        if len(fields) >= 9:
            interfaces[name.strip()] = int(fields[8])    # transmit bytes
    return interfaces["lo"] if set(interfaces) == {"lo"} else None


class Meter:
    """What the chief measures over ``steps`` training steps from its second
    (module docstring; the network over all but the first of them: those
    two send every process its part of the graph for their fetches). ``board``: a runtime.tensorboard.ChiefBoard
    the measured values also go to."""

    def __init__(self, graph: tf.Graph, analysis, plan, num_workers: int, steps: int,
                 first_step: int = 0, board=None) -> None:
        self.analysis, self.plan = analysis, plan
        self.num_workers = num_workers
        self.board = board
        self._steps = steps
        self._warm = False          # the first step ran (not measured)
        self._first = None          # the first global step measured
        self._done = False
        self._measured = 0
        self._rows: dict[str, list[int]] = defaultdict(list)      # per step
        self._distinct: dict[str, list[int]] = defaultdict(list)
        self._sent_before: int | None = None
        self._sent_after: int | None = None
        # variable -> (rows, distinct ids) of its sparse gradient this step
        self._tensors: dict[str, tuple[tf.Tensor, tf.Tensor]] = {}
        with graph.as_default(), tf.name_scope("autopar/measure/"):
            for v in analysis.variables:
                if v.gradient != "sparse":
                    continue
                try:
                    values = graph.get_tensor_by_name(v.grad_values)
                    indices = graph.get_tensor_by_name(v.grad_indices)
                except (KeyError, ValueError):
                    continue    # not in this worker's graph: not measured
                with tf.device(values.device):
                    self._tensors[v.name] = (
                        tf.shape(values, out_type=tf.int64)[0],
                        tf.size(tf.unique(tf.reshape(indices, [-1])).y, out_type=tf.int64))

    def fetches(self, step: int, groups: set[int]) -> dict | None:
        """What step ``step`` (updating train groups ``groups``) fetches for
        the measurement, or None once it is over."""
        if self._done or not self._steps:
            return None
        if not self._warm:
            # The first step sends every process its part of the graph.
            self._warm = True
            return None
        if self._first is None:
            self._first = step
        wanted = set()
        for g in groups:
            wanted.update(self.analysis.train_groups[g].variables)
        return {name: pair for name, pair in self._tensors.items() if name in wanted}

    def measured(self, step: int, got: dict) -> None:
        """The step's fetched counts; the summary once ``steps`` are in."""
        for name, (rows, distinct) in got.items():
            self._rows[name].append(int(rows))
            self._distinct[name].append(int(distinct))
        self._measured += 1
        if self._measured == 1:
            # Counted from here: the first measured step's fetches differ
            # from the steps', so it too sent graph parts.
            self._sent_before = loopback_only_sent_bytes()
        if self._measured >= self._steps:
            self._sent_after = loopback_only_sent_bytes()
            self._finish(step)

    def close(self) -> None:
        """A job shorter than the measurement: summarise what was measured."""
        if not self._done and self._measured:
            self._sent_after = loopback_only_sent_bytes()
            self._finish(self._first + self._measured - 1)

    # -- the summary ----------------------------------------------------------
    def alpha(self, name: str, kind: str) -> float | None:
        """The share of ``name``'s table rows its gradient carried per step
        (``kind``: "rows" or "distinct"), on average; None if not measured."""
        counts = (self._rows if kind == "rows" else self._distinct).get(name)
        v = self.analysis.variable(name)
        if not counts or not v.shape or not v.shape[0]:
            return None
        return sum(counts) / len(counts) / v.shape[0]

    def reports(self) -> tuple[Report, Report]:
        """The plan's report (the analysis's ``a``, 1 where unknown) and the
        same byte model at the ``a`` measured: the rows each variable's
        method moves (SyncMethod.sparse_rows)."""
        alphas = {}
        for name in self._rows:
            seen = self.alpha(name, METHODS[self.plan.variable(name).method].sparse_rows)
            if seen is not None:
                alphas[name] = seen
        return (build_report(self.analysis, self.plan, self.num_workers),
                build_report(self.analysis, self.plan, self.num_workers, alphas=alphas))

    def network_sent_per_step(self) -> float | None:
        if self._sent_before is None or self._sent_after is None or self._measured < 2:
            return None
        return (self._sent_after - self._sent_before) / (self._measured - 1)

    def _finish(self, last: int) -> None:
        self._done = True
        plan_report, seen_report = self.reports()
        planned, seen = plan_report.bytes_per_method(), seen_report.bytes_per_method()
        lines = [f"measured over steps {self._first}-{last} (the chief's batches) against the "
                 "plan, bytes per worker per step:"]
        for method in sorted(planned):
            mine = [v for v in plan_report.variables if v.method == method]
            kinds = sorted({v.kind for v in mine})
            (s, r), (ps, pr) = seen[method], planned[method]
            if "sparse" not in kinds:
                what = "the plan's"
            elif all(v.bytes_bound for v in mine):
                what = "the plan's (an upper bound)"
            else:
                # Rows unknown before running: an estimate at a = 1, its error shown.
                error = f", measured {s / ps:.2f}x it" if ps else ""
                what = f"the plan's (an estimate{error})"
            lines.append(f"  {method} ({', '.join(kinds)}): sent {human_bytes(s)}, received "
                         f"{human_bytes(r)}; {what}: {human_bytes(ps)}, {human_bytes(pr)}")
        scalars = {}
        for name in sorted(self._rows):
            v = self.analysis.variable(name)
            method = METHODS[self.plan.variable(name).method]
            rows, distinct = self.alpha(name, "rows"), self.alpha(name, "distinct")
            if v.alpha is not None:
                planned_alpha = f"<= {v.alpha:.4f}"
            elif not method.pushes_every_row(v):
                planned_alpha = "unknown before running (1 assumed)"   # a bound: the table
            else:
                planned_alpha = f"unknown before running (1 estimated, measured {rows:.2f}x it)"
            moves = ("every row" if method.sparse_rows == "rows" else
                     "every row to the servers, one per distinct id back"
                     if method.pushes_every_row(v) else "one row per distinct id")
            lines.append(f"    {name}: a = {rows:.4f} of its rows per step, {distinct:.4f} "
                         f"distinct ({method.name} moves {moves}); the plan's a {planned_alpha}")
            scalars[f"autopar/measured/alpha/{name}"] = rows
            scalars[f"autopar/measured/alpha_distinct/{name}"] = distinct
        network = self.network_sent_per_step()
        if network is not None:
            seen_job, planned_job = seen_report.job_sent, plan_report.job_sent
            ratio = f" ({network / seen_job:.2f}x)" if seen_job else ""
            lines.append(f"  the job's network (its private loopback, every process): "
                         f"{human_bytes(network)} sent per step{ratio}; the plan's bytes at the "
                         f"measured rows {human_bytes(seen_job)}, its estimate {human_bytes(planned_job)} "
                         "(the difference: protocol headers and RPC framing)")
            scalars["autopar/measured/job_network_bytes"] = network
        else:
            lines.append("  the job's network: not counted (its processes share this "
                         "machine's interfaces with other traffic, or run on several hosts)")
        for method, (s, r) in seen.items():
            scalars[f"autopar/measured/bytes_sent/{method}"] = s
            scalars[f"autopar/measured/bytes_received/{method}"] = r
        log.info("%s", "\n".join(lines))
        if self.board is not None:
            self.board.measured(last, scalars)
