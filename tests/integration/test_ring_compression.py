"""The ring all-reduce in float16 (Config.wire_dtype, as Horovod's fp16
compression): every bucket is cast to float16, summed in it around the ring
(flat, or by 2-D summation) and cast back, then averaged in float32. After 4 SGD steps every variable is within the bound
the wire precision allows of one device training on the same global batches,
and outside float32 summation tolerance (so the cast really happened).

The bound, from the arithmetic: with unit roundoff u (2^-11 for float16),
N workers' gradients g_i of one element, each cast
errs by at most u|g_i| and each of the N-1 additions by u times the partial
sum, so the mean errs by at most N u G (G = max_i |g_i|). SGD moves a
variable by lr times the gradient, so after S steps the variable is within
lr N u sum_t G_t, twice that for the small feedback of the perturbed
trajectory on later gradients. G_t per variable is measured here, on one
device, from the workers' shards of each step's global batch.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.integration.cluster import (load_worker, run_single_device, run_training, write_spec,
                                       write_two_host_spec)

tf1 = tf.compat.v1
MODEL, LR, STEPS, BATCH = "mlp_sgd", 0.3, 4, 12
UNIT_ROUNDOFF = 2.0 ** -11   # float16, round to nearest


def _shard_gradient_maxima(workers: int) -> dict[str, float]:
    """Per variable, sum over steps of max |gradient| over the workers'
    shards (mean loss over each shard), along one device's trajectory."""
    model = models.build(MODEL)
    with model.graph.as_default():
        variables = tf1.trainable_variables()
        grads = tf1.gradients(model.loss, variables)
        init = tf1.global_variables_initializer()
    totals = {v.op.name: 0.0 for v in variables}
    per = BATCH // workers
    with tf1.Session(graph=model.graph) as session:
        session.run(init)
        for step in range(STEPS):
            x, y = models.global_batch(MODEL, step, BATCH)
            for v, *shard_grads in zip(variables, *(
                    session.run(grads, models.feed(model, x[i * per:(i + 1) * per],
                                                   y[i * per:(i + 1) * per]))
                    for i in range(workers))):
                totals[v.op.name] += max(float(np.max(np.abs(g))) for g in shard_grads)
            session.run(model.train_op, models.feed(model, x, y))
    return totals


@pytest.mark.parametrize("layout", ["flat ring, 2 workers", "2-D summation, 3 workers on 2 hosts"])
def test_a_float16_ring_stays_within_its_precision_of_one_device(tmp_path, layout):
    wire = "float16"
    if layout.startswith("flat"):
        workers, spec, extra = 2, write_spec(tmp_path, workers=2), ()
    else:
        workers, spec = 3, write_two_host_spec(tmp_path, servers=(0, 0))
        extra = ("--hierarchical", "on")
    log = run_training(MODEL, tmp_path / "dist", "--steps", str(STEPS), "--batch", str(BATCH),
                       "--run-option", "allreduce", "--wire-dtype", wire, "--spec", str(spec),
                       "--stall-timeout", "40", *extra)
    assert re.search(rf"bucket #0: float32, .*, sent and summed as {wire}", log), log[-3000:]
    run_single_device(MODEL, tmp_path / "one", "--steps", str(STEPS), "--batch", str(BATCH))
    expected = load_worker(tmp_path / "one", 0)
    maxima = _shard_gradient_maxima(workers)
    outside_float32 = []
    for i in range(workers):
        actual = load_worker(tmp_path / "dist", i)
        assert set(actual) == set(expected)
        assert int(actual["global_step"]) == STEPS
        for name, total in maxima.items():
            bound = 2 * LR * workers * UNIT_ROUNDOFF * total + 1e-6
            error = float(np.max(np.abs(actual[name] - expected[name])))
            assert error <= bound, f"{layout}, worker {i}, {name}: {error:.3g} > {bound:.3g}"
            outside_float32.append(error > 1e-5 * float(np.max(np.abs(expected[name]))) + 1e-6)
    assert any(outside_float32), "the result is within float32 tolerance: nothing was compressed"
