"""The parameter-server method's graph protocol (Parallax §5.1, §5.3):
variables on servers, gradients pushed into accumulators, the update applied
once per step (planning and cost: transforms.methods.ps.method).

Per step, for a PS variable v:
  every worker   pushes its gradient (sparse: one row per distinct touched
                 index and the indices, packed in one tensor; scaled for
                 averaging) into v's accumulator on v's server —
                 with local aggregation only one worker per host pushes the
                 host's combined rows;
  the chief      takes the aggregate once every contribution is in, runs v's
                 own post-aggregation ops (clipping by the shared scale) and
                 v's optimizer update on the server, then releases one token
                 to each other worker;
  other workers  wait for their token before finishing the step, so nobody
                 reads v for step k+1 before step k's update is applied.
Messages between processes are what this protocol costs beyond bytes (each a
gRPC call and a context switch on both sides): the chief's takes wait for its
pushes on their own server, another worker's pushes are fetched with its step
on their servers (Edits.step_targets) and its token wait waits for nothing of
its own, every read of v that nothing orders apart shares one transfer per
step (_merge_reads), and constants a server op needs are made on that server.
All of this is per train group (Analysis.train_groups): each group has its
own pushes, release, tokens and wait, and each set of groups one fetch can
update has its own end-of-step barrier (Plan.barriers), so a step of one
train op runs exactly that train op's server work.
A global-norm term of a sparse gradient is additive over workers, so every
worker gets it from one scalar all-reduce and can clip its replicated dense
variables without waiting for the servers.

A sparse variable whose update transforms each row before rows of one id
are added (VariableInfo.row_wise: Keras's Adam, Adagrad, RMSprop square
them) keeps every row: a worker (or its host, its aggregation group) pushes
its rows as they left the tapes, scaled, into a queue of its own per
partition (a FIFO of one element per step), and the chief's update reads
every contributor's rows, in contributor order, concatenated: the rows one
device's update reads, in the order of the global batch's shards.

Accumulators and token queues are shared by name on the servers, so each
worker's own graph refers to the same objects.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.common.roles import SERVER_JOB
from autopar.transforms.comm import collective_rank
from autopar.transforms.graph_utils import in_gradient_scope, node_input_name
from autopar.transforms.methods.base import Edits, VariablePlan
from autopar.transforms.ops import ConstantPool, NodeWriter, new_op, rows_where
from autopar.transforms.partition import (PartitionedVariable, Partitioner, PullGroup, RowLayout,
                                          copy_prefix, dealt_sizes, read_order)
from autopar.transforms.placement import Move, ps_devices, server_device
from autopar.transforms.sparse_rows import combine_rows, split_shared_rows

if TYPE_CHECKING:   # annotations only: the plan imports the method registry, the
    # analysis (through the graph features) too
    from autopar.transforms.analysis import Analysis, VariableInfo
    from autopar.transforms.plan import Plan

tf1 = tf.compat.v1

# Accumulators drop a gradient whose step is older than theirs; the token
# protocol already keeps workers in step, so every push claims a step no
# accumulator can have reached.
_ALWAYS_FRESH = 1 << 62


# Names (under the "autopar" scope) of the contribution counters' ops.
COUNTERS_INIT = "autopar/init_contribution_counters"
CONTRIBUTIONS_OP = "autopar/contributions"


def pulls_per_group(vp: VariablePlan) -> bool:
    """Whether the plan pulls this variable's rows once per aggregation group
    (Config.aggregation_group): ParameterServer.variable_plan gave it the
    keys of its lookups' gathers, broadcasts and barriers."""
    return "pull_barrier" in vp.keys


def pack_rows(values: tf.Tensor, indices: tf.Tensor, constants: ConstantPool) -> tf.Tensor | None:
    """A sparse push's indices and rows as one uint8 tensor [n, 8 + row bytes]
    (each row's int64 index, then its bytes), so that the push costs the
    server one receive (a RecvTensor RPC) instead of two; None when a row's
    shape is not fully known or it has no elements. Built on the worker,
    bitcasts and a concat: the bytes are copied, never converted."""
    row = values.shape[1:]
    if not row.is_fully_defined() or row.num_elements() == 0:
        return None
    dtype = values.dtype.base_dtype
    row_bytes = row.num_elements() * dtype.size
    as_bytes = new_op("Bitcast", [values], T=dtype, type=tf.uint8).outputs[0]
    flat = new_op("Reshape", [as_bytes, constants.get([-1, row_bytes], tf.int32)],
                  T=tf.uint8, Tshape=tf.int32).outputs[0]
    ids = new_op("Bitcast", [indices], T=tf.int64, type=tf.uint8).outputs[0]
    return new_op("ConcatV2", [ids, flat, constants.get(1, tf.int32)], N=2, T=tf.uint8,
                  Tidx=tf.int32).outputs[0]


def unpack_rows(packed: tf.Tensor, row_shape: list[int], dtype: tf.DType,
                constants: ConstantPool, device: str) -> tuple[tf.Tensor, tf.Tensor]:
    """(values, indices) from pack_rows' tensor, built on `device` (the server)."""
    def cols(start: int, size: int) -> tf.Tensor:
        return new_op("Slice", [packed, constants.get([0, start], tf.int32, device),
                                constants.get([-1, size], tf.int32, device)],
                      T=tf.uint8, Index=tf.int32).outputs[0]
    with tf.device(device):
        indices = new_op("Bitcast", [cols(0, 8)], T=tf.uint8, type=tf.int64).outputs[0]
        shape = [-1, *row_shape] + ([dtype.size] if dtype.size > 1 else [])
        as_bytes = new_op("Reshape", [cols(8, -1), constants.get(shape, tf.int32, device)],
                          T=tf.uint8, Tshape=tf.int32).outputs[0]
        values = new_op("Bitcast", [as_bytes], T=tf.uint8, type=dtype).outputs[0]
    return values, indices


def _packs_rows(info: VariableInfo) -> bool:
    """Whether pack_rows packs this variable's gradient rows (a static row
    shape with elements)."""
    return all(d is not None for d in info.shape[1:]) and int(np.prod(info.shape[1:])) > 0


def _joined(ops: list[tf.Operation], name: str) -> tf.Operation:
    """A NoOp that runs after all `ops`: one control edge for dependants."""
    with tf.control_dependencies(None), tf.device(None):
        return tf.group(*ops, name=name)


class PsBuilder:
    def __init__(self, graph: tf.Graph, analysis: Analysis, plan: Plan, worker_index: int,
                 backend, worker_device: str, moves: list[Move] | None = None,
                 constants: ConstantPool | None = None, nodes: NodeWriter | None = None):
        if nodes is None:
            raise ValueError("PsBuilder needs the rewrite's NodeWriter (RewriteContext.nodes): "
                             "its nodes are written into the scratch graph's export")
        self.g = graph
        self.analysis = analysis
        self.plan = plan
        self.index = worker_index
        self.is_chief = worker_index == 0
        self.backend = backend
        self.worker_device = worker_device
        self.edits = Edits()
        self.moves = moves   # OPAU/OPSW placement computed beforehand (None: compute it here)
        # Per train group: its collectives (as ops, and written as NodeDefs by
        # self.nodes), its pushes and the op standing for all of them.
        self.collectives: dict[int, list[tf.Operation]] = {}
        self.collective_nodes: dict[int, list[str]] = {}
        self.pushes: dict[int, list] = {}
        self._pushed_on: dict[tuple[int, str], str] = {}   # (group, server device) -> NoOp
        self._collectives_done: dict[int, list[tf.Operation]] = {}   # non-chief, per group
        self._counters: dict[tuple[str, int], tf.Tensor] = {}
        self.constants = constants or ConstantPool(worker_device)
        # The per-variable and per-partition ops, written as NodeDefs
        self.nodes = nodes

    def build(self) -> Edits:
        ps_vars = self.plan.server_variables
        if not ps_vars:
            return self.edits
        host_key, members = self.plan.push_group(self.index)
        la = self.plan.local_aggregation and len(members) > 1
        self.is_host_leader = not la or members[0] == self.index
        # Config.aggregation_group: the group's lookups of partitioned sparse
        # variables pull once, by its first worker (transforms.partition)
        # (bounded by the stall timeout: a lookup one member runs alone, e.g. a
        # fetch of the loss by the chief only, fails naming its collective)
        self.pull_group = (PullGroup(self.backend.subgroup(len(members), host_key,
                                                           self.plan.collective_timeout_s),
                                     collective_rank(self.index, members),
                                     collective_rank(members[0], members))
                           if self.plan.grouped_pulls and len(members) > 1 else None)
        accumulators = {}
        self.part_handles: dict[str, list[str]] = {}
        with tf.name_scope("autopar/partition"):
            for vp in ps_vars:
                if len(vp.partitions) > 1:
                    self._split(vp)
        by_group: dict[int, list[VariablePlan]] = {}
        for vp in ps_vars:
            by_group.setdefault(self.analysis.variable(vp.name).group, []).append(vp)
        with tf.name_scope("autopar/ps"):
            for vp in ps_vars:
                info = self.analysis.variable(vp.name)
                self.group = info.group
                accumulators[vp.name] = self._accumulators(vp, info)
                self._norm_terms(vp, info)
                contribution = self._contribution(vp, info, la, host_key, members)
                if self.is_host_leader:
                    self._push(vp, info, accumulators[vp.name], contribution)
            done = {}
            for group, group_vars in sorted(by_group.items()):
                self.group = group
                if self.is_chief:
                    for vp in group_vars:
                        self._take(vp, self.analysis.variable(vp.name), accumulators[vp.name])
                    done[group] = self._release(group_vars)
                else:
                    done[group] = self._wait(group_vars)
        devices, self.edits.server_variables = ps_devices(
            self.g, self.analysis, self.plan, self.is_chief, self.worker_device, self.moves)
        self.edits.devices.update(devices)
        for vp in ps_vars:
            self._ordered_reference_reads(self.analysis.variable(vp.name), vp)
            self._merge_reads(self.analysis.variable(vp.name), vp)
        for barrier in self.plan.barriers:
            self._barrier(barrier, done)
        self._counter_ops(ps_vars)
        return self.edits

    def _ordered_reference_reads(self, info: VariableInfo, vp: VariablePlan) -> None:
        """A reference variable (VariableV2) on a server, read on a worker by
        an op of the step that runs after its update (an
        ExponentialMovingAverage of it): on one device that op reads the
        variable's buffer after the update (its snapshot aliases the
        buffer); here the value crosses to the worker when the server sends
        it, which nothing orders after the update. So such an op reads a
        server-side Identity of the variable that waits for its update ops
        (on a non-chief, their NoOps waiting for the chief's release)."""
        if info.resource or len(vp.partitions) != 1:
            return
        var = self.g.get_operation_by_name(info.name)
        region = set(info.update_ops) | set(info.own_path_ops)
        reads = [(c, info.name) for c in var.outputs[0].consumers()]
        reads += [(c, node_input_name(s.outputs[0].name)) for s in var.outputs[0].consumers()
                  if s.type == "Identity" for c in s.outputs[0].consumers()]
        ordered = None
        for consumer, read in reads:
            if (consumer.name in region or consumer.name not in self.analysis.step_ops
                    or consumer.type in ("Identity", "Assign", "IsVariableInitialized")
                    or consumer.name in self.edits.devices):
                continue
            if ordered is None:
                ordered = self.nodes.add(
                    "Identity", [info.name, *("^" + u for u in info.update_ops)],
                    server_device(vp.servers[0]), T=tf.as_dtype(info.dtype))
            self.edits.inputs.setdefault(consumer.name, {})[read] = ordered

    def _merge_reads(self, info: VariableInfo, vp: VariablePlan) -> None:
        """One transfer per step for the reads of a whole server variable
        that nothing orders apart.

        A program reads a resource variable once per use: an unrolled RNN
        reads its kernel at every time step, each read its own
        ReadVariableOp. On one device that is free; with the variable on a
        server each read moved the whole variable to the worker (the LM
        example's 20-step LSTM: 20 copies of its 2 MB kernel per step in ps
        mode). A read's only data input is the handle, so only its control
        inputs order it against the variable's writes: reads with the same
        control inputs (and in no control-flow body, whose reads take an
        Enter'd handle, not the handle) see the same value, and all become
        the first one's value, received once. The rest run on the worker
        as Identities. Reads feeding an op on a server (an OPSW move) or
        inside the variable's update region keep their own transfer.
        Partitioned variables do the same when their reads are redirected
        to the partitions (transforms.partition)."""
        if not info.resource or len(vp.partitions) != 1:
            return
        var = self.g.get_operation_by_name(info.name)
        region = self._regions([vp])
        server = f"/job:{SERVER_JOB}/"
        kept: dict[tuple[str, ...], tf.Operation] = {}
        for read in sorted(var.outputs[0].consumers(), key=lambda op: op.name):
            if (read.type != "ReadVariableOp" or read.name in region
                    or in_gradient_scope(read.name) or read.name in self.edits.identities
                    or read.name in self.edits.noop_deps
                    or any(self.edits.devices.get(c.name, "").startswith(server)
                           for c in read.outputs[0].consumers())):
                continue
            first = kept.setdefault(read_order(read), read)
            if first is not read:
                self.edits.identities[read.name] = first.outputs[0].name
                self.edits.devices[read.name] = self.worker_device

    def _counter_ops(self, ps_vars) -> None:
        """COUNTERS_INIT (run once by the chief) and CONTRIBUTIONS_OP: every
        accumulator's count, in plan order of variables and partitions."""
        inits, reads = [], []
        for vp in ps_vars:
            for p, server in enumerate(vp.servers):
                device = server_device(server)
                counter = self._counter(vp, p, server)
                zero = self._const(0, tf.int64, device)
                inits.append((self.nodes.add("AssignVariableOp", [counter, zero], device,
                                             dtype=tf.int64), device))
                reads.append(self.nodes.add("ReadVariableOp", [counter], device, dtype=tf.int64))
        self.nodes.group(inits, name=COUNTERS_INIT)
        self.edits.chief_init.append(COUNTERS_INIT)
        self.nodes.add("Pack", reads, name=CONTRIBUTIONS_OP, N=len(reads), T=tf.int64)

    def _barrier(self, barrier, done: dict[int, tf.Operation]) -> None:
        """A scalar all-reduce ending every training step, after all of this
        worker's server work. A graph with collectives shares its step id with
        the other workers, so every worker's server-side partitions of a step
        carry the same id; a worker that finished early would clean that id up
        on the server under a peer still using it. Nobody finishes a step
        before everyone's server work for it is done: the barrier waits for
        this worker's collectives and token (the chief: its release, after
        its takes of every push) here, and for every other op of the
        step that touches a server once the final devices are known
        (cover_server_work). One barrier per set of train groups a fetch can
        update (`barrier.groups`): it waits for those groups' work only."""
        waits = []
        for group in barrier.groups:
            if group in done:
                # The chief's release waits for its takes, which wait for its
                # pushes. Another worker's pushes run as step targets on their
                # servers (no message back to the worker): the token it waits
                # for comes only after the chief took them.
                waits.append(done[group])
                if not self.is_chief:
                    waits += self._collectives_done.get(group, [])
                    for device in sorted({d for _, d in self.pushes.get(group, [])}):
                        target = ((group,), self._pushes_noop(device, group))
                        if target not in self.edits.step_targets:
                            self.edits.step_targets.append(target)
        with tf.control_dependencies(waits):
            token = self.backend.barrier(barrier.key)
        self.edits.step_barriers.append((tuple(barrier.groups), token.op.name))

    def _const(self, value, dtype: tf.DType, device: str | None = None) -> tf.Tensor:
        return self.constants.get(value, dtype, device)

    def _pushes_noop(self, device: str, group: int) -> str | None:
        """A NoOp on `device` standing for this worker's pushes of train
        group `group` there and their contribution counts (None: none)."""
        mine = [(name, d) for name, d in self.pushes.get(group, []) if d == device]
        if not mine:
            return None
        key = (group, device)
        if key not in self._pushed_on:
            # one NoOp on the server stands for them (a control edge per push on
            # every take grew the graph with variables squared)
            self._pushed_on[key] = self.nodes.group(mine)
        return self._pushed_on[key]

    def _own_pushes_on(self, device: str) -> list[str]:
        """A control input on this worker's pushes of the current train
        group to `device` (_pushes_noop), or none.

        The chief's take of an accumulator waits for these, on its own
        server: the take already blocks until every contribution is in, and
        depending on them keeps the chief's pushes (and counts) in its step
        without a message. Waiting instead for the chief's "pushed" NoOp, on
        the worker, cost two messages per server and two hops between
        processes (each server's pushes to the worker, the worker back to
        each take) before any update could start."""
        noop = self._pushes_noop(device, self.group)
        return ["^" + noop] if noop else []

    def _after_collectives(self) -> list[tf.Operation]:
        if not (self.collectives.get(self.group) or self.collective_nodes.get(self.group)):
            return []
        return [self._all_collectives(self.collectives.get(self.group, []), "collectives_done")]

    def _all_collectives(self, ops: list[tf.Operation], name: str) -> tf.Operation:
        """_joined(ops) that also waits for the current train group's
        collectives written as NodeDefs."""
        nodes = self.collective_nodes.get(self.group, [])
        if not nodes:
            return _joined(ops, name)
        with tf.control_dependencies(None), tf.device(None):
            joined = tf.no_op(name=name)
        # grouped at the flush as tf.group groups (one NoOp per device)
        self.nodes.group([(op.name, op.device) for op in ops]
                         + [(n, self.worker_device) for n in nodes],
                         into=joined.name)
        return joined

    # -- shared objects ------------------------------------------------------
    def _accumulators(self, vp: VariablePlan, info: VariableInfo) -> list:
        """Per partition: its accumulator, or for a row-wise variable its
        queues, one per contributor (_row_queues)."""
        out = []
        for p, ((start, end), server) in enumerate(zip(vp.partitions, vp.servers)):
            shape = [end - start, *info.shape[1:]]
            with tf.device(server_device(server)):
                name = f"autopar/acc/{vp.name}/part_{p}"
                if info.row_wise:
                    out.append(self._row_queues(name, info))
                elif info.gradient == "sparse":
                    out.append(tf.raw_ops.SparseConditionalAccumulator(
                        dtype=info.dtype, shape=shape, shared_name=name, reduction_type="SUM"))
                else:
                    out.append(self.nodes.add("ConditionalAccumulator", [], server_device(server),
                                              dtype=tf.as_dtype(info.dtype), shape=shape,
                                              shared_name=name, reduction_type="SUM"))
        return out

    def _row_queues(self, name: str, info: VariableInfo) -> list[tf.Tensor]:
        """A row-wise variable's partition's queues, one per contributor (a
        host or an aggregation group with local aggregation, else a worker),
        each holding its rows of a step packed as one tensor (pack_rows:
        one receive per push), or as values and indices when a row's shape
        is not static. Created on the current device (the partition's
        server), shared by name."""
        types = ([tf.uint8] if _packs_rows(info) else [tf.as_dtype(info.dtype), tf.int64])
        return [tf.raw_ops.FIFOQueueV2(component_types=types, capacity=2,
                                       shared_name=f"{name}/rows_from_{c}")
                for c in range(self.plan.contributions_per_step())]

    def _contributor(self) -> int:
        """This worker's contributor index (its push group's, in order of
        their first workers; Plan.push_group)."""
        if not self.plan.local_aggregation:
            return self.index
        firsts = sorted({self.plan.push_group(w)[1][0] for w in range(self.plan.num_workers)})
        return firsts.index(self.plan.push_group(self.index)[1][0])

    def _token_queue(self, worker: int) -> tf.Tensor:
        """Worker `worker`'s queue of release tokens of the current train group."""
        name = (f"autopar/token/worker_{worker}" if self.group == 0
                else f"autopar/token/group_{self.group}/worker_{worker}")
        with tf.device(server_device(0)):
            return tf.raw_ops.FIFOQueueV2(component_types=[tf.int32], shapes=[[]], capacity=4,
                                          shared_name=name)

    # -- worker side ---------------------------------------------------------
    def _scale(self, info: VariableInfo) -> float:
        """The plan's decision for this kind of gradient (Plan.averages)."""
        return self.plan.gradient_scale(info.gradient)

    def _norm_terms(self, vp: VariablePlan, info: VariableInfo) -> None:
        """A global-norm L2 term of a sparse gradient. Rows of a plain lookup are
        one per occurrence, on one device as here: the single-device term is the
        sum over workers of the term on each worker's scaled rows, one scalar
        all-reduce. Deduplicated rows (one per distinct id) are combined on one
        device across the whole batch, and the square of a sum is not the sum of
        squares: the term needs the combined rows, so every worker gathers all
        rows, combines duplicates and takes the term itself (exact; costs an
        all-gather of the touched rows, as run_option="allreduce" does)."""
        if info.gradient != "sparse" or not info.norm_ops:
            return
        values = self.g.get_tensor_by_name(info.grad_values)
        scaled = values * self._const(self._scale(info), values.dtype)
        if info.dedup:
            indices = tf.cast(self.g.get_tensor_by_name(info.grad_indices), tf.int64)
            rows, ids = self.backend.allgather_rows(
                scaled, indices, (vp.keys["norm_count"], vp.keys["norm_values"],
                                  vp.keys["norm_indices"]))
            self.collectives.setdefault(self.group, []).extend([rows.op, ids.op])
            total = tf.nn.l2_loss(combine_rows(rows, ids)[0])
        elif info.shared_rows:
            # the examples' rows' terms add up; the shared ids' rows add up
            # first, position by position, then square
            (head, _), (tail, _) = split_shared_rows(
                scaled, self.g.get_tensor_by_name(info.grad_indices), info.shared_rows)
            heads = self.backend.allreduce_sum(tf.nn.l2_loss(head), vp.keys["norm"])
            tails = self.backend.allreduce_sum(tail, vp.keys["norm_shared"])
            self.collectives.setdefault(self.group, []).extend([heads.op, tails.op])
            total = heads + tf.nn.l2_loss(tails)
        else:
            total = self.backend.allreduce_sum(tf.nn.l2_loss(scaled), vp.keys["norm"])
            self.collectives.setdefault(self.group, []).append(total.op)
        for op_name in info.norm_ops:
            self.edits.replaced[f"{op_name}:0"] = total.name

    def _contribution(self, vp, info, la: bool, host_key: int, members: list[int]):
        """This worker's (or, with local aggregation, this host's) gradient."""
        scale = self._scale(info)
        if info.gradient == "dense":
            # NodeDefs (one per variable: as Python ops they were most of a
            # ps-mode rewrite); the node's name. Pushed unscaled: the chief
            # scales the sum once on the server (_scaled_take), as
            # TensorFlow's SyncReplicasOptimizer averages in its take,
            # instead of every worker passing over its whole gradient.
            dtype = self.g.get_tensor_by_name(info.grad_tensor).dtype.base_dtype
            grad = node_input_name(info.grad_tensor)
            if la:
                host = self.backend.subgroup(len(members), host_key)
                grad = host.allreduce_sum_node(self.nodes, grad, dtype, vp.keys["la_values"])
                self.collective_nodes.setdefault(self.group, []).append(grad)
            return grad
        values = self.g.get_tensor_by_name(info.grad_values)
        indices = tf.cast(self.g.get_tensor_by_name(info.grad_indices), tf.int64)
        values = values * self._const(scale, values.dtype)
        if la:
            host = self.backend.subgroup(len(members), host_key)
            values, indices = host.allgather_rows(
                values, indices, (vp.keys["la_count"], vp.keys["la_values"], vp.keys["la_indices"]))
            self.collectives.setdefault(self.group, []).extend([values.op, indices.op])
        if info.row_wise:
            return values, indices   # every row as it left the tapes
        # Sum rows touched several times (by one worker's lookups or by several
        # workers of the host) before they cross the network: one row per
        # distinct index. A Zipf-skewed batch repeats about half its ids.
        return combine_rows(values, indices)

    def _push(self, vp, info, accumulators, contribution) -> None:
        layout = _layout(vp, info) if len(vp.partitions) > 1 else None
        if info.gradient == "sparse" and layout is not None:
            # Each row's partition and its row there, computed once for all
            # partitions.
            which, local = layout.locate(contribution[1])
        for p, ((start, end), server) in enumerate(zip(vp.partitions, vp.servers)):
            device = server_device(server)
            if info.gradient == "dense":
                dtype = self.g.get_tensor_by_name(info.grad_tensor).dtype.base_dtype
                piece = contribution
                if layout is not None:   # its rows (a view of ranges, not a copy)
                    bounds = [self.constants.get([b]) for b in layout.slice_of(p)]
                    piece = self.nodes.add("StridedSlice", [contribution, *bounds], T=dtype,
                                           Index=tf.int32)
                push = self.nodes.add("AccumulatorApplyGradient", [
                    accumulators[p], self._const(_ALWAYS_FRESH, tf.int64, device), piece],
                    device, dtype=dtype)
            else:
                values, indices = contribution
                if layout is not None:   # this partition's rows, renumbered from 0
                    mine = new_op("Equal", [which, self._const(p, tf.int32)],
                                  T=tf.int32).outputs[0]
                    values, indices = rows_where(mine, [values, local], self._const(0, tf.int32))
                packed = pack_rows(values, indices, self.constants)
                if info.row_wise:
                    queue = accumulators[p][self._contributor()]
                    with tf.device(device):
                        push = tf.raw_ops.QueueEnqueueV2(
                            handle=queue, components=[packed] if packed is not None
                            else [values, indices]).name
                    self.pushes.setdefault(self.group, []).append((push, device))
                    self._count(vp, p, server, push)
                    continue
                if packed is not None:
                    values, indices = unpack_rows(packed, list(values.shape[1:]),
                                                  values.dtype.base_dtype, self.constants, device)
                # on the server: a constant on the worker is one more message per push
                shape = self._const([end - start, *info.shape[1:]], tf.int64, device)
                with tf.device(device):
                    push = new_op("SparseAccumulatorApplyGradient", [
                        accumulators[p], self._const(_ALWAYS_FRESH, tf.int64, device), indices,
                        values, shape], dtype=values.dtype.base_dtype,
                        has_known_shape=True).name
            self.pushes.setdefault(self.group, []).append((push, device))
            self._count(vp, p, server, push)

    def _count(self, vp, p: int, server: int, push) -> None:
        """Server-side count of the contributions this accumulator received:
        what local aggregation is meant to cut from one per worker to one per
        host (read as CONTRIBUTIONS_OP)."""
        counter = self._counter(vp, p, server)
        device = server_device(server)
        one = self._const(1, tf.int64, device)
        self.pushes[self.group].append((self.nodes.add(
            "AssignAddVariableOp", [counter, one, "^" + push], device, dtype=tf.int64), device))

    def _counter(self, vp, p: int, server: int) -> str:
        """The handle of an accumulator's contribution counter: one op for the
        count, the init and the read (created outside any control dependency,
        so the init does not wait for a push)."""
        key = (vp.name, p)
        if key not in self._counters:
            self._counters[key] = self.nodes.add(
                "VarHandleOp", [], server_device(server), dtype=tf.int64, shape=[],
                shared_name=f"autopar/contributions/{vp.name}/part_{p}")
        return self._counters[key]

    def _split(self, vp: VariablePlan) -> None:
        info = self.analysis.variable(vp.name)
        region = set(info.update_ops) | set(info.own_path_ops)
        group = None
        if self.pull_group is not None and pulls_per_group(vp):
            group = replace(self.pull_group, keys=(
                tuple(vp.keys[f"pull_ids_{k}"] for k in ("count", "values", "indices")),
                vp.keys["pull_rows"]))
        partitioner = Partitioner(self.g, self.edits, lambda p: server_device(vp.servers[p]),
                                  self.constants, self.nodes, group)
        layout = _layout(vp, info)
        for name in [info.name, *info.slots]:
            self.part_handles[name] = partitioner.split(name, layout, region)
            self.edits.partitions[name] = PartitionedVariable(self.part_handles[name], layout)
        if pulls_per_group(vp):
            self._lookup_barriers(vp, info, partitioner.lookups)

    def _lookup_barriers(self, vp: VariablePlan, info: VariableInfo, lookups: dict) -> None:
        """A barrier of every worker after each of the variable's lookups (its
        rows), on every worker, in a group of one too (rewrite.WorkerGraph:
        fetched with the lookup outside training steps), bounded as the
        group's collectives are."""
        everyone = self.backend.subgroup(self.plan.num_workers, self.plan.group_key,
                                         self.plan.collective_timeout_s)
        found = sorted(info.boundary_ops)
        for gather, rows in sorted(lookups.items()):
            if gather not in found:
                raise UnsupportedGraphError(
                    f"Config(aggregation_group): the lookup '{gather}' of '{info.name}' is not "
                    "one the analysis found; use Config(aggregation_group=0) for this graph")
            with tf.control_dependencies([rows]):
                barrier = everyone.barrier(vp.keys["pull_barrier"] + found.index(gather))
            self.edits.lookup_barriers[gather] = barrier.op.name

    # -- chief ---------------------------------------------------------------
    def _take(self, vp, info, accumulators) -> None:
        if len(vp.partitions) > 1:
            self._take_partitioned(vp, info, accumulators)
            return
        device = server_device(vp.servers[0])
        if info.gradient == "dense":
            grad = self.g.get_tensor_by_name(info.grad_tensor)
            self._read_as_gradient(grad, self._scaled_take(info, accumulators[0], device), device)
            return
        with tf.device(device):
            values = self.g.get_tensor_by_name(info.grad_values)
            indices = self.g.get_tensor_by_name(info.grad_indices)
            if info.row_wise:
                vals, idx = self._take_rows(info, accumulators[0], device)
            else:
                idx, vals, _ = tf.raw_ops.SparseAccumulatorTakeGradient(
                    handle=accumulators[0], num_required=self._required(device),
                    dtype=values.dtype)
                self.nodes.patch(idx.op.name, self._own_pushes_on(device))
            self.edits.replaced[values.name] = vals.name
            self.edits.replaced[indices.name] = tf.cast(idx, indices.dtype).name

    def _take_rows(self, info, queues: list[tf.Tensor], device: str
                   ) -> tuple[tf.Tensor, tf.Tensor]:
        """(values, indices): every contributor's rows of a row-wise
        variable's partition this step, in contributor order, on `device`
        (the current device); each dequeue waits for that contributor's push,
        the chief's own included (control inputs: they stay in its step)."""
        row = list(info.shape[1:])
        dtype = tf.as_dtype(info.dtype)
        packed = _packs_rows(info)
        values, indices = [], []
        for queue in queues:
            got = tf.raw_ops.QueueDequeueV2(
                handle=queue, component_types=[tf.uint8] if packed else [dtype, tf.int64])
            self.nodes.patch(got[0].op.name, self._own_pushes_on(device))
            if packed:
                got[0].set_shape([None, 8 + int(np.prod(row, dtype=np.int64)) * dtype.size])
                v, i = unpack_rows(got[0], row, dtype, self.constants, device)
            else:
                v, i = got
                v.set_shape([None, *row])
                i.set_shape([None])
            values.append(v)
            indices.append(i)
        if len(values) == 1:
            return values[0], indices[0]
        return tf.concat(values, 0), tf.concat(indices, 0)

    def _take_partitioned(self, vp, info, accumulators) -> None:
        """Each partition's aggregate feeds its own copy of the variable's update
        region; the original region becomes NoOps waiting for the copies."""
        region = set(info.update_ops) | set(info.own_path_ops)
        totals = []
        for p, server in enumerate(vp.servers):
            remap = {name: self.part_handles[name][p] for name in [info.name, *info.slots]}
            device = server_device(server)
            with tf.device(device):
                if info.gradient == "dense":
                    total = self._scaled_take(info, accumulators[p], device)
                    remap[node_input_name(info.grad_tensor)] = total
                    totals.append(total)
                else:
                    indices = self.g.get_tensor_by_name(info.grad_indices)
                    if info.row_wise:
                        vals, idx = self._take_rows(info, accumulators[p], device)
                    else:
                        idx, vals, _ = tf.raw_ops.SparseAccumulatorTakeGradient(
                            handle=accumulators[p], num_required=self._required(device),
                            dtype=info.dtype)
                        self.nodes.patch(idx.op.name, self._own_pushes_on(device))
                    remap[node_input_name(info.grad_values)] = node_input_name(vals.name)
                    local = tf.cast(idx, indices.dtype)
                    remap[node_input_name(info.grad_indices)] = node_input_name(local.name)
            own = set(info.own_path_ops)
            self.edits.copies.append((region, p, remap,
                                      lambda n, d=device: d if (self.plan.opau or n not in own)
                                      else self.worker_device))
        for name in region:
            self.edits.noop_deps[name] = [copy_prefix(p) + name for p in range(len(vp.servers))]
        if info.gradient == "dense":
            self._whole_aggregate(vp, info, totals)

    def _whole_aggregate(self, vp, info, totals: list[str]) -> None:
        """What reads a partitioned dense gradient outside its update regions
        (a global norm's term of it, which the other gradients' terms join)
        reads the aggregate, as it does for a variable kept whole: the
        partitions' takes concatenated, a dense gradient's partitions being
        ranges of rows (RowLayout.for_gradient) (before: the chief's own
        gradient, and the norm that clips every variable was the chief's)."""
        grad = self.g.get_tensor_by_name(info.grad_tensor)
        dtype = grad.dtype.base_dtype
        device = server_device(vp.servers[0])
        assert not _layout(vp, info).dealt, vp
        whole = self.nodes.add("ConcatV2", [*totals, self._const(0, tf.int32, device)],
                               device, N=len(totals), T=dtype, Tidx=tf.int32)
        self._read_as_gradient(grad, whole, device)

    def _scaled_take(self, info: VariableInfo, accumulator, device: str) -> str:
        """The node taking a dense accumulator's sum of this step's
        contributions (all of them in, the chief's own push included) on
        `device`, times the gradient scale (Plan.gradient_scale)."""
        dtype = tf.as_dtype(info.dtype)
        total = self.nodes.add("AccumulatorTakeGradient", [
            accumulator, self._required(device), *self._own_pushes_on(device)], device,
            dtype=dtype)
        scale = self._scale(info)
        if scale == 1.0:
            return total
        return self.nodes.add("Mul", [total, self._const(scale, dtype, device)], device, T=dtype)

    def _required(self, device: str) -> tf.Tensor:
        """How many contributions a take on `device` waits for (a constant there)."""
        return self._const(self.plan.contributions_per_step(), tf.int32, device)

    def _read_as_gradient(self, grad: tf.Tensor, aggregate: str, device: str) -> None:
        """What reads the dense gradient `grad` outside the backward pass reads
        the node `aggregate` instead, in `grad`'s shape."""
        self.edits.replaced[grad.name] = self.nodes.add(
            "Reshape", [aggregate, self.constants.shape_of(grad, device)], device,
            T=grad.dtype.base_dtype, Tshape=tf.int32) + ":0"

    def _release(self, ps_vars) -> tf.Operation:
        updates = [self.g.get_operation_by_name(u)
                   for vp in ps_vars for u in self.analysis.variable(vp.name).update_ops]
        with tf.control_dependencies([self._all_collectives(
                updates + self.collectives.get(self.group, []), "updated")]):
            tokens = [tf.raw_ops.QueueEnqueueV2(handle=self._token_queue(w),
                                                components=[self._const(0, tf.int32)])
                      for w in range(1, self.plan.num_workers)]
            release = tf.group(*tokens, name="release")
        # Every op outside the regions that reads one of their ops (data or
        # control) waits for the release: found from the regions' consumers,
        # not by a scan of the whole graph.
        region = self._regions(ps_vars)
        waiting = set()
        for name in sorted(region):
            op = self.g.get_operation_by_name(name)
            waiting.update(c.name for t in op.outputs for c in t.consumers())
            waiting.update(c.name for c in op._control_outputs)  # pylint: disable=protected-access
        for name in sorted(waiting - region):
            self.edits.extra_control.setdefault(name, []).append(release.name)
        return release

    def _wait(self, ps_vars) -> tf.Operation:
        # The dequeue waits for nothing of this worker's: the token comes only
        # after the chief's updates, which take every contribution, this
        # worker's pushes included, so it is already waiting on its server when
        # the token arrives. (Waiting first for the pushes and the collectives,
        # both on the worker, cost a message to the server and a hop at the end
        # of every step.) The pushes run as step targets on their servers and
        # the barrier waits for the collectives (_barrier).
        self._collectives_done[self.group] = self._after_collectives()
        wait = tf.raw_ops.QueueDequeueV2(handle=self._token_queue(self.index),
                                         component_types=[tf.int32])
        # Only the updates: the ops between gradient and update stay, though
        # this worker's step no longer needs them, because another op may read
        # them (a Keras optimizer's IdentityN carrying every variable's
        # gradient, a dead Identity of the first one); a NoOp has no outputs.
        for vp in ps_vars:
            for name in self.analysis.variable(vp.name).update_ops:
                self.edits.noop_deps[name] = [wait[0].op.name]
        return wait[0].op

    def _regions(self, ps_vars) -> set[str]:
        out = set()
        for vp in ps_vars:
            info = self.analysis.variable(vp.name)
            out |= set(info.update_ops) | set(info.own_path_ops)
        return out


def _layout(vp: VariablePlan, info: VariableInfo) -> RowLayout:
    """Which rows each of a partitioned variable's partitions holds (the
    plan's partition sizes, which place_partitions made dealt_sizes)."""
    layout = RowLayout.for_gradient(info.gradient, info.shape[0], len(vp.partitions))
    assert [e - s for s, e in vp.partitions] == dealt_sizes(layout.rows, layout.n), vp
    return layout
