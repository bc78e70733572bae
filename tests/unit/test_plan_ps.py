"""Plan decisions for the parameter-server path: methods per run option,
partition counts, balanced placement, fallbacks with reasons."""
import math

import pytest

from autopar.common.errors import AutoparError, SpecError
from tests import models
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.methods.ps.method import PARTITION_OVERHEAD_BYTES, partition_count
from autopar.transforms.report import build_report

TWO_HOSTS = Topology(("10.0.0.1", "10.0.0.1", "10.0.0.2"), num_servers=2)


@pytest.fixture(scope="module")
def lm():
    return analyze_graph(models.build("lm_adam_clip").graph)


@pytest.mark.parametrize("run_option,expected", [
    ("hybrid", {"embedding": "ps", "lstm/kernel": "allreduce", "softmax/kernel": "allreduce"}),
    ("ps", {"embedding": "ps", "lstm/kernel": "ps", "softmax/kernel": "ps"}),
    ("allreduce", {"embedding": "allgather", "lstm/kernel": "allreduce",
                   "softmax/kernel": "allreduce"}),
])
def test_methods_per_run_option(lm, run_option, expected):
    plan = make_plan(lm, TWO_HOSTS, options=PlanOptions(run_option=run_option))
    for name, method in expected.items():
        assert plan.variable(name).method == method


@pytest.mark.parametrize("run_option", ["hybrid", "ps"])
def test_collective_keys_never_overlap(lm, run_option):
    """The sparse variable's local-aggregation gather owns two blocks of
    ladder keys (one key per padded size); no other collective may use any."""
    from tests.unit.test_plan_report import all_keys
    plan = make_plan(lm, TWO_HOSTS, options=PlanOptions(run_option=run_option))
    emb = plan.variable("embedding").keys
    assert set(emb) == {"norm", "la_count", "la_values", "la_indices"}
    barriers = [b.key for b in plan.barriers]
    keys = all_keys(plan) + barriers + [plan.broadcast_key_base]
    assert len(keys) == len(set(keys))
    assert max(all_keys(plan)) < min(barriers) <= max(barriers) < plan.broadcast_key_base


def test_no_servers_keeps_everything_replicated_and_says_why(lm):
    plan = make_plan(lm, Topology(("a", "b"), num_servers=0), options=PlanOptions())
    emb = plan.variable("embedding")
    assert emb.method == "allgather" and "no server" in emb.reason
    assert plan.variable("lstm/kernel").method == "allreduce"


def test_run_option_ps_without_servers_is_refused(lm):
    # All-reduce in its place would train while the report's header says ps.
    with pytest.raises(SpecError, match=r"run_option='ps' keeps every variable on server "
                                        r"processes, but the resource spec has none"):
        make_plan(lm, Topology(("a", "b"), num_servers=0), options=PlanOptions(run_option="ps"))


@pytest.mark.parametrize("partitions, message", [
    ({"embeding": 2}, r"Config.partitions names 'embeding', which is not a trainable "
                      r"variable of the graph \(did you mean 'embedding'\?\)"),
    ({"embedding": 41}, r"Config.partitions asks for 41 partitions of 'embedding', "
                          r"which has 40 rows"),
])
def test_partitions_of_no_variable_or_beyond_its_rows_are_refused(lm, partitions, message):
    with pytest.raises(AutoparError, match=message):
        make_plan(lm, TWO_HOSTS, options=PlanOptions(run_option="ps", partitions=partitions))


def test_partition_count_follows_the_cost_model():
    a = PARTITION_OVERHEAD_BYTES
    assert partition_count(a // 2, 10_000, 2) == 1          # small: one partition
    assert partition_count(49 * a, 10_000, 1) == 7           # sqrt(49) on one server
    assert partition_count(49 * a, 10_000, 2) == 8           # rounded up to a multiple of 2
    assert partition_count(49 * a, 3, 2) == 3                # never more than rows
    b = 200_000 * 256 * 4
    assert partition_count(b, 200_000, 2) == math.ceil(round(math.sqrt(b / a)) / 2) * 2


def test_partitions_cover_all_rows_and_balance_servers(lm):
    plan = make_plan(lm, TWO_HOSTS, options=PlanOptions(partitions={"embedding": 5}))
    emb = plan.variable("embedding")
    rows = lm.variable("embedding").shape[0]
    assert emb.partitions[0][0] == 0 and emb.partitions[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(emb.partitions, emb.partitions[1:]))
    load = [0, 0]
    for (start, end), server in zip(emb.partitions, emb.servers):
        load[server] += end - start
    assert abs(load[0] - load[1]) <= max(e - s for s, e in emb.partitions)
    assert "5 partitions on server 0, server 1" == emb.placement


def test_report_counts_ps_bytes_per_worker_and_server(lm):
    plan = make_plan(lm, TWO_HOSTS, options=PlanOptions(run_option="ps"))
    report = build_report(lm, plan)
    by_name = {v.name: v for v in report.variables}
    kernel = lm.variable("lstm/kernel")
    # Dense on a server: push b, read b (Parallax Table 3: 2b in all).
    assert by_name["lstm/kernel"].sent_per_worker == kernel.bytes
    assert by_name["lstm/kernel"].received_per_worker == kernel.bytes
    # Servers together send every worker everything it reads and receive one
    # contribution per host (local aggregation) of everything.
    total_read = sum(v.received_per_worker for v in report.variables)
    assert sum(s["sent"] for s in report.servers) == pytest.approx(3 * total_read)
    assert sum(s["received"] for s in report.servers) == pytest.approx(2 * total_read)
    no_la = build_report(lm, make_plan(lm, TWO_HOSTS, options=PlanOptions(
        run_option="ps", local_aggregation=False)))
    assert sum(s["received"] for s in no_la.servers) == pytest.approx(3 * total_read)


def _dense_ps_graph():
    """One 1 MB dense kernel beside small variables, all on servers."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 256])
        kernel = tf1.get_variable("big/kernel", [256, 1024])
        small = tf1.get_variable("small/kernel", [1024, 16])
        bias = tf1.get_variable("small/bias", [16])
        loss = tf.reduce_mean(tf.matmul(tf.matmul(x, kernel), small) + bias)
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return g


def test_a_dense_variable_larger_than_a_servers_share_is_split_for_balance():
    """Whole, the 1 MB kernel would put ~1 MB per worker and step on one
    server and 64 kB on the others; split into one partition per server,
    the busiest server carries at most a partition more than the share."""
    analysis = analyze_graph(_dense_ps_graph())
    four = Topology(("a", "b", "c", "d"), num_servers=4)
    plan = make_plan(analysis, four, options=PlanOptions(run_option="ps"))
    big = plan.variable("big/kernel")
    assert len(big.partitions) == 4 and sorted(big.servers) == [0, 1, 2, 3]
    load = [0.0] * 4
    for name in ("big/kernel", "small/kernel", "small/bias"):
        vp, v = plan.variable(name), analysis.variable(name)
        rows = v.shape[0]
        for (start, end), server in zip(vp.partitions, vp.servers):
            load[server] += v.bytes * (end - start) / rows
    total = sum(load)
    assert max(load) <= total / 4 + 1024 * 16 * 4 + 1   # at most the small kernel over the share
    # A variable far below the split threshold stays whole.
    assert len(plan.variable("small/kernel").partitions) == 1


def _lm_like_ps_graph():
    """The bench's sparse LM in shape: a 204800 x 256 embedding looked up by
    1024 ids per step (alpha 0.005), then a 256 KB and a 1 MB dense kernel."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        ids = tf1.placeholder(tf.int32, [64, 16])
        emb = tf1.get_variable("embedding", [204800, 256])
        h = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), axis=1)
        hidden = tf1.get_variable("hidden/kernel", [256, 256])
        softmax = tf1.get_variable("softmax/kernel", [256, 1024])
        loss = tf.reduce_mean(tf.matmul(tf.tanh(tf.matmul(h, hidden)), softmax))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return g


@pytest.mark.parametrize("servers", [2, 4, 8])
def test_an_embedding_is_dealt_one_partition_per_server(servers):
    """Its rows spread evenly over its partitions, so each server must hold
    one of them whatever alpha was estimated; placed greedily by estimated
    bytes, two of four shared a server and the busiest server of the real
    steps carried 1.7x the mean (bench/results/full.json of 2026-11-25)."""
    analysis = analyze_graph(_lm_like_ps_graph())
    assert analysis.variable("embedding").gradient == "sparse"
    topology = Topology(tuple(f"h{i}" for i in range(servers)), num_servers=servers)
    plan = make_plan(analysis, topology, options=PlanOptions(run_option="ps"))
    emb = plan.variable("embedding")
    assert emb.servers == list(range(servers))


def test_a_split_dense_variable_takes_the_count_that_balances_the_servers():
    """4 servers, kernels of 1 MB and 256 KB: four 256 KB partitions of the
    big one would leave five equal pieces for four servers (one server 2x);
    three partitions of 341 KB beside the whole small kernel fill all four."""
    analysis = analyze_graph(_lm_like_ps_graph())
    plan = make_plan(analysis, Topology(("a", "b", "c", "d"), num_servers=4), options=PlanOptions(run_option="ps"))
    big, small = plan.variable("softmax/kernel"), plan.variable("hidden/kernel")
    assert len(big.partitions) == 3 and len(small.partitions) == 1
    assert sorted(big.servers + small.servers) == [0, 1, 2, 3]


@pytest.mark.parametrize("servers", [1, 2, 4, 8])
def test_a_dense_variable_the_cost_model_splits_past_the_servers_keeps_its_count(servers):
    """100 MiB: the cost model gives round(sqrt(100/4)) = 5, rounded up to a
    multiple of the servers (6 on 2, 8 on 4 or 8, 5 on 1); nothing
    splits it further, and its partitions still cover every server evenly."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 1024])
        big = tf1.get_variable("avg/buffer", [25600, 1024])
        loss = tf.reduce_mean(tf.matmul(x, big, transpose_b=True))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(g)
    topology = Topology(tuple(f"h{i}" for i in range(max(servers, 2))), num_servers=servers)
    plan = make_plan(analysis, topology, options=PlanOptions(run_option="ps"))
    vp = plan.variable("avg/buffer")
    expected = partition_count(analysis.variable("avg/buffer").bytes, 25600, servers)
    assert len(vp.partitions) == expected >= servers
    per_server = [vp.servers.count(s) for s in range(servers)]
    assert max(per_server) - min(per_server) <= 1
