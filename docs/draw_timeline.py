"""Draw one step of a job's timeline (Config(timeline=...)) as a PNG, lanes
as rows, the way chrome://tracing shows them:

    python -m docs.draw_timeline job.trace.json docs/timeline.png [--step N]

The picture in docs/inside-a-job.md is this drawing of a real job's file.
"""
from __future__ import annotations

import argparse
import json

COLOURS = {"step": "#d0d0d0", "forward": "#4c72b0", "backward": "#55a868", "update": "#8172b2",
           "all-reduce": "#c44e52", "all-gather": "#dd8452", "collective transfer": "#f2b5b5",
           "pull": "#64b5cd", "push": "#937860", "server update": "#da8bc3", "barrier": "#222222",
           "herring": "#ccb974", "micro-batch": "#8c8c8c", "checkpoint": "#000000"}


def draw(trace: dict, out: str, step: int | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    step = trace["otherData"]["steps"][-1] if step is None else step
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["step"] == step]
    t0 = min(e["ts"] for e in spans)
    rows = []          # (lane pid, category) in lane order, categories as they come
    for pid in sorted(lanes):
        for cat in COLOURS:
            if any(e["pid"] == pid and e["cat"] == cat for e in spans):
                rows.append((pid, cat))
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 1.2))
    for y, (pid, cat) in enumerate(rows):
        for e in spans:
            if e["pid"] == pid and e["cat"] == cat:
                ax.barh(y, max(e["dur"], 20) / 1e3, left=(e["ts"] - t0) / 1e3, height=0.8,
                        color=COLOURS[cat], edgecolor="none")
    ax.set_yticks(range(len(rows)), [f"{lanes[p]}  {c}" for p, c in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first event")
    ax.set_title(f"job {trace['otherData']['job']}: global step {step}, every lane", fontsize=10)
    used = sorted({c for _, c in rows}, key=list(COLOURS).index)
    ax.legend(handles=[Patch(color=COLOURS[c], label=c) for c in used], fontsize=7,
              loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--step", type=int)
    args = p.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        draw(json.load(f), args.out, args.step)


if __name__ == "__main__":
    main()
