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

What a step adds to state of its own from a mean over its batch (a Keras
`Mean` metric fed the batch's loss: its total grows by the loss, its count
by 1) is weighed alike: summed over workers (runner.combine_metrics,
autopar.fit's epoch logs), N equal shares give N times one device's
increment, and unequal ones the workers' mean of their means, not the
global batch's. Weighed by N * b / B, the workers' increments add up to N
times one device's on any split, as their counts do (N per step), so the
metric's result is one device's; a worker's own copy is its weighed
share. That holds whatever the gradients' combination (a summed loss
too), but for a loss divided by a count, and not with micro-batches. A
Mean fed one value per step that is a sum over the batch (a tracker of a
loss summed over the batch) adds up over workers already, but its count
does not: N per step, one device's 1, so its result would be 1/N of one
device's. Its additions are weighed by N (a constant: no
all-reduce), whatever the loss's reduction (find_batch_sum_increments).
A total no count divides (a Keras `Sum`) fed a mean over the batch has no
count to grow N per step: its additions are weighed by b / B, the worker's
share, so they add up over workers to one device's (find_batch_mean_totals;
before, N times it).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.graph_utils import (INPUT_OP_TYPES, in_gradient_scope, node_input_name,
                                            uncast)
from autopar.transforms.keys import BATCH_WEIGHTS
from autopar.transforms.lift import CALL_OP
from autopar.transforms.loss_reduction import batch_reduced, loss_reduction
from autopar.transforms.methods.base import Edits


class BatchWeights(GraphFeature):
    """Workers whose batches of a step may differ in size weigh their
    gradients by N * b / B."""
    name = "batch_weights"
    fields = ("batch_weights", "batch_mean_increments", "batch_sum_increments",
              "batch_mean_totals")
    keys = (BATCH_WEIGHTS,)
    # a loss divided by a count needs no weights; the examples' forms say
    # which axis of a mean runs over them
    after = ("loss_counts", "example_rows")

    def find(self, facts):
        input_ops = facts.index.of_types(INPUT_OP_TYPES)
        seeds = find_batch_weights(facts.graph, facts.trained_seeds, facts.reduced_of,
                                   facts.input_ops, input_ops)
        if not facts.trained_seeds:
            return {"batch_weights": seeds, "batch_mean_increments": {},
                    "batch_sum_increments": {}, "batch_mean_totals": []}
        # (only additions that run in training steps alone: an evaluation's
        # run would otherwise run the weight's all-reduce, which the
        # workers' evaluations need not run alike)
        in_step = ops_of_training_steps(facts.index, [seed for seed, _ in facts.trained_seeds])
        found = (facts.graph, facts.writers, facts.batch_local, facts.input_ops, in_step,
                 facts.shared["rows"])
        means = find_batch_mean_increments(*found)
        return {"batch_weights": seeds,
                "batch_mean_increments": means,
                "batch_sum_increments": find_batch_sum_increments(*found),
                "batch_mean_totals": find_batch_mean_totals(facts.graph, means)}

    def rewrite(self, ctx):
        plan, analysis = ctx.plan, ctx.analysis
        # (a metric's additions, whatever the gradients' combination; a
        # mean's not beside a loss divided by a count, which a worker's rows
        # do not weigh)
        metrics = plan.num_workers > 1 and ctx.micro_batches == 1
        means = analysis.batch_mean_increments if metrics and not analysis.loss_counts else {}
        sums = analysis.batch_sum_increments if metrics else {}
        weighs = weighs_batches(analysis, plan.loss_reduction, plan.num_workers,
                                ctx.micro_batches)
        if not (weighs or means or sums):
            return None
        rewire, built, increments = rewrite_batch_weights(
            ctx.graph, analysis.batch_weights if weighs else {}, ctx.backend, BATCH_WEIGHTS,
            plan.num_workers, means, sums, set(analysis.batch_mean_totals))
        return Rewiring({node_input_name(k): node_input_name(v) for k, v in rewire.items()},
                        built, edits=Edits(inputs=increments))

    def report_fields(self, analysis, plan):
        graph_writes = analysis.batch_mean_increments
        return {"batch_tensors": sorted(set(analysis.batch_weights.values())),
                "weighed_state": sorted({v for op, (v, _, _) in graph_writes.items()
                                         if op not in analysis.batch_mean_totals}),
                "weighed_totals": sorted({graph_writes[op][0]
                                          for op in analysis.batch_mean_totals}),
                "summed_state": sorted({v for v, _ in analysis.batch_sum_increments.values()})}


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


def ops_of_training_steps(index, seeds: list[str]) -> set[str]:
    """The ops that run in training steps alone: those after a backward
    pass (its `seeds`) by data or control edges, and a lifted traced
    function's every op (transforms.lift: its ops run only in a call of the
    function, a step, and TensorFlow orders them per variable only, so a
    metric's update is no successor of the optimizer's)."""
    reach = index.reachable([index.position[seed] for seed in seeds if seed in index.position],
                            extra=index.control_succs)
    call = index.position.get(CALL_OP)
    if call is not None:
        # (backwards from the call, along data and control inputs)
        inputs = [list(preds) for preds in index.preds]
        for i, succs in enumerate(index.control_succs):
            for j in succs:
                inputs[j].append(i)
        reach |= index.reachable([call], edges=inputs)
    return {index.names[i] for i in reach}


def find_batch_mean_increments(graph: tf.Graph, writers: dict[str, list[str]],
                               batch_local: set[str], batch_ops: set[str],
                               in_step: set[str] | None = None, rows=None
                               ) -> dict[str, tuple[str, str, str]]:
    """{op that adds a mean over the batch to a variable: (the variable, the
    added tensor, the tensor whose leading dimension is that batch)}: the
    additions a step makes to state of its own (not a gradient's:
    `batch_local`, the ops the batch feeds other than through the
    gradients) that run in training steps alone (`in_step`:
    ops_of_training_steps', when given) whose value is a mean over a batch
    of a size the graph leaves unknown, as the loss's mean is (loss_reduction.batch_reduced: a
    reduce_mean over the batch, a sum over it divided by its count, terms
    averaged alike). An addition is an AssignAdd, or an assignment of the
    variable's value plus the tensor (Keras 3's `v.assign(v + x)`: the op is
    then the Add). A sum over the batch (an accuracy's matches) or a
    constant (a count's 1) adds up over workers already: not among them.
    `rows`: the examples' forms (transforms.example_rows), when known."""
    out = {}
    for variable, adding, added in _batch_additions(graph, writers, batch_local, in_step):
        reduced = batch_reduced(graph, added.name, batch_ops, rows)
        if reduced is None:
            continue
        shape = graph.get_tensor_by_name(reduced).shape
        if shape.rank and shape[0] is None:
            out[adding.name] = (variable, added.name, reduced)
    return out


def find_batch_mean_totals(graph: tf.Graph, increments: dict[str, tuple[str, str, str]]
                           ) -> list[str]:
    """The ops of `increments` (find_batch_mean_increments') that add to a
    total no variable divides (Keras's `Sum`, which has no count), sorted:
    weighed by the worker's share b / B instead of N * b / B."""
    divisors = _divisors(graph, {variable for variable, _, _ in increments.values()})
    return sorted(op for op, (variable, _, _) in increments.items() if not divisors[variable])


def find_batch_sum_increments(graph: tf.Graph, writers: dict[str, list[str]],
                              batch_local: set[str], batch_ops: set[str],
                              in_step: set[str] | None = None, rows=None
                              ) -> dict[str, tuple[str, str]]:
    """{op that adds a sum over the batch, fed as one value, to a mean's
    total: (the variable, the tensor added)}, for the additions a step makes
    to state of its own that run in training steps alone (`in_step`, as
    find_batch_mean_increments'). Found from data flow, as Keras's `Mean`
    builds it: the value added is a reduction of a scalar (the Mean's own
    sum of what it is fed, which a scalar leaves as it is) whose value is a
    sum over the batch (loss_reduction: a reduce_sum of the examples'
    terms); the variable's value is divided by another variable's (the
    mean's result), and everything added to that one (its count) is
    independent of the batch. A tensor of the batch's examples fed to a
    Mean adds their number to its count, which adds up over workers: not
    among them; nor a total with no count (Keras's `Sum`), which adds up
    too. `rows`: as find_batch_mean_increments'."""
    out = {}
    counted: dict[str, bool] = {}   # variable -> whether it is a mean's total
    for variable, adding, added in _batch_additions(graph, writers, batch_local, in_step):
        fed = _scalar_reduced(added)
        if fed is None or loss_reduction(graph, fed.name, batch_ops, rows)[0] != "sum":
            continue
        if variable not in counted:
            count = _divided_by(graph, variable)
            counted[variable] = count is not None and _counts_steps(
                graph, writers.get(count, []), batch_local)
        if counted[variable]:
            out[adding.name] = (variable, added.name)
    return out


def _batch_additions(graph: tf.Graph, writers: dict[str, list[str]], batch_local: set[str],
                     in_step: set[str] | None):
    """(variable, the op adding to it, the tensor added) for each addition
    of a value of the batch a step makes to state of its own (not a
    gradient's: `batch_local`, the ops the batch feeds other than through
    the gradients) that runs in training steps alone (`in_step`, when
    given)."""
    for variable, ops in writers.items():
        for name in ops:
            op = graph.get_operation_by_name(name)
            if (name not in batch_local or in_gradient_scope(name) or len(op.inputs) < 2
                    or (in_step is not None and name not in in_step)):
                continue
            added = _added_to(op)
            if added is not None and added[1].op.name in batch_local:
                yield variable, added[0], added[1]


def _scalar_reduced(t: tf.Tensor) -> tf.Tensor | None:
    """The scalar `t` reduces (a Sum or Mean of a rank-0 tensor, through
    casts and identities), else None."""
    t = uncast(t)
    if t.op.type not in ("Sum", "Mean") or t.op.inputs[0].shape.rank != 0:
        return None
    return t.op.inputs[0]


def _divided_by(graph: tf.Graph, variable: str) -> str | None:
    """The variable whose value the value of `variable` is divided by (a
    mean's total by its count), through casts and identities; None if none,
    or several."""
    found = _divisors(graph, {variable})[variable]
    return next(iter(found)) if len(found) == 1 and variable not in found else None


def _divisors(graph: tf.Graph, variables: set[str]) -> dict[str, set[str]]:
    """{each of `variables`: the variables its value is divided by
    (DivNoNan, RealDiv, Div), through casts and identities}, in one pass
    over the graph."""
    found: dict[str, set[str]] = {v: set() for v in variables}
    for op in graph.get_operations():
        if op.type in ("DivNoNan", "RealDiv", "Div"):
            divided = found.get(_read_of(uncast(op.inputs[0])))
            if divided is None:
                continue
            divisor = uncast(op.inputs[1])
            if divisor.op.type == "ReadVariableOp":
                divided.add(divisor.op.inputs[0].op.name)
            elif divisor.op.type in ("VariableV2", "Variable"):
                divided.add(divisor.op.name)
    return found


def _counts_steps(graph: tf.Graph, writers: list[str], batch_local: set[str]) -> bool:
    """Whether every write of a variable adds a value independent of the
    batch to it (a count of updates, not of examples)."""
    added = [_added_to(graph.get_operation_by_name(name)) for name in writers]
    return bool(added) and all(a is not None and a[1].op.name not in batch_local for a in added)


def _added_to(writer: tf.Operation) -> tuple[tf.Operation, tf.Tensor] | None:
    """(the op that adds it, the tensor added) when `writer` adds a tensor
    to its variable, else None."""
    if writer.type in ("AssignAddVariableOp", "AssignAdd"):
        return writer, writer.inputs[1]
    if writer.type not in ("AssignVariableOp", "Assign"):
        return None
    add = writer.inputs[1].op
    if add.type not in ("Add", "AddV2"):
        return None
    handle = writer.inputs[0].op
    reads = [i for i, t in enumerate(add.inputs) if _reads(t, handle)]
    if len(reads) != 1:
        return None
    return add, add.inputs[1 - reads[0]]


def _reads(t: tf.Tensor, handle: tf.Operation) -> bool:
    """Whether `t` is the value of the variable `handle` (a resource read,
    or a reference variable itself, through identities)."""
    return _read_of(t) == handle.name


def _read_of(t: tf.Tensor) -> str:
    """The op `t` is the value of, through identities: a resource read's
    handle, else the op itself (a reference variable's)."""
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    return t.op.inputs[0].op.name if t.op.type == "ReadVariableOp" else t.op.name


def weighs_batches(analysis, loss_reduction: str, num_workers: int, micro_batches: int) -> bool:
    """Whether the workers' gradients are weighed by their batches' sizes
    (the module docstring's conditions; `analysis`: transforms.analysis's,
    None on one device)."""
    return bool(num_workers > 1 and analysis is not None and analysis.batch_weights
                and loss_reduction == "mean" and micro_batches == 1 and not analysis.loss_counts)


def rewrite_batch_weights(graph: tf.Graph, seeds: dict[str, str], backend, keys,
                          num_workers: int,
                          increments: dict[str, tuple[str, str, str]] | None = None,
                          sums: dict[str, tuple[str, str]] | None = None,
                          totals: set[str] = frozenset()
                          ) -> tuple[dict[str, str], set[str], dict[str, dict[str, str]]]:
    """Build this worker's weight N * b / B for each batch tensor in `graph`
    (the worker's scratch copy; `seeds`: seed -> the tensor whose leading
    dimension is its batch; `increments`: find_batch_mean_increments';
    `keys`: the instance-key range), each seed times its weight and each
    increment's value times its own (divided by N for those in `totals`,
    find_batch_mean_totals': a total with no count); each of `sums`'
    (find_batch_sum_increments') values times N. Returns (seed -> weighed
    seed, which the backward pass reads instead; the ops built for the
    seeds, which keep reading them; {adding op: {its value: the weighed
    value}}, for that op alone: the value's other readers, the step's logs,
    keep it)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    weights: dict[str, tf.Tensor] = {}

    def weight(batch_tensor: str) -> tf.Tensor:
        if batch_tensor not in weights:
            batch = graph.get_tensor_by_name(batch_tensor)
            # float64: the sizes and N * b are exact, so equal sizes give 1.0
            mine = tf.cast(tf.shape(batch, out_type=tf.int64)[0], tf.float64)
            total = backend.allreduce_sum(tf.reshape(mine, [1]), keys.key(len(weights)))
            weights[batch_tensor] = (tf.constant(float(num_workers), tf.float64) * mine
                                     / tf.reshape(total, []))
        return weights[batch_tensor]
    with tf.name_scope("autopar/batch_weight/"):
        for name, batch_tensor in seeds.items():
            seed = graph.get_tensor_by_name(name)
            rewire[name] = (seed * tf.cast(weight(batch_tensor), seed.dtype)).name
        inputs: dict[str, dict[str, str]] = {}
        weighed_values = set()
        for name, (_, added, batch_tensor) in sorted((increments or {}).items()):
            value = graph.get_tensor_by_name(added)
            factor = weight(batch_tensor)
            if name in totals:   # b / B: no count grows N per step beside it
                factor = factor / tf.constant(float(num_workers), tf.float64)
            weighed = value * tf.cast(factor, value.dtype)
            weighed_values.add(weighed.op.name)
            inputs[name] = {node_input_name(value.name): node_input_name(weighed.name)}
        for name, (_, added) in sorted((sums or {}).items()):
            value = graph.get_tensor_by_name(added)
            weighed = value * tf.constant(num_workers, value.dtype)
            weighed_values.add(weighed.op.name)
            inputs[name] = {node_input_name(value.name): node_input_name(weighed.name)}
    # Exempt from the features' replacements: what reads the seeds (the
    # weighed seeds would read themselves) and the weights (which read
    # nothing replaced); a weighed value reads what the step computes.
    built = {op.name for op in graph.get_operations()} - before - weighed_values
    return rewire, built, inputs
