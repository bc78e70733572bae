"""Collective keys come from one table (transforms.keys): no two ranges of
one kind overlap, and every key a job uses falls in its feature's range."""
import pytest

from autopar.common.errors import AutoparError
from autopar.transforms import keys
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.evaluate import MAX_EVAL_VALUES, totals_allreduce
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.methods.registry import METHODS
from tests import models
from tests.unit.test_plan_report import all_keys


def test_ranges_are_disjoint_and_the_check_would_see_an_overlap():
    keys.check_disjoint(keys.INSTANCE_RANGES)
    keys.check_disjoint(keys.GROUP_RANGES)
    # batch norm and evaluation once shared 2^21 (a 'Shape mismatch in the
    # collective instance' when both ran in one job)
    with pytest.raises(AssertionError, match="overlap"):
        keys.check_disjoint([keys.BATCH_NORM, keys.KeyRange("evaluation", 2 << 20, 10)])


def test_a_range_refuses_keys_beyond_its_end():
    assert keys.EVALUATION.key(0) == keys.EVALUATION.first
    with pytest.raises(AutoparError, match="evaluation totals"):
        keys.EVALUATION.key(keys.EVALUATION.size)
    with pytest.raises(ValueError):
        import tensorflow as tf
        with tf.Graph().as_default():
            totals_allreduce(make_plan(analyze_graph(models.build("mlp_sgd").graph), 2),
                             "/cpu:0", MAX_EVAL_VALUES + 1)


@pytest.mark.parametrize("model,run_option", [("lm_adam_clip", "hybrid"),
                                              ("emb_adam_clip", "ps"),
                                              ("mlp_adam_clip_ema_f32", "herring"),
                                              ("bncnn_momentum", "allreduce")])
def test_every_key_of_a_plan_falls_in_its_range(model, run_option):
    analysis = analyze_graph(models.build(model).graph)
    plan = make_plan(analysis, Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), 2),
                     options=PlanOptions(run_option=run_option, batch_norm_group="all",
                                         sync_local_state="average"))
    plan_keys = all_keys(plan) + [b.key for b in plan.barriers] + [plan.broadcast_key_base]
    if METHODS["herring"].state(plan).layout is not None:
        plan_keys += [b.la_key + i for b in METHODS["herring"].state(plan).layout.buffers for i in (0, 1)]
    assert len(plan_keys) == len(set(plan_keys))
    assert all(keys.PLAN.first <= k < keys.PLAN.end for k in plan_keys)
    assert keys.LOCAL_STATE.first <= plan.local_state_key < keys.LOCAL_STATE.end
    assert keys.BATCH_NORM.first <= plan.batch_norm_key < keys.BATCH_NORM.end
    assert keys.WUS.first <= plan.wus_key < keys.WUS.end
    host_groups = {plan.host_group(i)[0] for i in range(plan.num_workers)}
    assert all(keys.HOST_GROUPS.first <= g < keys.HOST_GROUPS.end for g in host_groups)
