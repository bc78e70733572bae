"""Throughput of examples/lm.py with each autopar run option, 4 workers on
"2 hosts" over loopback (resource_specs/loopback_2hosts_4workers.yaml:
127.0.0.1 and 127.0.0.2, 2 workers and 1 server each).

    .venv/bin/python bench/lm_loopback.py                      # 200k x 256 embedding, 3 runs each
    .venv/bin/python bench/lm_loopback.py --vocab 50000 --repeats 1 --out /tmp/lm.json

Runs hybrid, ps and allreduce in turn (interleaved: hybrid, ps, allreduce,
hybrid, ... so a change in the machine's load spreads over all three), each
--repeats times, every run as a user runs the example (its own launcher, its
own servers and workers). Reads the chief's `words/s:` line (words of every
worker per second over the steps after --warmup) and `final loss:`. Writes
every run, the means and the configuration to --out (keeping the results of
other configurations already in it, replacing an earlier run of this one) and
prints a Markdown table. Needs no root: loopback only, so there is no bandwidth limit and the
workers, servers and launcher all share this machine's cores.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from autopar.common.procs import stop_processes

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = "resource_specs/loopback_2hosts_4workers.yaml"
OPTIONS = ("hybrid", "ps", "allreduce")
NOTE = ("One machine: the launcher, 4 workers and 2 servers of a run share its cores, and other jobs "
        "may be running (load_avg_1min_before/after of each run). words/s counts the steps after the "
        "warm-up only; wall_s is the whole run: start-up (TensorFlow import in 7 processes, variable "
        "initialisation, the chief's broadcast), warm-up, measured steps and shut-down.")


def machine() -> dict:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    tf_version = None
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            tf_version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"cores": os.cpu_count(), "memory_gb": round(mem_kb / 1024 ** 2, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "tensorflow": tf_version}


def error_text(stdout: str, stderr: str) -> str:
    """The lines that say what failed: tracebacks' last lines and anything
    naming an error, from the end of the output."""
    lines = (stdout + "\n" + stderr).splitlines()
    hits = [ln for ln in lines if re.search(r"(Error|error:|exited|Traceback|failed)", ln)]
    return "\n".join(hits[-12:] or lines[-12:])


def run_once(args, option: str, extra: tuple[str, ...] = ()) -> dict:
    argv = [sys.executable, "examples/lm.py", "--spec", args.spec, "--run-option", option,
            "--vocab", str(args.vocab), "--dim", str(args.dim), "--hidden", str(args.hidden),
            "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--log-every", "0", *extra]
    # This checkout's autopar, not whichever one is installed.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    # Own session, so a run that hangs is ended with everything it started.
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        stop_processes([proc], grace_seconds=15.0)
        stdout, stderr = proc.communicate()
        code = f"timeout after {args.timeout} s"
    wall = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    words = re.search(r"words/s: ([0-9.]+)", stdout)
    loss = re.search(r"final loss: ([0-9.naif+-]+)", stdout)
    result = {"run_option": option, "exit": code, "wall_s": round(wall, 1),
              "words_per_s": float(words.group(1)) if words else None,
              "final_loss": float(loss.group(1)) if loss else None,
              "load_avg_1min_before": round(load_before, 2), "load_avg_1min_after": round(load_after, 2),
              "command": " ".join(["python", *argv[1:]])}
    if code != 0 or words is None:
        result["error"] = error_text(stdout, stderr)
    return result


def summarise(runs: list[dict]) -> dict:
    out = {}
    for option in OPTIONS:
        mine = [r for r in runs if r["run_option"] == option]
        if not mine:
            continue
        ok = [r["words_per_s"] for r in mine if r["words_per_s"] is not None]
        out[option] = {"words_per_s": [r["words_per_s"] for r in mine],
                       "mean_words_per_s": round(statistics.mean(ok), 1) if ok else None,
                       "stdev_words_per_s": round(statistics.stdev(ok), 1) if len(ok) > 1 else None,
                       "wall_s": [r["wall_s"] for r in mine],
                       "failures": sum(1 for r in mine if "error" in r)}
    return out


def table(summary: dict, repeats: int) -> str:
    head = ["run option", *[f"run {i + 1}" for i in range(repeats)], "mean", "stdev", "wall s per run"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def fmt(v):
        return "failed" if v is None else f"{v:,.0f}"
    for option, s in summary.items():
        cells = [f"`{option}`", *[fmt(v) for v in s["words_per_s"]], fmt(s["mean_words_per_s"]),
                 fmt(s["stdev_words_per_s"]) if s["stdev_words_per_s"] is not None else "-",
                 ", ".join(f"{w:.0f}" for w in s["wall_s"])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def add_lm_arguments(p: argparse.ArgumentParser, *, steps: int, warmup: int) -> None:
    """The job and model options run_once reads (shared with bench/ps_profile.py)."""
    p.add_argument("--spec", default=SPEC)
    p.add_argument("--options", nargs="+", choices=OPTIONS, default=list(OPTIONS))
    p.add_argument("--vocab", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--seq-len", type=int, default=20)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--timeout", type=float, default=600, help="seconds per run before it is ended")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_arguments(p, steps=50, warmup=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/results/lm_loopback.json")
    args = p.parse_args()

    config = {k: getattr(args, k) for k in ("spec", "vocab", "dim", "hidden", "batch_size", "seq_len",
                                            "steps", "warmup", "repeats")}
    config.update(workers=4, servers=2, hosts="127.0.0.1 and 127.0.0.2 (loopback, one machine)",
                  global_batch=4 * args.batch_size, data="zipf", optimizer="adagrad", clip=5.0,
                  num_sampled=1024, embedding_mb=round(args.vocab * args.dim * 4 / 1e6, 1),
                  softmax_weights_mb=round(args.vocab * args.hidden * 4 / 1e6, 1))
    started = time.time()
    runs = []
    for repeat in range(args.repeats):
        for option in args.options:
            r = run_once(args, option)
            r["repeat"] = repeat + 1
            runs.append(r)
            status = "ok" if "error" not in r else f"FAILED ({r['exit']})"
            print(f"run {repeat + 1}/{args.repeats} {option:9s} {status:10s} "
                  f"words/s {r['words_per_s']}  loss {r['final_loss']}  wall {r['wall_s']} s  "
                  f"load {r['load_avg_1min_before']}", flush=True)
            if "error" in r:
                print(r["error"], flush=True)
    summary = summarise(runs)
    entry = {"config": config, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
             "total_wall_s": round(time.time() - started, 1), "summary": summary, "runs": runs,
             "markdown": table(summary, args.repeats)}
    out = REPO_ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    result = merge(out, entry)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nvocab {args.vocab:,} x dim {args.dim} embedding, batch {args.batch_size}/worker x 4 workers, "
          f"seq_len {args.seq_len}, {args.steps} steps ({args.warmup} warm-up), words/s:\n")
    print(entry["markdown"])
    print(f"\nwrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out} "
          f"({len(result['results'])} configuration(s)); total {entry['total_wall_s']} s", flush=True)
    return 1 if any("error" in r for r in runs) else 0


SAME_CONFIG = ("spec", "vocab", "dim", "hidden", "batch_size", "seq_len", "steps", "warmup")


def merge(out: Path, entry: dict) -> dict:
    """The file's configurations plus this one: a run of the same
    configuration replaces the earlier one, others are kept (largest
    embedding first)."""
    entries = []
    if out.exists():
        old = json.loads(out.read_text())
        entries = old.get("results", [old] if "config" in old else [])
    def key(e):
        return tuple(e["config"].get(k) for k in SAME_CONFIG)
    entries = [{k: v for k, v in e.items() if k not in ("benchmark", "machine")}
               for e in entries if key(e) != key(entry)] + [entry]
    entries.sort(key=lambda e: -e["config"]["vocab"] * e["config"]["dim"])
    return {"benchmark": "examples/lm.py throughput, 4 workers on 2 loopback hosts",
            "machine": machine(), "note": NOTE, "results": entries}


if __name__ == "__main__":
    sys.exit(main())
