"""Analysis of a single-device training graph (Parallax §3, §6.1).

Finds, with no annotation from the user, every trainable variable, the tensor
that carries its gradient out of the backward pass, whether that gradient is
dense or IndexedSlices, its update ops and optimizer slots, the ops between
gradient and update (clipping, scaling), and state updated once per step.

How gradients are found: tf.gradients builds the backward pass under a
"gradients" name scope and every tf.compat.v1 optimizer builds the update of
variable v under "<opt>/update_<v>". Tensors leaving the gradients scope are
the *boundary*; walking backward from the inputs of v's update ops to the
boundary, the nearest boundary tensor shaped like v (or like rows of v, for
IndexedSlices values) is v's gradient. Clipping passes a gradient through
elementwise ops, so its own gradient is always nearer than the others, which
reach it only through the global norm.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms import serial
from autopar.transforms.batchnorm import BatchNormInfo
from autopar.transforms.features import registry as features
from autopar.transforms.features.base import Facts
from autopar.transforms.graph_index import GraphIndex
from autopar.transforms.graph_utils import (INPUT_OP_TYPES, VARIABLE_OP_TYPES, op_name_of, transforming,
                                            functions_run_by, graph_of, in_gradient_scope,
                                            is_restore_assignment, library_functions,
                                            static_shape, uncast, writes_variable)
from autopar.transforms.lift import FETCHES, tape_seed_pairs
from autopar.transforms.loss_reduction import batch_reduced, loss_reduction_of_all
from autopar.transforms.server_blockers import (FUNCTION_OPS, conditional_ops, read_in_a_function,
                                                updated_conditionally, whole_values_in_update,
                                                written_outside_update)
from autopar.transforms.sparse_rows import deduplicated, nonlinear_in_rows, rows_of_shared_ids

tf1 = tf.compat.v1

# Op types an optimizer uses only when the gradient is IndexedSlices.
_SPARSE_UPDATE_MARKERS = ("Sparse", "Scatter", "UnsortedSegmentSum", "Unique")
# Ops that read a variable through its handle or reference without writing it.
_READ_OP_TYPES = frozenset({"ReadVariableOp", "Identity", "VarIsInitializedOp",
                            "IsVariableInitialized", "VariableShape", "ResourceGather",
                            "ResourceGatherNd", "Gather", "GatherV2"})
# Ops next to a variable that may move across a worker/server boundary (OPSW).
_BOUNDARY_OP_TYPES = frozenset({"Slice", "StridedSlice", "Cast", "Gather", "GatherV2",
                                "ResourceGather", "Size", "L2Loss"})


@dataclass
class VariableInfo:
    name: str                      # variable op name, e.g. "dense/kernel"
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    gradient: str                  # "dense" or "sparse"
    grad_tensor: str | None = None   # dense: boundary tensor carrying the gradient
    # Position of the gradient's op in the graph's creation order (-1: none).
    # tf.gradients creates each op's gradient once all its output gradients
    # exist, so this is the order the backward pass produces gradients in:
    # the same on every process that builds the graph (transforms.methods.herring.bfb).
    grad_position: int = -1
    grad_values: str | None = None   # sparse: IndexedSlices values / indices
    grad_indices: str | None = None
    alpha: float | None = None     # sparse: gradient rows per step / table rows (may exceed 1)
    update_ops: list[str] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)
    path_ops: list[str] = field(default_factory=list)     # between gradient and update
    boundary_ops: list[str] = field(default_factory=list)  # slice/cast/gather/... of v
    # Ops between this variable's gradient and its update that nothing else
    # feeds with a tensor (clip's Mul by the shared scale, Identity...): with
    # the update, they can run wherever the aggregated gradient is.
    own_path_ops: list[str] = field(default_factory=list)
    # L2Loss ops reading the gradient (global-norm terms): additive over workers.
    norm_ops: list[str] = field(default_factory=list)
    # Why this variable's update cannot move to a server ("" when it can).
    ps_blocker: str = ""
    # sparse: the gradient has one row per *distinct* id of the batch (the
    # lookup applied tf.unique before gathering, as embedding_lookup_sparse
    # does). On one device the distinct ids are those of the global batch, so
    # workers' rows for the same id must be combined before anything uses them.
    dedup: bool = False
    # sparse: the gradient's last `shared_rows` rows are for ids every worker
    # looks up alike after its examples' (a sampled softmax's candidates
    # after the labels): each holds the worker's share of the batch's sum,
    # added over workers position by position, as one device has them once.
    shared_rows: int = 0
    # sparse: its update transforms each row of the gradient before rows of
    # one id are added (Keras's Adam, Adagrad and RMSprop square them): on
    # servers it must receive every worker's rows as they left the tapes,
    # neither summed by id on the worker, nor by local aggregation, nor on
    # the server (transforms.methods.ps.rewrite). Not with dedup or
    # shared_rows, whose rows of one id are combined first.
    row_wise: bool = False
    # The TrainGroup this variable belongs to (Analysis.train_groups).
    group: int = 0
    # A resource variable (VarHandleOp); False: a legacy reference variable
    # (VariableV2), which autopar places whole but cannot split into partitions.
    resource: bool = True
    # Why its update cannot be split into row partitions ("" when it can).
    partition_blocker: str = ""
    # How its update was recognised (for the report).
    recognised: str = ""


@dataclass
class TrainGroup:
    """Variables every train op updates together or not at all (a program
    with one optimizer has one group; two optimizers run on alternate steps
    make two). A step runs exactly its groups' communication: nothing of
    another group may be fused with, chained to or waited for by it."""
    variables: list[str]
    loss: str | None = None   # the tensor differentiated for these variables' gradients


@dataclass
class StateInfo:
    name: str
    # "global_step", "ema", "optimizer", "other", or "local": written from the
    # worker's own input batch (batch-norm moving statistics, an assignment
    # from activations or from a separate tf.gradients call), not from the
    # averaged gradients, so each replica computes its own value.
    kind: str
    update_ops: list[str] = field(default_factory=list)
    # Whether a trained loss reads it (a memory bank of the batch's
    # embeddings, a running mean the inputs are normalised by): for "local"
    # state, each worker's loss then reads values of its own share's.
    read_by_loss: bool = False


@dataclass
class Analysis:
    variables: list[VariableInfo]
    state: list[StateInfo]
    loss: str | None
    step_ops: frozenset[str]       # ops whose run means one training step
    untrained: list[str] = field(default_factory=list)  # trainable but never updated
    # How the loss reduces over the batch: "mean" (one device's gradient is the
    # mean over the global batch: workers' gradients are averaged), "sum" (it
    # is the sum: workers' gradients are added), "neither" (no aggregation
    # gives one device's gradient: a summed loss plus a batch-independent
    # term) or "unknown" (Config decides); loss_reduction_why says what in the
    # graph showed it.
    loss_reduction: str = "unknown"
    loss_reduction_why: str = ""
    # Training-mode batch-norm layers on the input batch (transforms.batchnorm).
    batch_norms: list[BatchNormInfo] = field(default_factory=list)
    train_groups: list[TrainGroup] = field(default_factory=list)
    # Denominators of the losses that count the batch's values (a mask's
    # sum): each worker divides by their sum over workers (transforms.loss_counts).
    loss_counts: list[str] = field(default_factory=list)
    # {count the backward pass does not read: the forward tensors, weights of
    # count^-1 (a Keras masked loss's), it reads in its place}.
    loss_count_reads: dict[str, list[str]] = field(default_factory=dict)
    # {seed of a loss's backward pass: the input whose leading dimension is a
    # worker's batch size}, where the graph leaves that size unknown: workers
    # whose batches of a step differ in size weigh their gradients by it
    # (transforms.batch_weights).
    batch_weights: dict[str, str] = field(default_factory=dict)
    # {op adding a mean over a batch of unknown size to a variable (a Keras
    # Mean metric fed the batch's loss): (the variable, the tensor added, the
    # tensor whose leading dimension is that batch)}: weighed alike
    # (transforms.batch_weights).
    batch_mean_increments: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # {op adding a sum over the batch, fed as one value, to a mean's total (a
    # Keras Mean fed a loss summed over the batch): (the variable, the tensor
    # added)}: weighed by N, as the mean's count grows N per step
    # (transforms.batch_weights).
    batch_sum_increments: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The ops of batch_mean_increments adding to a total no count divides (a
    # Keras Sum fed a mean over the batch): weighed by the worker's share
    # b / B, not N * b / B (transforms.batch_weights).
    batch_mean_totals: list[str] = field(default_factory=list)
    # {random op that draws per example (a dropout mask): [k, g], its k
    # blocks of the examples' rows, g rows each}: each worker draws the
    # global batch's and keeps its examples' rows (transforms.random_draws).
    batch_draws: dict[str, list[int]] = field(default_factory=dict)
    # {random op a training step's writes depend on that is not per example
    # (a sampled softmax's candidates, noise on a weight): [seed, seed2]},
    # given it on every worker, so every worker draws alike
    # (transforms.random_draws.find_shared_draws).
    shared_draws: dict[str, list[int]] = field(default_factory=dict)
    # {fed or dataset tensor a training step reads: its axes past the first
    # of a length the graph leaves unknown}: a training step checks that
    # every worker padded them alike (transforms.padded_lengths).
    padded_inputs: dict[str, list[int]] = field(default_factory=dict)
    # {boolean of the whole batch (tf.reduce_all / tf.reduce_any) a cond
    # decides by: the cond}: checked alike on every worker likewise.
    checked_predicates: dict[str, str] = field(default_factory=dict)
    # {the largest or smallest integer of the batch's values a trained loss
    # is computed from (its longest sequence's length, a loop's bound):
    # "Max" or "Min"}: each training step takes the global batch's
    # (transforms.padded_lengths), and the analysis reads it as the same on
    # every worker (transforms.example_rows).
    batch_statistics: dict[str, str] = field(default_factory=dict)
    # Local variables the input batch's ops add to (tf.compat.v1.metrics'
    # totals): each worker's own batches' (transforms.worker_counters).
    worker_counters: list[str] = field(default_factory=list)
    # A fed or dataset tensor of the batch's rows (the draws' b where their
    # rows per example are known only when run).
    batch_input: str | None = None
    # {op: what it does} where the losses mix the examples of a batch other
    # than in batch normalisation (in-batch negatives, a batch statistic fed
    # back into each example, an op of no known rule): refused on several
    # workers unless Config(batch_mixing="per_worker") (transforms.batch_mixing).
    batch_mixing: dict[str, str] = field(default_factory=dict)
    # Every step op that is not an update op of one variable (the train ops
    # a user fetches: minimize()'s op, tf.group()s of them, ops after them)
    # -> the train groups its run updates.
    trains: dict[str, list[int]] = field(default_factory=dict)

    def groups_of(self, op_name: str) -> list[int]:
        """The train groups a run of step op `op_name` updates (an update
        op of one variable: that variable's group)."""
        if op_name in self.trains:
            return self.trains[op_name]
        index = self.__dict__.get("_group_of_update")
        if index is None:
            index = self.__dict__["_group_of_update"] = {
                u: v.group for v in self.variables for u in v.update_ops}
        return [index[op_name]] if op_name in index else []

    @property
    def step_sets(self) -> list[tuple[int, ...]]:
        """The distinct sets of train groups one fetch can update: each
        group alone and every set a train op updates, smallest first."""
        sets = {(g,) for g in range(len(self.train_groups))}
        sets.update(tuple(groups) for groups in self.trains.values())
        return sorted(sets, key=lambda s: (len(s), s))

    def variable(self, name: str) -> VariableInfo:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(name)

    @property
    def dense(self) -> list[VariableInfo]:
        return [v for v in self.variables if v.gradient == "dense"]

    @property
    def sparse(self) -> list[VariableInfo]:
        return [v for v in self.variables if v.gradient == "sparse"]

    def to_dict(self) -> dict:
        return serial.encode(self)

    def to_json(self) -> str:
        return serial.dumps(self, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Analysis":
        """The Analysis `to_json` wrote (equal to it, field types included)."""
        return serial.loads(cls, text)


def analyze_graph(graph_or_meta, timings: dict[str, float] | None = None) -> Analysis:
    """Linear in the graph's size (plus the size of the answer): the ops are
    indexed once (GraphIndex) for the analysis and every graph feature,
    reachability questions asked for every variable are answered together
    by one pass in each direction, and per-variable walks stay in the
    variable's own neighbourhood. `timings`: filled with the seconds each
    phase took, each graph feature's find its own ("feature <name>")."""
    graph = graph_of(graph_or_meta)
    with transforming():
        return _analyze(graph, _Clock(timings))


class _Clock:
    """Seconds since the previous mark, by phase (no-op without a dict)."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
            self.last = now


def _analyze(graph: tf.Graph, clock: _Clock) -> Analysis:
    index = GraphIndex(graph)   # every walk below and every feature's reads it
    clock("index")
    boundary = _gradient_boundary(index)
    if not boundary:
        loop = _loop_computing_gradients(graph)
        if loop is not None:
            raise UnsupportedGraphError(
                f"the step's gradients are computed inside the loop '{loop.name}' ({loop.type}: "
                "a tf.range or tf.while_loop loop in a tf.function, e.g. accumulating "
                "micro-batches' gradients), whose body autopar does not see into: it finds "
                "each variable's gradient where the backward pass ends. Loop in Python (a for "
                "over range(k) unrolls into the step), or set Config(micro_batches=k) and "
                "compute one gradient per step")
        raise UnsupportedGraphError(
            "no gradient computation found in the graph: build the train op with a "
            "tf.compat.v1.train optimizer (minimize() or compute_gradients/apply_gradients) "
            "before calling autopar")
    trainable = _trainable_variable_ops(graph)
    updates = _update_ops_by_variable(index, trainable)
    recognised = {name: "its tf.compat.v1 optimizer's update (the ops under "
                        f"'{ops[0].rsplit('/update_', 1)[0]}/update_{name}')"
                  for name, ops in updates.items()}
    writers = writers_by_variable(index)
    from_data_flow = _updates_from_data_flow(graph, index, trainable, updates, boundary, writers)
    for name, ops in from_data_flow.items():
        updates[name] = ops
        recognised[name] = ("writes of it and of its slots fed by its gradient (data flow: "
                            f"{', '.join(o for o in ops if o in set(writers.get(name, [])))})")
    if not updates:
        consumer = _first_consumer(graph, boundary)
        inside = _inside_a_function(graph, index, boundary)
        raise UnsupportedGraphError(
            f"gradients are computed but no optimizer update was recognised: op '{consumer}' "
            "consumes a gradient, but no write of a trainable variable is fed by one. "
            + (inside or "Apply the gradients with an optimizer (tf.compat.v1.train or Keras)."))
    _reject_hand_written_updates(graph, index, trainable, updates, boundary, writers)
    slot_users = _variables_passed_to_updates(graph, updates, {v.name for v in trainable})
    slots_of: dict[str, list[str]] = collections.defaultdict(list)   # of one variable only
    for slot, users in slot_users.items():
        if len(users) == 1:
            slots_of[next(iter(users))].append(slot)
    variables = [_variable_info(graph, var_op, updates[var_op.name], boundary, slots_of,
                                writers.get(var_op.name, []))
                 for var_op in trainable if var_op.name in updates]
    for info in variables:
        info.recognised = recognised[info.name]
    clock("gradients and updates")
    fetches = {op.name for op in graph.get_collection(FETCHES)}
    groups, trains = _train_groups(index, variables, fetches)
    seeds = _loss_seeds(index)
    every_seed = seeds + tape_seed_pairs(graph)
    reached = {seed: index.reachable([index.position[seed]]) for seed, _ in every_seed}
    inner = _inner_seeds(index, every_seed, reached)
    losses = _losses(index, variables, groups, seeds, reached, inner, graph)
    loss = losses[0] if losses else None
    # A traced function's losses (several tapes: a GAN's two) all decide.
    every_loss = losses + ([] if seeds else _declared_losses(graph))
    input_ops = index.batch_local(set())
    averaged = {t for v in variables for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t}
    batch_local = index.batch_local(averaged)
    facts = Facts(graph, index, writers, losses, every_loss, frozenset(averaged), input_ops,
                  batch_local, trained_seeds=_trained_seeds(index, every_seed, reached, inner,
                                                            averaged),
                  inner_seeds=[(seed, loss) for seed, loss in every_seed if seed in inner],
                  reduced_of=lambda loss: batch_reduced(graph, loss, input_ops,
                                                        facts.shared.get("rows")))
    clock("train groups, losses, batch")
    found = features.find(facts, clock)
    # (once the examples' forms say which axis runs over them)
    reduction, why = loss_reduction_of_all(graph, every_loss, input_ops, facts.shared.get("rows"))
    rows = facts.shared["rows"]
    conditional = conditional_ops(index)
    paths = _path_ops(index, [([t for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t],
                               set(v.update_ops)) for v in variables])
    for info, path in zip(variables, paths):
        grads = [t for t in (info.grad_tensor, info.grad_values, info.grad_indices) if t]
        info.path_ops = path
        first = info.grad_tensor or info.grad_values
        info.grad_position = index.position.get(op_name_of(first), -1) if first else -1
        _own_region(graph, info, set(grads), set(info.update_ops))
        if info.gradient == "sparse" and not info.dedup:
            rows_of_shared_ids(graph, rows, info)
        if info.gradient == "sparse" and not info.ps_blocker and not info.dedup:
            nonlinear = nonlinear_in_rows(graph, info)
            if nonlinear and info.shared_rows:
                # the shared ids' rows would have to be added over workers
                # before the update's per-row transform, and the examples' not
                info.ps_blocker = (f"{nonlinear.split(' (servers add')[0]}, and its last "
                                   f"{info.shared_rows} rows are ids every worker looks up "
                                   "alike, which one device sees once: all-gather adds them")
            info.row_wise = bool(nonlinear) and not info.ps_blocker
        if not info.ps_blocker:
            info.ps_blocker = read_in_a_function(graph, info.name)
        if not info.ps_blocker:
            info.ps_blocker = written_outside_update(graph, info, writers)
        if not info.ps_blocker:
            info.ps_blocker = updated_conditionally(info, conditional)
        info.partition_blocker = whole_values_in_update(graph, info)
    clock("per-variable checks")
    slot_names = {s for v in variables for s in v.slots}
    all_update_ops = {u for v in variables for u in v.update_ops}
    state = _step_state(graph, trainable, slot_names, all_update_ops, batch_local, writers)
    # (a recognised batch norm's moving statistics: a fused op in training
    # mode takes them as inputs for their own update only)
    moving = {m for b in found.get("batch_norms", []) for m in b.moving}
    _mark_read_by_loss(index, [s for s in state if s.kind == "local" and s.name not in moving],
                       losses)
    step_ops = _step_ops(index, all_update_ops)
    clock("state and step ops")
    return Analysis(
        variables=variables,
        state=state,
        loss=loss,
        step_ops=step_ops,
        untrained=[v.name for v in trainable if v.name not in updates],
        loss_reduction=reduction,
        loss_reduction_why=why,
        train_groups=[TrainGroup(g, loss) for g, loss in zip(groups, losses)],
        trains=trains,
        **found,
    )


def _train_groups(index: GraphIndex, variables: list[VariableInfo], fetches: set[str] = frozenset()
                  ) -> tuple[list[list[str]], dict[str, list[int]]]:
    """(the variables of each train group, step op -> its groups), from data
    and control flow: one forward pass carries from every update op the bit
    of its variable, so each step op outside the update ops knows the
    variables a run of it updates. Variables updated by exactly the same of
    those ops form a group; numbered by their first variable, the same on
    every process. Sets `group` on each VariableInfo. `fetches`: when the
    graph declares the ops a step fetches (a lifted function's outputs,
    transforms.lift.FETCHES), only those."""
    seeds: dict[int, int] = collections.defaultdict(int)
    for k, v in enumerate(variables):
        for u in v.update_ops:
            seeds[index.position[u]] |= 1 << k
    reach = index.propagate(seeds, forward=True, control=True)
    updated_by: dict[str, int] = {}
    for i, bits in enumerate(reach):
        if bits and i not in seeds and (not fetches or index.names[i] in fetches):
            updated_by[index.names[i]] = bits
    distinct = sorted(set(updated_by.values()))
    signature: dict[int, tuple[int, ...]] = {}
    for k in range(len(variables)):
        signature[k] = tuple(j for j, bits in enumerate(distinct) if bits >> k & 1)
    first: dict[tuple[int, ...], int] = {}
    for k in range(len(variables)):
        first.setdefault(signature[k], len(first))
    groups: list[list[str]] = [[] for _ in first]
    for k, v in enumerate(variables):
        v.group = first[signature[k]]
        groups[v.group].append(v.name)
    trains = {}
    for name, bits in updated_by.items():
        trains[name] = sorted({variables[k].group for k in range(len(variables)) if bits >> k & 1})
    return groups, trains


def _losses(index: GraphIndex, variables: list[VariableInfo], groups: list[list[str]],
            seeds: list[tuple[str, str]], reached: dict[str, set[int]], inner: set[str],
            graph) -> list[str | None]:
    """The loss of each train group: of the tensors tf.gradients
    differentiated (`seeds`: _loss_seeds; `reached`: what each seed's
    backward pass reaches; `inner`: _inner_seeds), the one whose gradient
    seed reaches the group's gradients, an outer one first."""
    if not seeds:
        # A GradientTape names no seed: a loss the graph declares (a traced
        # function's, transforms.lift) if any.
        declared = _declared_losses(graph)
        return [declared[0] if declared else None] * len(groups)
    if len(seeds) <= 1:
        return [seeds[0][1]] * len(groups)
    out = []
    by_name = {v.name: v for v in variables}
    for members in groups:
        v = by_name[members[0]]
        first = op_name_of(v.grad_tensor or v.grad_values or "")
        position = index.position.get(first, -1)
        found = [i for i, (seed, _) in enumerate(seeds) if position in reached[seed]]
        outer = [i for i in found if seeds[i][0] not in inner]
        out.append(seeds[(outer or found or [0])[0]][1])
    return out


def _inner_seeds(index: GraphIndex, seeds: list[tuple[str, str]],
                 reached: dict[str, set[int]]) -> set[str]:
    """The seeds (of `seeds`: (seed op, loss)) whose backward pass computes
    another seed's loss: a gradient penalty's tf.gradients or inner tape
    inside the loss. Their gradients reach the variables' too, through the
    outer backward pass, but their targets are not what trains."""
    losses = {seed: index.position.get(op_name_of(loss), -1) for seed, loss in seeds}
    return {seed for seed, _ in seeds
            if any(p in reached[seed] for other, p in losses.items() if other != seed)}


def _trained_seeds(index: GraphIndex, seeds: list[tuple[str, str]],
                   reached: dict[str, set[int]], inner: set[str],
                   gradients: set[str]) -> list[tuple[str, str]]:
    """The (seed, loss) pairs of `seeds` that are not inner ones and whose
    backward pass reaches a gradient a variable is updated with
    (`gradients`: tensor names)."""
    wanted = {index.position[op_name_of(t)] for t in gradients
              if op_name_of(t) in index.position}
    return [(seed, loss) for seed, loss in seeds
            if seed not in inner and not reached[seed].isdisjoint(wanted)]


def _declared_losses(graph) -> list[str]:
    """The scalar losses the graph declares (tf.GraphKeys.LOSSES)."""
    return [t.name for t in graph.get_collection(tf1.GraphKeys.LOSSES)
            if t.dtype.is_floating and t.shape.rank == 0]


def _updates_from_data_flow(graph, index: GraphIndex, trainable, named: dict[str, list[str]],
                            boundary: set[str], writers: dict[str, list[str]]
                            ) -> dict[str, list[str]]:
    """{trainable variable: its update ops} for the trainable variables no
    tf.compat.v1 optimizer scope covers (a Keras optimizer's assign ops, a
    traced tf.function's), from data flow alone:

    - an op is fed by a gradient when a path of data edges leads to it from
      a tensor the backward pass produced, or through the state of a
      non-trainable variable: a write fed by a gradient makes the reads of
      that variable fed too (Keras's Adam writes m and v from the gradient,
      then reads them to write the weight);
    - the update of v is its writes fed by a gradient, the writes fed by a
      gradient of its slots (non-trainable variables read by those writes,
      or by a slot's, and by no other variable's), and every op whose outputs only these
      ops consume (the arithmetic between, reads of the slots), walking
      back no further than the backward pass and the variables.

    The optimizer's own counters (Keras's iteration count) are written
    without a gradient and read by every variable's update: state, not a
    slot. A write fed by a gradient that no optimizer pattern explains is
    still an update here: whatever computes it runs on the aggregated
    gradient, as on one device."""
    trainable_names = {v.name for v in trainable}
    candidates = [v.name for v in trainable if v.name not in named and writers.get(v.name)]
    if not candidates:
        return {}
    reads_of: dict[str, list[int]] = collections.defaultdict(list)
    for op in index.of_types(_READ_OP_TYPES):
        if op.inputs and op.inputs[0].op.type in VARIABLE_OP_TYPES:
            reads_of[op.inputs[0].op.name].append(index.position[op.name])
    writer_of = {w: var for var, ws in writers.items() for w in ws}
    fed = index.reachable({index.position[op_name_of(t)] for t in boundary})
    through = set()
    while True:
        states = {writer_of[index.names[i]] for i in fed if index.names[i] in writer_of
                  and writer_of[index.names[i]] not in trainable_names} - through
        if not states:
            break
        through |= states
        fed |= index.reachable([i for s in states for i in reads_of.get(s, [])])
    fed_writes = {var: [w for w in ws if index.position[w] in fed] for var, ws in writers.items()}
    backward = {op_name_of(t) for t in boundary}   # ops whose outputs are gradients

    def fed_state_read_by(name: str) -> set[str]:
        """The non-trainable variables with writes fed by a gradient that
        the writes of `name` fed by a gradient read."""
        read = set()
        seen, stack = set(), [graph.get_operation_by_name(w) for w in fed_writes[name]]
        while stack:
            op = stack.pop()
            if op.name in seen or in_gradient_scope(op.name):
                continue
            seen.add(op.name)
            if op.type in _READ_OP_TYPES and op.inputs and \
                    op.inputs[0].op.type in VARIABLE_OP_TYPES:
                read.add(op.inputs[0].op.name)
                continue
            stack.extend(t.op for t in op.inputs if t.op.type not in VARIABLE_OP_TYPES)
        return {x for x in read if x not in trainable_names and fed_writes.get(x)}

    # The state each candidate's writes read, through the writes of that
    # state in turn: AMSGrad writes the weight from v_hat, and v_hat from v.
    read_by: dict[str, set[str]] = {}
    for name in candidates:
        if not fed_writes.get(name):
            continue
        read, stack = set(), [name]
        while stack:
            for x in fed_state_read_by(stack.pop()) - read:
                read.add(x)
                stack.append(x)
        read_by[name] = read
    users: dict[str, int] = collections.Counter(x for xs in read_by.values() for x in xs)
    out = {}
    for name, read in read_by.items():
        slots = sorted(x for x in read if users[x] == 1)
        region = {w for x in [name, *slots] for w in fed_writes[x]}
        out[name] = sorted(_convex(graph, _exclusive_ancestors(graph, region, backward)))
    return out


def _convex(graph, region: set[str]) -> set[str]:
    """`region` with every op on a path (data or control) from one of its
    ops to another: such an op runs between them (a traced function orders
    each variable's reads and writes by control edges, and a read of a shared
    learning rate can sit between a slot's write and the weight's), so it
    belongs to the update; left outside it would wait for the update's end
    and the update for it. The walk back stays out of the backward pass,
    the variables and the inputs."""
    ops = {name: graph.get_operation_by_name(name) for name in region}
    before, stack = set(), list(ops.values())
    while stack:   # ancestors of the region, short of the backward pass
        op = stack.pop()
        for p in [t.op for t in op.inputs] + list(op.control_inputs):
            if (p.name in before or p.name in region or in_gradient_scope(p.name)
                    or p.type in VARIABLE_OP_TYPES or p.type in INPUT_OP_TYPES):
                continue
            before.add(p.name)
            stack.append(p)
    between, stack = set(), list(ops.values())
    while stack:   # ...that are also descendants of it
        op = stack.pop()
        for c in [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs):  # pylint: disable=protected-access
            if c.name in before and c.name not in between:
                between.add(c.name)
                stack.append(c)
    return region | between


def _exclusive_ancestors(graph, region: set[str], backward: set[str] = frozenset()) -> set[str]:
    """`region` grown by every op all of whose consumers (data and control)
    are in it, walking back no further than the backward pass (its scopes,
    and the ops in `backward` producing gradients outside them: a tape's
    AddN) and the variables."""
    region = set(region)
    frontier = list(region)
    while frontier:
        op = graph.get_operation_by_name(frontier.pop())
        for t in op.inputs:
            p = t.op
            if (p.name in region or in_gradient_scope(p.name) or p.name in backward
                    or p.type in VARIABLE_OP_TYPES or p.type in INPUT_OP_TYPES):
                continue
            consumers = {c.name for out in p.outputs for c in out.consumers()}
            consumers |= {c.name for c in p._control_outputs}  # pylint: disable=protected-access
            if consumers <= region:
                region.add(p.name)
                frontier.append(p.name)
    return region


def _reject_hand_written_updates(graph, index: GraphIndex, trainable, updates, boundary,
                                 writers) -> None:
    """A trainable variable written from a gradient outside any optimizer
    would be updated from this worker's gradient alone: replicas would drift
    apart silently, so refuse it."""
    consumers = {c.name for t in boundary for c in graph.get_tensor_by_name(t).consumers()
                 if not in_gradient_scope(c.name)}
    suspects = [(var, writer) for var in trainable if var.name not in updates
                for writer in writers.get(var.name, [])]
    if not suspects:
        return
    # One walk from every consumer answers "fed by some gradient"; only a
    # writer found there needs the per-consumer walk that names the culprit.
    fed = index.reachable(index.position[c] for c in consumers)
    for var, writer in suspects:
        if index.position[writer] not in fed:
            continue
        target = index.position[writer]
        feeding = sorted(c for c in consumers if target in index.reachable([index.position[c]]))
        if feeding:
            raise UnsupportedGraphError(
                f"variable '{var.name}' is updated by '{writer}' from a gradient through "
                f"'{feeding[0]}', outside any tf.compat.v1 optimizer: its replicas would "
                "diverge. Apply that gradient with an optimizer's apply_gradients.")


def _gradient_boundary(index: GraphIndex) -> set[str]:
    """Names of tensors produced inside a gradients scope and consumed outside.

    A GradientTape adds up a tensor's gradients from several consumers with
    an AddN outside its scope (named "AddN" at the graph's root): a weight
    with a regularizer gets its data gradient and its penalty's that way, a
    shared layer's weight one per use (an embedding used twice: its rows
    and ids concatenated). Such a sum of boundary tensors is itself on the
    boundary, and nearer to the update than its terms, so it is what a
    variable's gradient is (not one term of it, the others then left out of
    the averaging). A term may be an IndexedSlices gradient the tape made
    dense to add it to a dense one (an embedding with a regularizer)."""
    out = set()
    in_gradient = index.in_gradient
    for i, op in enumerate(index.ops):   # creation order: a sum after its terms
        if in_gradient[i]:
            continue
        preds = index.preds[i]
        if any(in_gradient[p] for p in preds):
            out.update(t.name for t, p in zip(op.inputs, preds) if in_gradient[p])
        if index.types[i] not in _AGGREGATING:
            continue
        terms = [t for t in _aggregated_terms(op) if not _zeros(t)]
        if terms and all(t.name in out or _densified(t, out) or _scaled_gradient(t.op, out)
                         for t in terms):
            out.add(op.outputs[0].name)
    return out


_SCALINGS = frozenset({"Mul", "RealDiv", "Div"})


def _scaled_gradient(op, boundary: set[str]) -> bool:
    """Whether `op` scales a gradient by a constant, its only reader: as a
    term of a sum (each of k micro-batches' gradients divided by k before
    they are added up), averaging the sum over workers is averaging each
    term. A gradient read by anything else as well (tf.clip_by_norm
    multiplies it by its constant norm and also takes its norm) is not such
    a term: every reader must see the average."""
    if op.type not in _SCALINGS or len(op.inputs) != 2:
        return False
    a, b = op.inputs
    if op.type == "Mul" and _scalar_constant(a):
        a, b = b, a
    return ((a.name in boundary or _densified(a, boundary)) and _scalar_constant(b)
            and a.dtype.is_floating and [c.name for c in a.consumers()] == [op.name])


def _scalar_constant(t: tf.Tensor) -> bool:
    t = uncast(t)
    return t.op.type == "Const" and t.shape.num_elements() == 1


def _zeros(t: tf.Tensor) -> bool:
    """A tensor of zeros an accumulation starts from (tf.zeros_like(v),
    tf.zeros(shape)): a term of a sum that adds nothing."""
    if t.op.type == "ZerosLike":
        return True
    if t.op.type == "Fill":
        t = t.op.inputs[1]
    return t.op.type == "Const" and not np.any(tf.make_ndarray(t.op.get_attr("value")))


def _densified(t: tf.Tensor, boundary: set[str]) -> bool:
    """Whether `t` is an IndexedSlices gradient made dense: a segment sum of
    its values by its indices, both from the backward pass (what
    tf.convert_to_tensor builds, outside the tape's scope). Only as a term
    of a sum: an optimizer densifies a gradient the same way, and that one
    stays sparse."""
    return (t.op.type == "UnsortedSegmentSum"
            and all(x.name in boundary for x in t.op.inputs[:2]))


_AGGREGATING = frozenset({"AddN", "Add", "AddV2", "ConcatV2"})


def _aggregated_terms(op) -> list:
    """The gradients a tape's aggregation op adds up: an AddN's inputs, or
    the pieces a ConcatV2 joins (an IndexedSlices gradient of a variable
    used twice, a tied embedding: its values and its indices each
    concatenated); none for other ops. A program's own sum of two gradients
    (micro-batches' tapes added up with `+`) is one too: each term is this
    worker's, and only their sum is the gradient of its step."""
    if op.type in ("AddN", "Add", "AddV2"):
        return list(op.inputs)
    if op.type == "ConcatV2":
        return list(op.inputs)[:-1]
    return []


def _inside_a_function(graph: tf.Graph, index: GraphIndex, boundary: set[str]) -> str:
    """Why no update was found when the gradients flow into an op that runs
    a function body, else "". A traced tf.cond that writes variables (Keras's
    LossScaleOptimizer, gradient accumulation) was lowered when the step was
    lifted (transforms.lower_cond); a loop, a call, or a tf.compat.v1 graph's
    own functional cond remain."""
    starts = [index.position[graph.get_tensor_by_name(t).op.name] for t in sorted(boundary)]
    for i in sorted(index.reachable(starts)):
        op = index.ops[i]
        if op.type in FUNCTION_OPS and not in_gradient_scope(op.name):
            if op.type in ("If", "StatelessIf", "Case", "StatelessCase"):
                return (f"The gradients reach '{op.name}' ({op.type}), which runs a function "
                        "body: updates applied inside a tf.cond of a tf.compat.v1 graph in "
                        "control flow v2 are not ones autopar reads; build the graph after "
                        "tf.compat.v1.disable_control_flow_v2() (its tf.cond is then Switch and "
                        "Merge ops), or apply the gradients outside the cond.")
            return (f"The gradients reach '{op.name}' ({op.type}), which runs a function "
                    "body: updates applied inside a loop or a called function are not ones "
                    "autopar can distribute; apply the gradients outside one.")
    return ""


def _first_consumer(graph: tf.Graph, boundary: set[str]) -> str:
    for op in graph.get_operations():
        if not in_gradient_scope(op.name) and any(t.name in boundary for t in op.inputs):
            return op.name
    return "?"


def _trainable_variable_ops(graph: tf.Graph) -> list[tf.Operation]:
    seen, out = set(), []
    for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES):
        if v.op.name not in seen:
            seen.add(v.op.name)
            out.append(v.op)
    return out


def _update_ops_by_variable(index: GraphIndex, var_ops: list[tf.Operation]) -> dict[str, list[str]]:
    """Ops under "<opt>/update_<var>/", assigned to the longest matching var name
    (so "update_a/b/..." belongs to variable "a/b", not "a")."""
    # Rank of each name: longest first, then creation order (the order a
    # stable sort by length would try them in).
    names = sorted((v.name for v in var_ops), key=len, reverse=True)
    rank = {name: i for i, name in reversed(list(enumerate(names)))}
    out: dict[str, list[str]] = collections.defaultdict(list)
    for name in index.names:
        padded = "/" + name
        start = padded.find("/update_")
        if start < 0:
            continue
        # Every "/update_<candidate>/" in the name, <candidate> ending at a
        # "/": a set lookup each instead of a substring test per variable.
        best = None
        while start >= 0:
            begin = start + len("/update_")
            end = padded.find("/", begin)
            while end >= 0:
                candidate = padded[begin:end]
                if candidate in rank and (best is None or rank[candidate] < rank[best]):
                    best = candidate
                end = padded.find("/", end + 1)
            start = padded.find("/update_", start + 1)
        if best is not None:
            out[best].append(name)
    return dict(out)


def _variable_info(graph, var_op, update_ops, boundary, slots_of: dict[str, list[str]],
                   writers: list[str]) -> VariableInfo:
    """Everything about one variable but its path ops and own region, which
    analyze_graph finds for all variables together. `writers`: the ops
    that write it (writers_by_variable)."""
    var_tensor = var_op.outputs[0]
    if var_op.type == "VarHandleOp":
        shape = tuple(tf.TensorShape(var_op.get_attr("shape")).as_list())
        dtype = tf.as_dtype(var_op.get_attr("dtype"))
    else:
        shape = tuple(var_tensor.shape.as_list())
        dtype = var_tensor.dtype.base_dtype
    nbytes = int(dtype.size * _prod(shape))
    update_set = set(update_ops)
    # its own writes in its update (several: several updates in one step)
    writes = [w for w in writers if w in update_set]

    def dense_gradient():
        return _nearest_boundary(graph, update_set, boundary,
                                 [lambda t: t.dtype.is_floating and static_shape(t) == shape])[0]

    def sparse_gradient():   # (values, indices)
        return _nearest_boundary(graph, update_set, boundary,
                                 [lambda t: t.dtype.is_floating and _rows_of(t, shape),
                                  lambda t: (t.dtype.is_integer and t.shape.rank == 1
                                             and not _is_dense_shape(t, shape))])

    sparse = any(m in graph.get_operation_by_name(u).type
                 for u in update_ops for m in _SPARSE_UPDATE_MARKERS)
    dense = pair = None
    if not sparse:
        # An optimizer may densify an IndexedSlices gradient before updating
        # the whole variable (Keras's do): the gradient is sparse when what
        # leaves the backward pass for it is rows and indices, not a tensor
        # of its shape.
        dense = dense_gradient()
        if dense is None:
            pair = sparse_gradient()
            sparse = None not in pair
        if dense is None and not sparse:
            # A gradient whose static shape the trace left partly unknown (a
            # Dense layer on a sequence: Tensordot reshapes by a computed
            # shape, so the kernel's gradient is (None, units)); it is the
            # variable's shape when it runs.
            dense = _nearest_boundary(graph, update_set, boundary, [
                lambda t: t.dtype.is_floating and t.shape.is_compatible_with(shape)
                and t.shape.rank == len(shape)])[0]
    info = VariableInfo(name=var_op.name, shape=shape, dtype=dtype.name, bytes=nbytes,
                        gradient="sparse" if sparse else "dense", update_ops=sorted(update_ops),
                        resource=var_op.type == "VarHandleOp")
    if sparse:
        _refuse_several_gradients(var_op, _row_gradients(graph, update_set, boundary, shape),
                                  writes)
        info.grad_values, info.grad_indices = pair or sparse_gradient()
        if info.grad_values is None or info.grad_indices is None:
            raise UnsupportedGraphError(
                f"variable '{var_op.name}' is updated sparsely by '{update_ops[0]}' but its "
                "IndexedSlices gradient (values and indices) could not be traced to the backward pass")
        info.grad_values = _values_beside(graph, info.grad_values, info.grad_indices, boundary,
                                          shape)
        info.dedup = deduplicated(graph.get_tensor_by_name(info.grad_indices))
        rows = static_shape(graph.get_tensor_by_name(info.grad_values))
        if rows and rows[0] is not None and shape and shape[0]:
            # One row per looked-up id, repeats included: more than the
            # table's rows when a batch looks up more ids than it has.
            info.alpha = rows[0] / shape[0]
    else:
        info.grad_tensor = dense
        if info.grad_tensor is None:
            raise UnsupportedGraphError(
                f"variable '{var_op.name}' is updated by '{update_ops[0]}' but no gradient of "
                f"shape {list(shape)} reaching it was found. autopar understands gradients from "
                "tf.gradients or a GradientTape passed (optionally through clipping/scaling) to "
                "an optimizer or a write of the variable")
        _refuse_several_gradients(var_op, _elementwise_gradients(graph, update_set, boundary,
                                                                 shape), writes)
    info.slots = sorted(slots_of.get(var_op.name, []))
    info.boundary_ops = _boundary_ops(graph, var_op)
    return info


def _loop_computing_gradients(graph: tf.Graph) -> tf.Operation | None:
    """A functional loop op of the graph whose body (or a function it
    calls) computes gradients, or None."""
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    library = library_functions(graph) if loops else {}
    for op in loops:
        if any(in_gradient_scope(node.name + "/x")
               for _, body in functions_run_by(library, [op.get_attr("body").name])
               for node in body.node_def):
            return op
    return None


def _refuse_several_gradients(var_op, terms: list[str], writes: list[str]) -> None:
    """A variable whose update reads several gradients (`terms`, of the
    backward pass) is refused: autopar averages one gradient per variable.
    Several `writes` of it, each from a gradient of its own, are several
    updates in one step (a GAN's critic trained several times per step:
    WGAN-GP); otherwise the gradients are combined before the update
    (each micro-batch's clipped, then added)."""
    if len(terms) < 2:
        return
    if len(writes) > 1:
        raise UnsupportedGraphError(
            f"variable '{var_op.name}' is updated {len(writes)} times in one step "
            f"('{writes[0]}', '{writes[1]}'), each from a gradient of its own "
            f"('{terms[0]}', '{terms[1]}'): autopar averages one gradient per variable per "
            "step over the workers. Make each update a step of its own (a train op run "
            "once per update, or the step called once per update)")
    raise UnsupportedGraphError(
        f"variable '{var_op.name}' is updated from {len(terms)} gradients combined "
        f"otherwise than by a sum ('{terms[0]}', '{terms[1]}'): autopar averages one "
        "gradient per variable over the workers. Add them up (+ or tf.add_n) before "
        "anything else reads them")


def _nearest_boundary(graph, update_set: set[str], boundary: set[str], accepts) -> list[str | None]:
    """For each predicate in `accepts`, the boundary tensor nearest to the
    update ops' outside inputs (BFS backward, not crossing the gradients
    scope or a variable) that it accepts; ties go to the smaller name.

    Level by level, stopping after the first level where every predicate has
    its answer: a clipped gradient is a step or two away, while the other
    gradients (reached through the global norm) are farther, so the walk
    does not visit every variable's gradient for each variable."""
    found: list[str | None] = [None] * len(accepts)
    seen: set[str] = set()
    level: list[tf.Tensor] = []
    for t in _update_inputs(graph, update_set):
        if t.name not in seen:
            seen.add(t.name)
            level.append(t)
    while level and None in found:
        hits = sorted((t for t in level if t.name in boundary), key=lambda t: t.name)
        for k, accept in enumerate(accepts):
            if found[k] is None:
                found[k] = next((t.name for t in hits if accept(t)), None)
        following = []
        for t in level:
            if t.name in boundary or in_gradient_scope(t.op.name) or t.op.type in VARIABLE_OP_TYPES:
                continue
            for inp in _inputs_behind(t):
                if inp.name not in seen:
                    seen.add(inp.name)
                    following.append(inp)
        level = following
    return found


def _update_inputs(graph, update_set: set[str]) -> list[tf.Tensor]:
    """What the update ops read from outside them, in their names' order:
    where walks back to the gradient start."""
    return [t for name in sorted(update_set) for t in graph.get_operation_by_name(name).inputs
            if t.op.name not in update_set]


def _elementwise_gradients(graph, update_set: set[str], boundary: set[str], shape) -> list[str]:
    """The backward-pass tensors of the variable's shape that reach its
    update through tensors of that shape only. One is its gradient; others
    beside it (two micro-batches' gradients each clipped, then added) are
    terms that averaging the one would leave this worker's own. What comes
    through a reduction (another variable's gradient in a global norm)
    does not count."""
    return _gradients_reaching(graph, update_set, boundary,
                               lambda t: static_shape(t) == tuple(shape))


def _row_gradients(graph, update_set: set[str], boundary: set[str], shape) -> list[str]:
    """The same for rows of the variable (an IndexedSlices gradient's
    values, or a dense gradient): more than one (each micro-batch's rows
    clipped, then made dense and added) are terms of which averaging one
    would leave the others this worker's own."""
    return _gradients_reaching(graph, update_set, boundary,
                               lambda t: t.dtype.is_floating and _rows_of(t, shape))


def _gradients_reaching(graph, update_set: set[str], boundary: set[str], kept) -> list[str]:
    """The boundary tensors that reach the update ops through tensors
    `kept` accepts only, walking back from the update's inputs."""
    found, seen = set(), set()
    stack = _update_inputs(graph, update_set)
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        if not kept(t):
            continue
        if t.name in boundary:
            found.add(t.name)
        elif not in_gradient_scope(t.op.name) and t.op.type not in VARIABLE_OP_TYPES:
            stack.extend(_inputs_behind(t))
    return sorted(found)


def _inputs_behind(t: tf.Tensor) -> list[tf.Tensor]:
    """The inputs tensor `t`'s value comes from: all its op's inputs, but for
    IdentityN only the one at t's position. Keras 3's optimizers pass every
    gradient through one IdentityN (output k is input k); walking back
    through all its inputs reaches every gradient at once, and two variables
    of one shape (a batch norm's gamma and beta) took each other's."""
    if t.op.type == "IdentityN":
        return [t.op.inputs[t.value_index]]
    return list(t.op.inputs)


def _values_beside(graph, values: str, indices: str, boundary: set[str], shape) -> str:
    """The IndexedSlices values that go with `indices`: an op taking both
    (the scatter, the densifying segment sum) names the pair. Another
    gradient of the same row shape may be as near to the update (through a
    global norm: a dense [4, 4] kernel's gradient looks like 4 rows of a
    [20, 4] table); keep `values` only if nothing pairs another tensor with
    the indices."""
    paired = {t.name for c in graph.get_tensor_by_name(indices).consumers() for t in c.inputs
              if t.name in boundary and t.name != indices and t.dtype.is_floating
              and _rows_of(t, shape)}
    if values in paired or len(paired) != 1:
        return values
    return paired.pop()


def _is_dense_shape(t: tf.Tensor, var_shape) -> bool:
    """Whether `t` is an IndexedSlices gradient's dense_shape rather than its
    indices: the variable's shape, read from it (Shape, VariableShape) or
    folded into a constant (a ResourceGather's gradient on a variable of
    static shape). It is as near to a densifying update as the indices (its
    first element is the segment sum's num_segments)."""
    t = uncast(t)
    if t.op.type in ("Shape", "VariableShape"):
        return True
    value = tf.get_static_value(t)
    return value is not None and [int(x) for x in value] == list(var_shape)


def _rows_of(t: tf.Tensor, var_shape) -> bool:
    s = static_shape(t)
    return s is not None and len(s) == len(var_shape) and tuple(s[1:]) == tuple(var_shape[1:])


def _path_ops(index: GraphIndex, variables: list[tuple[list[str], set[str]]]) -> list[list[str]]:
    """For each (gradient tensors, update ops) pair: the ops outside the
    gradients scope that lie on a data path from a gradient's op to an update
    op (a descendant of the one and an ancestor of the other), update ops
    excluded. All pairs at once: one forward pass carries a bitset of the
    variables whose gradient reaches each op, one backward pass a bitset of
    the variables whose update each op reaches."""
    position = index.position
    down_seeds: dict[int, int] = collections.defaultdict(int)
    up_seeds: dict[int, int] = collections.defaultdict(int)
    starts_of = []
    for k, (grads, updates) in enumerate(variables):
        starts = {position[op_name_of(g)] for g in grads}
        starts_of.append(starts)
        for i in starts:
            down_seeds[i] |= 1 << k
        for u in updates:
            up_seeds[position[u]] |= 1 << k
    down = index.propagate(down_seeds, forward=True)
    up = index.propagate(up_seeds, forward=False)
    out: list[list[str]] = [[] for _ in variables]
    for i, name in enumerate(index.names):
        both = down[i] & up[i]
        if not both or in_gradient_scope(name):
            continue
        while both:
            low = both & -both
            k = low.bit_length() - 1
            both ^= low
            if name in variables[k][1]:
                continue
            if i in starts_of[k] and not _reached_from_other(index, i, starts_of[k]):
                continue   # a gradient's own op counts only if another one feeds it
            out[k].append(name)
    return [sorted(names) for names in out]


def _reached_from_other(index: GraphIndex, target: int, starts: set[int]) -> bool:
    """Whether `target` is a descendant of a start other than itself (the
    forward pass also reports a start on a loop as its own descendant)."""
    others = [s for s in starts if s != target]
    if not others:
        return False
    return target in index.reachable(j for s in others for j in index.succs[s])


def _own_region(graph, info: VariableInfo, grads: set[str], update_set: set[str]) -> None:
    """Split the path from gradient to update into this variable's own ops and
    norm terms. An own op may take other tensors only as scalars (a clipping
    scale); a non-scalar from elsewhere means the update needs more than this
    variable's aggregated gradient, so it cannot simply move to a server."""
    path = set(info.path_ops)
    own, norms, frontier, passes = set(), set(), list(grads), set()
    while frontier:
        t = graph.get_tensor_by_name(frontier.pop())
        for c in t.consumers():
            if c.name in update_set or c.name in own or in_gradient_scope(c.name):
                continue
            if c.type == "L2Loss" and t.name in grads:
                norms.add(c.name)
            elif c.type == "IdentityN" and c.name in path:
                # Keras's optimizers pass every gradient through one
                # IdentityN, output k being input k: this variable's own
                # outputs only, the gradient itself (the other inputs are
                # other variables' gradients, not combined with this one)
                own.add(c.name)
                passed = [o.name for o, x in zip(c.outputs, c.inputs) if x is t]
                grads = grads | set(passed)
                passes.add(c.name)
                frontier.extend(passed)
            elif c.name in path:
                own.add(c.name)
                frontier.extend(o.name for o in c.outputs)
    inside = own | update_set
    for name in sorted(inside - passes):
        for t in graph.get_operation_by_name(name).inputs:
            if t.name in grads or t.op.name in inside or t.op.type in VARIABLE_OP_TYPES:
                continue
            if not t.dtype.is_floating:
                continue   # a shape or indices (its dense_shape): not another gradient's values
            if in_gradient_scope(t.op.name) or (t.shape.rank not in (0, None) and t.op.name in path):
                info.ps_blocker = (f"'{name}' combines this gradient with the non-scalar "
                                   f"'{t.name}' derived from other gradients")
                break
        if info.ps_blocker:
            break
    info.own_path_ops = sorted(own)
    info.norm_ops = sorted(norms)


def _variables_passed_to_updates(graph, updates: dict[str, list[str]],
                                 trainable: set[str]) -> dict[str, set[str]]:
    """{non-trainable variable: the trainable variables whose update ops
    write it (take its handle or reference in an op that is not a read)}.

    A slot is decided from data flow, whatever its name: an optimizer
    passes a variable's slots by handle to the fused update it writes them
    in (ResourceApplyAdam's m and v), or writes them itself inside the
    update (the sparse paths' assign/scatter ops), while state shared by
    every variable's update (Adam's beta powers, a learning-rate variable)
    is only read there, or written by several variables' updates. So a
    slot of v is a variable only v's update ops write; an optimizer built
    inside a variable_scope names it "<scope>/<v>/<slot>"
    ("model/model/emb/Adagrad"), which no name prefix would find."""
    users: dict[str, set[str]] = collections.defaultdict(set)
    for var, ops in updates.items():
        for name in ops:
            op = graph.get_operation_by_name(name)
            if op.type in _READ_OP_TYPES:
                continue
            for t in op.inputs:
                if (t.op.type in VARIABLE_OP_TYPES and t.op.name != var
                        and t.op.name not in trainable):
                    users[t.op.name].add(var)
    return users


def _boundary_ops(graph, var_op) -> list[str]:
    """Light ops reading the variable's value (through reads and Identity)."""
    out = set()
    frontier = [var_op]
    seen = set()
    while frontier:
        op = frontier.pop()
        for t in op.outputs:
            for c in t.consumers():
                if c.name in seen or in_gradient_scope(c.name):
                    continue
                seen.add(c.name)
                if c.type in ("ReadVariableOp", "Identity"):
                    frontier.append(c)
                elif c.type in _BOUNDARY_OP_TYPES:
                    out.add(c.name)
    return sorted(out)


def _step_state(graph, trainable, slot_names, update_ops, local_ops: set[str],
                writers: dict[str, list[str]]) -> list[StateInfo]:
    trainable_names = {v.name for v in trainable}
    gs = tf1.train.get_global_step(graph)
    gs_name = gs.op.name if gs is not None else None
    update_inputs = {t.op.name for u in update_ops for t in graph.get_operation_by_name(u).inputs}
    optimizer_scopes = _optimizer_scopes(update_ops)
    state = []
    for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        name = v.op.name
        if name in trainable_names or name in slot_names:
            continue
        if name == gs_name:
            kind = "global_step"
        elif any(w in local_ops for w in writers.get(name, [])):
            kind = "local"
        elif name.endswith("/ExponentialMovingAverage"):
            kind = "ema"
        elif name in update_inputs or any(w.split("/")[0] in optimizer_scopes
                                          for w in writers.get(name, [])):
            kind = "optimizer"
        else:
            kind = "other"
        state.append(StateInfo(name=name, kind=kind, update_ops=sorted(writers.get(name, []))))
    return state


def _mark_read_by_loss(index: GraphIndex, state: list[StateInfo],
                       losses: list[str | None]) -> None:
    """Sets read_by_loss on the `state` variables whose values a loss is
    computed from (data edges from the variable op: its reads; its writes
    produce no value a loss reads)."""
    if not state:
        return
    computed_from = index.computing(losses)
    for s in state:
        s.read_by_loss = index.position.get(s.name, -1) in computed_from


def _optimizer_scopes(update_ops) -> set[str]:
    return {u.split("/")[0] for u in update_ops}


# What passes a variable (its handle, or a reference) on unchanged to a
# write: V1 control flow's switch into a cond's branch (a TF1 batch norm's
# moving statistics updated under tf.cond(training, ...)), an identity.
_PASSING_A_VARIABLE = frozenset({"Switch", "RefSwitch", "Identity", "RefIdentity"})


def _written_variable(op: tf.Operation) -> tf.Operation | None:
    """The variable op a write's first input is, through _PASSING_A_VARIABLE."""
    if not op.inputs:
        return None
    source = op.inputs[0].op
    for _ in range(8):
        if source.type in VARIABLE_OP_TYPES:
            return source
        if source.type not in _PASSING_A_VARIABLE or not source.inputs:
            return None
        source = source.inputs[0].op
    return None


def writers_by_variable(index: GraphIndex) -> dict[str, list[str]]:
    """Ops writing a variable, excluding its initializer."""
    out = collections.defaultdict(list)
    for op in index.of_types(t for t in index.op_types() if writes_variable(t)):
        written = _written_variable(op)
        if written is not None:
            var = written.name
            if "/Initializer/" in "/" + op.name + "/" or op.name in (f"{var}/Assign", f"{var}/Assign:0"):
                continue
            if is_restore_assignment(op):
                continue
            out[var].append(op.name)
    return out


def _loss_seeds(index: GraphIndex) -> list[tuple[str, str]]:
    """(seed op, loss tensor) of every tf.gradients call: the tensor it
    differentiated. The seed "<scope>/grad_ys_0" is consumed by
    "<scope>/<loss op>_grad/..." ops, which name the loss op."""
    out = []
    graph = index.graph
    for i, name in enumerate(index.names):
        if not (name.endswith("grad_ys_0") and index.in_gradient[i]):
            continue
        op = index.ops[i]
        scope = op.name[: -len("grad_ys_0")]
        for consumer in op.outputs[0].consumers():
            rest = consumer.name[len(scope):]
            if consumer.name.startswith(scope) and "_grad/" in rest:
                loss_op = rest[: rest.index("_grad/")]
                try:
                    loss = graph.get_operation_by_name(loss_op).outputs[0]
                except KeyError:
                    continue
                out.append((op.name, _named_alias(loss).name))
                break
    return out


def _named_alias(t: tf.Tensor) -> tf.Tensor:
    """Identity has no gradient op, so `loss = tf.identity(mean, name="loss")`
    is found as the mean; follow a lone forward Identity to the user's name."""
    while True:
        forward = [c for c in t.consumers() if not in_gradient_scope(c.name)]
        if len(forward) != 1 or forward[0].type != "Identity":
            return t
        t = forward[0].outputs[0]


def _step_ops(index: GraphIndex, update_ops: set[str]) -> frozenset[str]:
    """The update ops and everything after them along data and control edges."""
    reached = index.reachable((index.position[u] for u in update_ops),
                              extra=index.control_succs)
    return frozenset(index.names[i] for i in reached)


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
