"""How many bytes per second the emulated cluster itself can carry on this
machine: plain TCP streams between its hosts, no TensorFlow.

    sudo .venv/bin/python -m bench.link_ceiling          # ~2 min

Every host's link is shaped to the rate (bench/cluster.py), and every packet
crosses the kernel of this one machine: its veths, its bridge, its token
buckets, on the same cores as everything else. This runs, for H hosts at
the rate, patterns of long TCP streams (one process per sender and one per
receiver, 1 MiB writes) for a few seconds each and reports the bytes all the
links carried per second against what the links could carry:

    ring      host i sends to host i+1: H flows, every uplink and downlink busy
              once (what a ring all-reduce offers)
    fan       host i sends to every other host: H(H-1) flows, the same links
              (what herring's pushes and results offer, with incast)

A pattern whose aggregate stays below H x rate while every link has work is
bound by this machine, not by the links: a benchmark point moving more
bytes than that per second cannot reach its link limit here. Writes
bench/results/link_ceiling.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.cluster import EmulatedCluster, require_root

RESULTS = Path(__file__).resolve().parent / "results"
PORT = 47000

# One process: receive on PORT from any number of senders, or send to the
# given addresses (one thread each) until the deadline.
_PEER = r"""
import socket, sys, threading, time
mode, seconds = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + seconds
if mode == "recv":
    server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(sys.argv[3]))); server.listen(64); server.settimeout(1.0)
    def drain(conn):
        buf = bytearray(1 << 20)
        try:
            while conn.recv_into(buf):
                pass
        except OSError:
            pass
    while time.monotonic() < deadline + 5:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
else:
    chunk = b"x" * (1 << 20)
    def stream(address):
        for _ in range(100):
            try:
                s = socket.create_connection((address, int(sys.argv[3])), timeout=2.0)
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        s.settimeout(None)
        while time.monotonic() < deadline:
            s.sendall(chunk)
        s.close()
    threads = [threading.Thread(target=stream, args=(a,)) for a in sys.argv[4:]]
    for t in threads: t.start()
    for t in threads: t.join()
"""


def run_pattern(cluster: EmulatedCluster, targets: dict[int, list[int]], seconds: float) -> dict:
    hosts = cluster.num_hosts
    receivers = [cluster.popen(i, [sys.executable, "-c", _PEER, "recv", seconds + 2, PORT])
                 for i in range(hosts)]
    time.sleep(1.0)
    senders = [cluster.popen(i, [sys.executable, "-c", _PEER, "send", seconds + 2, PORT,
                                 *[cluster.addresses[j] for j in targets[i]]])
               for i in range(hosts) if targets[i]]
    time.sleep(1.5)                       # slow start over
    before, start = cluster.counters(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = cluster.counters(), time.monotonic() - start
    for proc in senders + receivers:
        proc.kill()
    for proc in senders + receivers:
        proc.wait(timeout=30)
    sent = sum(after[i][1] - before[i][1] for i in range(hosts))
    capacity = hosts * cluster.rate_mbit * 1e6 / 8
    return {"flows": sum(len(t) for t in targets.values()), "aggregate_MB_s": sent / elapsed / 1e6,
            "links_MB_s": capacity / 1e6, "of_links": sent / elapsed / capacity,
            "losses": cluster.losses()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="4,8,16")
    p.add_argument("--rate-mbit", default="100,25", help="comma-separated link rates")
    p.add_argument("--seconds", type=float, default=6.0)
    args = p.parse_args(argv)
    require_root()
    rows = []
    for rate, hosts in ((float(r), int(h)) for r in args.rate_mbit.split(",")
                        for h in args.hosts.split(",")):
        with EmulatedCluster(hosts, rate_mbit=rate) as cluster:
            for pattern, targets in (
                    ("ring", {i: [(i + 1) % hosts] for i in range(hosts)}),
                    ("fan", {i: [j for j in range(hosts) if j != i] for i in range(hosts)})):
                row = {"hosts": hosts, "rate_mbit": rate, "pattern": pattern,
                       **run_pattern(cluster, targets, args.seconds)}
                losses = row.pop("losses")
                row["ingress_drops"] = sum(v.get("ingress_drops", 0) for v in losses.values())
                rows.append(row)
                print(f"{rate:5g} Mbit/s {hosts:3d} hosts {pattern:5s} {row['flows']:4d} flows: "
                      f"{row['aggregate_MB_s']:6.1f} MB/s of {row['links_MB_s']:.0f} "
                      f"({100 * row['of_links']:.0f} % of the links)", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "link_ceiling.json").write_text(json.dumps(
        {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
