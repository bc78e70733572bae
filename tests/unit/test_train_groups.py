"""Analysis and rewrite decisions for programs with several train ops, an
optimizer built inside a variable_scope, reference variables and moving
averages of server variables (tests/programs/two_trainers.py), each pinned
on the graph."""
import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.config import Config
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.compile import compile_for_config
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.methods.registry import METHODS
from tests.programs import two_trainers

tf1 = tf.compat.v1
UNEVEN = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), 2)
A = ["model/lm/emb/part_0", "model/lm/emb/part_1", "model/lm/head"]
B = ["b/emb", "b/ref_emb", "b/w"]


@pytest.fixture(scope="module")
def program():
    return two_trainers.build()


@pytest.fixture(scope="module")
def analysis(program):
    return analyze_graph(program.graph)


def _plan(analysis, run_option, topology=UNEVEN, **options):
    return make_plan(analysis, topology, options=PlanOptions(
        run_option=run_option, partitions=dict(two_trainers.PARTITIONS), **options))


def test_train_groups_from_data_flow(program, analysis):
    """Two optimizers over different variables: two groups; the train ops
    map to theirs, a tf.group of both to both; each group's loss is the one
    its gradients come from."""
    assert [g.variables for g in analysis.train_groups] == [A, B]
    assert [analysis.variable(n).group for n in A + B] == [0, 0, 0, 1, 1, 1]
    fetches = program.fetches
    assert analysis.groups_of(fetches["a"].name) == [0]
    assert analysis.groups_of(fetches["b"].name) == [1]
    assert analysis.groups_of(fetches["group"].name) == [0, 1]
    assert analysis.step_sets == [(0,), (1,), (0, 1)]
    losses = [g.loss for g in analysis.train_groups]
    assert losses[0].startswith("model/") and losses[1].startswith("b/")
    # an update op maps to its variable's group
    assert analysis.groups_of(analysis.variable("b/w").update_ops[0]) == [1]


def test_one_train_op_is_one_group():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3])
        w = tf1.get_variable("w", [3, 2])
        v = tf1.get_variable("v", [2, 1])
        train = tf1.train.AdamOptimizer(0.1).minimize(tf.reduce_mean(x @ w @ v))
    a = analyze_graph(graph)
    assert [g.variables for g in a.train_groups] == [["w", "v"]]
    assert a.step_sets == [(0,)] and a.groups_of(train.name) == [0]


def test_slots_found_by_data_flow_not_by_name(analysis):
    """An optimizer built inside variable_scope("model") names the slot of
    "model/lm/head" "model/model/lm/head/Adagrad"; Adam's beta powers, read
    by every update and written by none, are state, not slots."""
    assert analysis.variable("model/lm/emb/part_0").slots == ["model/model/lm/emb/part_0/Adagrad"]
    assert analysis.variable("model/lm/head").slots == ["model/model/lm/head/Adagrad"]
    assert analysis.variable("b/w").slots == ["b/w/AdamB", "b/w/AdamB_1"]
    kinds = {s.name: s.kind for s in analysis.state}
    assert kinds["beta1_power"] == kinds["beta2_power"] == "optimizer"


def test_single_variable_adam_slots_exclude_the_beta_powers():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3])
        w = tf1.get_variable("w", [3, 2])
        with tf1.variable_scope("outer"):
            tf1.train.AdamOptimizer(0.1).minimize(tf.reduce_mean(x @ w))
    assert analyze_graph(graph).variable("w").slots == ["outer/w/Adam", "outer/w/Adam_1"]


@pytest.mark.parametrize("run_option", ["hybrid", "ps"])
def test_scoped_slots_live_with_their_partitioned_variable(analysis, run_option):
    """The slot of a server variable is on the servers with it (a slot
    reported replicated put the update on two devices: 'Cannot place the
    graph')."""
    plan = _plan(analysis, run_option)
    wg = rewrite_for_worker(two_trainers.build().graph, analysis, plan, 1)
    assert {"model/lm/emb/part_0", "model/model/lm/emb/part_0/Adagrad"} <= wg.server_variables


def test_buckets_and_herring_buffers_never_mix_train_groups(analysis):
    plan = make_plan(analysis, UNEVEN, options=PlanOptions(run_option="allreduce"))
    assert len(METHODS["allreduce"].state(plan).buckets) == 2
    for b in METHODS["allreduce"].state(plan).buckets:
        assert {analysis.variable(v).group for v in b.variables} == {b.group}
    f32 = analyze_graph(two_trainers.build("float32").graph)
    herring = make_plan(f32, UNEVEN, options=PlanOptions(run_option="herring"))
    assert len(METHODS["herring"].state(herring).layout.buffers) == 2
    for buffer in METHODS["herring"].state(herring).layout.buffers:
        assert len({f32.variable(v).group for v in buffer.variables}) == 1


@pytest.mark.parametrize("worker", [0, 1])
def test_each_step_set_has_a_barrier_waiting_for_its_groups_only(program, analysis, worker):
    """hybrid: one barrier per set of groups a fetch can update; a group's
    barrier never waits for the other group's pushes, updates or inputs
    (it did: every step fetched one barrier covering every server
    variable, so a step of train_a applied train_b's server updates too)."""
    plan = _plan(analysis, "hybrid")
    assert [b.groups for b in plan.barriers] == [[0], [1], [0, 1]]
    assert len({b.key for b in plan.barriers} | {plan.broadcast_key_base}) == 4
    wg = rewrite_for_worker(program.graph, analysis, plan, worker)
    nodes = {n.name: n for n in wg.meta_graph.graph_def.node}

    def ancestors(name):
        seen, stack = set(), [name]
        while stack:
            n = stack.pop()
            if n in seen or n not in nodes:
                continue
            seen.add(n)
            stack += [i.lstrip("^").split(":")[0] for i in nodes[n].input]
        return seen
    barriers = dict(wg.step_barriers)
    assert set(barriers) == {(0,), (1,), (0, 1)}
    updates = {g: {u for n in names for u in analysis.variable(n).update_ops}
               for g, names in enumerate((A, B))}
    inputs = {0: {"ids_a", "y_a"}, 1: {"ids_b", "x_b", "y_b"}}
    for group, other in ((0, 1), (1, 0)):
        before = ancestors(barriers[(group,)])
        # its gradients (pushed, or summed on the host) need its inputs only
        assert before >= inputs[group] and not before & inputs[other]
        if worker == 0:   # the chief applies the server updates: its group's only
            assert before & updates[group] and not before & updates[other]
    assert inputs[0] | inputs[1] <= ancestors(barriers[(0, 1)])


def test_reference_variable_is_kept_whole_and_the_report_says_why(analysis):
    plan = _plan(analysis, "ps")
    assert len(plan.variable("b/emb").partitions) == 2          # resource: split as asked
    ref = plan.variable("b/ref_emb")
    assert len(ref.partitions) == 1 and "reference variable" in ref.placement
    assert "VariableV2" in ref.reason
    table = build_report(analysis, plan).table()
    assert "whole (reference variable: not partitioned)" in table
    assert "2 train ops update different variables" in table


def test_moving_average_guard_of_a_server_variable_becomes_its_initial_value(program, analysis):
    """An ExponentialMovingAverage shadow's initial value is guarded by
    cond(is_initialized(v), v, v's initial value); for a server variable the
    worker's cond raced the chief's initialisation (and a partitioned
    variable's whole handle does not exist): it becomes the initial value."""
    plan = _plan(analysis, "hybrid")
    graph_def = rewrite_for_worker(program.graph, analysis, plan, 1).meta_graph.graph_def
    guards = [op for op in program.graph.get_operations()
              if op.type in ("If", "StatelessIf") and op.inputs[1].op.name in ("b/emb", "b/ref_emb")]
    assert len(guards) >= 2
    nodes = {n.name: n for n in graph_def.node}
    for guard in guards:
        node = nodes[guard.name]
        assert node.op == "Identity" and list(node.input) == [guard.inputs[2].name.replace(":0", "")]


def test_two_train_ops_refused_where_unsupported(program, analysis):
    with pytest.raises(AutoparError, match="2 train ops"):
        make_plan(analysis, UNEVEN, options=PlanOptions(run_option="allreduce",
                                                        shard_weight_update=True))
    with pytest.raises(UnsupportedGraphError, match="micro_batches=2"):
        compile_for_config(program.graph, UNEVEN, Config(micro_batches=2))


def test_a_shadow_is_initialised_after_the_variable_it_reads(program):
    """Initialised in one run, a moving average's guarded initial value raced
    the initialisation of a reference variable it reads ('Attempting to use
    uninitialized value b/ref_emb', seen single-device under load): the
    shadows come in a later stage, everything else keeps its order."""
    from autopar.transforms.graph_utils import initialization_stages
    with program.graph.as_default():
        variables = tf1.global_variables()
    stages = [[v.op.name for v in stage] for stage in initialization_stages(variables)]
    assert len(stages) == 2
    assert stages[1] == [f"{n}/ExponentialMovingAverage" for n in B]
    assert stages[0] == [v.op.name for v in variables if not v.op.name.endswith("Average")]
