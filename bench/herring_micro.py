"""Microbenchmark of the Herring transport alone: transport.push_pull of one
G-MiB float32 buffer across N worker processes and S summation servers on
this machine (loopback; no root, no emulated links).

    python -m bench.herring_micro --workers 2 --servers 2 --mib 100 --iters 5 [--wire float16]

Starts the S servers (runtime/autopar_sumserver) and N workers (this module
with --worker), each of which averages its buffer `--iters` times after one
warm-up and checks the result. Prints one JSON line: seconds per averaging
(median over iterations of the slowest worker), the algorithm bandwidth
G/t, and the bytes each worker and each server moves per averaging (a
worker sends and receives G·w, a server N·G·w/S each way, w the wire bytes
per element relative to float32).
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

REPO = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import tensorflow as tf
    from autopar.transforms.methods.herring import transport
    from autopar.transforms.methods.herring.bfb import FusionBuffer, shards
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    size = args.mib * (1 << 20) // 4
    servers = len(os.environ["AUTOPAR_SUMSERVERS"].split(","))
    buffer = tf1.Variable(tf.fill([size], float(args.worker + 1)), name="buffer")
    reduced = transport.push_pull(buffer.value(), FusionBuffer(0, size, [], shards(size, servers)),
                             num_contributors=args.workers, contributor_index=args.worker,
                             wire_dtype=args.wire)
    # Fetch one element only: the benchmark times the transport, not a copy
    # of the result into numpy.
    probe = reduced[size // 2 + 1]
    with tf1.Session() as session:
        session.run(buffer.initializer)
        expected = (args.workers + 1) / 2
        assert abs(session.run(probe) - expected) < 1e-2 * expected
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            session.run(probe.op)
            times.append(time.perf_counter() - start)
    print("TIMES " + json.dumps(times), flush=True)


def _start_server(binary: Path, host: str = "127.0.0.1", popen=subprocess.Popen,
                  env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = popen([str(binary), "--port", "0", "--host", host], stdout=subprocess.PIPE, text=True,
                 env=env)
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        raise RuntimeError(f"autopar_sumserver did not start: {line!r}")
    return proc, match.group(1)


def run(workers: int, servers: int, mib: int, iters: int, wire: str,
        cluster=None) -> dict:
    """On loopback, or with `cluster` (bench.cluster.EmulatedCluster of
    workers + servers hosts) worker i in host i and server k in host
    workers + k, talking over the emulated links."""
    from autopar.common.env import HERRING_WINDOW
    from autopar.runtime import native
    from autopar.runtime.commands import user_window
    from autopar.runtime.flow_windows import job_window_setting
    binary = native.sumserver_path()

    def popen(host: int, argv, **kwargs):
        if cluster is None:
            return subprocess.Popen(argv, **kwargs)
        return cluster.popen(host, argv, **kwargs)

    # On emulated links, the flow window autopar's launcher would set.
    window = (job_window_setting(user_window(HERRING_WINDOW), cluster.rate_mbit / 1000,
                                 workers, servers) if cluster else None)
    base_env = dict(os.environ, **({HERRING_WINDOW: window} if window else {}))
    procs: list[subprocess.Popen] = []
    try:
        addresses = []
        for k in range(servers):
            host = cluster.addresses[workers + k] if cluster else "127.0.0.1"
            proc, address = _start_server(
                binary, host, lambda argv, **kw: popen(workers + k, argv, **kw), env=base_env)
            procs.append(proc)
            addresses.append(address)
        env = dict(base_env, AUTOPAR_SUMSERVERS=",".join(addresses),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TF_CPP_MIN_LOG_LEVEL="2")
        children = [popen(i, [sys.executable, "-m", "bench.herring_micro", "--worker", str(i),
                              "--workers", str(workers), "--mib", str(mib),
                              "--iters", str(iters), "--wire", wire],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
                    for i in range(workers)]
        procs += children
        per_worker = []
        for child in children:
            out, _ = child.communicate(timeout=600)
            if child.returncode != 0:
                raise RuntimeError(f"a worker failed (status {child.returncode}):\n{out[-2000:]}")
            per_worker.append(json.loads(out.split("TIMES ", 1)[1].splitlines()[0]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    slowest = [max(column) for column in zip(*per_worker)]
    seconds = sorted(slowest)[len(slowest) // 2]
    g = mib * (1 << 20)
    wire_factor = 1.0 if wire == "float32" else 0.5
    return {"workers": workers, "servers": servers, "mib": mib, "wire": wire, "iters": iters,
            "seconds_per_averaging": seconds, "algbw_gbit_s": 8 * g / seconds / 1e9,
            "bytes_per_worker_each_way": g * wire_factor,
            "bytes_per_server_each_way": workers * g * wire_factor / servers,
            "all_seconds": slowest, "flow_window_bytes": int(window) if window else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--wire", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--emulated-mbit", type=float,
                        help="run on an emulated cluster (root): workers and servers each on their "
                             "own host, links at this rate (bench/cluster.py)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        _worker(args)
        return 0
    if args.emulated_mbit:
        from bench.cluster import EmulatedCluster, require_root
        require_root()
        with EmulatedCluster(args.workers + args.servers, rate_mbit=args.emulated_mbit,
                             prefix="aphm") as cluster:
            result = run(args.workers, args.servers, args.mib, args.iters, args.wire, cluster)
        result["link_mbit"] = args.emulated_mbit
        # Each worker link carries G each way, each server link N·G/S.
        busiest = max(result["bytes_per_worker_each_way"], result["bytes_per_server_each_way"])
        result["link_limit_s"] = busiest * 8 / (args.emulated_mbit * 1e6)
        result["of_limit"] = result["link_limit_s"] / result["seconds_per_averaging"]
    else:
        result = run(args.workers, args.servers, args.mib, args.iters, args.wire)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
