"""Optimizers for large-batch training that TensorFlow does not ship.

`LARSOptimizer`: layer-wise adaptive rate scaling as in the MLPerf-0.6
ResNet-50 reference (Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3
Pods", Figure 5), with the update of You et al. (Figure 6) as an option. It
is an ordinary `tf.compat.v1.train.Optimizer`: its update of variable v is
built under "<name>/update_<v>" with one slot ("momentum"), so autopar's
analysis finds its gradients, update ops and slots like those of the built-in
optimizers, and each trust ratio is computed from the whole variable and its
whole, already combined gradient: exactly one device's.
"""
from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from autopar.common.errors import AutoparError

tf1 = tf.compat.v1


class LARSOptimizer(tf1.train.Optimizer):
    """For each variable w with gradient g (β = weight_decay, m = momentum):

        λ = learning_rate · eta · ‖w‖ / (‖g‖ + β‖w‖)      (learning_rate when ‖w‖ or ‖g‖ is 0)
        scaled_momentum=True  (Figure 5, the MLPerf-0.6 reference):
            v ← m·v + (g + βw);      w ← w − λ·v
        scaled_momentum=False (Figure 6, You et al.):
            v ← m·v + λ·(g + βw);    w ← w − v

    The paper's ε is learning_rate · eta: keeping them apart lets the learning
    rate follow a schedule (a tensor or a callable) while eta stays the LARS
    coefficient. The trust ratio falls back to 1 where a norm is zero (a
    zero-initialised bias), as the reference implementations do, so such a
    variable still moves. Variables whose name contains one of
    `exclude_from_adaptation` (e.g. "bias", "batch_normalization") get plain
    momentum: no trust ratio and no weight decay, as MLPerf's ResNet-50 does
    for biases and batch-norm parameters. Sparse (IndexedSlices) gradients
    are applied densely: weight decay moves every row anyway."""

    def __init__(self, learning_rate, momentum: float = 0.9, weight_decay: float = 1e-4,
                 eta: float = 0.001, *, scaled_momentum: bool = True,
                 exclude_from_adaptation: Sequence[str] = (), use_locking: bool = False,
                 name: str = "LARS"):
        for what, value in (("momentum", momentum), ("weight_decay", weight_decay), ("eta", eta)):
            if not callable(value) and not isinstance(value, tf.Tensor) and float(value) < 0:
                raise AutoparError(f"LARSOptimizer: {what} must be >= 0, got {value}")
        if isinstance(exclude_from_adaptation, str):
            raise AutoparError("LARSOptimizer: exclude_from_adaptation is a list of name "
                               f"substrings, got the string {exclude_from_adaptation!r}")
        super().__init__(use_locking, name)
        self._learning_rate = learning_rate
        self._momentum = momentum
        self._weight_decay = weight_decay
        self._eta = eta
        self._scaled_momentum = bool(scaled_momentum)
        self._exclude = tuple(exclude_from_adaptation)

    def _create_slots(self, var_list):
        for v in var_list:
            self._zeros_slot(v, "momentum", self._name)

    def _prepare(self):
        def tensor(value, name):
            value = value() if callable(value) else value
            # Python numbers stay numbers: _hyper makes them constants of the
            # variable's dtype (0.02 through float32 would be off by 2e-8).
            return value if isinstance(value, (int, float)) else tf.convert_to_tensor(value, name=name)
        self._lr_t = tensor(self._learning_rate, "learning_rate")
        self._momentum_t = tensor(self._momentum, "momentum")
        self._weight_decay_t = tensor(self._weight_decay, "weight_decay")
        self._eta_t = tensor(self._eta, "eta")

    @staticmethod
    def _hyper(value, dtype) -> tf.Tensor:
        if isinstance(value, (int, float)):
            return tf.constant(value, dtype)
        return tf.cast(value, dtype)

    def _adapted(self, var) -> bool:
        name = var.op.name
        return not any(s in name for s in self._exclude)

    def _update(self, grad: tf.Tensor, var) -> tf.Operation:
        dtype = var.dtype.base_dtype
        lr = self._hyper(self._lr_t, dtype)
        m = self._hyper(self._momentum_t, dtype)
        v = self.get_slot(var, "momentum")
        w = tf.convert_to_tensor(var)
        if self._adapted(var):
            beta = self._hyper(self._weight_decay_t, dtype)
            w_norm = tf.norm(w)
            g_norm = tf.norm(grad)
            zero = tf.zeros([], dtype)
            both = tf.logical_and(tf.greater(w_norm, zero), tf.greater(g_norm, zero))
            # Divide only where it is defined: tf.where would still evaluate 0/0.
            denominator = tf.where(both, g_norm + beta * w_norm, tf.ones([], dtype))
            trust = tf.where(both, self._hyper(self._eta_t, dtype) * w_norm / denominator,
                             tf.ones([], dtype))
            step = lr * trust
            direction = grad + beta * w
        else:
            step, direction = lr, grad
        if self._scaled_momentum:      # Figure 5
            new_v = m * tf.convert_to_tensor(v) + direction
            delta = step * new_v
        else:                          # Figure 6
            new_v = m * tf.convert_to_tensor(v) + step * direction
            delta = new_v
        update_v = tf1.assign(v, new_v, use_locking=self._use_locking)
        update_w = tf1.assign_sub(var, delta, use_locking=self._use_locking)
        return tf.group(update_v, update_w)

    def _apply_dense(self, grad, var):
        return self._update(grad, var)

    def _resource_apply_dense(self, grad, handle):
        return self._update(grad, handle)

    def _dense_of(self, values, indices, var):
        return tf.math.unsorted_segment_sum(values, indices, tf.shape(var, out_type=indices.dtype)[0])

    def _apply_sparse(self, grad, var):
        return self._update(self._dense_of(grad.values, grad.indices, var), var)

    def _resource_apply_sparse(self, grad, handle, indices):
        return self._update(self._dense_of(grad, indices, handle), handle)
