"""LARSOptimizer against a numpy transcription of the paper's Figures 5 and 6."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.optimizers import LARSOptimizer

tf1 = tf.compat.v1

LR, MOMENTUM, DECAY, ETA = 0.5, 0.9, 1e-2, 0.02


def numpy_lars(w, v, g, scaled: bool, adapted: bool = True):
    """One step of Figure 5 (scaled) or Figure 6 (unscaled) with ε = LR·ETA."""
    beta = DECAY if adapted else 0.0
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if adapted and w_norm > 0 and g_norm > 0:
        lam = LR * ETA * w_norm / (g_norm + beta * w_norm)
    else:
        lam = LR
    if scaled:                                    # Figure 5
        v = MOMENTUM * v + (g + beta * w)
        w = w - lam * v
    else:                                         # Figure 6
        v = MOMENTUM * v + lam * (g + beta * w)
        w = w - v
    return w, v


def run_steps(initial: np.ndarray, grads: list[np.ndarray], *, scaled: bool, use_resource: bool,
              exclude=(), name="w"):
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable(name, initializer=tf.constant(initial), use_resource=use_resource)
        g = tf1.placeholder(tf.float64, initial.shape)
        opt = LARSOptimizer(LR, MOMENTUM, DECAY, ETA, scaled_momentum=scaled,
                            exclude_from_adaptation=exclude)
        train = opt.apply_gradients([(g, w)])
        slot = opt.get_slot(w, "momentum")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            out = []
            for grad in grads:
                sess.run(train, {g: grad})
                out.append(sess.run([w, slot]))
    return out


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("scaled", [True, False], ids=["figure5", "figure6"])
def test_matches_the_figure(scaled, use_resource):
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=(3, 4))
    grads = [rng.normal(size=(3, 4)) * s for s in (0.1, 1.0, 5.0, 0.01)]
    got = run_steps(w0, grads, scaled=scaled, use_resource=use_resource)
    w, v = w0, np.zeros_like(w0)
    for grad, (w_tf, v_tf) in zip(grads, got):
        w, v = numpy_lars(w, v, grad, scaled)
        np.testing.assert_allclose(w_tf, w, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(v_tf, v, rtol=1e-12, atol=1e-14)
    # The trust ratio mattered: plain momentum would have ended elsewhere.
    plain_w, plain_v = w0, np.zeros_like(w0)
    for grad in grads:
        plain_w, plain_v = numpy_lars(plain_w, plain_v, grad, scaled, adapted=False)
    assert np.abs(plain_w - got[-1][0]).max() > 1e-3


def test_figures_differ():
    rng = np.random.default_rng(4)
    w0, grads = rng.normal(size=(5,)), [rng.normal(size=(5,)) for _ in range(3)]
    fig5 = run_steps(w0, grads, scaled=True, use_resource=True)[-1][0]
    fig6 = run_steps(w0, grads, scaled=False, use_resource=True)[-1][0]
    assert np.abs(fig5 - fig6).max() > 1e-4


def test_zero_norms_fall_back_to_the_learning_rate():
    """A zero-initialised variable (‖w‖ = 0) and a zero gradient step like
    momentum with the plain learning rate, instead of never moving (λ = 0) or
    dividing 0 by 0."""
    grads = [np.array([0.0, 0.0]), np.array([1.0, -2.0]), np.array([0.5, 0.5])]
    got = run_steps(np.zeros(2), grads, scaled=True, use_resource=True)
    w, v = np.zeros(2), np.zeros(2)
    for grad, (w_tf, v_tf) in zip(grads, got):
        w, v = numpy_lars(w, v, grad, scaled=True)
        assert np.all(np.isfinite(w_tf))
        np.testing.assert_allclose(w_tf, w, rtol=1e-12, atol=1e-14)
    assert np.abs(got[-1][0]).max() > 0.1


def test_excluded_variables_take_plain_momentum():
    rng = np.random.default_rng(5)
    w0, grads = rng.normal(size=(4,)), [rng.normal(size=(4,)) for _ in range(3)]
    got = run_steps(w0, grads, scaled=False, use_resource=True, exclude=("bias",),
                    name="layer/bias")
    w, v = w0, np.zeros(4)
    for grad in grads:
        w, v = numpy_lars(w, v, grad, scaled=False, adapted=False)
    np.testing.assert_allclose(got[-1][0], w, rtol=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(AutoparError, match="weight_decay must be >= 0"):
        LARSOptimizer(0.1, weight_decay=-1.0)
    with pytest.raises(AutoparError, match="list of name substrings"):
        LARSOptimizer(0.1, exclude_from_adaptation="bias")
