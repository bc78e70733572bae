"""transforms.plan (fusion buckets, collective keys, serialisation) and
transforms.report (bytes on the wire per worker).

Plans are built from hand-made Analyses whose byte sizes are written out as
arithmetic, and from analyses of real graphs (tests.models.build_case)."""
import json
import math

import pytest

from tests.models import build_case
from autopar.transforms.analysis import Analysis, StateInfo, VariableInfo, analyze_graph
from autopar.transforms.comm import ROW_LADDER
from autopar.transforms.plan import Plan, PlanOptions, make_plan
from autopar.transforms.methods.allreduce.method import Bucket
from autopar.transforms.methods.base import VariablePlan
from autopar.transforms.report import build_report
from autopar.transforms.methods.registry import METHODS

ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8}


def var(name, shape, dtype="float32", gradient="dense", alpha=None) -> VariableInfo:
    return VariableInfo(name=name, shape=tuple(shape), dtype=dtype,
                        bytes=math.prod(shape) * ITEMSIZE[dtype], gradient=gradient, alpha=alpha)


def analysis_of(*variables, state=()) -> Analysis:
    return Analysis(variables=list(variables), state=list(state), loss=None,
                    step_ops=frozenset(), untrained=[])


def all_keys(plan: Plan) -> list[int]:
    """Every instance key the plan hands out; a row gather's values and indices
    keys each start a block of one key per ladder rung."""
    keys = [b.instance_key for b in METHODS["allreduce"].state(plan).buckets]
    keys += [k for b in METHODS["allreduce"].state(plan).buckets if b.hierarchical for k in (b.host_key, b.host_key + 1)]
    for vp in plan.variables:
        row_gather = "count" in vp.keys or "la_count" in vp.keys
        for name, k in vp.keys.items():
            block = row_gather and name.endswith(("values", "indices"))
            keys += list(range(k, k + len(ROW_LADDER))) if block else [k]
    return keys


def check_plan_invariants(plan: Plan, analysis: Analysis):
    sizes = {v.name: v.bytes for v in analysis.variables}
    dtypes = {v.name: v.dtype for v in analysis.variables}
    dense = [v.name for v in analysis.variables if v.gradient == "dense"]
    sparse = [v.name for v in analysis.variables if v.gradient == "sparse"]
    # every dense variable in exactly one bucket, no sparse one in any
    in_buckets = [n for b in METHODS["allreduce"].state(plan).buckets for n in b.variables]
    assert sorted(in_buckets) == sorted(dense)
    assert len(in_buckets) == len(set(in_buckets))
    for i, b in enumerate(METHODS["allreduce"].state(plan).buckets):
        assert b.index == i
        assert b.variables
        assert {dtypes[n] for n in b.variables} == {b.dtype}
        assert b.bytes == sum(sizes[n] for n in b.variables)
        if len(b.variables) > 1:
            assert b.bytes <= plan.fusion_bytes
    # a variable larger than the fusion size is alone
    for n in dense:
        if sizes[n] > plan.fusion_bytes:
            (b,) = [b for b in METHODS["allreduce"].state(plan).buckets if n in b.variables]
            assert b.variables == [n]
    assert [vp.name for vp in plan.variables] == [v.name for v in analysis.variables]
    for vp in plan.variables:
        if vp.name in dense:
            assert vp.method == "allreduce"
            assert vp.name in METHODS["allreduce"].state(plan).buckets[vp.bucket].variables
            assert vp.keys == {}
        else:
            assert vp.name in sparse
            assert vp.method == "allgather"
            assert vp.bucket is None
            assert set(vp.keys) == {"count", "values", "indices"}
        assert vp.placement and vp.reason
    keys = all_keys(plan)
    assert len(keys) == len(set(keys))
    assert len(keys) == len(METHODS["allreduce"].state(plan).buckets) + (1 + 2 * len(ROW_LADDER)) * len(sparse)
    # the broadcast uses keys base, base+1, ...: all above every other key
    assert all(k < plan.broadcast_key_base for k in keys)
    assert plan.group_key not in keys


# ---------------------------------------------------------------- buckets
def test_greedy_buckets_last_created_first():
    """Sizes 400, 200, 300, 100 bytes (creation order a, b, c, d), fusion 500.
    Backprop order d, c, b, a: d+c = 400 <= 500; +b = 600 > 500 -> new bucket;
    b+a = 600 > 500 -> new bucket."""
    a = analysis_of(var("a", [100]), var("b", [50]), var("c", [75]), var("d", [25]))
    assert [v.bytes for v in a.variables] == [400, 200, 300, 100]
    plan = make_plan(a, 2, PlanOptions(fusion_bytes=500))
    assert [b.variables for b in METHODS["allreduce"].state(plan).buckets] == [["d", "c"], ["b"], ["a"]]
    assert [b.bytes for b in METHODS["allreduce"].state(plan).buckets] == [400, 200, 400]
    assert [plan.variable(n).bucket for n in "abcd"] == [2, 1, 0, 0]
    check_plan_invariants(plan, a)


def test_bucket_exactly_full_is_allowed():
    a = analysis_of(var("a", [25]), var("b", [25]))          # 100 + 100 bytes
    plan = make_plan(a, 2, PlanOptions(fusion_bytes=200))
    assert [b.variables for b in METHODS["allreduce"].state(plan).buckets] == [["b", "a"]]
    assert METHODS["allreduce"].state(plan).buckets[0].bytes == 200
    plan = make_plan(a, 2, PlanOptions(fusion_bytes=199))
    assert [b.variables for b in METHODS["allreduce"].state(plan).buckets] == [["b"], ["a"]]


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_variable_larger_than_fusion_bytes_is_alone(position):
    small = [var("s1", [10]), var("s2", [10]), var("s3", [10])]      # 40 bytes each
    big = var("big", [20, 20])                                      # 1600 bytes
    order = {"first": [big, *small], "middle": [small[0], big, *small[1:]],
             "last": [*small, big]}[position]
    a = analysis_of(*order)
    plan = make_plan(a, 4, PlanOptions(fusion_bytes=100))
    (bucket,) = [b for b in METHODS["allreduce"].state(plan).buckets if "big" in b.variables]
    assert bucket.variables == ["big"] and bucket.bytes == 1600
    check_plan_invariants(plan, a)


def test_one_dtype_per_bucket():
    # interleaved float32 / float64 / float16 variables, fusion large enough for all
    a = analysis_of(var("f32a", [6, 4]), var("f64a", [4, 4], "float64"),
                    var("f32b", [4]), var("f16a", [8], "float16"),
                    var("f64b", [4], "float64"), var("f32c", [4, 3]))
    plan = make_plan(a, 2, PlanOptions(fusion_bytes=1 << 20))
    by_dtype = {b.dtype: b for b in METHODS["allreduce"].state(plan).buckets}
    assert len(METHODS["allreduce"].state(plan).buckets) == 3 == len(by_dtype)
    assert by_dtype["float32"].variables == ["f32c", "f32b", "f32a"]
    assert by_dtype["float32"].bytes == 4 * 3 * 4 + 4 * 4 + 6 * 4 * 4
    assert by_dtype["float64"].variables == ["f64b", "f64a"]
    assert by_dtype["float64"].bytes == 4 * 8 + 4 * 4 * 8
    assert by_dtype["float16"].variables == ["f16a"]
    assert by_dtype["float16"].bytes == 8 * 2
    check_plan_invariants(plan, a)


@pytest.mark.parametrize("fusion_bytes", [1, 16, 50, 100, 250, 1000, 64 << 20])
def test_invariants_for_many_fusion_sizes(fusion_bytes):
    a = analysis_of(var("emb", [50, 5], gradient="sparse", alpha=0.48),
                    var("l1/kernel", [6, 4]), var("l1/bias", [4]),
                    var("wide/kernel", [4, 4], "float64"), var("wide/bias", [4], "float64"),
                    var("emb2", [30, 5], gradient="sparse"),
                    var("out/kernel", [4, 3]), var("out/bias", [3]))
    plan = make_plan(a, 3, PlanOptions(fusion_bytes=fusion_bytes))
    assert plan.fusion_bytes == fusion_bytes and plan.num_workers == 3
    check_plan_invariants(plan, a)
    if fusion_bytes == 1:     # (Config.fusion_bytes' least) every variable a bucket of its own
        assert all(len(b.variables) == 1 for b in METHODS["allreduce"].state(plan).buckets)
        assert len(METHODS["allreduce"].state(plan).buckets) == 6


def test_sparse_variables_use_allgather_with_distinct_keys():
    a = analysis_of(var("e1", [50, 5], gradient="sparse"), var("w", [5, 3]),
                    var("e2", [20, 5], gradient="sparse"), var("b", [3]))
    plan = make_plan(a, 2)
    e1, e2 = plan.variable("e1"), plan.variable("e2")
    assert e1.method == e2.method == "allgather"
    assert len(set(e1.keys.values()) | set(e2.keys.values())) == 6
    assert len(set(all_keys(plan))) == 1 + 2 * (1 + 2 * len(ROW_LADDER))   # blocks disjoint
    assert [b.variables for b in METHODS["allreduce"].state(plan).buckets] == [["b", "w"]]
    check_plan_invariants(plan, a)


def test_plan_of_a_real_graph():
    case = build_case("emb", "adam", clip=True, ema=True)
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, 2, PlanOptions(fusion_bytes=50))
    # head/bias 3*4 = 12 bytes, head/kernel 5*3*4 = 60 bytes: 12 + 60 > 50
    assert [b.variables for b in METHODS["allreduce"].state(plan).buckets] == [["head/bias"], ["head/kernel"]]
    assert plan.variable("embedding").method == "allgather"
    check_plan_invariants(plan, analysis)
    with pytest.raises(KeyError):
        plan.variable("nope")


# -------------------------------------------------- determinism, serialisation
def test_deterministic():
    a = analysis_of(var("e", [50, 5], gradient="sparse"), var("w", [6, 4]), var("b", [4]))
    assert make_plan(a, 4, PlanOptions(fusion_bytes=64)).to_json() == make_plan(
        a, 4, PlanOptions(fusion_bytes=64)).to_json()


def test_every_process_derives_the_same_plan_from_its_own_graph():
    plans = [make_plan(analyze_graph(build_case("emb", "adagrad", clip=True).graph), 3,
                       PlanOptions(fusion_bytes=40))
             for _ in range(2)]
    assert plans[0].to_json() == plans[1].to_json()


def test_json_round_trip():
    a = analysis_of(var("e", [50, 5], gradient="sparse", alpha=0.5), var("w", [6, 4]),
                    var("d", [4, 4], "float64"), var("b", [4]))
    plan = make_plan(a, 3, PlanOptions(fusion_bytes=70, communication_hint="auto"))
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == text
    assert all(isinstance(b, Bucket) for b in METHODS["allreduce"].state(again).buckets)
    assert all(isinstance(v, VariablePlan) for v in again.variables)
    d = json.loads(text)
    assert len(d["topology"]["worker_hosts"]) == 3 and d["fusion_bytes"] == 70
    assert isinstance(again.topology.worker_hosts, tuple)
    assert d["communication_hint"] == "auto"
    assert d["group_key"] == plan.group_key
    assert d["broadcast_key_base"] == plan.broadcast_key_base
    assert [b["instance_key"] for b in d["method_states"]["allreduce"]["buckets"]] == [b.instance_key for b in METHODS["allreduce"].state(plan).buckets]
    assert d["variables"][0]["keys"] == plan.variable("e").keys


# ------------------------------------------------------------------ report
# The emb graph: embedding 50x5 float32 = 1000 bytes, 8x3 = 24 rows of 50 touched per
# step (alpha = 0.48); head/kernel 5x3x4 = 60 bytes; head/bias 3x4 = 12 bytes.
EMB_BYTES = {"embedding": 1000, "head/kernel": 60, "head/bias": 12}
# Per worker and direction: allreduce 2(N-1)b/N, allgather (N-1)*alpha*b.
EXPECTED_SENT = {
    2: {"embedding": 1 * 0.48 * 1000, "head/kernel": 2 * 1 * 60 / 2, "head/bias": 2 * 1 * 12 / 2},
    3: {"embedding": 2 * 0.48 * 1000, "head/kernel": 2 * 2 * 60 / 3, "head/bias": 2 * 2 * 12 / 3},
    4: {"embedding": 3 * 0.48 * 1000, "head/kernel": 2 * 3 * 60 / 4, "head/bias": 2 * 3 * 12 / 4},
}


def test_expected_numbers_are_what_the_formulas_say():
    # the table above, written out: guards the arithmetic of the test itself
    assert EXPECTED_SENT[2] == pytest.approx({"embedding": 480, "head/kernel": 60, "head/bias": 12})
    assert EXPECTED_SENT[3] == pytest.approx({"embedding": 960, "head/kernel": 80, "head/bias": 16})
    assert EXPECTED_SENT[4] == pytest.approx({"embedding": 1440, "head/kernel": 90, "head/bias": 18})


@pytest.fixture(scope="module")
def emb_analysis():
    return analyze_graph(build_case("emb", "adagrad", clip=True).graph)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_report_bytes_per_worker(emb_analysis, n):
    plan = make_plan(emb_analysis, n)
    report = build_report(emb_analysis, plan, n)
    assert report.num_workers == n
    by_name = {v.name: v for v in report.variables}
    assert list(by_name) == ["embedding", "head/kernel", "head/bias"]
    for name, want in EXPECTED_SENT[n].items():
        v = by_name[name]
        assert v.bytes == EMB_BYTES[name]
        assert v.sent_per_worker == pytest.approx(want)
        assert v.received_per_worker == pytest.approx(want)
    assert by_name["embedding"].alpha == pytest.approx(0.48)
    assert by_name["embedding"].kind == "sparse" and by_name["embedding"].method == "allgather"
    assert by_name["embedding"].bucket is None
    assert by_name["head/kernel"].kind == "dense" and by_name["head/kernel"].method == "allreduce"
    assert by_name["head/kernel"].shape == [5, 3] and by_name["head/kernel"].dtype == "float32"
    assert by_name["head/kernel"].bucket == plan.variable("head/kernel").bucket
    total = sum(EXPECTED_SENT[n].values())
    assert report.sent_per_worker == pytest.approx(total)
    assert report.received_per_worker == pytest.approx(total)


def test_single_worker_sends_nothing(emb_analysis):
    report = build_report(emb_analysis, make_plan(emb_analysis, 1), 1)
    assert report.sent_per_worker == 0 and report.received_per_worker == 0


def test_unknown_alpha_is_counted_as_every_row():
    a = analysis_of(var("emb", [40, 8], gradient="sparse", alpha=None), var("w", [8, 2]))
    report = build_report(a, make_plan(a, 3), 3)
    emb = next(v for v in report.variables if v.name == "emb")
    assert emb.alpha is None
    assert emb.sent_per_worker == pytest.approx((3 - 1) * 1.0 * 40 * 8 * 4)
    assert any("emb" in note for note in report.notes)


def test_report_json_carries_everything(emb_analysis):
    n = 3
    plan = make_plan(emb_analysis, n, PlanOptions(fusion_bytes=50))
    report = build_report(emb_analysis, plan, n, num_servers=2)
    d = json.loads(report.to_json())
    assert d["num_workers"] == 3 and d["num_servers"] == 2
    assert [v["name"] for v in d["variables"]] == ["embedding", "head/kernel", "head/bias"]
    for v in d["variables"]:
        assert v["sent_per_worker"] == pytest.approx(EXPECTED_SENT[n][v["name"]])
        assert v["received_per_worker"] == pytest.approx(EXPECTED_SENT[n][v["name"]])
        assert v["bytes"] == EMB_BYTES[v["name"]]
    total = sum(EXPECTED_SENT[n].values())
    assert d["totals"]["sent_per_worker"] == pytest.approx(total)
    assert d["totals"]["received_per_worker"] == pytest.approx(total)
    assert [b["variables"] for b in d["buckets"]] == [b.variables for b in METHODS["allreduce"].state(plan).buckets]
    assert {s["name"]: s["kind"] for s in d["state"]} == {"global_step": "global_step"}
    assert any("2 server" in note for note in d["notes"])


def test_table_mentions_every_variable_state_and_untrained():
    a = Analysis(variables=[var("emb/table", [40, 8], gradient="sparse", alpha=0.25),
                            var("dense/kernel", [8, 2]), var("dense/bias", [2])],
                 state=[StateInfo("global_step", "global_step", ["GradientDescent"]),
                        StateInfo("dense/kernel/ExponentialMovingAverage", "ema", ["x"])],
                 loss="loss:0", step_ops=frozenset({"GradientDescent"}),
                 untrained=["frozen/kernel"])
    report = build_report(a, make_plan(a, 2), 2)
    table = report.table()
    for name in ("emb/table", "dense/kernel", "dense/bias", "global_step",
                 "dense/kernel/ExponentialMovingAverage", "frozen/kernel"):
        assert name in table
    assert "TOTAL" in table
    assert "40x8" in table and "8x2" in table
    assert "2 workers" in table


def test_a_batch_looking_up_more_ids_than_the_table_has_rows_is_bounded_by_its_rows():
    """40 ids per step into a table of 10 rows: the gradient carries 40 rows
    (a = 4), which an all-gather moves every one of; the servers' push and
    pull move one row per distinct id, at most the table. (Before, a was cut
    to 1 and the report's "upper bound" was 4x below what the all-gather
    moved.)"""
    import tensorflow as tf
    from autopar.transforms.plan import PlanOptions
    from autopar.transforms.topology import Topology
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [40])
        y = tf1.placeholder(tf.float32, [40])
        table = tf1.get_variable("table", [10, 4])
        w = tf1.get_variable("w", [4, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.gather(table, ids), w)[:, 0] - y))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(graph)
    assert analysis.variable("table").alpha == pytest.approx(4.0)
    table_bytes = 10 * 4 * 4
    gathered = build_report(analysis, make_plan(analysis, Topology.local(2),
                                                options=PlanOptions(run_option="allreduce")))
    row = next(v for v in gathered.variables if v.name == "table")
    assert (row.method, row.bytes_bound) == ("allgather", True)
    assert row.sent_per_worker == pytest.approx((2 - 1) * 4.0 * table_bytes)
    on_servers = build_report(analysis, make_plan(analysis, Topology.local(2, 1),
                                                  options=PlanOptions(run_option="ps")))
    row = next(v for v in on_servers.variables if v.name == "table")
    assert row.method == "ps" and row.sent_per_worker == pytest.approx(table_bytes)


def test_unknown_rows_are_an_estimate_not_a_bound():
    a = analysis_of(var("emb", [40, 8], gradient="sparse", alpha=None), var("w", [8, 2]))
    report = build_report(a, make_plan(a, 3), 3)
    emb = next(v for v in report.variables if v.name == "emb")
    assert not emb.bytes_bound
    assert any(note.startswith("emb: its rows per step are unknown before running") and
               "an estimate at a=1" in note and "not a bound" in note for note in report.notes)


def test_totals_separate_what_a_worker_holds_from_what_servers_hold():
    from autopar.transforms.plan import PlanOptions
    from autopar.transforms.topology import Topology
    a = analysis_of(var("emb", [1000, 8], gradient="sparse", alpha=0.1), var("w", [8, 2]))
    report = build_report(a, make_plan(a, Topology.local(2, 1),
                                       options=PlanOptions(run_option="hybrid")))
    assert (report.held_per_worker, report.held_on_servers) == (8 * 2 * 4, 1000 * 8 * 4)
    table = report.table()
    per_worker = [line for line in table.splitlines() if line.startswith("TOTAL per worker")]
    assert per_worker[0].split()[3:5] == ["64", "B"], table
    on_servers = [line for line in table.splitlines() if line.startswith("TOTAL on servers")]
    assert len(on_servers) == 1 and "31.2 KB" in on_servers[0]
    assert json.loads(report.to_json())["totals"]["held_on_servers"] == 32000
