"""How analysis and rewrite time grow with the size of the training graph.

Builds bench/bert_graph.py's BERT-style encoder at several depths and, for an
8-worker, 2-host, 2-server topology, times the analysis (graph analysis,
plan, OPAU/OPSW placement: what the launcher does before anything starts) and
the rewrite of worker 0's graph for each run option (what every worker does
before its first step). Also records the op count, the GraphDef sizes before
and after, and peak memory. Writes bench/results/transform_scale.json and a
log-log plot of time vs ops.

    .venv/bin/python bench/transform_scale.py                       # 3, 6, 12, 24 layers
    .venv/bin/python bench/transform_scale.py --layers 3 6 --hidden 64 --profile /tmp/prof

Hidden size changes the memory the graph's constants take, not the op count:
the default (1024, BERT-large) is what the timings in the README use.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.bert_graph import build  # noqa: E402
from autopar.transforms.analysis import analyze_graph  # noqa: E402
from autopar.transforms.graph_utils import graph_of  # noqa: E402
from autopar.transforms.placement import place_ops  # noqa: E402
from autopar.transforms.plan import PlanOptions, Topology, make_plan  # noqa: E402
from autopar.transforms.rewrite import rewrite_for_worker  # noqa: E402

OPTIONS = ("allreduce", "hybrid", "ps")
TOPOLOGY = Topology(("10.0.0.1",) * 4 + ("10.0.0.2",) * 4, num_servers=2)


def _timed(fn, profile_path: str | None):
    profiler = cProfile.Profile() if profile_path else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    result = fn()
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile_path)
    return result, time.perf_counter() - start


def measure(layers: int, hidden: int, options, profile_dir: str | None) -> dict:
    graph, *_ = build(layers, hidden, heads=max(1, hidden // 64))
    ops = len(graph.get_operations())
    with graph.as_default():
        import tensorflow as tf
        trainable = len(tf.compat.v1.trainable_variables())
        original_bytes = graph.as_graph_def().ByteSize()
    row = {"layers": layers, "hidden": hidden, "ops": ops, "trainable_variables": trainable,
           "graph_def_bytes": original_bytes, "analyze_s": {}, "rewrite_s": {},
           "rewritten_graph_def_bytes": {}, "rewritten_nodes": {}}

    def prof(name):
        return os.path.join(profile_dir, f"L{layers}-{name}.prof") if profile_dir else None

    for option in options:
        plan_options = PlanOptions(run_option=option)

        def analyze():
            analysis = analyze_graph(graph)
            plan = make_plan(analysis, TOPOLOGY, options=plan_options)
            place_ops(graph_of(graph), analysis, plan)
            return analysis, plan
        (analysis, plan), row["analyze_s"][option] = _timed(analyze, prof(f"analyze-{option}"))
        worker, row["rewrite_s"][option] = _timed(
            lambda: rewrite_for_worker(graph, analysis, plan, 0), prof(f"rewrite-{option}"))
        row["rewritten_graph_def_bytes"][option] = worker.meta_graph.graph_def.ByteSize()
        row["rewritten_nodes"][option] = len(worker.meta_graph.graph_def.node)
        print(f"L={layers:>2} ops={ops:>6} vars={trainable:>4} {option:>9}: "
              f"analyze {row['analyze_s'][option]:7.2f} s  rewrite {row['rewrite_s'][option]:7.2f} s  "
              f"GraphDef {original_bytes / 1e6:6.1f} -> "
              f"{row['rewritten_graph_def_bytes'][option] / 1e6:6.1f} MB", flush=True)
        del worker
        gc.collect()
    row["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ops = [r["ops"] for r in rows]
    first = rows[0]["analyze_s"]
    for option in first:
        ax.plot(ops, [r["analyze_s"][option] for r in rows], "o--", label=f"analyze ({option})")
        ax.plot(ops, [r["rewrite_s"][option] for r in rows], "s-", label=f"rewrite worker 0 ({option})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops in the training graph")
    ax.set_ylabel("seconds")
    ax.set_title("analysis and rewrite time vs graph size (BERT-style encoder)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[3, 6, 12, 24])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--options", nargs="+", default=list(OPTIONS), choices=OPTIONS)
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "transform_scale.json"))
    p.add_argument("--profile", metavar="DIR", help="write a cProfile per phase here")
    args = p.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    rows = [measure(layers, args.hidden, args.options, args.profile) for layers in args.layers]
    for r in rows:
        r["per_10k_ops_s"] = {
            phase: {o: r[f"{phase}_s"][o] / r["ops"] * 1e4 for o in r[f"{phase}_s"]}
            for phase in ("analyze", "rewrite")}
    result = {"machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                          "load_avg_1min_after": os.getloadavg()[0]},
              "topology": {"workers": TOPOLOGY.num_workers, "hosts": len(TOPOLOGY.hosts),
                           "servers": TOPOLOGY.num_servers},
              "bound": "pure Python/TensorFlow graph building on one core: CPU time of this "
                       "process, no communication",
              "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
