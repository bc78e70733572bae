"""The benchmark harness's outputs: JSON, Markdown tables, plots, README section,
and the settings/flags of bench.run — from a synthetic results dict, no namespaces."""
import json

import pytest

from bench import metrics, models, report, run


def _point(workload, peer, n, s=0, status="ok", loss=5.0, ref=5.0, floor_s=0.05, rate=1000.0, floats=1024):
    w = models.get(workload) if workload != "avg" else models.get("avg", floats=floats)
    method = metrics.PEER_METHODS[peer]
    t3 = metrics.required_traffic(method, w.dense_bytes, w.sparse_touched_bytes(), n, s)
    if status == "failed":
        return {"workload": workload, "peer": peer, "method": method, "num_workers": n, "num_servers": s,
                "status": "failed", "error": "worker1 exited with status 1 | while waiting"}
    step_s = 0.1
    comm = metrics.limit_seconds(t3, rate)
    rec = {"workload": workload, "peer": peer, "method": method, "num_workers": n, "num_servers": s,
           "link_mbit": rate, "comm_limit_s": comm,
           "status": status, "error": None if status == "ok" else "loss differs",
           "throughput": w.examples_per_step() * n / step_s, "unit": w.unit, "step_s": step_s,
           "median_step_s": step_s, "loss": loss, "reference_loss": ref,
           "loss_check": {"ok": status == "ok"},
           "bytes_per_step": {"worker": {"send": t3.worker_send * 1.01, "recv": t3.worker_recv * 1.01},
                              "server": {"send": t3.server_send * 1.01, "recv": t3.server_recv * 1.01}},
           "table3": t3.to_dict(), "worker_send_vs_table3": 0.01, "worker_recv_vs_table3": 0.01}
    metrics.apply_floor(rec, floor_s)
    if workload == "sparse":
        rec["alpha"] = metrics.sparse_alpha(w, 0, 2, n)
    if workload == "avg":
        rec["microbench"] = {"bytes": w.dense_bytes, "ms_per_averaging": 100.0, "median_ms": 100.0,
                             "bus_bandwidth_bytes_per_s": metrics.bus_bandwidth(w.dense_bytes, n, step_s),
                             "bus_bandwidth_fraction_of_link": 0.5}
    if peer.startswith("autopar"):
        rec["autopar_report"] = {"totals": {"sent_per_worker": t3.worker_send,
                                            "received_per_worker": t3.worker_recv},
                                 "per_server": [{"server": i, "sent": t3.server_send, "received": t3.server_recv}
                                                for i in range(s)]}
        rec["worker_send_vs_report"] = rec["worker_recv_vs_report"] = 0.01
    return rec


@pytest.fixture
def results():
    peers = [{"name": p.name, "method": p.method} for p in run.PEERS]
    return {
        "name": "unit", "started": "2026-01-01T00:00:00", "wall_s": 123.0,
        "settings": {"link_mbit": [1000.0, 100.0], "setup_mbit": 10000.0, "delay_ms": 0.1, "servers": "equal",
                     "steps": {"sparse": [3, 10]}},
        "cluster": {"rate_mbit": 1000.0, "delay_emulated": False},
        "machine": {"cpus": 2, "cpu_model": "test", "memory_gib": 24},
        "git": {"commit": "0123456789abcdef", "dirty": True},
        "tolerance": {"loss_rtol": metrics.LOSS_RTOL, "loss_atol": metrics.LOSS_ATOL},
        "peers": peers,
        "workloads": {"avg": models.to_dict(models.get("avg", floats=1024)),
                      "sparse": models.to_dict(models.SPARSE)},
        "references": {"sparse": {"2": {"initial_loss": 6.9, "loss": 5.0, "local_only_loss": 5.1}}},
        "points": [_point("sparse", "floor", 2), _point("sparse", "tf_mwms", 2),
                   dict(_point("sparse", "autopar-hybrid", 2, 2, rate=100.0),
                        machine_cpu={"busy_fraction": 0.951, "cpu_ms_per_step": 190.2,
                                     "kernel_ms_per_step": 120.4, "window_s": 1.0}),
                   _point("sparse", "autopar-ps", 2, 2),
                   _point("sparse", "horovod", 2, status="failed"),
                   _point("sparse", "tf_ps", 2, 2, status="wrong-loss", loss=5.05),
                   _point("avg", "floor", 2), _point("avg", "autopar-allreduce", 2), _point("avg", "tf_ps", 2, 2),
                   _point("avg", "autopar-herring", 4, 2, floats=1 << 20)],
        "notes": ["a note"],
    }


def test_markdown_has_every_point_and_the_failures(results):
    md = report.markdown(results)
    assert "## Training workloads" in md and "## Gradient averaging microbenchmark" in md
    for peer in ("tf_mwms", "autopar-ps", "horovod", "tf_ps", "autopar-allreduce"):
        assert f"| {peer} |" in md
    assert "worker1 exited with status 1" in md          # failure cause in the table and the list
    assert "## Failures and skipped points" in md and "**wrong-loss**" in md
    assert "## autopar: measured bytes vs its report" in md
    assert "| yes |" in md                                # autopar within 10% of its report
    assert "a note" in md and "0123456789ab" in md


def _rows(table: str, peer: str) -> list[dict]:
    lines = [r for r in table.splitlines() if r.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in lines[2:]]
    return [r for r in rows if r["system"] == peer]


def test_training_table_shows_floor_rate_binding_and_alpha(results):
    table = report.training_table(results)
    floor = _rows(table, "floor")[0]
    assert floor["compute floor ms"] == "50" and floor["link Mbit/s"] == "1000"
    # 1000 Mbit/s, N = 2: the sparse LM's 2.36 MB need 19 ms on the wire < the 50 ms floor
    mwms = _rows(table, "tf_mwms")[0]
    assert mwms["compute floor ms"] == "50" and mwms["of limit (bound)"] == "50% compute"
    assert float(mwms["comm limit ms"]) == pytest.approx(18.9, abs=0.1)
    # 100 Mbit/s: the same bytes need ~190 ms, more than the floor and the 100 ms step can have
    hybrid = _rows(table, "autopar-hybrid")[0]
    assert hybrid["link Mbit/s"] == "100" and hybrid["of limit (bound)"].endswith("comm")
    assert float(hybrid["comm limit ms"]) > 150
    a = results["points"][0]["alpha"]
    assert hybrid["cores busy (CPU ms/step)"] == "95% (190, kernel 120)"     # the point's machine_cpu
    assert mwms["cores busy (CPU ms/step)"] == "–"                # a result without it
    # the limit over the CPU per step spread over the 2 cores (capped at 100 %):
    # ~190 ms of limit, 190.2 CPU ms (95 ms of both cores) -> 100 %; a point
    # needing more CPU than 2 cores give in its limit is below 100 %
    point = next(p for p in results["points"] if p["peer"] == "autopar-hybrid")
    limit_ms = 1e3 * point["limit_s"]
    assert hybrid["of limit the cores allow"] == "100% (kernel 100%)"
    point["machine_cpu"] = dict(point["machine_cpu"], cpu_ms_per_step=4 * limit_ms,
                                kernel_ms_per_step=2 * limit_ms)
    slow = _rows(report.training_table(results), "autopar-hybrid")[0]
    assert slow["of limit the cores allow"] == "50% (kernel 100%)"
    assert mwms["of limit the cores allow"] == "–"
    # ps pulls every byte before the compute floor and pushes it after: the
    # order needs 2 x its comm limit + the floor, where the limit is the floor
    ps_point = next(p for p in results["points"] if p["peer"] == "autopar-ps")
    ps = _rows(table, "autopar-ps")[0]
    assert ps["of limit the order allows"] == \
        f"{100 * 0.05 / (2 * ps_point['comm_limit_s'] + 0.05):.0f}%"
    assert _rows(table, "tf_ps")[0]["of limit the order allows"] == ps["of limit the order allows"]
    assert mwms["α worker / all"] == f"{100 * a['worker_unique']:.2f}% / {100 * a['global_unique']:.2f}%"
    md = report.markdown(results)
    assert "1000 and 100 Mbit/s" in md and "compute floor" in md


def test_results_without_a_floor_still_render(results):
    # results of an older harness: one rate, limit_s only, no floor, no alpha
    old = dict(results, settings={"rate_mbit": 1000.0, "delay_ms": 0.1, "servers": "equal", "steps": {}})
    old["points"] = []
    for p in results["points"]:
        q = {k: v for k, v in p.items()
             if k not in ("comm_limit_s", "compute_floor_s", "binding", "link_mbit", "alpha")}
        old["points"].append(q)
    table = report.training_table(old)
    row = _rows(table, "tf_mwms")[0]
    assert row["compute floor ms"] == "–" and row["α worker / all"] == "–"
    assert row["of limit (bound)"] == "50%"
    assert "1000 Mbit/s" in report.markdown(old)


def test_tables_have_consistent_columns(results):
    for table in (report.training_table(results), report.microbench_table(results),
                  report.report_comparison_table(results)):
        rows = [r for r in table.splitlines() if r.startswith("|")]
        widths = {r.count("|") for r in rows}
        assert len(widths) == 1, table


def test_write_all_writes_json_markdown_and_plots(tmp_path, results):
    paths = report.write_all(results, tmp_path)
    assert json.loads(paths["json"].read_text())["name"] == "unit"
    assert paths["md"].read_text().startswith("# Benchmark `unit`")
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["unit-bytes.png", "unit-microbench.png", "unit-throughput.png"]
    for png in pngs:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_section_is_replaced_between_markers(tmp_path, results):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\nkeep me\n{report.README_BEGIN}\nold table\n{report.README_END}\ntail stays\n")
    assert report.write_readme_section(readme, results, {"throughput vs workers": "unit-throughput.png"})
    text = readme.read_text()
    assert "old table" not in text and "keep me" in text and "tail stays" in text
    assert "| sparse | 1000 | 2 | tf_mwms | ok |" in text and "results/unit-throughput.png" in text
    other = tmp_path / "OTHER.md"
    other.write_text("no markers\n")
    assert not report.write_readme_section(other, results, {})
    assert other.read_text() == "no markers\n"


def test_run_settings_quick_and_full():
    quick = run.parse_args(["--quick"])
    assert quick.name == "quick" and quick.host_counts == [2, 4, 8] and quick.link_mbit == [100.0]
    assert quick.workloads == ["sparse"] and set(quick.peers) == {p.name for p in run.PEERS}
    assert "floor" in quick.peers
    full = run.parse_args([])
    assert full.host_counts == [2, 4, 8] and set(full.workloads) == {"avg", "sparse", "dense"}
    assert full.link_mbit == [1000.0, 100.0] and full.rate_mbit == 1000.0 and full.setup_mbit == 10000.0
    rates = run.parse_args(["--link-mbit", "250,50", "--setup-mbit", "2000"])
    assert rates.link_mbit == [250.0, 50.0] and rates.rate_mbit == 250.0 and rates.setup_mbit == 2000.0
    assert run.parse_args(["--rate-mbit", "300"]).link_mbit == [300.0]
    for bad in ("fast", "0", "100,-1"):
        with pytest.raises(SystemExit):
            run.parse_args(["--link-mbit", bad])
    assert full.workload("avg").dense_bytes == 100 * models.MiB
    custom = run.parse_args(["--quick", "--hosts", "2", "--peers", "horovod", "--steps", "sparse=1:2",
                             "--avg-mib", "8", "--servers", "1"])
    assert custom.host_counts == [2] and custom.peers == ["horovod"]
    assert custom.steps["sparse"] == (1, 2) and custom.num_servers(4) == 1
    assert custom.workload("avg").dense_bytes == 8 * models.MiB
    with pytest.raises(SystemExit):
        run.parse_args(["--peers", "nope"])


def test_peer_environment_drops_cluster_variables(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{}")
    monkeypatch.setenv("HOROVOD_RANK", "3")
    env = run._peer_env()
    assert "TF_CONFIG" not in env and "HOROVOD_RANK" not in env
    assert env["PYTHONPATH"] == str(run.REPO)


def test_microbench_table_shows_herring_server_bytes(results):
    # Herring Table III at N = 4, S = 2, G = 4 MiB: a worker moves G, a server 4G/2 each way;
    # the synthetic point measured 1 % more.
    rows = [ln for ln in report.microbench_table(results).splitlines() if "autopar-herring" in ln]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    head = [c.strip() for c in report.microbench_table(results).splitlines()[0].strip("|").split("|")]
    row = dict(zip(head, cells))
    assert row["Table 3 MB"] == "4.19 (srv 8.39)"
    assert row["server send / recv MB"] == "8.47 / 8.47"
    assert row["worker send / recv MB"] == "4.24 / 4.24"


def test_per_workload_hosts_and_peers():
    # The bench-herring selection (Makefile): avg at 2, 4, 8 with every peer, dense at 4 and 8
    # without the TF collective.
    s = run.parse_args(["--hosts", "2,4,8", "--workloads", "avg,dense",
                        "--peers", "floor,horovod,tf_mwms,autopar-allreduce,autopar-herring",
                        "--workload-hosts", "dense=4,8",
                        "--workload-peers", "dense=floor,horovod,autopar-allreduce,autopar-herring"])
    assert s.hosts_for("avg") == [2, 4, 8] and s.hosts_for("dense") == [4, 8]
    assert "tf_mwms" in s.peers_for("avg") and "tf_mwms" not in s.peers_for("dense")
    for bad in (["--workload-hosts", "dense=16"],            # not among --hosts
                ["--workload-hosts", "sparse=2"],            # not among --workloads
                ["--workload-hosts", "dense"],               # no list
                ["--workload-peers", "dense=tf_ps"]):        # not among --peers
        with pytest.raises(SystemExit):
            run.parse_args(["--hosts", "2,4,8", "--workloads", "avg,dense", "--peers", "floor,horovod", *bad])


def test_herring_peer_starts_summation_servers_and_ps_tasks_only_for_sparse_variables():
    herring = next(p for p in run.PEERS if p.name == "autopar-herring")
    assert herring.sumservers and herring.servers and herring.method == "herring"
    assert herring.options == {"run_option": "herring"}
    assert "herring" in run.AUTOPAR_RUN_OPTIONS
    ps = next(p for p in run.PEERS if p.name == "autopar-ps")

    def point(peer, workload, n, s):
        return run.Point(models.get(workload), peer, n, s, warmup=1, steps=1, port=24000)
    assert not point(herring, "avg", 4, 4).ps_tasks           # dense only: summation servers alone
    assert not point(herring, "dense", 4, 4).ps_tasks
    assert point(herring, "sparse", 4, 4).ps_tasks            # the embedding lives on ps tasks
    assert point(ps, "dense", 4, 4).ps_tasks
    p = point(herring, "dense", 4, 4)
    assert p.server_hosts == [4, 5, 6, 7]
    # Its own port: ps tasks use port + 1, Horovod's rendezvous port + 2.
    assert p.sumserver_port() not in (p.port, p.port + 1, p.port + 2)


def test_link_losses_section_lists_points_with_drops_or_timeouts(results):
    quiet = {"egress_drops": 0, "ingress_drops": 0, "retransmitted_segments": 4, "timeouts": 0, "loss_probes": 4}
    lossy = {"egress_drops": 0, "ingress_drops": 12, "retransmitted_segments": 30, "timeouts": 2, "loss_probes": 1}
    results["points"][1]["link_losses"] = quiet
    results["points"][2]["link_losses"] = lossy
    lines = report.link_losses(results)
    assert lines[0].startswith("2 points counted: 12 frames dropped") and "2 retransmission timeouts" in lines[0]
    rows = [ln for ln in lines if ln.startswith("| sparse")]
    assert rows == ["| sparse | 100 | 2 | autopar-hybrid | 0 / 12 | 2 | 30 |"]     # the quiet point is not listed
    assert "## Link losses in the measured windows" in report.markdown(results)
    del results["points"][1]["link_losses"], results["points"][2]["link_losses"]
    assert report.link_losses(results) == []
    assert "Link losses" not in report.markdown(results)


def test_header_gives_the_floors_own_step_counts(results):
    for p in results["points"]:
        p.update(warmup_steps=3, measured_steps=10)
        if p["peer"] == "floor":
            p.update(warmup_steps=10, measured_steps=60)
    assert "(the floor: (10, 60)" in report.markdown(results)
