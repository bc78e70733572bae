"""Config.wire_dtype on the ring all-reduce (an axis of its own,
transforms/methods/wire.py, that the allreduce method reads): which
variables and buckets travel narrower, and what the report and the byte
model say of them."""
import pytest

import autopar
from autopar.transforms.compile import compile_for_config
from autopar.transforms.methods.registry import METHODS
from tests import models


def _compiled(model: str, wire: str, **options):
    return compile_for_config(models.build(model).graph, 4,
                              autopar.Config(run_option="allreduce", wire_dtype=wire, **options))


@pytest.mark.parametrize("model, dtype", [("mlp_sgd", "float32"), ("mlp_adam_clip", "float64")])
def test_float16_narrows_float_buckets_and_their_bytes(model, dtype):
    plain, narrow = _compiled(model, "float32"), _compiled(model, "float16")
    ring = METHODS["allreduce"]
    assert {b.wire_dtype for b in ring.state(plain.plan).buckets} == {""}
    assert {vp.method for vp in plain.plan.variables} == {"allreduce"}
    assert {vp.wire_dtype for vp in plain.plan.variables} == {None}
    # every variable of these models is float32/float64: every bucket narrowed
    assert {(b.dtype, b.wire_dtype) for b in ring.state(narrow.plan).buckets} == {(dtype, "float16")}
    assert {vp.method for vp in narrow.plan.variables} == {"allreduce"}
    assert {vp.wire_dtype for vp in narrow.plan.variables} == {"float16"}
    assert all("sent as float16 on the ring" in vp.reason for vp in narrow.plan.variables)
    assert not any("sent as" in vp.reason for vp in plain.plan.variables)
    ratio = 2 / {"float32": 4, "float64": 8}[dtype]
    sent = {r.name: r.sent_per_worker for r in plain.report().variables}
    for row in narrow.report().variables:
        assert row.sent_per_worker == pytest.approx(sent[row.name] * ratio)
    assert "sent and summed as float16" in narrow.report().table()
    assert "sent and summed as" not in plain.report().table()


def test_bfloat16_leaves_the_ring_as_it_is():
    """TensorFlow's collective ops carry no bfloat16: the ring keeps float32."""
    compiled = _compiled("mlp_sgd", "bfloat16")
    assert {b.wire_dtype for b in METHODS["allreduce"].state(compiled.plan).buckets} == {""}
    assert {vp.method for vp in compiled.plan.variables} == {"allreduce"}
