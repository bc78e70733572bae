"""Weight-update sharding (TPU-pod scaling paper §3) for all-reduce variables.

Every all-reduce variable has one owner (Plan: VariablePlan.owner, whole
variables balanced by bytes). Gradients are still all-reduced in full — every
worker then holds every averaged gradient, so a global norm (clipping) is
computed exactly as one device computes it — but only the owner applies the
optimizer update: on the other workers the variable's update ops become
NoOps. The optimizer slots live once, on the owner's device (the other
workers' graphs refer to the same resources there, as they do to server
variables), so slot memory per worker falls by ~N; the chief initialises,
saves and restores them remotely, whole, under their original names, so
checkpoints stay portable. After the updates, the owners' new values are
all-gathered (one gather per dtype, each worker's owned values padded to the
largest owner's) and assigned on every worker, before anything that runs
after the update in the step (the global step increment, Adam's beta powers,
moving averages) runs.
"""
from __future__ import annotations

from dataclasses import replace

import tensorflow as tf

from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.transforms.comm import rank_order
from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.graph_utils import in_gradient_scope, op_name_of
from autopar.transforms.keys import WUS
from autopar.transforms.methods.base import Edits, RewriteContext, VariablePlan
from autopar.transforms.methods.registry import METHODS

tf1 = tf.compat.v1

DONE_OP = "autopar/wus/done"


class WeightUpdateSharding(GraphFeature):
    """Config(shard_weight_update=True)."""
    name = "weight_update_sharding"
    keys = (WUS,)

    def plan_fields(self, analysis, options, topology, variables):
        if options.shard_weight_update and len(analysis.train_groups) > 1:
            raise AutoparError(
                f"Config(shard_weight_update=True) with {len(analysis.train_groups)} train ops "
                "updating different variables is not supported (the owners' new values are "
                "gathered in one collective per dtype): turn weight-update sharding off")
        if options.shard_weight_update:
            on_servers = [vp.name for vp in variables if not vp.replicated]
            if on_servers:
                raise AutoparError(
                    f"Config(shard_weight_update=True) with variables on parameter servers "
                    f"({', '.join(on_servers[:3])}) is not supported: use run_option='allreduce' "
                    "(sparse variables then use all-gather) or turn weight-update sharding off")
            assign_owners(analysis, variables, topology.num_workers)
        return {"shard_weight_update": options.shard_weight_update}

    def reads_collections(self, plan):
        return plan.shard_weight_update

    def rewrite(self, ctx):
        return Rewiring(edits=shard_weight_updates(ctx, ctx.device_of, ctx.edits.replaced))

    def notes(self, analysis, plan, num_workers):
        if plan.shard_weight_update and all(vp.owner is None for vp in plan.variables):
            return ["Config(shard_weight_update=True) is set but no variable is all-reduced: "
                    "nothing to shard"]
        return []

    def report_fields(self, analysis, plan):
        unsharded = replace(plan, variables=[replace(vp, owner=None) for vp in plan.variables])
        return {"shard_weight_update": plan.shard_weight_update,
                "slot_bytes": slot_bytes_per_worker(analysis, plan),
                "slot_bytes_unsharded": slot_bytes_per_worker(analysis, unsharded)}


def assign_owners(analysis, plans: list[VariablePlan], num_workers: int) -> None:
    """Weight-update sharding: each all-reduce variable gets one owner,
    whole variables balanced by bytes (largest first to the least loaded
    worker, ties to the lower index: the same on every process)."""
    load = [0] * num_workers
    sharded = [(analysis.variable(vp.name).bytes, i, vp) for i, vp in enumerate(plans)
               if METHODS[vp.method].shards_weight_update]
    for size, _, vp in sorted(sharded, key=lambda t: (-t[0], t[1])):
        owner = min(range(num_workers), key=lambda w: (load[w], w))
        vp.owner = owner
        load[owner] += size
        vp.placement = f"replicated; updated by worker {owner} (weight-update sharding)"


def shard_weight_updates(ctx: RewriteContext, device_of, replaced: dict[str, str]) -> Edits:
    """Edits making worker ctx.worker_index apply only its own variables'
    updates, with the slots on their owners' devices (`device_of(worker)`:
    a worker's device name), and the op gathering the new values.
    `replaced`: the methods' averaged tensors by original tensor name."""
    graph, analysis, plan = ctx.graph, ctx.analysis, ctx.plan
    edits = Edits()
    owned = [vp for vp in plan.variables if vp.owner is not None]
    if not plan.shard_weight_update or not owned:
        return edits
    updates = {u for vp in owned for u in analysis.variable(vp.name).update_ops}
    frontier = _after_updates(graph, updates)
    for vp in owned:
        info = analysis.variable(vp.name)
        mine = set(info.update_ops)
        device = device_of(vp.owner)
        for slot in info.slots:
            edits.server_variables.add(slot)
            edits.devices[slot] = device
            for consumer in graph.get_operation_by_name(slot).outputs[0].consumers():
                if consumer.name not in mine:
                    edits.devices[consumer.name] = device   # resource ops live with the resource
        if vp.owner == ctx.worker_index:
            continue
        for name in info.update_ops:
            for t in graph.get_operation_by_name(name).outputs:
                outside = [c.name for c in t.consumers() if c.name not in mine]
                if outside:
                    raise UnsupportedGraphError(
                        f"weight-update sharding: '{outside[0]}' reads '{t.name}' of the update "
                        f"of '{vp.name}', which only its owner runs; use "
                        "Config(shard_weight_update=False) for this graph")
            # The NoOp keeps waiting for the update's data inputs (the averaged
            # gradient, through its clipping): otherwise a fusion bucket that
            # holds only other owners' gradients has no consumer here, its
            # all-reduce is pruned from this worker's step, and the owners
            # wait in it forever. Control inputs are not rewired to the
            # averaged tensors, so name those directly (`replaced`).
            op = graph.get_operation_by_name(name)
            edits.noop_deps[name] = sorted({op_name_of(replaced.get(t.name, t.name))
                                            for t in op.inputs if t.dtype != tf.resource})
    variables = {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
    # the gathered blocks come in the workers' ranks, not their indices
    rank = {w: i for i, w in enumerate(rank_order(range(plan.num_workers)))}
    with tf.name_scope("autopar/wus/"):
        assigns, previous = [], []
        for i, (dtype, by_owner) in enumerate(_by_dtype(owned, variables, plan.num_workers)):
            sizes = [sum(int(variables[n].shape.num_elements()) for n in names)
                     for names in by_owner]
            width = max(sizes)
            mine_names = by_owner[ctx.worker_index]
            # New values are read once every update of the step has run.
            with tf.control_dependencies(sorted(updates) + previous):
                pieces = [tf.reshape(variables[n].read_value(), ctx.constants.get([-1]))
                          for n in mine_names]
                pieces.append(tf.zeros([width - sizes[ctx.worker_index]], dtype))
                gathered = ctx.backend.allgather(tf.concat(pieces, 0), plan.wus_key + i)
            previous = [gathered.op]
            for owner, names in enumerate(by_owner):
                if owner == ctx.worker_index:
                    continue
                offset = rank[owner] * width
                for n in names:
                    v = variables[n]
                    size = int(v.shape.num_elements())
                    assigns.append(v.assign(tf.reshape(gathered[offset:offset + size],
                                                       v.shape.as_list())).op)
                    offset += size
        done = tf.group(*assigns, *previous, name="done")
    for name in frontier:
        edits.extra_control.setdefault(name, []).append(done.name)
    return edits


def _by_dtype(owned, variables, num_workers: int) -> list[tuple]:
    """[(dtype, [variable names owned by worker w, in plan order] per w)] in dtype-name order."""
    out: dict[str, list[list[str]]] = {}
    dtypes = {}
    for vp in owned:
        v = variables[vp.name]
        name = v.dtype.base_dtype.name
        dtypes[name] = v.dtype.base_dtype
        out.setdefault(name, [[] for _ in range(num_workers)])[vp.owner].append(vp.name)
    return [(dtypes[name], out[name]) for name in sorted(out)]


def _after_updates(graph, updates: set[str]) -> list[str]:
    """Ops outside `updates` (and the backward pass) with a data or control
    input from one of them: what must wait for the gathered values."""
    out = []
    for op in graph.get_operations():
        if op.name in updates or in_gradient_scope(op.name):
            continue
        if any(t.op.name in updates for t in op.inputs) or \
                any(c.name in updates for c in op.control_inputs):
            out.append(op.name)
    return out


def slot_bytes_per_worker(analysis, plan) -> list[int]:
    """Optimizer-slot bytes each worker holds: a sharded variable's slots on
    its owner only, every other replicated variable's slots on every worker
    (server variables' slots on the servers)."""
    out = [0] * plan.num_workers
    for vp in plan.variables:
        info = analysis.variable(vp.name)
        size = info.bytes * len(info.slots)
        if vp.owner is not None:
            out[vp.owner] += size
        elif vp.replicated:
            out = [b + size for b in out]
    return out
