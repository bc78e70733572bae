"""Where one training step's time goes, per run option: examples/lm.py on
4 workers over "2 hosts" on loopback (as bench/lm_loopback.py, 2 servers),
one step traced with TensorFlow's FULL_TRACE on every worker.

    .venv/bin/python bench/ps_profile.py                         # hybrid, ps and allreduce
    .venv/bin/python bench/ps_profile.py --options hybrid --vocab 50000 --out /tmp/p.json

A traced step's step stats hold every op's start and end on every device the
step ran on: the worker's own and, for a parameter-server step, the servers'
(ops a worker's graph places there). Each op is put in one category by its
type (see CATEGORIES); per device the script reports the time the category's
ops spanned (the union of their intervals, so ops that overlap count once)
and the device's busy time. Receives (`_Recv`) and waits (accumulator take,
token dequeue, collectives) span the time until their data arrives: that is
time the step waits on another process, not CPU.

Each worker also writes the partition graphs of its traced step; from them
the script counts the messages between processes the step cost
(count_messages: RunGraph calls, and receives of data or of a bare
ordering), per worker.

Writes --out (JSON: every worker's figures and the configuration) and prints
Markdown tables: the chief's step (worker 0) by device, and the messages.
Tracing costs time of its own, so the traced step is slower than the
untraced ones; the untraced step time (from words/s) is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.lm_loopback import add_lm_arguments, machine, run_once  # noqa: E402

# Op type -> category, first match wins (regular expressions on the type).
CATEGORIES = (
    ("collective", r"^Collective"),
    ("herring push/pull", r"^AutoparHerring"),
    ("receive", r"^_(Host)?Recv$|^Recv(Tensor|Buf)$"),
    ("send", r"^_(Host)?Send$"),
    ("accumulator push", r"AccumulatorApplyGradient$"),
    ("accumulator take", r"AccumulatorTakeGradient$|AccumulatorNumAccumulated|AccumulatorSetGlobalStep"),
    ("token queue", r"^Queue(Enqueue|Dequeue)"),
    ("optimizer update", r"^Resource(Sparse)?Apply|^ResourceScatter|^(Sparse)?Apply|^AssignAddVariableOp$|"
                         r"^AssignVariableOp$|^AssignSubVariableOp$"),
    ("embedding gather/scatter", r"Gather|Unique|SegmentSum|UnsortedSegment|DynamicPartition|"
                                 r"DynamicStitch|ScatterNd"),
    ("input pipeline", r"Iterator|GetNext"),
)


def op_type(node) -> str:
    """`timeline_label` is "name = Type(inputs)" (or empty for some ops)."""
    label = node.timeline_label
    if " = " in label:
        return label.split(" = ", 1)[1].split("(", 1)[0].strip()
    return node.node_name.split(":")[0]


def category(kind: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, kind):
            return name
    return "compute"


def union_us(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def short_device(device: str) -> str:
    m = re.search(r"/job:(\w+)/replica:\d+/task:(\d+)", device)
    base = f"{m.group(1)}{m.group(2)}" if m else device
    return base + (" (stream)" if "stream" in device or "memcpy" in device else "")


def summarise_step(stats_bytes: bytes, wall_us: int) -> dict:
    from tensorflow.core.framework.step_stats_pb2 import StepStats
    stats = StepStats()
    stats.ParseFromString(stats_bytes)
    start = min((n.all_start_micros for d in stats.dev_stats for n in d.node_stats), default=0)
    devices, top_ops = {}, {}
    for dev in stats.dev_stats:
        per_cat: dict[str, list] = {}
        intervals = []
        for n in dev.node_stats:
            lo = n.all_start_micros - start
            hi = lo + max(n.all_end_rel_micros, 1)
            kind = op_type(n)
            per_cat.setdefault(category(kind), []).append((lo, hi))
            intervals.append((lo, hi))
            key = (short_device(dev.device), kind)
            top_ops[key] = top_ops.get(key, 0) + (hi - lo)
        if not intervals:
            continue
        name = short_device(dev.device)
        entry = devices.setdefault(name, {"ops": 0, "busy_ms": 0.0, "span_ms": 0.0, "categories_ms": {}})
        entry["ops"] += len(intervals)
        entry["busy_ms"] = round(entry["busy_ms"] + union_us(intervals) / 1e3, 2)
        entry["span_ms"] = round(max(entry["span_ms"], (max(h for _, h in intervals)
                                                         - min(lo for lo, _ in intervals)) / 1e3), 2)
        for cat, iv in per_cat.items():
            entry["categories_ms"][cat] = round(entry["categories_ms"].get(cat, 0.0) + union_us(iv) / 1e3, 2)
    heaviest = sorted(top_ops.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_ms": round(wall_us / 1e3, 2), "devices": devices,
            "heaviest_ops": [{"device": d, "op": k, "summed_ms": round(us / 1e3, 2)}
                             for (d, k), us in heaviest]}


def count_messages(partition_graphs_bytes: bytes, worker: int) -> dict:
    """The messages between processes of one worker's traced step, from the
    partition graphs its session ran (RunOptions.output_partition_graphs):
    a RunGraph call to every other process the step used, and a RecvTensor
    for every receive whose sender runs in another process. A receive whose
    value is only ever used as a control input (TensorFlow turns a control
    edge between processes into a dummy tensor fed to an Identity) is a
    "control" message: it carries nothing but an ordering."""
    from tensorflow.core.protobuf.config_pb2 import RunMetadata
    md = RunMetadata()
    md.ParseFromString(partition_graphs_bytes)
    own = f"worker{worker}"
    remote, data, control, pairs = set(), 0, 0, {}
    for graph in md.partition_graphs:
        consumers: dict[str, list[tuple[bool, object]]] = {}
        for node in graph.node:
            for i in node.input:
                consumers.setdefault(i.lstrip("^").partition(":")[0], []).append((i.startswith("^"), node))
            if node.device and short_device(node.device) != own:
                remote.add(short_device(node.device))

        def only_control(name: str) -> bool:
            uses = consumers.get(name, [])
            return all(ctrl or (n.op == "Identity" and only_control(n.name)) for ctrl, n in uses)
        for node in graph.node:
            if node.op not in ("_Recv", "_HostRecv"):
                continue
            src, dst = (short_device(node.attr[k].s.decode()) for k in ("send_device", "recv_device"))
            if src == dst:
                continue
            kind = "control" if only_control(node.name) else "data"
            data, control = data + (kind == "data"), control + (kind == "control")
            key = f"{src}->{dst}"
            pairs.setdefault(key, {"data": 0, "control": 0})[kind] += 1
    return {"run_graph_calls": len(remote), "data_receives": data, "control_receives": control,
            "by_pair": dict(sorted(pairs.items()))}


def profile(args, option: str) -> dict:
    trace_dir = Path(tempfile.mkdtemp(prefix=f"autopar-profile-{option}-"))
    run = run_once(args, option, ("--trace-step", str(args.trace_step), "--trace-dir", str(trace_dir)))
    workers = {}
    for path in sorted(trace_dir.glob("worker*.step_stats.pb")):
        index = int(re.search(r"worker(\d+)", path.name).group(1))
        wall = int((trace_dir / f"worker{index}.wall_us").read_text())
        workers[index] = summarise_step(path.read_bytes(), wall)
        graphs = trace_dir / f"worker{index}.partition_graphs.pb"
        if graphs.exists():
            workers[index]["messages"] = count_messages(graphs.read_bytes(), index)
    words = run.get("words_per_s")
    global_words = args.batch_size * 4 * args.seq_len
    run["untraced_step_ms"] = round(global_words / words * 1e3, 1) if words else None
    run["trace_dir"] = str(trace_dir)
    return {"run": run, "workers": workers}


def table(results: dict) -> str:
    cats = [c for c, _ in CATEGORIES] + ["compute"]
    rows = ["| run option | device | busy ms | " + " | ".join(cats) + " |",
            "|" + "---|" * (3 + len(cats))]
    for option, r in results.items():
        chief = r["workers"].get(0) or r["workers"].get("0")
        if chief is None:
            rows.append(f"| `{option}` | failed | " + " | ".join("" for _ in range(len(cats) + 1)) + " |")
            continue
        rows.append(f"| `{option}` | step (traced / untraced) | {chief['wall_ms']:.0f} / "
                    f"{r['run']['untraced_step_ms']} | " + " | ".join("" for _ in cats) + " |")
        for dev, d in sorted(chief["devices"].items()):
            rows.append(f"| | {dev} | {d['busy_ms']:.1f} | "
                        + " | ".join(f"{d['categories_ms'].get(c, 0):.1f}" for c in cats) + " |")
    return "\n".join(rows) + "\n\n" + messages_table(results)


def messages_table(results: dict) -> str:
    """Messages between processes per step: RunGraph calls and receives
    (data, control), of the chief and of all workers together."""
    rows = ["| run option | chief: RunGraph / data / control | all workers: RunGraph / data / control |",
            "|---|---|---|"]
    for option, r in results.items():
        counted = [w["messages"] for w in r["workers"].values() if "messages" in w]
        if not counted:
            continue
        chief = (r["workers"].get(0) or r["workers"].get("0") or {}).get("messages")
        keys = ("run_graph_calls", "data_receives", "control_receives")
        rows.append(f"| `{option}` | " + (" / ".join(str(chief[k]) for k in keys) if chief else "–")
                    + " | " + " / ".join(str(sum(m[k] for m in counted)) for k in keys) + " |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_arguments(p, steps=20, warmup=8)
    p.add_argument("--trace-step", type=int, default=14, help="the step traced (after --warmup)")
    p.add_argument("--out", default="bench/results/ps_profile.json")
    args = p.parse_args()
    if not args.warmup <= args.trace_step < args.steps:
        p.error("need --warmup <= --trace-step < --steps")
    results = {}
    for option in args.options:
        results[option] = profile(args, option)
        run = results[option]["run"]
        print(f"{option}: exit {run['exit']}, words/s {run['words_per_s']}, load {run['load_avg_1min_before']}",
              flush=True)
        if "error" in run:
            print(run["error"], flush=True)
    config = {k: getattr(args, k) for k in ("spec", "vocab", "dim", "hidden", "batch_size", "seq_len",
                                            "steps", "warmup", "trace_step")}
    out = Path(args.out) if Path(args.out).is_absolute() else REPO_ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = table(results)
    out.write_text(json.dumps({"benchmark": "one traced step of examples/lm.py per run option",
                               "machine": machine(), "config": config,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "categories": {c: pat for c, pat in CATEGORIES},
                               "results": results, "markdown": markdown}, indent=2) + "\n")
    print("\nchief (worker 0), ms per device and category (union of the category's op intervals):\n")
    print(markdown)
    print(f"\nwrote {out}")
    return 1 if any("error" in r["run"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
