"""DropCompute benchmark: baseline synchronous training vs a compute threshold
chosen automatically, 4 and 8 local workers, with the simulated delay of the
paper's appendix B.1 (a bounded log-normal sleep after every micro-batch,
seeded per worker) so compute variance exists on one machine.

    .venv/bin/python bench/dropcompute.py                       # 4 and 8 workers, 80 steps
    .venv/bin/python bench/dropcompute.py --workers 4 --steps 12 --warmup 2,6 --out /tmp/dc.json

Each run is a job as a user starts it (this script re-executed by the
launcher per worker, loopback only). Every worker writes its DropCompute CSV
(step, computed, dropped, compute_s, step_s, tau); over the steps after the
warm-up window the benchmark computes

  computed samples/s = sum over workers of computed micro-batches x rows per
                       micro-batch / the chief's summed step time

for the baseline (micro_batches=M, no threshold) and for DropCompute
(compute_threshold="auto"), the measured effective speedup (their ratio),
the drop rate, and the speedup the chief predicted when it chose tau (eq. 6 on
the warm-up latencies). Results go to --out (JSON) and a plot beside it.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
FEATURES, CLASSES = 32, 10


# -- the training job (this script, re-executed per worker) ---------------------
def train(args) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import numpy as np
    import tensorflow as tf

    import autopar
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        w1 = tf1.get_variable("w1", [FEATURES, 64], initializer=tf1.glorot_uniform_initializer())
        w2 = tf1.get_variable("w2", [64, CLASSES], initializer=tf1.glorot_uniform_initializer())
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        gs = tf1.train.get_or_create_global_step()
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
    warmup = tuple(int(s) for s in args.warmup.split(","))
    config = autopar.Config(
        micro_batches=args.micro_batches, log_every_steps=0,
        compute_threshold="auto" if args.mode == "dropcompute" else None,
        dropcompute_warmup=warmup, dropcompute_log_dir=args.csv_dir,
        simulated_delay=autopar.SimulatedDelay(median_s=args.delay_median, sigma=args.delay_sigma,
                                               max_s=args.delay_max, seed=args.seed))
    spec = Path(args.csv_dir) / "spec.yaml"
    with autopar.get_runner(graph, str(spec), config) as runner:
        rng = np.random.default_rng(runner.worker_index)
        rows = args.rows * args.micro_batches
        for _ in range(args.steps):
            runner.run(train_op, {x: rng.normal(size=(rows, FEATURES)).astype(np.float32),
                                  y: rng.integers(0, CLASSES, rows).astype(np.int32)})


# -- the driver -----------------------------------------------------------------
def run_job(args, workers: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="autopar-dc-") as tmp:
        Path(tmp, "spec.yaml").write_text(
            f"hosts:\n  - address: 127.0.0.1\n    workers: {workers}\n    servers: 0\n")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--train", "--mode", mode,
               "--csv-dir", tmp, "--steps", str(args.steps), "--warmup", args.warmup,
               "--micro-batches", str(args.micro_batches), "--rows", str(args.rows),
               "--delay-median", str(args.delay_median), "--delay-sigma", str(args.delay_sigma),
               "--delay-max", str(args.delay_max), "--seed", str(args.seed)]
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2")
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"{mode} with {workers} workers exited {proc.returncode}:\n"
                             f"{proc.stdout[-4000:]}")
        logs = []
        for i in range(workers):
            with open(Path(tmp) / f"dropcompute_worker{i}.csv") as f:
                logs.append(list(csv.DictReader(f)))
    first = int(args.warmup.split(",")[1])      # measured: the steps after the warm-up
    measured = [[r for r in w if int(r["step"]) >= first] for w in logs]
    computed = sum(int(r["computed"]) for w in measured for r in w)
    possible = sum(int(r["computed"]) + int(r["dropped"]) for w in measured for r in w)
    seconds = sum(float(r["step_s"]) for r in measured[0])
    chosen = re.search(r"tau = ([0-9.]+) s; expected drop rate ([0-9.]+)%, expected effective "
                       r"speedup ([0-9.]+)x.*analytic estimate .* ([0-9.]+)x", proc.stdout)
    result = {"workers": workers, "mode": mode, "steps": args.steps,
              "measured_steps": len(measured[0]), "wall_s": round(wall, 2),
              "computed_micro_batches": computed, "possible_micro_batches": possible,
              "drop_rate": 1 - computed / possible if possible else 0.0,
              "computed_samples_per_s": computed * args.rows / seconds if seconds else 0.0,
              "mean_step_s": seconds / max(1, len(measured[0]))}
    if chosen:
        result.update(tau_s=float(chosen[1]), predicted_drop_rate=float(chosen[2]) / 100,
                      predicted_speedup=float(chosen[3]), analytic_speedup=float(chosen[4]))
    elif mode == "dropcompute":
        result["tau_s"] = None    # no threshold beat the baseline on the warm-up latencies
    return result


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workers = sorted({r["workers"] for r in results})
    by = {(r["workers"], r["mode"]): r for r in results}
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    for k, mode in enumerate(("baseline", "dropcompute")):
        xs = [i + (k - 0.5) * width for i in range(len(workers))]
        ys = [by[(n, mode)]["computed_samples_per_s"] if (n, mode) in by else 0 for n in workers]
        ax.bar(xs, ys, width, label=mode)
        if mode == "dropcompute":
            for x, n, yv in zip(xs, workers, ys):
                r = by.get((n, mode), {})
                base = by.get((n, "baseline"), {}).get("computed_samples_per_s")
                if base:
                    note = f"{yv / base:.2f}x"
                    if r.get("predicted_speedup"):
                        note += f"\n(pred {r['predicted_speedup']:.2f}x)"
                    note += f"\ndrop {r['drop_rate']:.0%}"
                    ax.text(x, yv, note, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(top=1.35 * max(r["computed_samples_per_s"] for r in results))
    ax.set_xticks(range(len(workers)), [f"{n} workers" for n in workers])
    ax.set_ylabel("computed samples/s")
    ax.set_title("DropCompute vs baseline, simulated log-normal delay")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="baseline", help=argparse.SUPPRESS)
    p.add_argument("--csv-dir", help=argparse.SUPPRESS)
    p.add_argument("--workers", default="4,8", help="worker counts, comma-separated")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", default="5,30", help="warm-up window FIRST,LAST (steps)")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--rows", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--delay-median", type=float, default=0.02)
    p.add_argument("--delay-sigma", type=float, default=1.0)
    p.add_argument("--delay-max", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=str(RESULTS / "dropcompute.json"))
    args = p.parse_args()
    if args.train:
        train(args)
        return
    results = []
    for n in (int(w) for w in args.workers.split(",")):
        for mode in ("baseline", "dropcompute"):
            r = run_job(args, n, mode)
            print(json.dumps(r), flush=True)
            results.append(r)
    for n in {r["workers"] for r in results}:
        base = next(r for r in results if r["workers"] == n and r["mode"] == "baseline")
        dc = next(r for r in results if r["workers"] == n and r["mode"] == "dropcompute")
        dc["measured_speedup"] = dc["computed_samples_per_s"] / base["computed_samples_per_s"]
        print(f"{n} workers: baseline {base['computed_samples_per_s']:.0f} samples/s, DropCompute "
              f"{dc['computed_samples_per_s']:.0f} samples/s (tau {dc.get('tau_s')}), measured "
              f"speedup {dc['measured_speedup']:.3f}x, predicted {dc.get('predicted_speedup')}, "
              f"drop rate {dc['drop_rate']:.1%}")
    sys.path.insert(0, str(REPO_ROOT))
    from bench.outputs import write_results
    write_results(args.out, args, ("train", "mode", "csv_dir"), {"results": results}, plot)


if __name__ == "__main__":
    main()
