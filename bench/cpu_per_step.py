"""CPU time per training step of every process of an examples/lm.py job on
loopback (the job of bench/lm_loopback.py: 4 workers on "2 hosts", 2 servers).

    .venv/bin/python bench/cpu_per_step.py                        # hybrid and allreduce
    .venv/bin/python bench/cpu_per_step.py --options ps --from-step 20 --to-step 60

On one machine every process of the job shares its cores, so a step can only
be as short as the CPU time all processes spend on it divided by the cores.
This reads each process's user and system time from /proc/PID/stat when the
chief logs step --from-step and again at --to-step, and divides the
difference by the steps in between. The job runs without the fork server
(AUTOPAR_FORK_SERVER=0), so each process's command line says what it is.
Writes --out (JSON) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from autopar.common.procs import stop_processes  # noqa: E402
from bench.lm_loopback import add_lm_arguments, machine  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                stack += [int(c) for c in
                          Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def role(cmdline: str) -> str:
    if "server_main" in cmdline:
        return "server"
    if "lm.py" in cmdline:
        return "lm.py"
    return cmdline[:40]


def cpu_times(root: int) -> dict[int, tuple[float, float, str]]:
    """pid -> (user s, system s, what it runs) for `root` and its descendants."""
    out = {}
    for pid in descendants(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        out[pid] = (int(fields[11]) / TICK, int(fields[12]) / TICK, role(cmd))
    return out


def measure(args, option: str) -> dict:
    argv = [sys.executable, "examples/lm.py", "--spec", args.spec, "--run-option", option,
            "--vocab", str(args.vocab), "--dim", str(args.dim), "--hidden", str(args.hidden),
            "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
            "--steps", str(args.to_step + 5), "--warmup", "2", "--log-every", "5"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", AUTOPAR_FORK_SERVER="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    first = last = None
    deadline = time.monotonic() + args.timeout
    try:
        for line in proc.stdout:
            if time.monotonic() > deadline:
                raise SystemExit(f"{option}: no result within {args.timeout} s")
            m = re.search(r"step (\d+)", line)
            if m and first is None and int(m.group(1)) >= args.from_step:
                first = (int(m.group(1)), time.monotonic(), cpu_times(proc.pid))
            elif m and first is not None and last is None and int(m.group(1)) >= args.to_step:
                last = (int(m.group(1)), time.monotonic(), cpu_times(proc.pid))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            stop_processes([proc], grace_seconds=15.0)
    if first is None or last is None or proc.returncode != 0:
        raise SystemExit(f"{option}: the job failed or logged too few steps (exit {proc.returncode})")
    steps = last[0] - first[0]
    processes = []
    for pid, (user, system, what) in sorted(last[2].items()):
        if pid not in first[2] or pid == proc.pid:
            continue
        u0, s0, _ = first[2][pid]
        processes.append({"pid": pid, "runs": what,
                          "user_ms_per_step": round((user - u0) / steps * 1e3, 1),
                          "system_ms_per_step": round((system - s0) / steps * 1e3, 1)})
    total = sum(p["user_ms_per_step"] + p["system_ms_per_step"] for p in processes)
    return {"run_option": option, "steps": [first[0], last[0]],
            "wall_ms_per_step": round((last[1] - first[1]) / steps * 1e3, 1),
            "cpu_ms_per_step": round(total, 1),
            "cpu_ms_per_step_over_cores": round(total / os.cpu_count(), 1),
            "processes": processes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_arguments(p, steps=0, warmup=0)
    p.set_defaults(options=["hybrid", "allreduce"])
    p.add_argument("--from-step", type=int, default=15)
    p.add_argument("--to-step", type=int, default=45)
    p.add_argument("--out", default="bench/results/cpu_per_step.json")
    args = p.parse_args()
    results = [measure(args, option) for option in args.options]
    print("| run option | step ms (wall) | CPU ms per step, all processes | ÷ cores | per worker | per server |")
    print("|---|---|---|---|---|---|")
    for r in results:
        per = {"lm.py": [], "server": []}
        for proc in r["processes"]:
            per.setdefault(proc["runs"], []).append(proc["user_ms_per_step"] + proc["system_ms_per_step"])
        def fmt(xs):
            return " / ".join(f"{x:.0f}" for x in xs) or "-"
        print(f"| {r['run_option']} | {r['wall_ms_per_step']:.0f} | {r['cpu_ms_per_step']:.0f} | "
              f"{r['cpu_ms_per_step_over_cores']:.0f} | {fmt(per['lm.py'])} | {fmt(per['server'])} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "CPU time per step of every process, examples/lm.py on "
                               "loopback", "machine": machine(), "load_avg_1min": os.getloadavg()[0],
                               "config": {k: getattr(args, k) for k in (
                                   "spec", "vocab", "dim", "hidden", "batch_size", "seq_len",
                                   "from_step", "to_step")},
                               "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
