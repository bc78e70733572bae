"""Where a step's time goes, from the job timeline (runtime/timeline.py).

    sudo BENCH_TIMELINE=1 .venv/bin/python -m bench.run --name NAME --hosts 8 \\
        --workloads sparse --link-mbit 100 --steps sparse=2:30 \\
        --peers autopar-hybrid,autopar-herring,autopar-ps
    .venv/bin/python -m bench.breakdown bench/results/NAME.json

With BENCH_TIMELINE set, every autopar peer runs with Config(timeline=...)
(one step in 10 traced) and its workers write their parts beside their logs.
For each point this merges the parts and, for the chief's traced steps,
gives every phase of the step (bench/README.md, "Step breakdown"): when it
starts and ends (ms from the step's start, median over the traced steps)
and how long it is busy (the union of its spans). Phases are the
timeline's: the chief's forward, backward and update, its all-reduce and
all-gather collectives, its receives from servers (pull), the herring
buffers' push-sum-return, the end-of-step barrier, and on the servers the
pushes they received from the chief and their update. Two phases whose
intervals intersect overlap. Writes bench/results/<NAME>-breakdown.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autopar.runtime.timeline import merge

CHIEF = "worker 0"
# Columns, in the order a step runs them: (name, category, lanes: "chief" or "servers")
PHASES = (("pull", "pull", "chief"), ("forward", "forward", "chief"),
          ("backward", "backward", "chief"), ("all-reduce", "all-reduce", "chief"),
          ("all-gather", "all-gather", "chief"),
          ("collective transfer", "collective transfer", "chief"),
          ("herring", "herring", "chief"), ("update", "update", "chief"),
          ("push at servers", "push", "servers"), ("server update", "server update", "servers"),
          ("barrier", "barrier", "chief"))


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3


def step_phases(trace: dict) -> dict[int, dict]:
    """Per traced step of the chief: {"step_ms", phase: (from ms, to ms, busy ms)}."""
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"
             and e["args"].get("by") == CHIEF]
    steps = {}
    for whole in (e for e in spans if e["name"] == "step" and lanes[e["pid"]] == CHIEF):
        step, t0 = whole["args"]["step"], whole["ts"]
        row = {"step_ms": whole["dur"] / 1e3}
        mine = [e for e in spans if e["args"]["step"] == step and e["name"] != "step"]
        for name, category, where in PHASES:
            intervals = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["cat"] == category
                         and (lanes[e["pid"]] == CHIEF) == (where == "chief")]
            if intervals:
                row[name] = (min(s for s, _ in intervals) / 1e3 - t0 / 1e3,
                             max(e for _, e in intervals) / 1e3 - t0 / 1e3, _union_ms(intervals))
        steps[step] = row
    return steps


def summarise(steps: dict[int, dict]) -> dict:
    """Medians over the traced steps."""
    out = {"traced_steps": sorted(steps),
           "step_ms": statistics.median(r["step_ms"] for r in steps.values())}
    for name, _, _ in PHASES:
        rows = [r[name] for r in steps.values() if name in r]
        if rows:
            out[name] = tuple(round(statistics.median(x[i] for x in rows), 1) for i in range(3))
    return out


def point_breakdown(run_dir: Path) -> dict | None:
    parts = {str(p): p.read_bytes() for p in sorted(run_dir.glob("timeline.json.worker-*.json"))}
    if not parts:
        return None
    steps = step_phases(merge(parts, {}, {}, ""))
    return summarise(steps) if steps else None


def markdown(rows: list[dict]) -> str:
    names = [name for name, _, _ in PHASES if any(name in r for r in rows)]
    head = ["workload", "N", "system", "step ms (untraced)", "step ms (traced)"] + names
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["workload"], str(r["N"]), r["system"], f"{r['untraced_ms']:.0f}",
                 f"{r['step_ms']:.0f}"]
        cells += [f"{r[n][0]:.0f}–{r[n][1]:.0f} ({r[n][2]:.0f})" if n in r else "–"
                  for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nEach phase: from–to ms after the chief's step started "
                               "(busy ms), median over its traced steps.\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="bench/results/NAME.json of a BENCH_TIMELINE run")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    rows = []
    for point in results["points"]:
        run_dir = Path(point.get("run_dir", ""))
        found = point_breakdown(run_dir) if run_dir.is_dir() else None
        if found is None:
            continue
        rows.append({"N": point["num_workers"], "system": point["peer"],
                     "workload": point["workload"], "link_mbit": point.get("link_mbit"),
                     "untraced_ms": 1e3 * (point.get("median_step_s") or float("nan")),
                     **found})
    if not rows:
        print(f"no timeline parts in the run directories of {args.results}", file=sys.stderr)
        return 1
    stem = args.results.with_suffix("")
    Path(f"{stem}-breakdown.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows)
    Path(f"{stem}-breakdown.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
