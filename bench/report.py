"""Turn a results dict (bench/results/<name>.json) into the Markdown summary
and the PNG plots. Pure functions of the dict, so they can be re-run on a
saved JSON:

    python -m bench.report bench/results/quick.json
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench import metrics

README_BEGIN = "<!-- bench:quick-results:begin -->"
README_END = "<!-- bench:quick-results:end -->"
TRAINING = ("sparse", "dense")
MB = 1e6


def _mb(x) -> str:
    return "–" if x is None else f"{x / MB:.2f}"


def _pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _signed_pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def _kb(x) -> str:
    return "–" if x is None else f"{x / 1e3:.1f}"


def _ms(x) -> str:
    return "–" if x is None else f"{1e3 * x:.0f}"


def _short(text: str | None, n: int = 140) -> str:
    text = (text or "").strip().splitlines()[0] if text else ""
    text = text.replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def _order(points: list[dict], peers: list[str]) -> list[dict]:
    rank = {name: i for i, name in enumerate(peers)}
    return sorted(points, key=lambda p: (p["workload"], -_rate(p), p["num_workers"], rank.get(p["peer"], 99)))


def _rate(p: dict) -> float:
    return float(p.get("link_mbit") or 0.0)


def _rates(results: dict) -> list[float]:
    """The run's link rates (older results: the one rate_mbit)."""
    s, c = results.get("settings", {}), results.get("cluster", {})
    rates = s.get("link_mbit") or [c.get("rate_mbit", s.get("rate_mbit", 1000.0))]
    return [float(r) for r in rates]


def _rate_cell(p: dict, rates: list[float]) -> str:
    """A point's link rate; older results record one rate for the whole run."""
    if p.get("link_mbit"):
        return f"{_rate(p):g}"
    return f"{rates[0]:g}" if len(rates) == 1 else "–"


def _comm_limit(p: dict):
    """The communication limit of a point (older results only have limit_s)."""
    return p.get("comm_limit_s", p.get("limit_s"))


def _limit(p: dict) -> str:
    """'of limit' with the binding term: '43% comm' / '90% compute'."""
    frac = _pct(p.get("fraction_of_limit"))
    return f"{frac} {p['binding']}" if p.get("binding") and frac != "–" else frac


def _busy(p: dict) -> str:
    """The share of the machine's cores busy over the measured steps, and
    the CPU ms of all processes per step (older results: –)."""
    m = p.get("machine_cpu")
    if not m:
        return "–"
    kernel = m.get("kernel_ms_per_step")
    return (f"{_pct(m['busy_fraction'])} ({m['cpu_ms_per_step']:.0f}"
            + (f", kernel {kernel:.0f})" if kernel is not None else ")"))


def _cores_allow(p: dict, cpus: int | None) -> str:
    """The share of its limit a point could reach if the machine's cores did
    nothing but its processes' CPU work of a step: the limit over the CPU ms
    per step spread over every core (every emulated host shares them).
    Under its "of limit", the cores leave room; at it, they bind whatever the
    links allow; "kernel" is the same for the kernel's part alone (the links'
    TCP and queues), which no change to a system's own code removes."""
    m, limit = p.get("machine_cpu"), p.get("limit_s")   # the limit "of limit" is held to
    if not m or not cpus or not limit or not m.get("cpu_ms_per_step"):
        return "–"
    allow = [min(1.0, 1e3 * limit * cpus / m[k]) if m.get(k) else None
             for k in ("cpu_ms_per_step", "kernel_ms_per_step")]
    return _pct(allow[0]) + (f" (kernel {_pct(allow[1])})" if allow[1] is not None else "")


def _order_allows(p: dict) -> str:
    """The share of its limit a point's step order leaves reachable
    (metrics.order_limit_seconds: a pull from servers before the compute,
    the sends after it); older results: –."""
    return _pct(p["order_allows"]) if p.get("order_allows") is not None else "–"


def _alpha(p: dict) -> str:
    a = p.get("alpha")
    if not a:
        return "–"
    return f"{100 * a['worker_unique']:.2f}% / {100 * a['global_unique']:.2f}%"


def training_table(results: dict) -> str:
    peers = [p["name"] for p in results.get("peers", [])]
    rows = [p for p in results["points"] if p["workload"] in TRAINING]
    rates = _rates(results)
    cpus = results.get("machine", {}).get("cpus")
    head = ("workload", "link Mbit/s", "N", "system", "status", "throughput", "step ms", "compute floor ms",
            "worker send / recv MB/step", "Table 3 MB/step", "Δ send / recv", "server send / recv MB/step",
            "comm limit ms", "of limit (bound)", "cores busy (CPU ms/step)", "of limit the cores allow",
            "of limit the order allows", "α worker / all",
            "loss (reference)", "idle kB/s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in _order(rows, peers):
        if p.get("status") in ("ok", "wrong-loss"):
            wb, sb, t3 = p["bytes_per_step"]["worker"], p["bytes_per_step"]["server"], p["table3"]
            server = f"{_mb(sb['send'])} / {_mb(sb['recv'])}" if p["num_servers"] else "–"
            t3s = f"{_mb(t3['worker_send'])}" + (f" (srv {_mb(t3['server_send'])})" if p["num_servers"] else "")
            loss = f"{p['loss']:.6f} ({p.get('reference_loss', float('nan')):.6f})"
            comm = _comm_limit(p)
            lines.append("| " + " | ".join([
                p["workload"], _rate_cell(p, rates), str(p["num_workers"]), p["peer"], p["status"],
                f"{p['throughput']:.0f} {p['unit']}/s", _ms(p["step_s"]), _ms(p.get("compute_floor_s")),
                f"{_mb(wb['send'])} / {_mb(wb['recv'])}", t3s,
                f"{_signed_pct(p.get('worker_send_vs_table3'))} / {_signed_pct(p.get('worker_recv_vs_table3'))}",
                server, "–" if comm is None else f"{1e3 * comm:.1f}", _limit(p), _busy(p), _cores_allow(p, cpus),
                _order_allows(p), _alpha(p), loss,
                _kb(p.get("idle_bytes_per_s_per_host"))]) + " |")
        else:
            lines.append("| " + " | ".join([p["workload"], _rate_cell(p, rates), str(p["num_workers"]), p["peer"],
                                             p.get("status", "?"), _short(p.get("error"))]
                                            + [""] * (len(head) - 6)) + " |")
    return "\n".join(lines)


def microbench_table(results: dict) -> str:
    peers = [p["name"] for p in results.get("peers", [])]
    rows = [p for p in results["points"] if p["workload"] == "avg"]
    if not rows:
        return ""
    head = ("N", "system", "status", "ms per averaging", "compute floor ms", "bus bandwidth Gbit/s",
            "of link rate", "worker send / recv MB", "Table 3 MB", "server send / recv MB",
            "comm limit ms", "of limit (bound)", "loss ok")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in _order(rows, peers):
        if p.get("status") in ("ok", "wrong-loss"):
            mb, wb, sb = p["microbench"], p["bytes_per_step"]["worker"], p["bytes_per_step"]["server"]
            averages = p["peer"] != "floor"      # the floor averages nothing: no bandwidth
            comm = _comm_limit(p)
            lines.append("| " + " | ".join([
                str(p["num_workers"]), p["peer"], p["status"], f"{mb['ms_per_averaging']:.0f}",
                _ms(p.get("compute_floor_s")),
                f"{mb['bus_bandwidth_bytes_per_s'] * 8 / 1e9:.2f}" if averages else "–",
                _pct(mb["bus_bandwidth_fraction_of_link"]) if averages else "–",
                f"{_mb(wb['send'])} / {_mb(wb['recv'])}",
                _mb(p["table3"]["worker_send"]) + (f" (srv {_mb(p['table3']['server_send'])})"
                                                    if p["num_servers"] else ""),
                f"{_mb(sb['send'])} / {_mb(sb['recv'])}" if p["num_servers"] else "–",
                "–" if comm is None else f"{1e3 * comm:.0f}", _limit(p),
                "yes" if p.get("loss_check", {}).get("ok") else "NO"]) + " |")
        else:
            lines.append("| " + " | ".join([str(p["num_workers"]), p["peer"], p.get("status", "?"),
                                             _short(p.get("error"))] + [""] * (len(head) - 4)) + " |")
    return "\n".join(lines)


def report_comparison_table(results: dict) -> str:
    """Measured bytes per worker per step against autopar's own report (Parallax Table 3)."""
    rows = [p for p in results["points"] if p.get("autopar_report") and p.get("status") in ("ok", "wrong-loss")]
    if not rows:
        return ""
    head = ("workload", "N", "run option", "measured send / recv MB", "report sent / recv MB", "Δ send / recv",
            "within 10%", "server measured send / recv MB", "report server MB", "Δ server")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in sorted(rows, key=lambda p: (p["workload"], p["num_workers"], p["peer"])):
        wb, tot = p["bytes_per_step"]["worker"], p["autopar_report"]["totals"]
        ds, dr = p.get("worker_send_vs_report"), p.get("worker_recv_vs_report")
        ok = ds is not None and dr is not None and abs(ds) <= 0.10 and abs(dr) <= 0.10
        servers = p["autopar_report"].get("per_server") or []
        if p["num_servers"] and servers:
            sb = p["bytes_per_step"]["server"]
            ps = sum(s["sent"] for s in servers) / len(servers)
            pr = sum(s["received"] for s in servers) / len(servers)
            srv = [f"{_mb(sb['send'])} / {_mb(sb['recv'])}", f"{_mb(ps)} / {_mb(pr)}",
                   f"{_signed_pct(p.get('server_send_vs_report'))} / {_signed_pct(p.get('server_recv_vs_report'))}"]
        else:
            srv = ["–", "–", "–"]
        lines.append("| " + " | ".join([
            p["workload"], str(p["num_workers"]), p["peer"].replace("autopar-", ""),
            f"{_mb(wb['send'])} / {_mb(wb['recv'])}",
            f"{_mb(tot['sent_per_worker'])} / {_mb(tot['received_per_worker'])}",
            f"{_signed_pct(ds)} / {_signed_pct(dr)}", "yes" if ok else "NO", *srv]) + " |")
    return "\n".join(lines)


def _floor_steps_note(results: dict) -> str:
    counts = sorted({(p["warmup_steps"], p["measured_steps"]) for p in results["points"]
                     if p["peer"] == "floor" and "measured_steps" in p})
    return f" (the floor: {', '.join(map(str, counts))}; its steps are a few ms)" if counts else ""


def link_losses(results: dict) -> list[str]:
    """Lines on the queues' drops and TCP's retransmissions and timeouts
    (cluster.losses) between the measure and done barriers: a summary, and a
    table of the points with any drop or timeout."""
    pts = [p for p in results["points"] if p.get("link_losses")]
    if not pts:
        return []
    total = {k: sum(p["link_losses"].get(k, 0) for p in pts)
             for k in ("egress_drops", "ingress_drops", "retransmitted_segments", "loss_probes", "timeouts")}
    lines = [f"{len(pts)} points counted: {total['egress_drops'] + total['ingress_drops']} frames dropped by the "
             f"links' queues, {total['timeouts']} retransmission timeouts (each ≥ 200 ms), "
             f"{total['retransmitted_segments']} retransmitted segments and {total['loss_probes']} tail-loss "
             f"probes (a probe resends or sends one segment when no ACK came for ~2 round trips; it is not a "
             f"loss, and Linux counts a resent probe as a retransmission too)."]
    bad = [p for p in pts if p["link_losses"].get("timeouts") or p["link_losses"].get("egress_drops")
           or p["link_losses"].get("ingress_drops")]
    if bad:
        lines += ["", "| workload | Mbit/s | N | system | drops out / in | timeouts | retransmitted |",
                  "|---|---|---|---|---|---|---|"]
        for p in bad:
            q = p["link_losses"]
            lines.append(f"| {p['workload']} | {_rate(p):g} | {p['num_workers']} | {p['peer']} | "
                         f"{q.get('egress_drops', 0)} / {q.get('ingress_drops', 0)} | {q.get('timeouts', 0)} | "
                         f"{q.get('retransmitted_segments', 0)} |")
    return lines


def failures(results: dict) -> list[str]:
    out = []
    for p in results["points"]:
        if p.get("status") not in ("ok",):
            out.append(f"- {p['workload']} N={p['num_workers']} {p['peer']}: **{p.get('status')}** — "
                       f"{_short(p.get('error'), 600)}")
    return out


def markdown(results: dict, plots: dict[str, str] | None = None) -> str:
    s, c, m, g = results["settings"], results.get("cluster", {}), results.get("machine", {}), results.get("git", {})
    tol = results.get("tolerance", {})
    lines = [f"# Benchmark `{results['name']}`", "",
             f"{results.get('started', '')} · commit `{(g.get('commit') or '?')[:12]}`"
             f"{' (uncommitted changes)' if g.get('dirty') else ''} · "
             f"{m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), {m.get('memory_gib', '?')} GiB · "
             f"wall time {results.get('wall_s', 0):.0f} s", "",
             f"Emulated cluster: one worker per host, {' and '.join(f'{r:g}' for r in _rates(results))} Mbit/s "
             f"full-duplex links"
             + (f" (jobs start at {s['setup_mbit']:g} Mbit/s; the links are shaped before the warm-up)"
                if s.get("setup_mbit") else "")
             + f", delay {s['delay_ms']:g} ms"
             f"{'' if c.get('delay_emulated', True) else ' requested but not emulated (no sch_netem)'}; "
             f"parameter-server systems get S = {'N' if s['servers'] == 'equal' else s['servers']} "
             f"extra server hosts. "
             f"Steps (warm-up, measured): {s['steps']}{_floor_steps_note(results)}. "
             f"Bytes are counted on each host's link between the "
             f"'measure' and 'done' barriers and divided by the measured steps.", "",
             f"Losses after the measured steps are checked against a single-device run with the global "
             f"batch: |loss − reference| ≤ {tol.get('loss_atol')} + {tol.get('loss_rtol')}·|reference| "
             f"(the `floor` row: against a worker that trains alone on its own batches).", "",
             "`floor` is the compute-only floor: the same N worker processes, co-located as in every other "
             "row, each training on its own batch with no aggregation. Every row is held to "
             "limit = max(compute floor, comm limit), the comm limit being Parallax Table 3's bytes on the "
             "most loaded link direction at the link rate; \"of limit\" = limit / step time, and the word "
             "after it says which term binds. \"cores busy\" = the share of the machine's cores busy "
             "between those barriers (every host's processes share them: near 100% the step is bound by "
             "the cores, whatever the links allow), with all processes' CPU ms per step and the kernel's "
             "part of them; \"of limit the cores allow\" = limit / (CPU ms per step / cores): the share "
             "of its limit a point could reach were the cores busy with nothing else (its kernel part "
             "alone in brackets), so an \"of limit\" near it is bound by this machine's cores; "
             "\"of limit the order allows\" = limit / (pull from servers, then the compute floor, then "
             "the sends, each direction at the link rate): what lives on servers is read before the step "
             "can compute, with nothing to send meanwhile, so a method that pulls cannot keep both "
             "directions busy all the step (ps, whose every byte is pulled, at most half). α = embedding rows a worker's step touches / vocabulary "
             "(distinct rows, mean over the measured steps), and of the N workers' batches together.", ""]
    if any(p["workload"] in TRAINING for p in results["points"]):
        lines += ["## Training workloads", "", training_table(results), ""]
    micro = microbench_table(results)
    if micro:
        g_mib = results["workloads"]["avg"]["dense_bytes"] / 2**20
        lines += [f"## Gradient averaging microbenchmark (G = {g_mib:.0f} MiB float32)", "",
                  "Bus bandwidth is 2(N−1)/N·G per averaging time (the all-reduce convention) for every "
                  "system; parameter-server systems move only G each way per worker, so compare them by "
                  "time and fraction of their own limit.", "", micro, ""]
    comp = report_comparison_table(results)
    if comp:
        lines += ["## autopar: measured bytes vs its report (Parallax Table 3)", "", comp, ""]
    refs = results.get("references", {})
    if refs:
        lines += ["## Single-device references", "",
                  "| workload | N | initial loss | reference loss | loss of a worker that never communicates "
                  "| its distance in tolerances | loss with the workers' sparse gradients summed |",
                  "|---|---|---|---|---|---|---|"]
        for w, by_n in refs.items():
            for n, r in by_n.items():
                if isinstance(r, dict):
                    summed = r.get("sparse_summed_loss")
                    margin = metrics.loss_check_margin(r["loss"], r["local_only_loss"],
                                                       tol.get("loss_rtol", metrics.LOSS_RTOL),
                                                       tol.get("loss_atol", metrics.LOSS_ATOL))
                    lines.append(f"| {w} | {n} | {r['initial_loss']:.6f} | {r['loss']:.6f} | "
                                 f"{r['local_only_loss']:.6f} | {'–' if margin is None else f'{margin:.1f}'} | "
                                 f"{'–' if summed is None else f'{summed:.6f}'} |")
                else:
                    lines.append(f"| {w} | – | {_short(str(r))} | | | | |")
        lines.append("")
    losses = link_losses(results)
    if losses:
        lines += ["## Link losses in the measured windows", "", *losses, ""]
    bad = failures(results)
    if bad:
        lines += ["## Failures and skipped points", "", *bad, ""]
    if results.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in results["notes"]], ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{k}]({v})" for k, v in plots.items()] + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots

def _ok(points):
    return [p for p in points if p.get("status") in ("ok", "wrong-loss")]


def plot_all(results: dict, out_dir: Path) -> dict[str, str]:
    """Write the PNGs; returns {title: file name}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = results["name"]
    peers = [p["name"] for p in results.get("peers", [])]
    colors = {peer: plt.cm.tab10(i % 10) for i, peer in enumerate(peers)}
    files = {}
    points = _ok(results["points"])

    # 1. throughput vs workers
    wls = [w for w in ("sparse", "dense", "avg") if any(p["workload"] == w for p in points)]
    if wls:
        fig, axes = plt.subplots(1, len(wls), figsize=(5.5 * len(wls), 4.2), squeeze=False)
        rates = sorted({_rate(p) for p in points}, reverse=True)
        styles = ["o-", "s--", "^-.", "v-"]
        for ax, w in zip(axes[0], wls):
            for peer in peers:
                for r, rate in enumerate(rates):
                    pts = sorted((p for p in points if p["workload"] == w and p["peer"] == peer
                                  and _rate(p) == rate), key=lambda p: p["num_workers"])
                    if not pts:
                        continue
                    xs = [p["num_workers"] for p in pts]
                    label = peer if len(rates) == 1 else f"{peer} {rate:g} Mbit/s"
                    ax.plot(xs, [p["throughput"] for p in pts], styles[r % len(styles)], color=colors[peer],
                            label=label)
                    limit = [p["throughput"] / p["fraction_of_limit"] if p.get("fraction_of_limit") else None
                             for p in pts]
                    if peer != "floor" and all(v is not None for v in limit):
                        ax.plot(xs, limit, ":", color=colors[peer], alpha=0.6)
            unit = next(p["unit"] for p in points if p["workload"] == w)
            ax.set_title(f"{w}: throughput (dotted: max(compute floor, comm limit))")
            ax.set_xlabel("workers (hosts)")
            ax.set_ylabel(f"{unit}/s")
            ax.set_yscale("log")
            ax.set_xticks(sorted({p["num_workers"] for p in points}))
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        files["throughput vs workers"] = f"{name}-throughput.png"
        fig.savefig(out_dir / files["throughput vs workers"], dpi=110)
        plt.close(fig)

    # 2. bytes per step per worker and per server
    wls = [w for w in ("sparse", "dense", "avg") if any(p["workload"] == w for p in points)]
    if wls:
        fig, axes = plt.subplots(2, len(wls), figsize=(5.5 * len(wls), 7.5), squeeze=False)
        for col, w in enumerate(wls):
            for row, role in enumerate(("worker", "server")):
                ax = axes[row][col]
                # bytes do not depend on the link rate: one rate's points (the fastest)
                top = max((_rate(p) for p in points if p["workload"] == w), default=0.0)
                pts = [p for p in points if p["workload"] == w and _rate(p) == top and p["peer"] != "floor"
                       and (role == "worker" or p["num_servers"])]
                ns = sorted({p["num_workers"] for p in pts})
                present = [peer for peer in peers if any(p["peer"] == peer for p in pts)]
                width = 0.8 / max(1, len(present))
                for i, peer in enumerate(present):
                    for j, n in enumerate(ns):
                        p = next((p for p in pts if p["peer"] == peer and p["num_workers"] == n), None)
                        if p is None:
                            continue
                        x = j + (i - (len(present) - 1) / 2) * width
                        b = p["bytes_per_step"][role]
                        ax.bar(x, b["send"] / MB, width, color=colors[peer],
                               label=peer if j == 0 else None)
                        pred = p["table3"][f"{role}_send"]
                        ax.plot([x - width / 2, x + width / 2], [pred / MB] * 2, "k-", lw=1.5)
                ax.set_xticks(range(len(ns)))
                ax.set_xticklabels([f"N={n}" for n in ns])
                ax.set_ylabel("MB sent per step")
                ax.set_title(f"{w}: per {role} (bars measured, lines Table 3)")
                ax.grid(alpha=0.3, axis="y")
                if present:
                    ax.legend(fontsize=7)
        fig.tight_layout()
        files["bytes per step"] = f"{name}-bytes.png"
        fig.savefig(out_dir / files["bytes per step"], dpi=110)
        plt.close(fig)

    # 3. microbenchmark time vs N
    micro = [p for p in points if p["workload"] == "avg"]
    if micro:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for peer in peers:
            pts = sorted((p for p in micro if p["peer"] == peer), key=lambda p: p["num_workers"])
            if not pts:
                continue
            xs = [p["num_workers"] for p in pts]
            ax.plot(xs, [p["microbench"]["ms_per_averaging"] for p in pts], "o-", color=colors[peer], label=peer)
            ax.plot(xs, [p["limit_s"] * 1e3 for p in pts], ":", color=colors[peer], alpha=0.6)
        g_mib = results["workloads"]["avg"]["dense_bytes"] / 2**20
        ax.set_title(f"averaging {g_mib:.0f} MiB float32 (dotted: physical limit)")
        ax.set_xlabel("workers (hosts)")
        ax.set_ylabel("ms per averaging")
        ax.set_xticks(sorted({p["num_workers"] for p in micro}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        files["microbenchmark time vs N"] = f"{name}-microbench.png"
        fig.savefig(out_dir / files["microbenchmark time vs N"], dpi=110)
        plt.close(fig)
    return files


def write_readme_section(readme: Path, results: dict, plots: dict[str, str]) -> bool:
    """Replace the text between the quick-results markers of bench/README.md."""
    try:
        text = readme.read_text()
    except OSError:
        return False
    if README_BEGIN not in text or README_END not in text:
        return False
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    g = results.get("git", {})
    body = [f"Latest `make bench-quick` ({results.get('started', '')}, commit "
            f"`{(g.get('commit') or '?')[:12]}`{', uncommitted changes' if g.get('dirty') else ''}, "
            f"{results.get('wall_s', 0):.0f} s wall time; full details in "
            f"[results/{results['name']}.md](results/{results['name']}.md)):", "",
            training_table(results), ""]
    micro = microbench_table(results)
    if micro:
        body += [micro, ""]
    if "throughput vs workers" in plots:
        body += [f"![throughput vs workers](results/{plots['throughput vs workers']})", ""]
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(body) + README_END + tail)
    return True


def write_all(results: dict, out_dir: Path, update_readme: bool = False) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = results["name"]
    paths = {}
    try:
        plots = plot_all(results, out_dir)
    except Exception as exc:   # noqa: BLE001 - a plotting problem must not lose the table
        results.setdefault("notes", []).append(f"plotting failed: {type(exc).__name__}: {exc}")
        plots = {}
    results["plots"] = plots
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(results, indent=1, default=str))
    md_path = out_dir / f"{name}.md"
    md_path.write_text(markdown(results, plots))
    paths.update(json=json_path, md=md_path, **{k: out_dir / v for k, v in plots.items()})
    if update_readme:
        write_readme_section(out_dir.parent / "README.md", results, plots)
    return paths


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m bench.report bench/results/<name>.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    results = json.loads(path.read_text())
    for k, v in write_all(results, path.parent).items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
