"""How analysis and rewrite time grow with the size of the training graph.

Builds bench/bert_graph.py's BERT-style encoder at several depths and, for an
8-worker, 2-host, 2-server topology, times the analysis (graph analysis,
plan, OPAU/OPSW placement: what the launcher does before anything starts) and
the rewrite of worker 0's graph for each run option (what every worker does
before its first step). Also records the op count, the GraphDef sizes before
and after, peak memory, and the seconds of each phase of the analysis, each
graph feature's detection on its own (transforms/features). Writes
bench/results/transform_scale.json and a
log-log plot of time vs ops (same name, .png).

    .venv/bin/python -m bench.transform_scale                       # 3, 6, 12, 24 layers
    .venv/bin/python -m bench.transform_scale --layers 12 24 --skip-rewrite
    .venv/bin/python -m bench.transform_scale --layers 3 6 --hidden 64 --profile /tmp/prof
    .venv/bin/python -m bench.transform_scale --end-to-end          # 24 layers, 2 local workers

Hidden size changes the memory the graph's constants take, not the op count:
the default (1024, BERT-large) is what the timings in docs/benchmarks.md use. Times
are wall-clock seconds of this process, with its CPU seconds alongside (the
machine may be shared: CPU time is what the code itself costs). Each rewrite
runs --repeats times (default 3) and the median is reported; each row also
records the machine's Python speed at that moment (python_speed_s), because
this VM's CPU time for the same work varies up to 2x with the host's load.

--end-to-end launches bert_graph.py on resource_specs/localhost_2workers.yaml
(hidden 64) and reports the time from launch to two finished steps, split
into the phases each worker logs (see bert_graph.py --phase-times).
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import re
import resource
import subprocess
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
RESULTS = REPO_ROOT / "bench" / "results"


def _timed(fn, profile_path: str | None = None):
    """(result, wall seconds, CPU seconds of this process)."""
    profiler = cProfile.Profile() if profile_path else None
    gc.collect()   # garbage of the previous phase is not this phase's cost
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    result = fn()
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile_path)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def python_speed_s() -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this (virtual)
    machine runs Python right now. On this VM it varies up to 2x from minute
    to minute with the host's load, so each row records it beside its times."""
    cpu = time.process_time()
    total = 0
    for i in range(2_000_000):
        total += i
    return time.process_time() - cpu


def measure(layers: int, hidden: int, options, profile_dir: str | None,
            skip_rewrite: bool, repeats: int = 1) -> dict:
    graph, *_ = build(layers, hidden, heads=max(1, hidden // 64))
    ops = len(graph.get_operations())
    with graph.as_default():
        import tensorflow as tf
        trainable = len(tf.compat.v1.trainable_variables())
        original = graph.as_graph_def()
    row = {"layers": layers, "hidden": hidden, "ops": ops, "trainable_variables": trainable,
           "graph_def_bytes": original.ByteSize(), "graph_def_nodes": len(original.node),
           # analyze_graph alone, the first time on this graph (what a
           # fresh launcher or worker process pays), then again; and the
           # seconds of each of its phases, each graph feature's find its own
           "analyze_graph_s": {}, "analyze_graph_cpu_s": {}, "analyze_graph_phases_s": {},
           # analyze_graph + make_plan + place_ops: autopar.analyze
           "analyze_s": {}, "plan_s": {}, "place_s": {},
           # rewrite: the median of `repeats` rewrites (a worker does one; the
           # median takes the machine's minute-to-minute noise out), every run
           # listed in rewrite_cpu_runs_s, the first one first
           "rewrite_s": {}, "rewrite_cpu_s": {}, "rewrite_cpu_runs_s": {},
           "python_speed_s": python_speed_s(),
           "rewritten_graph_def_bytes": {}, "rewritten_nodes": {}, "size_ratio": {}}
    del original
    print(f"L={layers:>2}: machine speed now {row['python_speed_s']:.2f} CPU s per 2M-iteration "
          "Python loop (python_speed_s)", flush=True)

    def prof(name):
        return os.path.join(profile_dir, f"L{layers}-{name}.prof") if profile_dir else None

    for option in options:
        plan_options = PlanOptions(run_option=option)
        phases: dict[str, float] = {}
        analysis, t_graph, c_graph = _timed(lambda: analyze_graph(graph, timings=phases),
                                            prof(f"analyze-{option}"))
        row["analyze_graph_phases_s"][option] = phases
        plan, t_plan, _ = _timed(lambda: make_plan(analysis, TOPOLOGY, options=plan_options))
        moves, t_place, _ = _timed(lambda: place_ops(graph_of(graph), analysis, plan))
        row["analyze_graph_s"][option] = t_graph
        row["analyze_graph_cpu_s"][option] = c_graph
        row["plan_s"][option] = t_plan
        row["place_s"][option] = t_place
        row["analyze_s"][option] = t_graph + t_plan + t_place
        line = (f"L={layers:>2} ops={ops:>6} vars={trainable:>4} {option:>9}: "
                f"analyze {row['analyze_s'][option]:6.2f} s (graph {t_graph:5.2f} s, "
                f"cpu {c_graph:5.2f} s; plan {t_plan:5.2f}; place {t_place:5.2f})")
        if not skip_rewrite:
            # With the compiled placement, as a worker rewrites (runtime.worker).
            runs = []
            for k in range(repeats):
                worker, t_rw, c_rw = _timed(
                    lambda: rewrite_for_worker(graph, analysis, plan, 0, moves=moves),
                    prof(f"rewrite-{option}") if k == 0 else None)
                runs.append((c_rw, t_rw))
                if k < repeats - 1:
                    del worker
            c_rw, t_rw = sorted(runs)[len(runs) // 2]
            size = worker.meta_graph.graph_def.ByteSize()
            row["rewrite_s"][option] = t_rw
            row["rewrite_cpu_s"][option] = c_rw
            row["rewrite_cpu_runs_s"][option] = [c for c, _ in runs]
            row["rewritten_graph_def_bytes"][option] = size
            row["rewritten_nodes"][option] = len(worker.meta_graph.graph_def.node)
            row["size_ratio"][option] = size / row["graph_def_bytes"]
            line += (f"  rewrite {t_rw:7.2f} s (cpu {c_rw:6.2f}"
                     + (f", median of {repeats}: " + " ".join(f"{c:.2f}" for c, _ in runs)
                        if repeats > 1 else "") + ")  GraphDef "
                     f"{row['graph_def_bytes'] / 1e6:5.1f} -> {size / 1e6:5.1f} MB "
                     f"(x{row['size_ratio'][option]:.2f}, {row['graph_def_nodes']} -> "
                     f"{row['rewritten_nodes'][option]} nodes)")
            del worker
        print(line, flush=True)
        print("      analyze_graph by phase: " + "  ".join(
            f"{name} {seconds:.3f}" for name, seconds in phases.items()), flush=True)
    row["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def plot(rows: list[dict], path: Path) -> None:
    """CPU seconds (the machine may be shared: wall time there measures the
    other jobs too) of analyze_graph and of worker 0's rewrite vs ops."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ops = [r["ops"] for r in rows]
    for option in rows[0]["analyze_graph_cpu_s"]:
        ax.plot(ops, [r["analyze_graph_cpu_s"][option] for r in rows], "o--",
                label=f"analyze ({option})")
        if all(option in r["rewrite_cpu_s"] for r in rows):
            ax.plot(ops, [r["rewrite_cpu_s"][option] for r in rows], "s-",
                    label=f"rewrite worker 0 ({option})")
    # A line of slope 1 through the first analysis point: linear growth.
    first = rows[0]["analyze_graph_cpu_s"][next(iter(rows[0]["analyze_graph_cpu_s"]))]
    ax.plot(ops, [first * n / ops[0] for n in ops], ":", color="grey", label="linear in ops")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops in the training graph")
    ax.set_ylabel("CPU seconds")
    ax.set_title("analysis and rewrite time vs graph size (BERT-style encoder)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# End to end: launch to two finished steps on 2 local workers.

_PHASES = re.compile(r"PHASES (\{.*\})")
_LAUNCHER = re.compile(r"LAUNCHER (\{.*\})")


def end_to_end(layers: int, hidden: int, steps: int, run_option: str) -> dict:
    """Runs bert_graph.py under autopar's launcher and reads back the phase
    times each worker prints (one "PHASES {json}" line per worker)."""
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "bert_graph.py"), "--layers", str(layers),
           "--hidden", str(hidden), "--heads", str(max(1, hidden // 64)), "--steps", str(steps),
           "--spec", str(REPO_ROOT / "resource_specs" / "localhost_2workers.yaml"),
           "--run-option", run_option, "--phase-times"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    total = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    workers = [json.loads(m.group(1)) for m in _PHASES.finditer(output)]
    if proc.returncode != 0 or len(workers) != 2:
        sys.stderr.write(output[-5000:])
        raise SystemExit(f"end-to-end run failed (exit {proc.returncode}, "
                         f"{len(workers)} of 2 workers reported)")
    workers.sort(key=lambda w: w["worker"])
    launcher = next((json.loads(m.group(1)) for m in _LAUNCHER.finditer(output)), None)
    result = {"layers": layers, "hidden": hidden, "steps": steps, "run_option": run_option,
              "launch_to_done_s": total, "launcher": launcher, "workers": workers}
    print(f"end to end, {layers} layers, hidden {hidden}, {run_option}, 2 local workers: "
          f"{total:.1f} s from launch to {steps} finished steps (launcher exit)")
    if launcher:
        phases = "  ".join(f"{k} {v:.2f}" for k, v in launcher["phases_s"].items())
        print(f"  launcher: {launcher['since_process_start_s']:.1f} s before starting the "
              f"workers: {phases}")
    for w in workers:
        phases = "  ".join(f"{k} {v:.2f}" for k, v in w["phases_s"].items())
        print(f"  worker {w['worker']}: process start to done {w['since_process_start_s']:.1f} s: "
              f"{phases}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[3, 6, 12, 24])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--options", nargs="+", default=list(OPTIONS), choices=OPTIONS)
    p.add_argument("--repeats", type=int, default=3,
                   help="rewrites per layer count and option; the median is reported")
    p.add_argument("--skip-rewrite", action="store_true",
                   help="time the analysis only (plan and placement included)")
    p.add_argument("--end-to-end", action="store_true",
                   help="instead: launch bert_graph.py on 2 local workers, time to 2 steps")
    p.add_argument("--steps", type=int, default=2, help="with --end-to-end")
    p.add_argument("--out", help="JSON path (default bench/results/transform_scale.json, "
                                 "or transform_scale_e2e.json with --end-to-end)")
    p.add_argument("--profile", metavar="DIR", help="write a cProfile per phase here")
    p.add_argument("--plot-only", metavar="JSON", help="redraw the plot of an earlier run's JSON")
    args = p.parse_args()
    if args.plot_only:
        plot(json.loads(Path(args.plot_only).read_text())["rows"],
             Path(args.plot_only).with_suffix(".png"))
        return
    machine = {"cores": os.cpu_count(), "platform": platform.platform(),
               "load_avg_1min_before": os.getloadavg()[0]}
    if args.end_to_end:
        layers = args.layers[-1] if args.layers != p.get_default("layers") else 24
        hidden = args.hidden if args.hidden != p.get_default("hidden") else 64
        # localhost_2workers.yaml has no servers: one run option is enough
        options = args.options if args.options != p.get_default("options") else ["allreduce"]
        results = [end_to_end(layers, hidden, args.steps, option) for option in options]
        out = Path(args.out or RESULTS / "transform_scale_e2e.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine, "runs": results}, indent=1))
        print(f"wrote {out}")
        return
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    rows = []
    for layers in args.layers:
        rows.append(measure(layers, args.hidden, args.options, args.profile, args.skip_rewrite,
                            args.repeats))
        gc.collect()
    for r in rows:
        r["per_10k_ops_s"] = {
            phase: {o: r[f"{phase}_s"][o] / r["ops"] * 1e4 for o in r[f"{phase}_s"]}
            for phase in ("analyze_graph", "analyze_graph_cpu", "analyze", "rewrite", "rewrite_cpu")}
    machine["load_avg_1min_after"] = os.getloadavg()[0]
    result = {"machine": machine,
              "topology": {"workers": TOPOLOGY.num_workers, "hosts": len(TOPOLOGY.hosts),
                           "servers": TOPOLOGY.num_servers},
              "bound": "pure Python/TensorFlow graph building on one core: CPU time of this "
                       "process, no communication",
              "rows": rows}
    out = Path(args.out or RESULTS / "transform_scale.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    plot(rows, out.with_suffix(".png"))
    print("per 10k ops (s):")
    for phase in ("analyze_graph", "analyze_graph_cpu", "analyze", "rewrite", "rewrite_cpu"):
        for option in args.options:
            values = [r["per_10k_ops_s"][phase].get(option) for r in rows]
            if None not in values:
                print(f"  {phase:>17} {option:>9}: " + "  ".join(
                    f"L{r['layers']}={v:.3f}" for r, v in zip(rows, values)))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
