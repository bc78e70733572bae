"""An alpha-beta-gamma model of synchronous data-parallel training steps,
calibrated on the emulated-cluster measurements and projected past them.

    python -m bench.simulate            # or: make simulate (seconds, no root)

writes bench/results/simulate.{json,md,png}.

The model (phases, terms, step time) is transforms/cost.py, which the planner
predicts with too; this module fits its constants and projects.

Fitting: every term above is linear in the constants (gamma, wire factor,
kappa, message cost and overhead per peer, compute per workload; alpha is not
fitted, see `design`), so the fit
is a non-negative least-squares problem on the relative error
(each row divided by the measured step time): minimising
sum((predicted - measured) / measured)^2, solved by Lawson-Hanson (numpy).
The measured step time of a point is its mean step: the throughput the
benchmark's tables report (words/s = examples / mean step), and what the
measured TCP timeouts (an input) and Horovod's bimodal two-rank all-gather
(a fitted share, PAIR_SERIALISED_PEERS) add to; a median of a bimodal step
jumps between its modes from run to run. The compute-only floor's points (method "none":
no phases, so only compute) are fitted too, with the slowest worker's mean
step (its workers do not wait for each other); they pin compute per example,
so a peer's overhead is what it adds to the floor. (Runs without floor
points fall back to: the leanest peer's overhead is 0.)
"""
from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from autopar.transforms.cost import (GROUP_SIZES, METHODS, MIN_GAIN, PLANNER_PEER, RTO_MIN_S,
                                     Cluster, Constants, PeerConstants, Workload, best_allreduce_group,
                                     best_structure,
                                     expected_distinct, step_time, terms)
from bench.metrics import DISTINCT_ROW_PEERS, PEER_METHODS

RESULTS = Path(__file__).resolve().parent / "results"
# The commit from which autopar's server paths move each distinct row once
# (DISTINCT_ROW_PEERS); runs of older commits moved a row per looked-up id.
DISTINCT_ROWS_SINCE = "2badec4"
# Peers whose runs before a commit measured a server path that commit changed,
# so the fit leaves those points out: from 70463f0 autopar-ps splits a dense
# variable into ranges of rows and scales its gradient on the server (before:
# strided copies on every worker, bench/README.md "CPU per byte of the server
# paths"); make bench-messages and make bench-ps-bytes measure it anew.
SUPERSEDED_BEFORE = {"autopar-ps": "70463f0"}
# Peers whose all-gather between two ranks sometimes runs one direction after the
# other instead of both at once: Horovod/Gloo at N = 2, traced (bench/README.md,
# "Horovod at N = 2") at 1.0x or 2.0x the one-way transfer time from step to step,
# never in between; at N >= 4 its steps are unimodal. The model fits, per such peer,
# the expected share of the two-rank all-gather's link time paid a second time.
PAIR_SERIALISED_PEERS = ("horovod",)
# Peers that are another peer measured differently (autopar-hybrid with its job
# timeline on, to measure the timeline's cost): the same system, so neither fitted
# constants of their own nor projected.
VARIANT_PEERS = ("autopar-hybrid-timeline",)
# Peers whose method this model has phases for and that aggregate (not the floor,
# nor herring, which has no fitted points yet).
MODELLED_PEERS = tuple(peer for peer, method in PEER_METHODS.items()
                       if method in METHODS and method != "none" and peer not in VARIANT_PEERS)


# --------------------------------------------------------------------------- fitting

def nnls(a: np.ndarray, y: np.ndarray, tol: float = 1e-12, max_iter: int = 500) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0 (Lawson & Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (y - a @ x)
    it = 0
    while (~passive).any() and (w[~passive] > tol).any() and it < max_iter:
        it += 1
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (y - a @ x)
    return x


@dataclass
class Point:
    """One measured step: the inputs of the model and the measured time."""
    source: str
    workload: Workload
    cluster: Cluster
    peer: str
    method: str
    step_s: float
    status: str = "ok"


def design(points: list[Point], workloads: list[str], peers: list[str]) -> tuple[np.ndarray, list[str]]:
    """Columns: gamma, compute[w]..., then per aggregating peer p
    overhead[p], kappa[p], kappa_rpc[p], wire[p], message[p] and rpc[p] (each transport
    reaches its own fraction of the link rate and pays its own CPU per byte and per
    ring step or parameter-server RPC: TF's gRPC collectives, Gloo and the parameter
    servers' RPCs differ by up to 2x in the measured "of limit", and a
    hybrid step has both kinds; a peer with one kind has all-zero columns
    for the other, which the fit leaves at 0). The floor's points have only compute: they
    pin compute per example, so the peers' overheads are what they add to it.
    No alpha column: on shared cores a hop's wait (hops x processes / cores)
    is, for a ring, exactly its messages / cores, so alpha and the peers'
    message costs cannot both be fitted; the CPU per message is kept (it is
    what differs between transports) and alpha is 0 in fitted constants."""
    names = ["gamma", "timeouts"] + [f"compute[{w}]" for w in workloads] + \
            [f"overhead[{p}]" for p in peers] + [f"kappa[{p}]" for p in peers] + \
            [f"kappa_rpc[{p}]" for p in peers] + \
            [f"wire[{p}]" for p in peers] + [f"message[{p}]" for p in peers] + \
            [f"rpc[{p}]" for p in peers] + \
            [f"serialised[{p}]" for p in peers if p in PAIR_SERIALISED_PEERS]
    col = {name: i for i, name in enumerate(names)}
    rows = []
    for pt in points:
        t = terms(pt.method, pt.workload, pt.cluster)
        r = np.zeros(len(names))
        r[col["gamma"]] = t["gamma"]
        r[col["timeouts"]] = t["timeouts"]
        r[col[f"compute[{pt.workload.name}]"]] = t["compute"]
        if pt.method == "none":
            rows.append(r)
            continue
        r[col[f"overhead[{pt.peer}]"]] = t["overhead"]
        r[col[f"kappa[{pt.peer}]"]] = t["kappa"]
        r[col[f"kappa_rpc[{pt.peer}]"]] = t["kappa_rpc"]
        r[col[f"wire[{pt.peer}]"]] = t["wire"]
        r[col[f"message[{pt.peer}]"]] = t["mu"]
        r[col[f"rpc[{pt.peer}]"]] = t["mu_rpc"]
        if pt.peer in PAIR_SERIALISED_PEERS:
            # fitted as share x wire factor (linear); _fit_constants divides the factor out
            r[col[f"serialised[{pt.peer}]"]] = t["pair_allgather"]
        rows.append(r)
    return np.array(rows), names


def with_run_speed(points: list[Point], speeds: dict) -> list[Point]:
    """The points with each run's cpu_speed (runs not in `speeds`: 1)."""
    return [replace(p, cluster=replace(p.cluster, cpu_speed=speeds.get(p.source, 1.0))) for p in points]


def fit(points: list[Point], iterations: int = 100) -> Constants:
    """Fit the constants to the points, minimising the squared relative error,
    and, with points from several runs, each run's CPU speed relative to the
    run with the most points (the reference: its cpu_speed is 1). The machine
    is a virtual machine whose cores are 20-50 % slower in some sessions than
    in others (bench/README.md, "Limits of these numbers"); the wire is not
    (the links are shaped by tc). The model is linear in the constants for
    given speeds and linear in one run's speed for given constants, so the
    two are fitted in turn until the speeds settle."""
    runs = sorted({p.source for p in points}, key=lambda r: (-sum(p.source == r for p in points), r))
    speeds = {r: 1.0 for r in runs}
    k = _fit_constants(points)
    for _ in range(iterations if len(runs) > 1 else 0):
        new = dict(speeds)
        for run in runs[1:]:
            # predicted = rest + speed * cpu: least squares on the relative error, in closed form;
            # cpu and rest read off the model at speeds 1 and 2 (every CPU term scales with it)
            num = den = 0.0
            for p in [q for q in points if q.source == run]:
                t1, t2 = (step_time(p.method, p.workload, replace(p.cluster, cpu_speed=v), k, p.peer)["step_s"]
                          for v in (1.0, 2.0))
                cpu, rest = t2 - t1, 2 * t1 - t2
                num += cpu * (p.step_s - rest) / p.step_s ** 2
                den += (cpu / p.step_s) ** 2
            new[run] = min(3.0, max(1 / 3, num / den)) if den > 0 else 1.0
        settled = max(abs(new[r] - speeds[r]) for r in runs) < 1e-6
        speeds = new
        k = _fit_constants(with_run_speed(points, speeds))
        if settled:
            break
    k.run_cpu_speed = speeds
    return k


def _fit_constants(points: list[Point]) -> Constants:
    """The constants for points whose clusters carry their run's cpu_speed."""
    workloads = sorted({p.workload.name for p in points})
    peers = sorted({p.peer for p in points if p.method != "none"})
    a, names = design(points, workloads, peers)
    y = np.array([p.step_s for p in points])
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    x = nnls((a / y[:, None]) / scale, np.ones(len(points))) / scale
    val = dict(zip(names, x))
    # Without floor points a per-step overhead shared by every peer and compute per
    # example cannot be told apart (both scale with N, and every peer ran every
    # workload): any d moved from all peers' overheads into compute (d / examples per
    # workload) predicts the same times. Convention then: the leanest peer's overhead
    # is 0, the rest is compute. With them, compute is measured and nothing moves.
    if not any(p.method == "none" for p in points):
        examples = {p.workload.name: p.workload.examples for p in points}
        d = min(val[f"overhead[{p}]"] for p in peers)
        for p in peers:
            val[f"overhead[{p}]"] -= d
        for w in workloads:
            val[f"compute[{w}]"] += d / examples[w]
    return Constants(alpha=0.0, gamma=val["gamma"], wire_factor=1.0, timeout_share=val["timeouts"],
                     compute_per_example={w: val[f"compute[{w}]"] for w in workloads},
                     peers={p: PeerConstants(overhead_s=val[f"overhead[{p}]"], kappa=val[f"kappa[{p}]"],
                                             rpc_kappa=val[f"kappa_rpc[{p}]"],
                                             wire_factor=val[f"wire[{p}]"], message_s=val[f"message[{p}]"],
                                             rpc_s=val[f"rpc[{p}]"],
                                             pair_serialised=(val.get(f"serialised[{p}]", 0.0) / val[f"wire[{p}]"]
                                                              if val[f"wire[{p}]"] > 0 else 0.0))
                            for p in peers})


# --------------------------------------------------------------------------- measured points

def workload_from_results(spec: dict) -> Workload:
    params = spec.get("params", {})
    rows = int(params.get("vocab", 0)) if spec.get("sparse_bytes") else 0
    row_bytes = spec["sparse_bytes"] / rows if rows else 0.0
    name = spec["name"]
    if name == "avg":
        # the microbenchmark's "compute" is elementwise work on its G bytes, and G differs by run
        name = f"avg{spec['dense_bytes'] / 2**20:.0f}MiB"
    return Workload(name, float(spec["dense_bytes"]), rows, row_bytes,
                    float(spec.get("sparse_rows_per_step", 0)), float(spec.get("batch", 1)),
                    zipf_s=params.get("zipf_a"))


def points_from_results(results: dict, source: str) -> list[Point]:
    """Every timed point of a bench/results/<name>.json (wrong-loss points
    too: their timing is valid; they are flagged)."""
    wls = {name: workload_from_results(spec) for name, spec in results["workloads"].items()}
    default_mbit = results["settings"].get("rate_mbit")   # runs before per-point link rates
    commit = results.get("git", {}).get("commit")
    distinct = _includes(DISTINCT_ROWS_SINCE, commit)
    superseded = {peer for peer, since in SUPERSEDED_BEFORE.items() if not _includes(since, commit)}
    cores = results.get("machine", {}).get("cpus") or 2
    # --autopar-config's Config.aggregation_group (0: the hosts) and allreduce_group
    # (0: the flat ring)
    given = results["settings"].get("autopar_config", {})
    groups = int(given.get("aggregation_group") or 0)
    ring_groups = int(given.get("allreduce_group") or 0)
    out = []
    for p in results["points"]:
        if p.get("status") not in ("ok", "wrong-loss") or not p.get("step_s"):
            continue
        wl = wls[p["workload"]]
        method = PEER_METHODS[p["peer"]]
        if method not in METHODS or p["peer"] in VARIANT_PEERS or p["peer"] in superseded:
            continue
        rate = (p.get("link_mbit") or default_mbit) / 1000.0
        # the structure the plan ran: the report's (runs since the planner
        # chooses it), else the run's hand-set group
        plan = p.get("autopar_report") or {}
        group = (plan.get("aggregation_group") or 0) if "aggregation_group" in plan else groups
        servers = plan.get("sparse_servers") or p["num_servers"]
        ring = (plan.get("allreduce_group") or 0) if "allreduce_group" in plan else ring_groups
        cl = Cluster(p["num_workers"], 1, servers, False, rate, cores,
                     aggregation_group=group if p["peer"].startswith("autopar-") else 0,
                     allreduce_group=ring if p["peer"].startswith("autopar-") else 0)
        if method in ("ps", "hybrid") and p["num_servers"]:
            srv = p["bytes_per_step"]["server"]
            # the mean over the servers the rows use (the others hold nothing)
            mean_srv = srv["recv"] * p["num_servers"] / servers
            if mean_srv > 0:
                # the measured placement: most loaded server over the mean (1 = even spread)
                cl.server_imbalance = max(1.0, srv["recv_max"] / mean_srv)
        losses = p.get("link_losses") or {}
        if losses.get("timeouts") and p.get("measured_steps"):
            cl.timeouts_per_step = losses["timeouts"] / p["measured_steps"]
        if distinct and p["peer"] in DISTINCT_ROW_PEERS and wl.touched_rows:
            # each distinct row once per worker: the run's measured distinct rows
            alpha = (p.get("alpha") or {}).get("worker_unique")
            rows = (alpha * wl.sparse_rows if alpha
                    else expected_distinct(wl.sparse_rows, wl.touched_rows, wl.zipf_s))
            wl = replace(wl, touched_rows=rows)
        step = float(p["step_s"])
        if method == "none" and p.get("compute_floor_s"):
            # the floor's workers do not wait for each other: a worker's median step is
            # one run alone on a core; the slowest worker's mean is the CPU share of N
            step = float(p["compute_floor_s"])
        out.append(Point(source, wl, cl, p["peer"], method, step, p["status"]))
    return out


# The runs fitted by default (bench/results/<name>.json).
DEFAULT_RUNS = ("full", "quick", "messages", "ps_bytes")


# Config.aggregation_group measured on the emulated cluster (make bench-groups)
GROUP_RUNS = tuple(RESULTS / f"groups_g{g}.json" for g in (1, 2, 4, 8))


def _measured_points(paths) -> list[Point]:
    """The points of the committed runs at `paths` that exist, each run its own source."""
    return [p for path in paths if Path(path).exists()
            for p in points_from_results(json.loads(Path(path).read_text()), Path(path).stem)]


def group_validation(k: Constants, paths=GROUP_RUNS) -> list[dict]:
    """Config.aggregation_group measured (hybrid on the sparse LM, N = 8, one
    run per group size) against the model fitted without those runs: each
    step over the same link's step with groups of one, measured and
    predicted (so the runs' CPU speeds cancel)."""
    points = _measured_points(paths)
    alone = {p.cluster.link_gbit: p for p in points if p.cluster.aggregation_group <= 1}
    rows = []
    for p in sorted(points, key=lambda p: (-p.cluster.link_gbit, p.cluster.aggregation_group)):
        base = alone.get(p.cluster.link_gbit)
        if base is None:
            continue
        predicted = [step_time(q.method, q.workload, q.cluster, k, q.peer)["step_s"]
                     for q in (p, base)]
        rows.append({"link_mbit": 1000 * p.cluster.link_gbit, "N": p.cluster.workers,
                     "group": max(1, p.cluster.aggregation_group), "measured_s": p.step_s,
                     "measured_ratio": p.step_s / base.step_s,
                     "predicted_ratio": predicted[0] / predicted[1]})
    return rows


# Config.allreduce_group measured on the emulated cluster (hybrid on the sparse
# LM, N = 8, 1000 Mbit/s; bench/README.md "2-D summation over groups")
ALLREDUCE_GROUP_RUNS = tuple(sorted(RESULTS.glob("allreduce_groups_*.json")))
# autopar's peers whose dense all-reduce is TensorFlow's collectives (the launches' cost)
COLLECTIVE_PEERS = ("autopar-allreduce", "autopar-hybrid")


def allreduce_group_launches(k: Constants, paths=ALLREDUCE_GROUP_RUNS) -> tuple[float, list[dict]]:
    """The CPU seconds per worker of each collective 2-D summation over groups
    launches beyond the flat ring's one (PeerConstants.launch_s), from the
    runs of Config.allreduce_group (the flat ring and groups on the same
    cluster): the value that makes the model's ratio of each group size's
    mean step to the flat ring's the measured one, averaged over the group
    sizes (ratios, so the runs' CPU speed cancels; the fitted constants
    otherwise). Measured, not fitted; 0 without such runs. With the rows:
    each group size's measured and predicted ratio."""
    points = _measured_points(paths)
    by_group: dict[int, list] = {}
    for p in points:
        by_group.setdefault(p.cluster.allreduce_group, []).append(p)
    flat = by_group.pop(0, [])
    if not flat or not by_group:
        return 0.0, []

    def predicted(p, launch_s: float) -> float:
        kl = replace(k, peers={**k.peers, p.peer: replace(k.peer(p.peer), launch_s=launch_s)})
        return step_time(p.method, p.workload, p.cluster, kl, p.peer)["step_s"]
    base, flat_s = flat[0], float(np.mean([p.step_s for p in flat]))
    estimates, rows = [], []
    for d, pts in sorted(by_group.items()):
        measured = float(np.mean([p.step_s for p in pts])) / flat_s
        p = pts[0]
        without, slope = predicted(p, 0.0), predicted(p, 1.0) - predicted(p, 0.0)
        estimates.append(max(0.0, (measured * predicted(base, 0.0) - without) / slope))
        rows.append({"group": d, "N": p.cluster.workers, "link_mbit": 1000 * p.cluster.link_gbit,
                     "runs": len(pts), "measured_s": float(np.mean([q.step_s for q in pts])),
                     "flat_measured_s": flat_s, "measured_ratio": measured,
                     "predicted_ratio_without_launches": without / predicted(base, 0.0)})
    launch_s = float(np.mean(estimates))
    for row, (d, pts) in zip(rows, sorted(by_group.items())):
        row["predicted_ratio"] = predicted(pts[0], launch_s) / predicted(base, launch_s)
    return launch_s, rows


def _includes(change: str, commit: str | None) -> bool:
    """Whether a run's commit includes the commit `change` (git decides;
    without git or the run's commit, assume the run is of current code)."""
    if not commit:
        return True
    try:
        done = subprocess.run(["git", "merge-base", "--is-ancestor", change, commit],
                              cwd=Path(__file__).resolve().parent, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return done.returncode != 1   # 0: ancestor; 1: not; other: unknown commit


def errors(points: list[Point], k: Constants) -> list[dict]:
    rows = []
    for pt in with_run_speed(points, k.run_cpu_speed):
        pred = step_time(pt.method, pt.workload, pt.cluster, k, pt.peer)
        rows.append({"source": pt.source, "workload": pt.workload.name, "peer": pt.peer,
                     "method": pt.method, "N": pt.cluster.workers, "status": pt.status,
                     "server_imbalance": round(pt.cluster.server_imbalance, 3),
                     "measured_s": pt.step_s, "predicted_s": pred["step_s"],
                     "error": (pred["step_s"] - pt.step_s) / pt.step_s,
                     "parts_s": pred["parts"]})
    return rows


def summarise(rows: list[dict]) -> dict:
    e = np.abs([r["error"] for r in rows])
    return {"points": len(rows), "median_abs_error": float(np.median(e)),
            "mean_abs_error": float(np.mean(e)), "max_abs_error": float(np.max(e)),
            "within_20pct": int(np.sum(e <= 0.2))}


def run_to_run(points: list[Point]) -> list[dict]:
    """The same configuration measured in two runs: how far apart the two
    measurements are (the noise floor no model of the configuration can beat)."""
    seen: dict = {}
    for pt in points:
        # the same workload (its size too), link rate, peer and N
        key = (pt.workload.name, pt.workload.sparse_rows, pt.workload.dense_bytes, pt.cluster.link_gbit,
               pt.peer, pt.cluster.workers)
        seen.setdefault(key, []).append(pt)
    out = []
    for (w, _, _, _, peer, n), pts in sorted(seen.items()):
        if len(pts) > 1:
            t = [p.step_s for p in pts]
            out.append({"workload": w, "peer": peer, "N": n, "step_s": {p.source: p.step_s for p in pts},
                        "max_over_min": max(t) / min(t)})
    return out


# --------------------------------------------------------------------------- projections

PROJECT_N = (16, 32, 64, 128, 256, 512)


def project_bench(wls: dict[str, Workload], k: Constants, link_gbit: float,
                  ns=PROJECT_N, peers=MODELLED_PEERS) -> list[dict]:
    """The bench's workloads on a real cluster of N hosts (one worker each, S = N
    server hosts for PS systems, servers evenly loaded, every process on its own
    cores) with the fitted constants. autopar-hybrid runs the aggregation
    structure its planner chooses (transforms.cost.best_structure, with these
    constants): its default; FLAT_LABEL is it with the hosts and every server."""
    out = []
    for wl in wls.values():
        for n in ns:
            for peer in peers:
                method = PEER_METHODS[peer]
                cl = Cluster(n, 1, n, False, link_gbit, None)
                extra = {}
                # the planner's choices take ids as uniform (transforms.plan:
                # aggregation_structure, allreduce_structure); the step is
                # then predicted for the workload's own ids
                planned = replace(wl, zipf_s=None)
                if peer == PLANNER_PEER and wl.touched_bytes:
                    r = step_time(method, wl, cl, k, peer)
                    out.append({"workload": wl.name, "N": n, "peer": FLAT_LABEL, "method": method,
                                "step_s": r["step_s"], "throughput": r["throughput"],
                                "parts_s": r["parts"]})
                    chosen = best_structure(planned, cl, k, peer)
                    cl = replace(cl, servers=chosen.servers, aggregation_group=chosen.group)
                    extra = {"aggregation_group": chosen.group, "servers": chosen.servers,
                             "predicted_gain": chosen.gain}
                if peer.startswith("autopar-") and method in ("allreduce", "hybrid"):
                    # the planner's 2-D summation of the dense all-reduce
                    # (transforms.plan.allreduce_structure)
                    ring = best_allreduce_group(method, planned, cl, k, peer)
                    cl = replace(cl, allreduce_group=ring.group if ring.group > 1 else 0)
                    extra["allreduce_group"] = ring.group
                r = step_time(method, wl, cl, k, peer)
                out.append({"workload": wl.name, "N": n, "peer": peer, "method": method,
                            "step_s": r["step_s"], "throughput": r["throughput"],
                            "parts_s": r["parts"], **extra})
    return out


# autopar-hybrid with Config(aggregation_group=0) (the hosts) and every server:
# the flat structure its planner compares its choice with.
FLAT_LABEL = "autopar-hybrid, flat (hosts, every server)"


# Parallax (§7.1): 8 machines x 6 TITAN Xp, 100 Gbit/s InfiniBand; Table 1 sizes
# (millions of float32 parameters) and per-GPU batches; one-GPU throughput derived
# from Table 1 / Table 4 throughput at 48 GPUs divided by Fig. 13's normalised
# throughput (LM: 101.2k/3.4 = 29.8k, 39.0k/1.3 = 30.0k, 276k/9.4 = 29.4k words/s).
PARALLAX_GPUS_PER_HOST = 6
PARALLAX_LINK_GBIT = 100.0
PARALLAX_MODELS = {
    # name: (dense M params, sparse M params, sparse subset M params per GPU step, row width,
    #        examples per GPU step, one-GPU examples/s, zipf exponent of the ids)
    "ResNet-50": (26, 0, 0, 0, 64, 202.0, None),
    "Inception-v3": (24, 0, 0, 0, 64, 135.0, None),
    # 128 sequences x 20 unrolled steps (Jozefowicz et al.'s LM); 800K-word vocabulary, embedding and
    # softmax rows 512 wide; ids Zipf(1) (word frequencies)
    "LM": (9, 814, 6.5, 512, 128 * 20, 29.7e3, 1.0),
    # 128 sentence pairs of ~25 words (an assumption: the paper gives no length); 1024-wide rows
    "NMT": (94, 75, 7, 1024, 128 * 25, 11.2e3, 1.0),
}
# From the paper, at 48 GPUs: throughput (Table 1: PS, MPI; Table 4: BASE, +HYB, +LA, all)
# and Fig. 13's normalised throughput (Parallax, TF-PS, Horovod).
PARALLAX_PAPER = {
    "ResNet-50": {"table1_ps": 6.0e3, "table1_mpi": 8.1e3, "fig13": {"hybrid": 39.8, "tf_ps": 30.2, "horovod": 39.5}},
    "Inception-v3": {"table1_ps": 3.9e3, "table1_mpi": 5.8e3, "fig13": {"hybrid": 43.6, "tf_ps": 28.4, "horovod": 44.0}},
    "LM": {"table1_ps": 101.2e3, "table1_mpi": 39.0e3, "fig13": {"hybrid": 9.4, "tf_ps": 3.4, "horovod": 1.3},
           "table4": {"BASE": 101e3, "+HYB": 112e3, "+LA": 251e3, "+OPSW": 276e3}},
    "NMT": {"table1_ps": 86.8e3, "table1_mpi": 67.2e3, "fig13": {"hybrid": 17.1, "tf_ps": 7.8, "horovod": 6.0},
            "table4": {"BASE": 87e3, "+HYB": 117e3, "+LA": 188e3, "+OPSW": 191e3}},
}
# the systems of the Parallax comparison: TF-PS (no local aggregation), Horovod
# (NCCL ring for dense, MPI all-gather for sparse), Parallax = hybrid (+LA), and +HYB alone
PARALLAX_SYSTEMS = {"tf_ps": "ps", "horovod": "allreduce", "hybrid": "hybrid", "hybrid_nola": "hybrid_nola"}


def parallax_workload(name: str) -> Workload:
    dense, sparse, subset, width, examples, one_gpu, zipf = PARALLAX_MODELS[name]
    rows = int(sparse * 1e6 / width) if sparse else 0
    return Workload(name, dense * 4e6, rows, 4.0 * width, subset * 1e6 / width if sparse else 0.0,
                    float(examples), compute_s=examples / one_gpu, zipf_s=zipf)


def parallax_cluster(gpus: int) -> Cluster:
    h = min(PARALLAX_GPUS_PER_HOST, gpus)
    return Cluster(gpus, h, 0, True, PARALLAX_LINK_GBIT, None)


SPARSE_PS_PHASES = ("ps-sparse-push", "ps-sparse-pull")
ALL_PS_PHASES = SPARSE_PS_PHASES + ("ps-dense-push", "ps-dense-pull")


def parallax_constants(grpc_factor: float = 1.0, allgather_factor: float = 1.0,
                       alpha: float = 10e-6, gamma: float = 1e-10,
                       grpc_phases: tuple = SPARSE_PS_PHASES) -> Constants:
    """Transport model of the Parallax cluster: NCCL all-reduce and dense PS
    traffic at the link rate, sparse rows through the PS (gRPC, IndexedSlices
    gathered and scattered on CPU servers) and Horovod's MPI all-gather of rows
    at 1/factor of it. alpha 10 us per hop, gamma 0.1 ns/byte (a summing pass
    at ~10 GB/s)."""
    factors = {name: grpc_factor for name in grpc_phases}
    factors["allgather"] = allgather_factor
    return Constants(alpha=alpha, gamma=gamma, phase_wire_factor=factors)


def _solve_factor(method: str, wl: Workload, cl: Cluster, k: Constants, phase_names: tuple,
                  target_step_s: float) -> float:
    """The factor on `phase_names`' wire time that makes the step last target_step_s
    (the step is linear in it)."""
    base = step_time(method, wl, cl, k)
    wire = {name: w for name, w in terms(method, wl, cl)["wire_by_phase"].items() if name in phase_names}
    w_sum = sum(wire.values())
    others = base["step_s"] - sum(w * k.phase_wire_factor.get(n, 1.0) for n, w in wire.items())
    if w_sum <= 0:
        return 1.0
    return max(1.0, (target_step_s - others) / w_sum)


def calibrate_parallax_transports(gpus: int = 48, grpc_phases: tuple = SPARSE_PS_PHASES) -> dict:
    """Effective rates of TF-PS's gRPC (on `grpc_phases`) and Horovod's MPI
    all-gather on the Parallax cluster, from Table 1's LM row alone (PS 101.2k,
    MPI 39.0k words/s at 48 GPUs)."""
    wl, cl = parallax_workload("LM"), parallax_cluster(gpus)
    paper = PARALLAX_PAPER["LM"]
    k = parallax_constants(grpc_phases=grpc_phases)
    grpc = _solve_factor("ps", wl, cl, k, grpc_phases, gpus * wl.examples / paper["table1_ps"])
    mpi = _solve_factor("allreduce", wl, cl, k, ("allgather",), gpus * wl.examples / paper["table1_mpi"])
    return {"grpc_factor": grpc, "allgather_factor": mpi,
            "grpc_gbit": PARALLAX_LINK_GBIT / grpc, "allgather_gbit": PARALLAX_LINK_GBIT / mpi}


def project_parallax(k: Constants, gpus_list=(6, 12, 24, 36, 48, 96, 192, 384, 512)) -> list[dict]:
    out = []
    for name in PARALLAX_MODELS:
        wl = parallax_workload(name)
        one = wl.examples / wl.compute_s
        for g in gpus_list:
            cl = parallax_cluster(g)
            for system, method in PARALLAX_SYSTEMS.items():
                r = step_time(method, wl, cl, k)
                out.append({"model": name, "gpus": g, "system": system, "method": method,
                            "step_s": r["step_s"], "throughput": r["throughput"],
                            "normalised": r["throughput"] / one, "parts_s": r["parts"]})
    return out


def compare_with_paper(rows: list[dict], gpus: int = 48) -> list[dict]:
    """Projected vs published ratios at `gpus` GPUs."""
    out = []
    for name, paper in PARALLAX_PAPER.items():
        at = {r["system"]: r for r in rows if r["model"] == name and r["gpus"] == gpus}
        f = paper["fig13"]
        entry = {"model": name, "gpus": gpus,
                 "hybrid_over_tf_ps": {"projected": at["hybrid"]["throughput"] / at["tf_ps"]["throughput"],
                                       "paper_fig13": f["hybrid"] / f["tf_ps"]},
                 "hybrid_over_horovod": {"projected": at["hybrid"]["throughput"] / at["horovod"]["throughput"],
                                         "paper_fig13": f["hybrid"] / f["horovod"]},
                 "normalised": {s: {"projected": at[s]["normalised"], "paper_fig13": f[s]}
                                for s in ("hybrid", "tf_ps", "horovod")},
                 "throughput": {s: at[s]["throughput"] for s in at}}
        if "table4" in paper:
            t4 = paper["table4"]
            entry["table4"] = {
                "+HYB/BASE": {"projected": at["hybrid_nola"]["throughput"] / at["tf_ps"]["throughput"],
                              "paper": t4["+HYB"] / t4["BASE"]},
                "+LA/+HYB": {"projected": at["hybrid"]["throughput"] / at["hybrid_nola"]["throughput"],
                             "paper": t4["+LA"] / t4["+HYB"]},
                "all/BASE": {"projected": at["hybrid"]["throughput"] / at["tf_ps"]["throughput"],
                             "paper": t4["+OPSW"] / t4["BASE"]}}
        out.append(entry)
    return out


PARALLAX_VARIANTS = {
    "line-rate": "every transport at 100 Gbit/s (alpha 10 us, gamma 0.1 ns/B)",
    "slow-rows": "sparse rows through the PS and Horovod's MPI all-gather at the effective rates that "
                 "reproduce Table 1's LM row (PS 101.2k, MPI 39.0k words/s); dense traffic at the link rate",
    "slow-ps": "all PS traffic (dense and sparse) and the MPI all-gather at the effective rates that "
               "reproduce Table 1's LM row",
}


def parallax_variant(name: str) -> tuple[Constants, dict]:
    if name == "line-rate":
        return parallax_constants(), {}
    phases_ = SPARSE_PS_PHASES if name == "slow-rows" else ALL_PS_PHASES
    cal = calibrate_parallax_transports(grpc_phases=phases_)
    return parallax_constants(cal["grpc_factor"], cal["allgather_factor"], grpc_phases=phases_), cal


# --------------------------------------------------------------------------- report

def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def markdown(out: dict) -> str:
    lines = ["# Simulator: alpha-beta-gamma model of the benchmark's systems", "",
             "Generated by `python -m bench.simulate` from " + ", ".join(out["sources"]) + ".", "",
             "## Fitted constants (emulated cluster, all processes on "
             f"{out['cores']} cores)", ""]
    k = out["constants"]
    lines += [f"- gamma = {1e9 * k['gamma']:.3f} ns per byte summed/applied; alpha (latency per hop) "
              "is not fitted: on shared cores it is the same term as a ring's messages, below",
              f"- timeouts: {k.get('timeout_share', 0.0):.3f} of each measured TCP retransmission timeout's "
              f"{1e3 * RTO_MIN_S:.0f} ms is on the step's critical path (an input only where the emulated "
              "links' queues overflowed; 0 in projections)",
              "- compute per example: " + ", ".join(f"{w} {1e3 * v:.3f} ms" for w, v in
                                                    k["compute_per_example"].items()),
              "- CPU speed of each run (CPU seconds relative to the first, fitted; the links are "
              "shaped, so only CPU terms scale): " + ", ".join(f"{r} {v:.3f}" for r, v in
                                                               k.get("run_cpu_speed", {}).items()), "",
              "| peer | overhead ms / worker step | kappa ns / byte of ring steps | "
              "kappa ns / byte of PS RPCs | ms / ring step | ms / PS RPC | "
              "wire factor (1 = TCP at the link rate) | 2-rank all-gather paid twice |",
              "|---|---|---|---|---|---|---|---|"]
    for p, c in k["peers"].items():
        lines.append(f"| {p} | {1e3 * c['overhead_s']:.2f} | {1e9 * c['kappa']:.3f} | "
                     f"{1e9 * c.get('rpc_kappa', 0.0):.3f} | "
                     f"{1e3 * c['message_s']:.3f} | {1e3 * c.get('rpc_s', 0.0):.3f} | "
                     f"{c['wire_factor']:.3f} | "
                     + (f"{c.get('pair_serialised', 0.0):.2f} |" if p in PAIR_SERIALISED_PEERS else "– |"))
    lines += ["", "Overheads are what a peer adds to the compute-only floor, whose points "
              "(the slowest worker's mean step) pin compute per example."]
    s = out["fit_summary"]
    lines += ["", f"## Prediction error on the measured points ({s['points']} points)", "",
              f"Median |error| {100 * s['median_abs_error']:.1f} %, mean {100 * s['mean_abs_error']:.1f} %, "
              f"max {100 * s['max_abs_error']:.0f} %; {s['within_20pct']} of {s['points']} within 20 %.", ""]
    v = out["validation_fit_n2_n4_predict_n8"]["summary"]
    if v:
        lines += [f"Fitted on N = 2 and 4 only, predicting the N = 8 points: median |error| "
                  f"{100 * v['median_abs_error']:.1f} %, {v['within_20pct']} of {v['points']} within 20 %.", ""]
    lines += [
              "| run | workload | N | system | measured ms | predicted ms | error |", "|---|---|---|---|---|---|---|"]
    for r in out["points"]:
        flag = " (wrong-loss)" if r["status"] != "ok" else ""
        lines.append(f"| {r['source']} | {r['workload']} | {r['N']} | {r['peer']}{flag} | "
                     f"{1e3 * r['measured_s']:.0f} | {1e3 * r['predicted_s']:.0f} | {100 * r['error']:+.0f}% |")
    if not out["run_to_run"]:
        lines += ["", "No configuration (workload and its size, link rate, system, N) was measured "
                  "in more than one run here, so run-to-run noise is not measured."]
    else:
        lines += ["", "Same configuration measured in both runs (the noise no model can beat):", "",
                  "| workload | N | system | step ms by run | max/min |", "|---|---|---|---|---|"]
    for r in out["run_to_run"]:
        lines.append(f"| {r['workload']} | {r['N']} | {r['peer']} | " +
                     ", ".join(f"{k_}: {1e3 * v_:.0f}" for k_, v_ in r["step_s"].items()) +
                     f" | {r['max_over_min']:.2f} |")
    lines += ["", f"## Projection: the bench workloads at {out['bench_projection_link_gbit']:g} Gbit/s, "
              "one worker per host, S = N servers, each process on its own cores", "",
              "| workload | system | " + " | ".join(f"N={n}" for n in PROJECT_N) + " |",
              "|---|---|" + "---|" * len(PROJECT_N)]
    proj = out["bench_projection"]
    for w in sorted({r["workload"] for r in proj}):
        for peer in [*PEER_METHODS, FLAT_LABEL]:
            vals = {r["N"]: r["throughput"] for r in proj if r["workload"] == w and r["peer"] == peer}
            if vals:
                lines.append(f"| {w} | {peer} | " + " | ".join(f"{vals[n]:.0f}" for n in PROJECT_N) + " |")
    chosen = {r["N"]: r for r in proj if r["peer"] == PLANNER_PEER and "servers" in r}
    lines += ["", "(examples/s)"]
    if chosen:
        lines += ["", f"{PLANNER_PEER}: the aggregation structure its planner chooses "
                  "(transforms/cost.py, best_structure, with these constants): Config(aggregation_group=g) "
                  f"and S of the N servers holding the sparse rows (g in "
                  f"{', '.join(map(str, GROUP_SIZES))}, S a power of 2 up to N; the hosts and every "
                  f"server unless predicted {MIN_GAIN:g}x faster): " + ", ".join(
                      f"N = {n}: g = {r['aggregation_group']}, S = {r['servers']} "
                      f"({r['predicted_gain']:.2f}x)" for n, r in sorted(chosen.items())),
                  "", "autopar's dense all-reduce (autopar-allreduce, autopar-hybrid): the 2-D "
                  "summation over groups of d workers its planner chooses (transforms/cost.py, "
                  "best_allreduce_group: Config(allreduce_group=d), d a power of 2 making 2 groups "
                  f"or more; the flat ring unless the step is predicted {MIN_GAIN:g}x faster), "
                  "d by workload and N (1: the flat ring): " + "; ".join(
                      f"{w} " + ", ".join(f"{n}: {r['allreduce_group']}" for n, r in sorted(
                          (r["N"], r) for r in proj if r["workload"] == w
                          and r["peer"] == PLANNER_PEER and "allreduce_group" in r))
                      for w in sorted({r["workload"] for r in proj})),
                  "", f"{FLAT_LABEL}: the same with Config(aggregation_group=0) and every server, "
                  "and the flat ring (Config(allreduce_group=0))."]
    measured = out.get("aggregation_groups_measured") or []
    if measured:
        lines += ["", "Aggregation groups measured on the emulated cluster (hybrid, sparse LM, "
                  f"N = {measured[0]['N']}, S = N; not fitted): each step over the step with "
                  "groups of one on the same link", "",
                  "| link | g | measured ms | measured / g = 1 | predicted / g = 1 |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['link_mbit']:.0f} Mbit/s | {r['group']} | {1e3 * r['measured_s']:.0f} | "
                  f"{r['measured_ratio']:.2f} | {r['predicted_ratio']:.2f} |" for r in measured]
    ring = out.get("allreduce_groups_measured") or []
    if ring:
        launch = out["constants"]["peers"][PLANNER_PEER].get("launch_s", 0.0)
        lines += ["", "2-D summation of the dense all-reduce over groups of d workers "
                  f"(Config.allreduce_group) measured on the emulated cluster (hybrid, sparse LM, "
                  f"N = {ring[0]['N']}, {ring[0]['link_mbit']:.0f} Mbit/s; "
                  f"{ring[0]['flat_measured_s'] * 1e3:.0f} ms with the flat ring): the CPU of each "
                  f"collective it launches beyond the flat ring's one, taken from these runs "
                  f"(not fitted), {launch * 1e3:.2f} ms per worker (autopar-allreduce and "
                  "autopar-hybrid's launch_s)", "",
                  "| d | runs | measured ms | measured / flat ring | predicted without the "
                  "launches' CPU | predicted |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['group']} | {r['runs']} | {1e3 * r['measured_s']:.0f} | "
                  f"{r['measured_ratio']:.2f} | {r['predicted_ratio_without_launches']:.2f} | "
                  f"{r['predicted_ratio']:.2f} |" for r in ring]
    lines += ["", "## Parallax's setting (6 GPUs per machine, 100 Gbit/s, Table 1 sizes), "
              "48 GPUs", ""]
    for name, var in out["parallax"].items():
        lines += [f"### {name}: {PARALLAX_VARIANTS[name]}", ""]
        if var["calibration"]:
            c = var["calibration"]
            lines += [f"Effective rates: PS {c['grpc_gbit']:.2f} Gbit/s, MPI all-gather "
                      f"{c['allgather_gbit']:.2f} Gbit/s.", ""]
        lines += ["| model | hybrid/TF-PS projected (paper) | hybrid/Horovod projected (paper) | normalised "
                  "hybrid, TF-PS, Horovod projected (paper) | Table 4 +HYB/BASE, +LA/+HYB projected (paper) |",
                  "|---|---|---|---|---|"]
        for c in var["comparison"]:
            n = c["normalised"]
            t4 = c.get("table4")
            t4s = (f"{_fmt(t4['+HYB/BASE']['projected'])} ({_fmt(t4['+HYB/BASE']['paper'])}), "
                   f"{_fmt(t4['+LA/+HYB']['projected'])} ({_fmt(t4['+LA/+HYB']['paper'])})") if t4 else "–"
            lines.append(
                f"| {c['model']} | {_fmt(c['hybrid_over_tf_ps']['projected'])} "
                f"({_fmt(c['hybrid_over_tf_ps']['paper_fig13'])}) | {_fmt(c['hybrid_over_horovod']['projected'])} "
                f"({_fmt(c['hybrid_over_horovod']['paper_fig13'])}) | " +
                ", ".join(f"{n[s_]['projected']:.1f}" for s_ in ("hybrid", "tf_ps", "horovod")) +
                " (" + ", ".join(f"{n[s_]['paper_fig13']:.1f}" for s_ in ("hybrid", "tf_ps", "horovod")) +
                f") | {t4s} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(out: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    # measured vs predicted
    ax = axes[0][0]
    rows = out["points"]
    for peer in PEER_METHODS:
        pts = [r for r in rows if r["peer"] == peer]
        ax.scatter([1e3 * r["measured_s"] for r in pts], [1e3 * r["predicted_s"] for r in pts], s=14, label=peer)
    lo, hi = 20, 5000
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [1.2 * lo, 1.2 * hi], "k:", lw=0.6)
    ax.plot([lo, hi], [lo / 1.2, hi / 1.2], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="measured step ms", ylabel="predicted step ms",
           title=f"fit: median |err| {100 * out['fit_summary']['median_abs_error']:.0f}%, "
                 f"{out['fit_summary']['within_20pct']}/{out['fit_summary']['points']} within 20% (dotted)")
    ax.legend(fontsize=7)
    # bench projections
    for ax, w in zip((axes[0][1], axes[0][2]), ("sparse", "dense")):
        proj = [r for r in out["bench_projection"] if r["workload"] == w]
        meas = [r for r in rows if r["workload"] == w and r["source"] == out["sources_by_name"][0]]
        for peer in PEER_METHODS:
            pr = sorted((r["N"], r["throughput"]) for r in proj if r["peer"] == peer)
            if not pr:
                continue
            line, = ax.plot(*zip(*pr), "-", label=peer)
            mp = sorted((r["N"], r["N"] * out["examples_per_worker_step"].get(w, 1) / r["measured_s"]) for r in meas
                        if r["peer"] == peer)
            if mp:
                ax.plot(*zip(*mp), "o", color=line.get_color(), ms=4)
        ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="examples/s",
               title=f"bench {w}: projected (lines: own core per process, "
                     f"{out['bench_projection_link_gbit']:g} Gbit/s)\nmeasured (dots: all on {out['cores']} shared cores)")
        ax.title.set_fontsize(8)
        if proj:
            ax.legend(fontsize=7)
    # Parallax setting
    var = out["parallax"]["slow-rows"]
    for ax, model in zip(axes[1], ("LM", "NMT", "ResNet-50")):
        pr = [r for r in var["projection"] if r["model"] == model]
        for system in ("hybrid", "tf_ps", "horovod", "hybrid_nola"):
            xy = sorted((r["gpus"], r["normalised"]) for r in pr if r["system"] == system)
            line, = ax.plot(*zip(*xy), "-", label=system)
            paper = PARALLAX_PAPER[model]["fig13"].get(system)
            if paper:
                ax.plot([48], [paper], "*", ms=11, color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="GPUs (6 per machine, 100 Gbit/s)",
               ylabel="throughput / one GPU",
               title=f"Parallax {model}: projected (lines, 'slow-rows'); Fig. 13 at 48 GPUs (stars)")
        ax.title.set_fontsize(8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def build(sources: list[Path]) -> dict:
    points, workloads, cores, names = [], {}, 2, []
    for src in sources:
        res = json.loads(Path(src).read_text())
        name = res.get("name", Path(src).stem)
        names.append(name)
        points += points_from_results(res, name)
        cores = res.get("machine", {}).get("cpus") or cores
        for spec in res["workloads"].values():
            wl = workload_from_results(spec)
            if not wl.name.startswith("avg"):
                workloads[wl.name] = wl
    k = fit(points)
    launch_s, ring_groups = allreduce_group_launches(k)
    k.peers.update({p: replace(k.peers[p], launch_s=launch_s) for p in COLLECTIVE_PEERS
                    if p in k.peers})
    rows = errors(points, k)
    train = [p for p in points if p.cluster.workers < 8]
    test = [p for p in points if p.cluster.workers >= 8]
    val = {"summary": None, "points": []}
    if train and test:
        kv = fit(train)
        vrows = errors(test, kv)
        val = {"summary": summarise(vrows), "points": vrows}
    link = points[0].cluster.link_gbit if points else 1.0
    out = {"sources": [str(Path(s).name) for s in sources], "cores": cores, "sources_by_name": names,
           "method": "non-negative least squares on the relative error of the mean step time; "
                     "shared-cores model (sum of all processes' CPU seconds, messages included, / cores + wire); "
                     "the floor's points pin compute",
           "constants": k.to_dict(), "fit_summary": summarise(rows), "points": rows,
           "validation_fit_n2_n4_predict_n8": val, "run_to_run": run_to_run(points),
           "bench_projection_link_gbit": link,
           "examples_per_worker_step": {name: wl.examples for name, wl in workloads.items()},
           "allreduce_groups_measured": ring_groups,
           "bench_projection": project_bench(workloads, k, link),
           "aggregation_groups_measured": group_validation(k),
           "parallax": {}}
    for name in PARALLAX_VARIANTS:
        kp, cal = parallax_variant(name)
        proj = project_parallax(kp)
        out["parallax"][name] = {"about": PARALLAX_VARIANTS[name], "calibration": cal,
                                 "constants": kp.to_dict(), "comparison": compare_with_paper(proj),
                                 "projection": proj}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", type=Path,
                    default=[RESULTS / f"{name}.json" for name in DEFAULT_RUNS],
                    help="bench results to fit (default: full.json, quick.json, messages.json: "
                         "the microbenchmark at 1 MiB, where a step is its messages, "
                         "make bench-messages, and ps_bytes.json: the parameter-server "
                         "peers' bytes, make bench-ps-bytes)")
    ap.add_argument("--out", type=Path, default=RESULTS / "simulate",
                    help="output prefix (writes .json, .md, .png)")
    args = ap.parse_args(argv)
    out = build(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    args.out.with_suffix(".md").write_text(markdown(out))
    plot(out, args.out.with_suffix(".png"))
    s = out["fit_summary"]
    print(f"{s['points']} points: median |error| {100 * s['median_abs_error']:.1f} %, "
          f"{s['within_20pct']} within 20 %; wrote {args.out}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
