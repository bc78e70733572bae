"""Large-batch benchmark (docs/benchmarks.md, "Large-batch techniques"): a wide MLP trained
with Adam, where the optimizer update and its slots are a large part of
every worker's step.

(a) `--part wus`: N workers on this machine (loopback, one job started by the
    launcher, as a user starts it), with and without
    Config(shard_weight_update=True): step time, the optimizer-slot bytes
    each worker holds (measured: the slot variables that exist on its device;
    and the plan's figure), its resident set size (VmRSS / VmHWM), and the
    CPU-seconds each worker spends per step. The cores bound the step when
    the workers' CPU-seconds per step divided by the cores available equal
    the step time (loopback has no rate limit: communication is memory
    copies on the same cores).
(b) `--part 2d`: the emulated cluster (bench/cluster.py, root; namespaces
    `<prefix>-h<i>`), 2 hosts x 2 workers joined through TF_CONFIG, with and
    without Config(hierarchical_allreduce=True): bytes each host sends and
    receives over its link per step (veth counters around the measured
    steps, every worker held at a file barrier while they are read), against
    the report's host_link_bytes prediction.

    python -m bench.large_batch                        # full size: 52 M parameters
    python -m bench.large_batch --width 1024 --layers 3 --steps 2 --warmup 1   # a smoke run

Results: --out (JSON, default bench/results/large_batch.json) and a plot beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
INPUTS, CLASSES = 256, 10
RESULT_TAG = "LARGE_BATCH_RESULT "


# -- the model -------------------------------------------------------------------
def build_mlp(width: int, layers: int):
    """INPUTS -> width -> ... (layers hidden layers) -> CLASSES, ReLU, Adam.
    Parameters: INPUTS*width + (layers-1)*width^2 + width*CLASSES (+ biases)."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, INPUTS], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        h = x
        sizes = [INPUTS] + [width] * layers
        for i in range(layers):
            w = tf1.get_variable(f"dense{i}/kernel", [sizes[i], sizes[i + 1]],
                                 initializer=tf1.glorot_uniform_initializer())
            b = tf1.get_variable(f"dense{i}/bias", [sizes[i + 1]], initializer=tf1.zeros_initializer())
            h = tf.nn.relu(tf.matmul(h, w) + b)
        w = tf1.get_variable("out/kernel", [width, CLASSES], initializer=tf1.glorot_uniform_initializer())
        logits = tf.matmul(h, w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        gs = tf1.train.get_or_create_global_step()
        train_op = tf1.train.AdamOptimizer(1e-4).minimize(loss, global_step=gs)
    params = sum(int(v.shape.num_elements()) for v in graph.get_collection("trainable_variables"))
    return graph, x, y, train_op, params


def _rss() -> dict[str, int]:
    """VmRSS and VmHWM of this process, bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _resident_slot_bytes(runner, graph, index: int) -> int:
    """Bytes of the Adam slot variables that exist on this worker's device: a
    handle with a slot's shared name in a separate session on the same
    server finds the resource only where it was created."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    slots = [v for v in graph.get_collection("variables") if "/Adam" in v.op.name]
    probe = tf.Graph()
    with probe.as_default(), tf.device(f"/job:worker/replica:0/task:{index}/device:CPU:0"):
        checks = {v.op.name: tf.raw_ops.VarIsInitializedOp(resource=tf.raw_ops.VarHandleOp(
            dtype=v.dtype.base_dtype, shape=v.shape, shared_name=v.op.name)) for v in slots}
    config = tf1.ConfigProto(device_filters=[f"/job:worker/task:{index}"])
    with tf1.Session(runner.session.sess_str, graph=probe, config=config) as session:
        found = session.run(checks)
    return sum(int(v.shape.num_elements()) * v.dtype.base_dtype.size
               for v in slots if found[v.op.name])


def _traced_update_ms(runner, train_op, feed) -> float:
    """Milliseconds this worker's device spent in optimizer-update ops
    (ResourceApplyAdam and the like; bench/ps_profile.py's categories) in
    one step run under a full trace: the part of the step weight-update
    sharding divides among the workers."""
    import tensorflow as tf
    from bench.ps_profile import category, op_type, union_us
    tf1 = tf.compat.v1
    metadata = tf1.RunMetadata()
    runner.run(train_op, feed, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
    intervals = [(n.all_start_micros, n.all_start_micros + n.all_end_rel_micros)
                 for d in metadata.step_stats.dev_stats
                 if f"/task:{runner.worker_index}/" in d.device
                 for n in d.node_stats if category(op_type(n)) == "optimizer update"]
    return union_us(intervals) / 1e3


def _wait_for(path: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.05)


def train(args) -> None:
    """One worker (re-executed by the launcher, or started in a namespace with
    TF_CONFIG for part 2d). Prints one RESULT_TAG line with its figures."""
    sys.path.insert(0, str(REPO_ROOT))
    import numpy as np

    import autopar
    graph, x, y, train_op, params = build_mlp(args.width, args.layers)
    config = autopar.Config(log_every_steps=0, run_option="allreduce",
                            shard_weight_update=args.mode == "wus",
                            hierarchical_allreduce={"2d": True, "ring": False}.get(args.mode),
                            stall_timeout_s=args.stall_timeout)
    spec = None if args.mode in ("2d", "ring") else str(Path(args.work) / "spec.yaml")
    barrier = Path(args.work)
    with autopar.get_runner(graph, spec, config) as runner:
        i, n = runner.worker_index, runner.num_workers
        rows = max(1, args.batch // n)
        rng = np.random.default_rng(i)
        feeds = [{x: rng.normal(size=(rows, INPUTS)).astype(np.float32),
                  y: rng.integers(0, CLASSES, rows).astype(np.int32)} for _ in range(2)]
        for k in range(args.warmup):
            runner.run(train_op, feeds[k % 2])
        if args.mode in ("2d", "ring"):        # the harness reads the counters now
            (barrier / f"ready{i}").touch()
            _wait_for(barrier / "go", args.timeout)
        times, cpu0 = [], time.process_time()
        for k in range(args.steps):
            start = time.perf_counter()
            runner.run(train_op, feeds[k % 2])
            times.append(time.perf_counter() - start)
        cpu = (time.process_time() - cpu0) / max(1, args.steps)
        update_ms = None
        if args.mode in ("wus", "replicated"):
            update_ms = _traced_update_ms(runner, train_op, feeds[0])
        if args.mode in ("2d", "ring"):        # ... and again, before any shutdown traffic
            (barrier / f"done{i}").touch()
            _wait_for(barrier / "end", args.timeout)
        result = {"worker": i, "workers": n, "params": params, "step_s": times,
                  "cpu_s_per_step": cpu, "update_ms": update_ms, **_rss()}
        if args.mode in ("wus", "replicated"):
            result["resident_slot_bytes"] = _resident_slot_bytes(runner, graph, i)
        print(RESULT_TAG + json.dumps(result), flush=True)


# -- the driver --------------------------------------------------------------------
def _worker_args(args, mode: str, work: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--train", "--mode", mode,
            "--work", work, "--width", str(args.width), "--layers", str(args.layers),
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--stall-timeout", str(args.stall_timeout), "--timeout", str(args.timeout)]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2")


def _results(text: str) -> list[dict]:
    found = [json.loads(m) for m in re.findall(rf"{RESULT_TAG}(\{{.*\}})", text)]
    return sorted(found, key=lambda r: r["worker"])


def _planned(args, spec: str, **config) -> dict:
    """The plan report of the model on `spec` (slot bytes, host-link bytes)."""
    sys.path.insert(0, str(REPO_ROOT))
    import autopar
    graph = build_mlp(args.width, args.layers)[0]
    return json.loads(autopar.analyze(graph, spec, autopar.Config(run_option="allreduce",
                                                                 **config)).to_json())


def run_local(args, mode: str) -> dict:
    """Part wus: one job of args.workers workers on 127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="autopar-lb-") as work:
        spec = Path(work, "spec.yaml")
        spec.write_text(f"hosts:\n  - address: 127.0.0.1\n    workers: {args.workers}\n"
                        f"    servers: 0\n")
        proc = subprocess.run(_worker_args(args, mode, work), cwd=REPO_ROOT, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
        report = _planned(args, str(spec), shard_weight_update=mode == "wus")
    workers = _results(proc.stdout)
    if len(workers) != args.workers:
        raise SystemExit(f"{mode}: {len(workers)} of {args.workers} workers reported:\n"
                         f"{proc.stdout[-4000:]}")
    median = statistics.median(t for w in workers for t in w["step_s"])
    cores = len(os.sched_getaffinity(0))
    cpu_floor = sum(w["cpu_s_per_step"] for w in workers) / cores
    return {"part": "wus", "mode": mode, "workers": args.workers, "params": workers[0]["params"],
            "median_step_s": median, "cores": cores,
            "cpu_s_per_step": [w["cpu_s_per_step"] for w in workers],
            "update_ms": [w["update_ms"] for w in workers],
            "cpu_floor_s": cpu_floor,
            "bound": ("cores (compute and loopback copies)" if cpu_floor >= 0.8 * median else
                      "waiting (communication latency or load from other jobs)"),
            "slot_bytes_resident": [w["resident_slot_bytes"] for w in workers],
            "slot_bytes_planned": report["slot_bytes"],
            "rss_bytes": [w["VmRSS"] for w in workers],
            "peak_rss_bytes": [w["VmHWM"] for w in workers]}


def run_emulated(args, mode: str) -> dict:
    """Part 2d: 2 hosts x 2 workers in network namespaces, TF_CONFIG join."""
    sys.path.insert(0, str(REPO_ROOT))
    from bench.cluster import EmulatedCluster
    hosts, per_host = 2, 2
    with EmulatedCluster(hosts, rate_mbit=args.link_mbit, prefix=args.prefix) as cluster, \
            tempfile.TemporaryDirectory(prefix="autopar-lb-") as work:
        spec = cluster.write_spec(Path(work, "spec.yaml"), workers_per_host=per_host)
        addresses = [f"{a}:{24100 + k}" for a in cluster.addresses for k in range(per_host)]
        report = _planned(args, spec, hierarchical_allreduce=mode == "2d")
        procs, logs = [], []
        for i, address in enumerate(addresses):
            env = _env()
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                           "task": {"type": "worker", "index": i}})
            log = open(Path(work, f"worker{i}.log"), "w")
            logs.append(log)
            procs.append(cluster.popen(i // per_host, _worker_args(args, mode, work), env=env,
                                       stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT))

        def barrier(prefix: str) -> None:
            end = time.monotonic() + args.timeout
            while not all(Path(work, f"{prefix}{i}").exists() for i in range(len(addresses))):
                failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
                if failed or time.monotonic() > end:
                    text = Path(work, f"worker{(failed or [0])[0]}.log").read_text()
                    raise SystemExit(f"{mode}: workers {failed or 'timed out'} before '{prefix}':\n"
                                     f"{text[-4000:]}")
                time.sleep(0.05)

        barrier("ready")
        before = cluster.counters()
        Path(work, "go").touch()
        barrier("done")
        after = cluster.counters()
        Path(work, "end").touch()
        for p in procs:
            p.wait(timeout=args.timeout)
        for log in logs:
            log.close()
        text = "".join(Path(work, f"worker{i}.log").read_text() for i in range(len(addresses)))
        if any(p.returncode for p in procs):
            raise SystemExit(f"{mode}: a worker exited non-zero:\n{text[-4000:]}")
    workers = _results(text)
    steps = args.steps
    sent = {h: (after[h][1] - before[h][1]) / steps for h in range(hosts)}
    received = {h: (after[h][0] - before[h][0]) / steps for h in range(hosts)}
    predicted = report["host_link_bytes"]["2d" if mode == "2d" else "ring"]
    return {"part": "2d", "mode": mode, "hosts": hosts, "workers_per_host": per_host,
            "link_mbit": args.link_mbit, "params": workers[0]["params"],
            "median_step_s": statistics.median(t for w in workers for t in w["step_s"]),
            "host_sent_bytes_per_step": list(sent.values()),
            "host_received_bytes_per_step": list(received.values()),
            "predicted_bytes_per_host": list(predicted.values()),
            "hierarchical_why": report.get("hierarchical_why", "")}


def _summary(results: list[dict]) -> dict:
    """The ratios the benchmark is about, with a sentence each."""
    by = {(r["part"], r["mode"]): r for r in results}
    out: dict = {"lines": []}
    rep, wus = by.get(("wus", "replicated")), by.get(("wus", "wus"))
    if rep and wus:
        out["slot_fall"] = max(rep["slot_bytes_resident"]) / max(wus["slot_bytes_resident"])
        out["step_ratio"] = wus["median_step_s"] / rep["median_step_s"]
        out["lines"].append(
            f"weight-update sharding: the largest per-worker Adam slot memory falls "
            f"{out['slot_fall']:.2f}x ({rep['workers']} workers; whole variables per owner); "
            f"step time x{out['step_ratio']:.2f}; optimizer update per worker (traced step) "
            f"{max(rep['update_ms']):.1f} -> {max(wus['update_ms']):.1f} ms; workers' CPU-s per step "
            f"{sum(rep['cpu_s_per_step']):.3f} -> {sum(wus['cpu_s_per_step']):.3f}")
    ring, two_d = by.get(("2d", "ring")), by.get(("2d", "2d"))
    if ring and two_d:
        out["link_fall"] = max(ring["host_sent_bytes_per_step"]) / max(
            two_d["host_sent_bytes_per_step"])
        out["link_fall_predicted"] = max(ring["predicted_bytes_per_host"]) / max(
            two_d["predicted_bytes_per_host"])
        error = max(abs(m / p - 1) for r in (ring, two_d)
                    for m, p in zip(r["host_sent_bytes_per_step"], r["predicted_bytes_per_host"]))
        out["max_prediction_error"] = error
        out["lines"].append(
            f"2-D summation: bytes per host link per step fall {out['link_fall']:.2f}x "
            f"(host_link_bytes predicts {out['link_fall_predicted']:.2f}x: 2(N-1)/N -> "
            f"2(H-1)/H of the buckets' bytes); measured within {error:.1%} of the prediction")
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    wus = [r for r in results if r["part"] == "wus"]
    two_d = [r for r in results if r["part"] == "2d"]
    panels = [p for p in (wus and "step", wus and "slots", two_d and "links") if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "step":
            ax.bar([r["mode"] for r in wus], [r["median_step_s"] for r in wus], label="step")
            ax.plot([r["mode"] for r in wus], [r["cpu_floor_s"] for r in wus], "k_", ms=30,
                    mew=2, label="CPU-s / cores")
            ax.set_ylabel("median step (s)")
            ax.legend()
        elif panel == "slots":
            ax.bar([r["mode"] for r in wus],
                   [max(r["slot_bytes_resident"]) / 2**20 for r in wus])
            ax.set_ylabel("largest per-worker Adam slots (MiB)")
        else:
            ax.bar([r["mode"] for r in two_d],
                   [max(r["host_sent_bytes_per_step"]) / 2**20 for r in two_d], label="measured")
            ax.plot([r["mode"] for r in two_d],
                    [max(r["predicted_bytes_per_host"]) / 2**20 for r in two_d], "k_", ms=30,
                    mew=2, label="host_link_bytes")
            ax.set_ylabel("bytes sent per host link per step (MiB)")
            ax.legend()
    params = (wus or two_d)[0]["params"]
    fig.suptitle(f"wide MLP, {params / 1e6:.1f} M parameters, Adam")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--part", default="wus,2d", help="wus, 2d or both (comma-separated)")
    p.add_argument("--width", type=int, default=3584, help="hidden layer width")
    p.add_argument("--layers", type=int, default=5,
                   help="hidden layers (layers-1 width x width kernels)")
    p.add_argument("--workers", type=int, default=4, help="part wus: workers on this machine")
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--link-mbit", type=float, default=1000.0, help="part 2d: link rate")
    p.add_argument("--prefix", default="aplb", help="part 2d: emulated cluster name prefix")
    p.add_argument("--stall-timeout", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", default=str(RESULTS / "large_batch.json"))
    args = p.parse_args()
    if args.train:
        train(args)
        return
    parts = set(args.part.split(","))
    results = []
    if "wus" in parts:
        for mode in ("replicated", "wus"):
            results.append(run_local(args, mode))
            print(json.dumps(results[-1]), flush=True)
    if "2d" in parts:
        from bench.cluster import require_root
        require_root()
        for mode in ("ring", "2d"):
            results.append(run_emulated(args, mode))
            print(json.dumps(results[-1]), flush=True)
    summary = _summary(results)
    for line in summary["lines"]:
        print(line)
    for r in results:
        if r["part"] == "wus":
            print(f"{r['mode']:>10}: {r['workers']} workers, {r['params'] / 1e6:.1f} M parameters: "
                  f"median step {r['median_step_s']:.3f} s (workers' CPU-s per step / "
                  f"{r['cores']} cores = {r['cpu_floor_s']:.3f} s: bound by {r['bound']}); Adam "
                  f"slots per worker {[round(b / 2**20, 1) for b in r['slot_bytes_resident']]} MiB "
                  f"(planned {[round(b / 2**20, 1) for b in r['slot_bytes_planned']]}); RSS "
                  f"{[round(b / 2**20) for b in r['rss_bytes']]} MiB")
        else:
            print(f"{r['mode']:>10}: 2 hosts x 2 workers at {r['link_mbit']:g} Mbit/s: each host "
                  f"sends {[round(b / 2**20, 2) for b in r['host_sent_bytes_per_step']]} MiB per "
                  f"step over its link (host_link_bytes predicts "
                  f"{[round(b / 2**20, 2) for b in r['predicted_bytes_per_host']]}); median step "
                  f"{r['median_step_s']:.3f} s")
    sys.path.insert(0, str(REPO_ROOT))
    from bench.outputs import write_results
    write_results(args.out, args, ("train", "mode", "work"),
                  {"summary": summary, "results": results}, plot)


if __name__ == "__main__":
    main()
