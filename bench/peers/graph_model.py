"""The workload as an ordinary single-device tf.compat.v1 training graph:
static-shape placeholders for one worker's batch, the model of bench.models,
plain SGD. autopar, the TF parameter-server peer, the Horovod peer and the
single-device reference all build their graph here; each only wraps the
optimizer or places variables its own way.
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from bench import models

tf1 = tf.compat.v1


@dataclass
class GraphModel:
    graph: tf.Graph
    inputs: dict            # input name -> placeholder (training batch, static shape)
    eval_inputs: dict       # input name -> placeholder (evaluation batch)
    loss: tf.Tensor
    eval_loss: tf.Tensor
    train_op: tf.Operation
    variables: dict
    global_step: tf.Variable
    optimizer: object

    def feed(self, batch: dict) -> dict:
        return {self.inputs[k]: v for k, v in batch.items()}

    def eval_feed(self, batch: dict) -> dict:
        return {self.eval_inputs[k]: v for k, v in batch.items()}


def build(workload: models.Workload, *, wrap_optimizer=None, partitioner=None,
          device=None, graph: tf.Graph | None = None) -> GraphModel:
    """`wrap_optimizer(opt)` may return a wrapping optimizer (SyncReplicas,
    Horovod); `partitioner(spec)` may return a tf1 partitioner for a variable
    (TF parameter servers); `device` is a device function/string for the whole
    model (replica_device_setter)."""
    graph = graph or tf.Graph()
    with graph.as_default(), tf1.device(device):
        inputs = {s.name: tf1.placeholder(s.dtype, s.shape, name=s.name) for s in workload.inputs()}
        eval_inputs = {s.name: tf1.placeholder(s.dtype, (None,) + tuple(s.shape[1:]), name="eval_" + s.name)
                       for s in workload.inputs()}

        def create(spec: models.VarSpec, init):
            part = partitioner(spec) if partitioner is not None else None
            return tf1.get_variable(spec.name, shape=spec.shape, dtype=tf.float32, initializer=init,
                                    partitioner=part, use_resource=True)

        variables = workload.build_variables(create)
        global_step = tf1.train.get_or_create_global_step()
        loss = tf.identity(workload.loss(variables, inputs), name="loss")
        eval_loss = tf.identity(workload.loss(variables, eval_inputs), name="eval_loss")
        opt = tf1.train.GradientDescentOptimizer(workload.lr)
        if wrap_optimizer is not None:
            opt = wrap_optimizer(opt)
        train_op = opt.minimize(loss, global_step=global_step)
    return GraphModel(graph, inputs, eval_inputs, loss, eval_loss, train_op, variables, global_step, opt)
