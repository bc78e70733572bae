"""A sampled softmax's gradient rows (examples/lm.py's loss): the labels'
rows, each an example's, then the sampler's candidates', which every worker
draws alike and holds its share of the batch's sum of (analysis
VariableInfo.shared_rows). One device has those once: all-gathered, they
are added over workers row by row, so the global norm (and an update that
transforms each row) sees one device's rows. Run for real: three workers'
rewritten graphs in one session, each on a CPU device of its own (their
collectives between local devices), against one device on the global
batch."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from tests import models
from tests.unit.local_run import run_workers_together

tf1 = tf.compat.v1
N, STEPS, BATCH = 3, 4, 6
MODEL = "lmsampled_adagrad_clip"


def _one_device(name: str = MODEL, seeds: dict | None = None) -> dict:
    """One device's variables after STEPS steps; `seeds`: {op: [seed,
    seed2]} given to those random ops first."""
    model = models.build(name)
    for op, (seed, seed2) in (seeds or {}).items():
        model.graph.get_operation_by_name(op)._set_attr("seed", tf1.AttrValue(i=seed))
        model.graph.get_operation_by_name(op)._set_attr("seed2", tf1.AttrValue(i=seed2))
    with model.graph.as_default():
        init, variables = tf1.global_variables_initializer(), tf1.global_variables()
    with tf1.Session(graph=model.graph) as session:
        session.run(init)
        for step in range(STEPS):
            x, y = models.global_batch(name, step, BATCH)
            session.run(model.train_op, models.feed(model, x, y))
        return session.run({v.op.name: v for v in variables})


def _workers_together(run_option: str, name: str = MODEL) -> tuple[list[dict], object]:
    model = models.build(name)
    analysis = analyze_graph(model.graph)
    plan = make_plan(analysis, N, options=PlanOptions(run_option=run_option))
    rewritten = [rewrite_for_worker(model.graph, analysis, plan, w) for w in range(N)]
    with model.graph.as_default():
        names = [v.op.name for v in tf1.global_variables()]

    def train(session):
        per = BATCH // N
        for step in range(STEPS):
            x, y = models.global_batch(name, step, BATCH)
            feeds = {}
            for w in range(N):
                rows = slice(w * per, (w + 1) * per)
                feeds.update({f"w{w}/{t.name}": value for t, value in
                              models.feed(model, x[rows], y[rows]).items()})
            session.run([f"w{w}/{model.train_op.name}" for w in range(N)], feeds)
        return session.run([{n: f"w{w}/{n}/Read/ReadVariableOp:0" for n in names}
                            for w in range(N)])
    return run_workers_together(rewritten, train), build_report(analysis, plan), analysis


@pytest.mark.slow
def test_a_sampled_softmax_trains_as_one_device_under_a_global_norm():
    expected = _one_device()
    got, report, _ = _workers_together("allreduce")
    assert [(v.name, v.shared_rows) for v in report.variables if v.kind == "sparse"] == [
        ("embedding", 0), ("softmax/w", models.LM_SAMPLED), ("softmax/b", models.LM_SAMPLED)]
    assert (f"softmax/w: its gradient's last {models.LM_SAMPLED} rows are for ids every worker "
            "looks up alike" in report.table())
    for w, values in enumerate(got):
        for name, value in expected.items():
            np.testing.assert_allclose(values[name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"worker {w}: {name}")


@pytest.mark.slow
def test_a_sampler_without_a_seed_draws_alike_on_every_worker():
    """TensorFlow's word2vec tutorial's nce_loss gives its sampler no seed:
    each process would draw its own candidates, and the rows added over
    workers position by position would be other ids' (each worker's share
    of a candidate's sum landing on another worker's candidate). Every
    worker draws with the seeds the plan gives the sampler, as one device
    given them."""
    name = "lmsampledunseeded_adagrad_clip"
    got, report, analysis = _workers_together("allreduce", name)
    [(sampler, seeds)] = analysis.shared_draws.items()
    assert models.build(name).graph.get_operation_by_name(sampler).type == (
        "LogUniformCandidateSampler")
    assert seeds[0] and seeds[1]
    assert f"random draws every worker makes alike ('{sampler}'" in report.table()
    expected = _one_device(name, analysis.shared_draws)
    for w, values in enumerate(got):
        for var, value in expected.items():
            np.testing.assert_allclose(values[var], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"worker {w}: {var}")
