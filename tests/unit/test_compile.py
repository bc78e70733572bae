"""The compile step (transforms/compile.py): one CompiledPlan per job, shipped
as JSON. Its round trip must give an equal plan, and rewriting with the
shipped plan must give the same worker graph as rewriting with the plan
computed in place."""
import dataclasses
import enum
import json

import pytest
import tensorflow as tf

from autopar.transforms import serial
from autopar.transforms.compile import CompiledPlan, compile_plan
from autopar.transforms.plan import PlanOptions
from autopar.transforms.topology import Topology
from autopar.transforms.rewrite import rewrite_for_worker
from tests import models

TWO_HOSTS = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)

# (model of tests/models.py, topology, plan options): dense and sparse, clipping
# (OPAU moves), EMA, batch norm, partitions over servers, every run option.
CASES = [
    ("mlp_adam_clip_ema", Topology.local(2), PlanOptions()),
    ("cnn_momentum", Topology.local(3), PlanOptions()),
    ("bn_sgd", Topology.local(2), PlanOptions(sync_local_state="average")),
    ("emb_adam_clip", Topology.local(3), PlanOptions()),
    ("lm_adam_clip", TWO_HOSTS, PlanOptions()),
    ("lm_adam_clip", TWO_HOSTS, PlanOptions(run_option="ps", local_aggregation=False)),
    ("lm_adagrad_clip", TWO_HOSTS, PlanOptions(run_option="ps",
                                                partitions={"embedding": 3,
                                                            "softmax/kernel": 2})),
    ("embsparse_sgd_clip", TWO_HOSTS, PlanOptions(run_option="hybrid", opau=False)),
]
IDS = [f"{m}-{t.num_workers}w{t.num_servers}s-{o.run_option}" + ("-parts" if o.partitions else "")
       for m, t, o in CASES]


@pytest.fixture(scope="module", params=range(len(CASES)), ids=IDS)
def compiled(request):
    name, topology, options = CASES[request.param]
    model = models.build(name)
    return model, compile_plan(model.graph, topology, dataclasses.replace(options,
                                                                          fusion_bytes=4096))


def test_json_round_trip_gives_an_equal_plan(compiled):
    _, c = compiled
    text = c.to_json()
    again = CompiledPlan.from_json(text)
    assert again == c
    assert again.to_json() == text
    assert CompiledPlan.from_bytes(c.to_bytes()) == c
    # Field types survive, not only values (tuples stay tuples, sets sets).
    assert isinstance(again.analysis.step_ops, frozenset)
    assert all(isinstance(v.shape, tuple) for v in again.analysis.variables)
    # The report is a view of the plan: the same from the shipped copy.
    assert again.report().to_json() == c.report().to_json()


def test_rewrite_with_the_shipped_plan_is_the_same_graph(compiled):
    """The worker graphs built from the received plan (with its moves) are
    identical GraphDefs to those built from the plan computed in place, the
    moves recomputed by the ps rewrite."""
    model, c = compiled
    shipped = CompiledPlan.from_json(c.to_json())
    for worker in range(c.plan.num_workers):
        here = rewrite_for_worker(model.graph, c.analysis, c.plan, worker)
        there = rewrite_for_worker(model.graph, shipped.analysis, shipped.plan, worker,
                                   moves=shipped.moves)
        assert there.meta_graph.graph_def == here.meta_graph.graph_def, f"worker {worker}"
        assert there.server_variables == here.server_variables
        assert there.partitions == here.partitions


def test_the_ps_rewrite_applies_the_given_moves():
    """`moves=` is what the rewrite places, not a recomputation: without the
    OPAU moves, the chief's clipping ops stay on the worker."""
    model = models.build("lm_adam_clip")
    c = compile_plan(model.graph, TWO_HOSTS, PlanOptions(run_option="ps"))
    opau = [m for m in c.moves if m.rule == "OPAU" and m.place.server is not None]
    assert opau, "the clipped LM on servers should have post-aggregation moves"
    with_moves = rewrite_for_worker(model.graph, c.analysis, c.plan, 0, moves=c.moves)
    without = rewrite_for_worker(model.graph, c.analysis, c.plan, 0, moves=[])
    device = {n.name: n.device for n in with_moves.meta_graph.graph_def.node}
    device_without = {n.name: n.device for n in without.meta_graph.graph_def.node}
    for m in opau:
        assert "/job:ps/" in device[m.op], m
        assert "/job:worker/" in device_without[m.op], m


# -- the generic codec, on types the plan does not use yet -------------------

class Method(enum.Enum):
    ALLREDUCE = "allreduce"
    PS = "ps"


@dataclasses.dataclass(frozen=True)
class Place:
    kind: Method
    index: int = 0


@dataclasses.dataclass
class Future:
    places: tuple[Place, ...]
    by_method: dict[Method, list[int]]
    by_index: dict[int, str]
    optional: Place | None = None
    ratio: float = 1.0
    names: frozenset[str] = frozenset()
    pair: tuple[str, int] = ("a", 1)


def test_codec_round_trips_enums_nested_dataclasses_and_containers():
    x = Future(places=(Place(Method.PS, 2), Place(Method.ALLREDUCE)),
               by_method={Method.PS: [1, 2]}, by_index={3: "c"}, optional=Place(Method.PS, 1),
               ratio=2, names=frozenset({"b", "a"}), pair=("z", 9))
    text = serial.dumps(x)
    assert json.loads(text)["places"][0] == {"kind": "ps", "index": 2}
    back = serial.loads(Future, text)
    assert back == x
    assert isinstance(back.ratio, float) and isinstance(back.places, tuple)
    assert serial.loads(Future, serial.dumps(dataclasses.replace(x, optional=None))).optional is None


def test_codec_rejects_what_it_cannot_rebuild():
    with pytest.raises(ValueError, match="no field"):
        serial.loads(Place, '{"kind": "ps", "index": 1, "extra": 0}')
    with pytest.raises(ValueError):
        serial.loads(Place, '{"kind": "nccl"}')
    with pytest.raises(TypeError):
        serial.encode({("tuple", "key"): 1})
    with pytest.raises(TypeError):
        serial.encode(tf.constant(1))


def test_a_graph_other_than_the_compiled_one_is_refused():
    """A process that built another graph (here: its own hand-written update
    instead of the optimizer the plan was compiled from) is told so, naming
    an op the plan needs."""
    from autopar.common.errors import UnsupportedGraphError
    c = compile_plan(models.build("mlp_sgd").graph, 2)
    c.check_graph(models.build("mlp_sgd").graph)     # the same script again: accepted
    other = models.build_case("mlp", "sgd", minimize=True)
    with pytest.raises(UnsupportedGraphError, match="another graph.*update_"):
        c.check_graph(other.graph)


def test_a_graph_without_a_draw_the_plan_seeds_is_refused():
    """The plan gives a shared draw its seeds by name: a process whose graph
    draws under another name (its own scope) would draw its own."""
    from autopar.common.errors import UnsupportedGraphError
    c = compile_plan(models.build("lmsampledunseeded_adagrad_clip").graph, 2)
    [sampler] = c.analysis.shared_draws
    c.check_graph(models.build("lmsampledunseeded_adagrad_clip").graph)
    other = models.build("lmsampledunseeded_adagrad_clip").graph
    graph_def = other.as_graph_def()
    for node in graph_def.node:
        if node.name == sampler:
            node.name = sampler + "_elsewhere"
        node.input[:] = [i.replace(sampler, sampler + "_elsewhere") for i in node.input]
    renamed = tf.Graph()
    with renamed.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with pytest.raises(UnsupportedGraphError, match=f"another graph.*'{sampler}'"):
        c.check_graph(renamed)
