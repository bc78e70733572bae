"""Steps whose workers' batches differ in size.

A finite dataset's last batch seldom splits evenly: autopar.shard before
.batch(b) gives 7 examples over 3 workers as 3/2/2. With a loss averaged
over each worker's batch, worker w's gradient is (1/b_w) times the sum of
its examples' gradients, and one device's is (1/B) times the sum over all B
examples; averaging the workers' gradients with equal weights is that only
when every b_w is B/N. So each worker weighs its gradients by N * b_w / B
(B the sum of the b_w over workers, one scalar all-reduce per step), and
the average of the weighted gradients is one device's on any split. Equal
batches give a weight of exactly 1.0 (N * b and B are the same integer), so
a step that splits evenly is computed bit for bit as without the weight.

The weight multiplies the gradient seed of every loss a train op is
trained on (the initial gradient that tf.gradients or a tape's gradient()
starts the backward pass from), so everything the backward pass computes
is weighed, and so is what other workers add into it (batch normalisation
over the workers), while the forward pass and the loss a worker reports
stay its own. A seed the losses themselves are computed from (the inner
tape of a gradient penalty) is not weighed: it is part of the forward
pass.

Only where batches can differ: the batch's leading dimension must be
unknown in the graph (a static one is the same on every worker). Not with
micro-batches (each is weighed 1/M: transforms.accumulate), nor with a
loss divided by a count of the batch's values (transforms.loss_counts
makes it exact already), nor with a summed loss (the workers' sums add up
whatever their sizes).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.graph_utils import (INPUT_OP_TYPES, VARIABLE_OP_TYPES, in_gradient_scope,
                                            tape_seeds)


def find_batch_weights(graph: tf.Graph, tf1_seeds: list[tuple[str, str]], losses: list[str],
                       gradients: set[str]) -> dict[str, str]:
    """{seed: batch input} for the gradient seeds to weigh (tensor names):
    of tf.gradients' seeds (`tf1_seeds`: (seed op, the tensor it
    differentiates)) and the tapes', those whose backward pass reaches a
    gradient a variable is updated with (`gradients`: tensor names), from
    which no differentiated tensor is computed (`losses`, the tf.gradients
    targets and the tapes': tf.GraphKeys.LOSSES), and whose batch can differ
    in size between workers (_batch_input)."""
    if not any(t.shape.rank and t.shape[0] is None and t.dtype != tf.resource
               for op in graph.get_operations() if op.type in INPUT_OP_TYPES for t in op.outputs):
        return {}   # every batch's size is known in the graph
    candidates = [graph.get_operation_by_name(s) for s, _ in tf1_seeds]
    candidates += [op for op in tape_seeds(graph.get_operations()) if op not in candidates]
    if not candidates:
        return {}
    targets = [graph.get_tensor_by_name(t).op for t in losses]
    targets += [graph.get_tensor_by_name(t).op for _, t in tf1_seeds]
    targets += [t.op for t in graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)
                if isinstance(t, tf.Tensor)]
    before_losses = _ancestors(targets)
    wanted = {t.split(":")[0] for t in gradients}
    position = {op.name: i for i, op in enumerate(graph.get_operations())}
    out = {}
    for seed in candidates:
        if seed.name in before_losses:
            continue
        backward = _backward(seed)
        if not backward & wanted:
            continue
        batch = _batch_input(graph, backward, position)
        if batch is not None:
            out[seed.outputs[0].name] = batch
    return out


def _batch_input(graph: tf.Graph, backward: set[str], position: dict[str, int]) -> str | None:
    """The input tensor whose leading dimension is a worker's batch size for
    the backward pass `backward` (op names): the first, in graph order, of
    rank one or more that the forward tensors it reads are computed from;
    None when there is none, or when its leading dimension is known in the
    graph (every worker's batch then has that size)."""
    # the forward ops the backward pass reads and what they are computed
    # from, not crossing a variable
    stack = [x.op for name in backward for x in graph.get_operation_by_name(name).inputs
             if not in_gradient_scope(x.op.name)]
    forward: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in forward or in_gradient_scope(op.name) or op.type in VARIABLE_OP_TYPES:
            continue
        forward.add(op.name)
        stack.extend(x.op for x in op.inputs)
    inputs = sorted((name for name in forward
                     if graph.get_operation_by_name(name).type in INPUT_OP_TYPES),
                    key=position.__getitem__)
    for name in inputs:
        for t in graph.get_operation_by_name(name).outputs:
            if (t.dtype != tf.resource and t.shape.rank
                    and any(c.name in forward or c.name in backward for c in t.consumers())):
                return None if t.shape[0] is not None else t.name
    return None


def weighs_batches(analysis, loss_reduction: str, num_workers: int, micro_batches: int) -> bool:
    """Whether the workers' gradients are weighed by their batches' sizes
    (the module docstring's conditions; `analysis`: transforms.analysis's,
    None on one device)."""
    return bool(num_workers > 1 and analysis is not None and analysis.batch_weights
                and loss_reduction == "mean" and micro_batches == 1 and not analysis.loss_counts)


def rewrite_batch_weights(graph: tf.Graph, seeds: dict[str, str], backend, keys,
                          num_workers: int) -> tuple[dict[str, str], set[str]]:
    """Build this worker's weight N * b / B for each batch input in `graph`
    (the worker's scratch copy; `seeds`: seed -> its batch input; `keys`:
    the instance-key range) and each seed times its weight. Returns (seed ->
    weighed seed, which the backward pass reads instead; the ops built
    here, which keep reading the seeds)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    weights: dict[str, tf.Tensor] = {}
    with tf.name_scope("autopar/batch_weight/"):
        for name, batch_input in seeds.items():
            if batch_input not in weights:
                batch = graph.get_tensor_by_name(batch_input)
                # float64: the sizes and N * b are exact, so equal sizes give 1.0
                mine = tf.cast(tf.shape(batch, out_type=tf.int64)[0], tf.float64)
                total = backend.allreduce_sum(tf.reshape(mine, [1]), keys.key(len(weights)))
                weights[batch_input] = (tf.constant(float(num_workers), tf.float64) * mine
                                        / tf.reshape(total, []))
            seed = graph.get_tensor_by_name(name)
            rewire[name] = (seed * tf.cast(weights[batch_input], seed.dtype)).name
    return rewire, {op.name for op in graph.get_operations()} - before


def _ancestors(roots: list[tf.Operation]) -> set[str]:
    """Every op `roots` are computed from (data edges: not what a read of a
    variable waits for, such as a GAN's first update before its second
    loss)."""
    seen = {op.name for op in roots}
    stack = list(roots)
    while stack:
        op = stack.pop()
        for x in [t.op for t in op.inputs]:
            if x.name not in seen:
                seen.add(x.name)
                stack.append(x)
    return seen


def _backward(seed: tf.Operation) -> set[str]:
    """The ops computed from `seed` (data edges): its backward pass and what
    reads the gradients."""
    seen, stack = {seed.name}, [seed]
    while stack:
        op = stack.pop()
        for t in op.outputs:
            for c in t.consumers():
                if c.name not in seen:
                    seen.add(c.name)
                    stack.append(c)
    return seen
