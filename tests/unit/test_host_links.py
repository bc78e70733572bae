"""Bytes over host links for the all-reduce buckets: flat ring in worker
order vs 2-D summation (transforms.methods.allreduce.method.host_link_bytes), and the report."""
import pytest

from autopar.transforms.methods.allreduce.method import host_link_bytes
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.methods.registry import METHODS
from tests.models import build_case

B = 1200.0


def test_hosts_in_order_cross_each_link_once():
    # 4 workers, 2 per host: the ring 0-1-2-3-0 crosses 1->2 and 3->0, one
    # edge leaving each host, each carrying 2(N-1)B/N = 1.5 B.
    hosts = ["a", "a", "b", "b"]
    assert host_link_bytes(hosts, B) == {"a": 1.5 * B, "b": 1.5 * B}
    # 2-D: only the ring of the 2 leaders crosses: 2(H-1)B/H = B.
    assert host_link_bytes(hosts, B, two_dimensional=True) == {"a": B, "b": B}


def test_interleaved_hosts_cross_on_every_edge():
    hosts = ["a", "b", "a", "b"]
    assert host_link_bytes(hosts, B) == {"a": 3 * B, "b": 3 * B}
    assert host_link_bytes(hosts, B, two_dimensional=True) == {"a": B, "b": B}


def test_uneven_hosts_and_one_host():
    # 3 workers on 2 hosts (2 + 1): one edge leaves each host, 2(2/3)B each.
    got = host_link_bytes(["a", "a", "b"], B)
    assert got == pytest.approx({"a": 4 / 3 * B, "b": 4 / 3 * B})
    assert host_link_bytes(["a", "a", "a"], B) == {"a": 0.0}
    assert host_link_bytes(["a", "a", "a"], B, two_dimensional=True) == {"a": 0.0}


def test_report_counts_the_buckets_bytes_per_host():
    case = build_case("mlp", "momentum")
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, Topology(("10.0.0.1",) * 2 + ("10.0.0.2",) * 2))
    report = build_report(analysis, plan)
    total = sum(b.bytes for b in METHODS["allreduce"].state(plan).buckets)
    assert total == sum(v.bytes for v in analysis.variables)
    assert report.host_link_bytes["ring"] == {"10.0.0.1": 1.5 * total, "10.0.0.2": 1.5 * total}
    assert report.host_link_bytes["2d"] == {"10.0.0.1": total, "10.0.0.2": total}
    assert "host links: all-reduce bytes each host sends per step" in report.table()
    # One host: nothing crosses a link, and the table does not mention links.
    one = build_report(analysis, make_plan(analysis, Topology.local(2)))
    assert "host links" not in one.table()
