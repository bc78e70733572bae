"""Random draws per example: dropout masks, Gaussian noise on activations,
a GAN's latent vectors and label noise.

One device draws a mask for the global batch of B examples; a worker's
graph draws one for its own b. Seeded the same way on every worker (a graph
seed, or a Keras seed generator's state, which starts equal everywhere),
every worker would draw the same b rows: each worker's examples would get
the masks of the first b examples of one device's batch, the same ones on
every worker, where one device gives every example its own.

A draw is per example when its shape's first element counts the batch's
examples (transforms.example_rows): tf.shape(x)[0] of a tensor of the
batch's rows, a noise shape built from it, the shape of a concatenation of
such tensors (a GAN's labels for its fake rows then its real ones: 2 blocks
of b rows), or a tensor whose examples have g rows each (g static); or,
when TensorFlow folded the batch's static size into a constant shape, a
constant first element that is neither 1 nor unlike the batch tensor the
draw is combined with elementwise (a dropout mask multiplying the
activations). A draw whose first dimension is 1 (a noise shape shared over
the batch) or whose shape does not depend on the batch (noise on a weight,
a sampled softmax's candidates) is one device's draw as it is: every worker
draws the same, as one device draws it once.

The rewrite makes worker w draw the global batch's k * B * g rows (k
blocks of B examples of g rows), with the op's own seed and state (a
stateful op's generator then advances as one device's does), and keep, in
every block, the rows of examples w, w+N, w+2N, ...: the worker's examples
when worker w holds examples w, w+N, ... of each global batch, which is how
autopar.shard and autopar.fit split it, in equal shares or not (32 examples
on 3 workers: 11/11/10). B is the sum of the workers' b: where the graph
leaves the batch's size unknown, a training step adds them up (one scalar
all-reduce, which the runner asks for by feeding the rewrite's in-step
flag); a run that is no training step (an evaluation on the chief alone)
takes B = N * b, so it waits for no other worker.

A draw over padded sequences ([b, L, d] where the graph leaves L unknown)
is per example too when each of its shape's other elements is computed from
the inputs' padded lengths and constants alone: a training step checks that
every worker padded those inputs to one device's lengths
(transforms.padded_lengths), so such an element is one device's. That is
shown with TensorFlow's own shape inference (`PinnedLengths`): in copies of
the graph whose checked inputs have one static length on each padded axis
and several batch sizes, the element is known and the same; one computed
from anything else (a maximum of the ids' lengths, a length of an input no
trained loss reads, hence unchecked, the batch's size) is not.

Every draw a training step makes that is not per example (a sampled
softmax's candidates, noise on a weight, one coin for the whole batch) is
one device's only if every worker draws it alike: the worker's graph gives
each such op the seeds it has in the process that compiled the plan (a
process whose script made other random ops before it, on the chief alone,
has other seeds from the graph seed), and an op with none (no
graph seed nor op seed: each process would draw its own, and rows of
candidates added over workers position by position would be other ids')
gets TensorFlow's default graph seed and a number from its name. Only
draws a training step's writes depend on: an initializer's draw runs on
the chief alone and is broadcast, and stays unseeded.

A random op that depends on the batch otherwise (a categorical draw from
per-example logits, a shuffle of the batch, a shape whose first element is
not a count of the examples, a per-example rate, a shape holding a length
that one device's batch would have otherwise) is refused by name: no split
of one device's draw gives each worker its share.
"""
from __future__ import annotations

import zlib

import tensorflow as tf
from tensorflow.python.framework import op_def_registry   # an op type's OpDef
from tensorflow.python.framework import tensor_util   # try_evaluate_constant

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.example_rows import BATCH, SHARED, ExampleRows
from autopar.transforms.features.base import GraphFeature, Rewiring, in_step_cond, in_step_flag
from autopar.transforms.graph_utils import (INPUT_OP_TYPES, function_calls, functions_run_by,
                                            library_functions, node_input_name, op_name_of,
                                            v1_loop_frames)
from autopar.transforms.keys import BATCH_DRAWS
from autopar.transforms.ops import copy_op

tf1 = tf.compat.v1

# Random ops whose output's leading dimensions are a shape input: the input's index.
SHAPED_DRAWS = {
    **dict.fromkeys(("RandomUniform", "RandomStandardNormal", "TruncatedNormal",
                     "RandomUniformInt", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
                     "ParameterizedTruncatedNormal", "StatelessRandomUniform",
                     "StatelessRandomNormal", "StatelessTruncatedNormal",
                     "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
                     "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                     "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
                     "StatelessRandomUniformFullIntV2", "StatelessRandomBinomial",
                     "StatelessRandomGammaV2", "StatelessRandomGammaV3",
                     "StatelessRandomPoisson", "StatelessParameterizedTruncatedNormal"), 0),
    # tf.random.Generator's ops: (state, algorithm, shape, ...)
    **dict.fromkeys(("StatefulUniform", "StatefulStandardNormal", "StatefulStandardNormalV2",
                     "StatefulTruncatedNormal", "StatefulUniformInt",
                     "StatefulUniformFullInt"), 2),
}
# Random ops without such a shape: refused when they depend on the batch.
OTHER_DRAWS = frozenset({"Multinomial", "StatelessMultinomial", "RandomShuffle",
                         "StatelessShuffle", "RandomCrop", "RngSkip",
                         "RandomIndexShuffle", "StatelessRandomGetKeyCounter",
                         "StatelessRandomGetKeyCounterAlg"})
# tf.random.Generator's read of its state, advanced by `delta` (input 2): the
# number of values of the draw that follows, the product of its shape.
SKIP = "RngReadAndSkip"
# Where a worker's graph draws the global batch's rows (rewrite_batch_draws).
BATCH_DRAWS_SCOPE = "autopar/batch_draws/"
# The first seed of a shared draw that has none: TensorFlow's own for an op
# given a seed in a graph without one (random_seed.DEFAULT_GRAPH_SEED).
UNSEEDED_GRAPH_SEED = 87654321


class RandomDraws(GraphFeature):
    """Per-example random draws: each worker draws the global batch's rows
    and keeps its examples'."""
    name = "random_draws"
    fields = ("batch_draws", "shared_draws")
    keys = (BATCH_DRAWS,)
    after = ("example_rows", "padded_lengths")

    def find(self, facts):
        # (a variable's gradient is a sum over the batch, whatever its shape:
        # a draw of its shape, noise added to it, is not per example)
        gradients = {op_name_of(t) for t in facts.gradients}
        batch_draws = find_batch_draws(
            facts.graph, facts.shared["rows"], facts.batch_local - gradients,
            facts.index.of_types({SKIP, *OTHER_DRAWS, *SHAPED_DRAWS}),
            PinnedLengths(facts.graph, facts.found["padded_inputs"],
                          facts.index.of_types(INPUT_OP_TYPES)))
        index = facts.index
        # what a training step's writes depend on
        written = index.computing([w for ws in facts.writers.values() for w in ws])
        refuse_draws_in_functions(facts.graph, index, written)
        # (a draw no write depends on runs in no training step: tf.vectorized_map
        # leaves its function's own ops beside their vectorized copies)
        batch_draws = {name: shape for name, shape in batch_draws.items()
                       if index.position[name] in written}
        return {"batch_draws": batch_draws,
                "shared_draws": find_shared_draws(index, written, batch_draws)}

    def check(self, analysis, plan, config):
        if config.micro_batches > 1 and analysis.batch_draws:
            raise UnsupportedGraphError(
                f"Config(micro_batches={config.micro_batches}) with random draws per example "
                f"('{next(iter(analysis.batch_draws))}', a dropout mask): each micro-batch "
                "would draw its own rows, where one device draws the whole batch's at once. Use "
                "micro_batches=1 for this program")

    def rewrite(self, ctx):
        """(tensor -> replacement, ops exempt, and the in-step flag the
        runner feeds True in a training step: WorkerGraph.in_step). B, the
        step's examples: N * b where the graph fixes b; else, in a training
        step, the workers' b added up (they may differ: a dataset's last
        batch, 32 rows on 3 workers), and N * b in any other run, which then
        waits for no other worker."""
        analysis, plan, backend = ctx.analysis, ctx.plan, ctx.backend
        if plan.num_workers == 1 or not (analysis.batch_draws or analysis.shared_draws):
            return None
        if not analysis.batch_draws:
            return Rewiring(state=analysis.shared_draws)
        n = plan.num_workers
        flag = in_step_flag(ctx.graph)
        totals: list[tf.Tensor] = []

        def global_batch(b: tf.Tensor) -> tf.Tensor:
            static = tf.get_static_value(b)
            if static is not None:
                return tf.constant(n * int(static), tf.int64)
            if not totals:   # every draw's b counts the same examples
                totals.append(in_step_cond(flag, lambda: tf.cast(tf.reshape(
                    backend.allreduce_sum(tf.reshape(tf.cast(b, tf.float64), [1]),
                                          BATCH_DRAWS.key(0)), []), tf.int64), lambda: b * n))
            return totals[0]
        rewire, built = rewrite_batch_draws(ctx.graph, analysis.batch_draws, n, ctx.worker_index,
                                            global_batch, analysis.batch_input)
        built.add(flag.op.name)
        return Rewiring({node_input_name(k): node_input_name(v) for k, v in rewire.items()},
                        built, outputs={"in_step": flag.name}, state=analysis.shared_draws)

    def edit_graph_def(self, graph_def, ctx, rewiring):
        """Every shared draw's seeds: the plan's (find_shared_draws)."""
        seeds = rewiring.state
        for node in graph_def.node:
            if node.name in seeds:
                node.attr["seed"].i, node.attr["seed2"].i = seeds[node.name]

    def report_fields(self, analysis, plan):
        return {"batch_draws": list(analysis.batch_draws),
                "shared_draws": dict(analysis.shared_draws)}


def find_shared_draws(index, written: set[int],
                      batch_draws: dict[str, list[int]]) -> dict[str, list[int]]:
    """{random op seeded by attributes whose draw a training step's writes
    depend on (`written`: the positions of what they depend on) and that is
    not per example (not in `batch_draws`): [seed, seed2]}, the ones it has
    here, or UNSEEDED_GRAPH_SEED and a number from its name for an op with
    none (the module's docstring). A queue or a reader that takes seeds (its
    output a handle) draws nothing a step computes with."""
    types = [t for t in index.op_types() if _seeded_by_attributes(t)]
    ops = [op for op in index.of_types(types) if op.name not in batch_draws
           and not any(t.dtype in (tf.resource, tf.variant, tf.string) or t.dtype._is_ref_dtype
                       for t in op.outputs)]
    out = {}
    for op in ops:
        if index.position[op.name] not in written:
            continue
        seed, seed2 = op.get_attr("seed"), op.get_attr("seed2")
        if seed == 0 and seed2 == 0:   # TensorFlow's kernels then seed themselves
            seed, seed2 = UNSEEDED_GRAPH_SEED, zlib.crc32(op.name.encode()) % (2 ** 31 - 1) + 1
        out[op.name] = [seed, seed2]
    return out


# Ops that run functions of the graph's library (a loop's body, a cond's
# branches, a call); an op whose type is a library function's name runs it too.
FUNCTION_CALLERS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                              "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})


def refuse_draws_in_functions(graph: tf.Graph, index, written: set[int]) -> None:
    """Refuse a random draw inside a function that a training step runs (a
    `tf.while_loop` body of TensorFlow 2's control flow: a dropout per time
    step): the rewrite makes a worker draw its examples' rows of one
    device's draw, or draw alike, only for ops of the graph itself; inside
    a body every worker would draw the rows of the first examples, the same
    on every worker, or draws of its own. `written`: the positions of what
    the step's writes depend on. A cond whose branches draw is lowered into
    the graph before (transforms.lower_cond); a tf.data function is run by
    the input pipeline, not by a step's ops."""
    _refuse_draws_in_v1_loops(graph, index, written)
    callers = [op for op in index.of_types(
        [t for t in index.op_types() if t in FUNCTION_CALLERS or op_def_registry.get(t) is None])
        if index.position[op.name] in written]
    if not callers:
        return
    library = library_functions(graph)
    for caller in callers:
        run = [f.name for f in function_calls([caller.node_def])] + [caller.type]
        for name, body in functions_run_by(library, run):
            for node in body.node_def:
                if draws_randomly(node.op) or _seeded_by_attributes(node.op):
                    raise UnsupportedGraphError(
                        f"the random op '{node.name}' ({node.op}) draws inside the function "
                        f"'{name}', which '{caller.name}' ({caller.type}) runs in a training "
                        "step: autopar gives each worker its examples' rows of one device's "
                        "draw, or the draw every worker shares, only for a draw of the graph "
                        "itself, not inside a loop's body. Draw it before the loop (one mask "
                        "for every time step, as Keras's LSTM(dropout=...) does)")


def _refuse_draws_in_v1_loops(graph: tf.Graph, index, written: set[int]) -> None:
    """The same refusal for a draw inside a TensorFlow 1 while loop's body
    (a DropoutWrapper in dynamic_rnn under disable_v2_behavior()): its ops
    are the graph's own, but the rewrite's would be made outside the loop's
    frame, and TensorFlow refuses an op with inputs from two frames when the
    step runs."""
    frames = v1_loop_frames(graph)
    if not frames:
        return
    for op in index.of_types([t for t in index.op_types()
                              if draws_randomly(t) or _seeded_by_attributes(t)]):
        if op.name in frames and index.position[op.name] in written:
            raise UnsupportedGraphError(
                f"the random op '{op.name}' ({op.type}) draws inside the while loop "
                f"'{frames[op.name]}' (TensorFlow 1 control flow), which runs in a training "
                "step: autopar gives each worker its examples' rows of one device's draw, or "
                "the draw every worker shares, only for a draw outside a loop's body. Draw it "
                "before the loop (one mask for every time step, as "
                "DropoutWrapper(variational_recurrent=True) does)")


def _seeded_by_attributes(op_type: str) -> bool:
    """Whether ops of this type draw from a kernel seeded by their seed and
    seed2 attributes (a stateful random op, a candidate sampler)."""
    op_def = op_def_registry.get(op_type)
    return (op_def is not None and op_def.is_stateful
            and {"seed", "seed2"} <= {a.name for a in op_def.attr})


def stateful_draw(op_type: str) -> bool:
    """Whether an op of this type draws from a generator state it keeps or
    advances (a stateful random op's kernel, a tf.random.Generator's)."""
    return op_type == SKIP or op_type.startswith("Stateful") or (
        op_type in SHAPED_DRAWS and not op_type.startswith("Stateless"))


def draws_randomly(op_type: str) -> bool:
    """Whether an op of this type draws random numbers."""
    return op_type in SHAPED_DRAWS or op_type in OTHER_DRAWS or op_type == SKIP


# Elementwise ops through which a draw reaches the batch tensor it is combined with.
_ELEMENTWISE = frozenset({"Mul", "Add", "AddV2", "Sub", "RealDiv", "Div", "DivNoNan",
                          "Maximum", "Minimum", "Select", "SelectV2", "GreaterEqual",
                          "Greater", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
                          "LogicalOr", "LogicalNot", "Cast", "Identity", "Floor", "Neg",
                          "Sqrt", "Exp", "Log", "Snapshot"})


def find_batch_draws(graph: tf.Graph, rows: ExampleRows, batch_ops: set[str],
                     candidates=None, pinned: "PinnedLengths | None" = None
                     ) -> dict[str, list[int]]:
    """{random op of `graph` that draws per example: [k, g], its k blocks of
    the examples' rows, g rows each (0: known when run)} (the module's
    docstring), and the
    tf.random.Generator state reads advanced by such a draw's size (k, and
    g times the draw's other dimensions), in graph order. `rows`: the
    tensors' forms; `batch_ops`: the ops computed from the input batch other
    than through the averaged gradients (graph_utils.batch_local_ops).
    Refuses a random op that depends on the batch otherwise. `candidates`:
    the graph's ops of those types in graph order, when the caller's index
    has them (else every op is looked at). `pinned`: the proof that a
    shape's padded lengths are the checked inputs' (None: no input is
    checked)."""
    out: dict[str, list[int]] = {}
    for op in graph.get_operations() if candidates is None else candidates:
        if op.type == SKIP and rows.form(op.inputs[2]) != SHARED:
            form = rows.form(op.inputs[2])
            if form[0] == "size" and form[2] is not None:
                out[op.name] = [form[1], form[2]]
                continue
            raise _refusal(op, "its inputs come from the input batch")
        if op.type in OTHER_DRAWS and any(rows.form(t) != SHARED for t in op.inputs):
            raise _refusal(op, "its inputs come from the input batch")
        if op.type not in SHAPED_DRAWS:
            continue
        index = SHAPED_DRAWS[op.type]
        shape = op.inputs[index]
        others = [t for i, t in enumerate(op.inputs) if i != index and rows.form(t) != SHARED
                  and broadcast_parameter(op, t, rows) is None]
        if others:
            raise _refusal(op, f"its input '{others[0].name}' comes from the input batch")
        layout = _layout(op, shape, rows, batch_ops, pinned)
        if layout is None:
            continue
        if shape.shape.rank != 1 or shape.shape[0] is None:
            raise UnsupportedGraphError(
                f"the random op '{op.name}' ({op.type}) draws per example, but its shape "
                f"'{shape.name}' has no static length")
        out[op.name] = layout
    return out


# Draws whose parameters (a gamma's alpha, a truncated normal's bounds)
# broadcast to the draw's shape, their output that shape.
_BROADCAST_PARAMETERS = frozenset({"StatelessRandomGammaV2", "StatelessRandomGammaV3",
                                   "StatelessRandomPoisson", "StatelessRandomBinomial",
                                   "StatelessParameterizedTruncatedNormal"})


def broadcast_parameter(op: tf.Operation, t: tf.Tensor, rows: ExampleRows) -> tf.Tensor | None:
    """For a draw's parameter `t` that is a value the same on every worker
    broadcast to the draw's shape (Keras's random.beta: tf.broadcast_to(alpha,
    shape) before a gamma of that shape), that value, which the draw
    broadcasts alike to one device's shape; else None."""
    shape = rows.form(op.inputs[SHAPED_DRAWS[op.type]])
    if op.type not in _BROADCAST_PARAMETERS or t.op.type != "BroadcastTo" \
            or shape[0] != "shape" or not all(isinstance(d, int) for d in shape[3]):
        return None
    while t.op.type == "BroadcastTo":   # (stateless_gamma broadcasts alpha again)
        if rows.form(t.op.inputs[1]) != shape:
            return None
        t = t.op.inputs[0]
    return t if rows.form(t) == SHARED else None


def _layout(op: tf.Operation, shape: tf.Tensor, rows: ExampleRows,
            batch_ops: set[str], pinned: "PinnedLengths | None" = None) -> list[int] | None:
    """[k, g] of a per-example draw of shape `shape`, None for a draw that is
    one device's as it is; refuses any other shape of the batch."""
    form = rows.form(shape)
    if form[0] == "shape":
        padded = "d" in form[3] and not (pinned and pinned.known_past_first(shape))
        if padded or (form[2] is None and not rows.fixed_lengths):
            raise _refusal(op, f"its shape '{shape.name}' holds a length of the worker's "
                               "batch other than its count of examples, which one device's "
                               "batch may have otherwise (not a constant nor computed from "
                               "the inputs' padded lengths alone, which a training step "
                               "checks are one device's)")
        return [form[1], form[2] or 0]   # 0: each example's rows, known when run
    if form[0] == "shared":
        return _constant_batch_layout(op, shape, batch_ops, rows)
    raise _refusal(op, f"its shape '{shape.name}' comes from the input batch, but its first "
                       "element is not the batch's size")


class PinnedLengths:
    """Copies of the graph in which every input has static dimensions: each
    padded axis of the inputs a training step checks
    (transforms.padded_lengths: {input tensor: its axes}) one length, each
    input's first axis one of several batch sizes, every other unknown axis
    left unknown. A shape element that TensorFlow's shape inference then
    knows, the same for every batch size, is computed from the checked
    lengths and constants alone (the module's docstring): one computed from
    the ids' values or from an unchecked length stays unknown, one computed
    from the batch's size differs. The batch sizes 1, 2 and 1031 tell apart
    the arithmetic of a size (a product, a quotient, a remainder, a
    comparison with a constant up to 1031). `input_ops`: the graph's ops of
    INPUT_OP_TYPES. Copied when first asked."""
    # Any positive length would do; one that many kernel sizes and strides
    # divide keeps a convolution or a reshape along the lengths well-formed.
    LENGTH = 720
    BATCHES = (1, 2, 1031)

    def __init__(self, graph: tf.Graph, padded: dict[str, list[int]], input_ops) -> None:
        self.graph, self.padded, self.input_ops = graph, padded, input_ops
        self._copies: list[tf.Graph] | None = None

    def known_past_first(self, shape: tf.Tensor) -> bool:
        """Whether every element of the 1-D `shape` but its first is known in
        every copy, and the same in all."""
        values = []
        for copy in self._pinned():
            # (TensorFlow's own evaluation of a tensor from static shapes and
            # constants, as its shape inference evaluates a shape input)
            value = tensor_util.try_evaluate_constant(copy.get_tensor_by_name(shape.name))
            if value is None or value.ndim != 1 or len(value) < 2:
                return False
            values.append(tuple(int(v) for v in value[1:]))
        return len(values) == len(self.BATCHES) and len(set(values)) == 1

    def _pinned(self) -> list[tf.Graph]:
        if self._copies is None:
            self._copies = []
            if self.padded:
                graph_def = self.graph.as_graph_def()
                inputs = [t for op in self.input_ops
                          for t in op.outputs if t.dtype != tf.resource and t.shape.rank]
                for batch in self.BATCHES:
                    copy = self._copy(graph_def, inputs, batch)
                    if copy is None:
                        self._copies = []
                        break
                    self._copies.append(copy)
        return self._copies

    def _copy(self, graph_def, inputs: list[tf.Tensor], batch: int) -> tf.Graph | None:
        copy = tf.Graph()
        with copy.as_default():
            pinned = {}
            for t in inputs:
                axes = self.padded.get(t.name, ())
                dims = [self.LENGTH if i in axes else batch if i == 0 and d is None else d
                        for i, d in enumerate(t.shape)]
                pinned[t.name] = tf1.placeholder(t.dtype, dims, name="autopar_pinned")
            try:
                tf1.import_graph_def(graph_def, input_map=pinned, name="")
            except ValueError:   # a pinned size contradicts the graph: nothing proven
                return None
        return copy


def _refusal(op: tf.Operation, why: str) -> UnsupportedGraphError:
    return UnsupportedGraphError(
        f"the random op '{op.name}' ({op.type}) draws from the input batch: {why}, so no "
        "split of one device's draw over the global batch gives each worker its examples' "
        "share (autopar makes each worker draw the rows of its own examples for a draw whose "
        "shape starts with the batch's size, such as a dropout mask: tf.shape(x) or a noise "
        "shape starting with tf.shape(x)[0])")


def _constant_batch_layout(op: tf.Operation, shape: tf.Tensor, batch_ops: set[str],
                           rows: ExampleRows) -> list[int] | None:
    """[k, g] of a draw of a constant shape (tf.shape of a batch of static
    size, folded) whose first element is not 1 and that the draw, through
    elementwise ops, combines with a batch tensor of its rank and first
    dimension: that tensor's blocks and rows per example where its form says
    (BERT's [b * L, d] activations: L rows each; the backward pass, which
    reads the mask too, has no forms), else one row each; None for any
    other draw. Consumers are visited in name order: the same answer on
    every process."""
    value = tf.get_static_value(shape)
    if value is None or value.ndim != 1 or len(value) == 0 or int(value[0]) == 1:
        return None
    rank, first = len(value), int(value[0])
    mine, frontier, combined = {op.name}, [op], False
    while frontier and len(mine) < 64:
        consumers = {c.name: c for t in frontier.pop().outputs for c in t.consumers()}
        for consumer in (consumers[name] for name in sorted(consumers)):
            if consumer.type not in _ELEMENTWISE or consumer.name in mine:
                continue
            for t in consumer.inputs:
                if t.op.name in mine or t.op.name not in batch_ops:
                    continue
                dims = t.shape
                if dims.rank == rank and dims[0] is not None and int(dims[0]) == first:
                    form = rows.form(t)
                    if (form[0] == "rows" and form[1] == 0 and form[2] == BATCH
                            and isinstance(form[4], int) and form[4] >= 1):
                        return [form[3], form[4]]
                    combined = True
            mine.add(consumer.name)
            frontier.append(consumer)
    return [1, 1] if combined else None


def rewrite_batch_draws(graph: tf.Graph, draws: dict[str, list[int]], num_workers: int,
                        worker_index: int, global_batch, batch_input: str | None
                        ) -> tuple[dict[str, str], set[str]]:
    """Worker `worker_index`'s per-example draws (module docstring): a copy
    of each draw's op (its seeds and state) draws the global batch's rows,
    and the op's readers read this worker's examples' rows of it; a copy of
    a generator's state read skips as far as one device's draw. `draws`:
    find_batch_draws's; `global_batch(b)`: B, the step's examples, from this
    worker's b (int64 scalars); `batch_input`: a tensor of the batch's rows,
    whose first dimension is b where a draw's rows per example are known
    only when run. Returns (each original op's output -> what its readers
    read instead; the ops built here)."""
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    n, w = num_workers, worker_index
    with tf.name_scope(BATCH_DRAWS_SCOPE):
        for name, (blocks, group) in _upstream_first(graph, draws):
            op = graph.get_operation_by_name(name)
            if op.type == SKIP:
                # the generator's state advances by one device's count: the
                # draw's k * b * G values here, k * B * G there
                delta = op.inputs[2]
                count = tf.cast(delta, tf.int64)
                b = count // (blocks * group)
                whole = tf.cast(count // b * global_batch(b), delta.dtype.base_dtype)
                rewire[op.outputs[0].name] = copy_op(op, [*op.inputs[:2], whole]).outputs[0].name
                continue
            index = SHAPED_DRAWS[op.type]
            shape = op.inputs[index]
            dtype = shape.dtype.base_dtype
            first = tf.cast(shape[0], tf.int64)
            if group:
                b = first // (blocks * group)
                rows = tf.constant(group, tf.int64)
            else:   # each example's rows, from the batch's size
                b = tf.shape(graph.get_tensor_by_name(batch_input), out_type=tf.int64)[0]
                rows = first // (blocks * b)
            total = global_batch(b)
            # the global batch's draw, with the op's own seeds and state
            whole = tf.concat([tf.cast(tf.reshape(total * blocks * rows, [1]), dtype),
                               shape[1:]], 0)
            drawn = copy_op(op, [whole if i == index else _unbroadcast(op, t)
                                 for i, t in enumerate(op.inputs)])
            # [k, B, g, ...]: element (j, e) holds block j's rows of example e
            blocked = tf.concat([tf.cast(tf.stack([tf.constant(blocks, tf.int64), total, rows]),
                                         dtype), shape[1:]], 0)
            mine = tf.gather(tf.reshape(drawn.outputs[0], blocked),
                             tf.range(w, w + n * b, n, dtype=tf.int64), axis=1)
            rewire[op.outputs[0].name] = tf.reshape(mine, shape).name
    return rewire, {o.name for o in graph.get_operations()} - before


def _unbroadcast(op: tf.Operation, t: tf.Tensor) -> tf.Tensor:
    """A parameter of the global batch's draw: a value broadcast to the
    worker's shape (broadcast_parameter) is given as it was before, which the
    draw broadcasts to the global batch's shape; one already of a shape the
    draw broadcasts alike is too."""
    while op.type in _BROADCAST_PARAMETERS and t.op.type == "BroadcastTo":
        t = t.op.inputs[0]
    return t


def _upstream_first(graph: tf.Graph, draws: dict[str, list[int]]) -> list:
    """`draws`' items, one whose shape is computed from no other draw first:
    the global batch's size every draw shares is computed from that first
    draw's (a later draw's would make the earlier ones wait on the forward
    pass after them: a cycle). A graph's op order need not follow its data
    flow (a traced function's, imported)."""
    ops = {name: graph.get_operation_by_name(name) for name in draws}
    for name, op in ops.items():
        seen, stack, clean = set(), [t.op for t in op.inputs], True
        while stack and clean:
            x = stack.pop()
            if x.name in seen:
                continue
            seen.add(x.name)
            clean = x.name not in ops
            stack.extend(t.op for t in x.inputs)
        if clean:
            return [(name, draws[name])] + [item for item in draws.items() if item[0] != name]
    return list(draws.items())
