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

b_w is the leading dimension of what the loss's mean reduces (its
per-example losses: loss_reduction.batch_reduced), not of the first input the
loss reads, which may be a flat list of ids whose count differs between
workers of equal batches. Only where batches can differ: that dimension
must be unknown in the graph (a static one is the same on every worker).
A loss of the batch that shows no such mean leaves every gradient
unweighed (equal weights; the runner warns of batches of another size).
Not with
micro-batches (each is weighed 1/M: transforms.accumulate), nor with a
loss divided by a count of the batch's values (transforms.loss_counts
makes it exact already), nor with a summed loss (the workers' sums add up
whatever their sizes).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.graph_utils import INPUT_OP_TYPES, node_input_name
from autopar.transforms.keys import BATCH_WEIGHTS


class BatchWeights(GraphFeature):
    """Workers whose batches of a step may differ in size weigh their
    gradients by N * b / B."""
    name = "batch_weights"
    fields = ("batch_weights",)
    keys = (BATCH_WEIGHTS,)
    after = ("loss_counts",)   # a loss divided by a count needs no weights

    def find(self, facts):
        return {"batch_weights": find_batch_weights(
            facts.graph, facts.trained_seeds, facts.reduced_of, facts.input_ops,
            facts.index.of_types(INPUT_OP_TYPES))}

    def rewrite(self, ctx):
        plan = ctx.plan
        if not weighs_batches(ctx.analysis, plan.loss_reduction, plan.num_workers,
                              ctx.micro_batches):
            return None
        rewire, built = rewrite_batch_weights(ctx.graph, ctx.analysis.batch_weights, ctx.backend,
                                              BATCH_WEIGHTS, plan.num_workers)
        return Rewiring({node_input_name(k): node_input_name(v) for k, v in rewire.items()},
                        built)

    def report_fields(self, analysis, plan):
        return {"batch_tensors": sorted(set(analysis.batch_weights.values()))}


def find_batch_weights(graph: tf.Graph, seeds: list[tuple[str, str]], reduced_of,
                       batch_ops: set[str], input_ops=None) -> dict[str, str]:
    """{seed: the tensor whose leading dimension is its loss's batch} for
    the gradient seeds to weigh (tensor names). `seeds`: (seed op, the loss
    it differentiates) of the seeds whose backward pass trains a variable
    and computes no other seed's loss (analysis._trained_seeds); weighed
    are those whose loss is a mean over a batch of a size the graph leaves
    unknown: `reduced_of(loss)` gives the tensor that mean reduces
    (loss_reduction.batch_reduced; its leading dimension is the examples the mean
    divides by, which a flat list of ids read first would not be). A seed
    of a batch-dependent loss that shows no such mean leaves every gradient
    unweighed (equal weights, as before; the runner warns of unequal
    batches); `batch_ops`: the ops that depend on the batch; `input_ops`:
    the graph's ops of INPUT_OP_TYPES, when the caller's index has them."""
    if input_ops is None:
        input_ops = [op for op in graph.get_operations() if op.type in INPUT_OP_TYPES]
    if not any(t.shape.rank and t.shape[0] is None and t.dtype != tf.resource
               for op in input_ops for t in op.outputs):
        return {}   # every batch's size is known in the graph
    out = {}
    for seed, loss in seeds:
        if graph.get_tensor_by_name(loss).op.name not in batch_ops:
            continue
        reduced = reduced_of(loss)
        if reduced is None:
            return {}
        shape = graph.get_tensor_by_name(reduced).shape
        if shape.rank is None:
            return {}
        if shape[0] is None:
            out[graph.get_operation_by_name(seed).outputs[0].name] = reduced
    return out


def weighs_batches(analysis, loss_reduction: str, num_workers: int, micro_batches: int) -> bool:
    """Whether the workers' gradients are weighed by their batches' sizes
    (the module docstring's conditions; `analysis`: transforms.analysis's,
    None on one device)."""
    return bool(num_workers > 1 and analysis is not None and analysis.batch_weights
                and loss_reduction == "mean" and micro_batches == 1 and not analysis.loss_counts)


def rewrite_batch_weights(graph: tf.Graph, seeds: dict[str, str], backend, keys,
                          num_workers: int) -> tuple[dict[str, str], set[str]]:
    """Build this worker's weight N * b / B for each batch tensor in `graph`
    (the worker's scratch copy; `seeds`: seed -> the tensor whose leading
    dimension is its batch; `keys`: the instance-key range) and each seed
    times its weight. Returns (seed ->
    weighed seed, which the backward pass reads instead; the ops built
    here, which keep reading the seeds)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    weights: dict[str, tf.Tensor] = {}
    with tf.name_scope("autopar/batch_weight/"):
        for name, batch_tensor in seeds.items():
            if batch_tensor not in weights:
                batch = graph.get_tensor_by_name(batch_tensor)
                # float64: the sizes and N * b are exact, so equal sizes give 1.0
                mine = tf.cast(tf.shape(batch, out_type=tf.int64)[0], tf.float64)
                total = backend.allreduce_sum(tf.reshape(mine, [1]), keys.key(len(weights)))
                weights[batch_tensor] = (tf.constant(float(num_workers), tf.float64) * mine
                                        / tf.reshape(total, []))
            seed = graph.get_tensor_by_name(name)
            rewire[name] = (seed * tf.cast(weights[batch_tensor], seed.dtype)).name
    return rewire, {op.name for op in graph.get_operations()} - before
