"""Local-state averaging (Config(sync_local_state="average")): state each
worker updates from its own batch (the analysis' state of kind "local":
batch-norm moving statistics, an assignment from activations) is replaced
by its mean over workers after every training step, so every replica holds
the same values (the mean of the workers' values, not the statistics one
device would compute on the global batch)."""
from __future__ import annotations

import tensorflow as tf

from typing import TYPE_CHECKING

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.keys import LOCAL_STATE
from autopar.transforms.ops import ConstantPool

if TYPE_CHECKING:   # annotations only
    from autopar.transforms.analysis import Analysis
    from autopar.transforms.plan import Plan

tf1 = tf.compat.v1

SYNC_LOCAL_STATE_OP = "autopar/sync_local_state"


class LocalStateAveraging(GraphFeature):
    name = "local_state"
    keys = (LOCAL_STATE,)

    def plan_fields(self, analysis, options, topology, variables):
        return {"sync_local_state": options.sync_local_state}

    def reads_collections(self, plan):
        return plan.sync_local_state == "average"

    def rewrite(self, ctx):
        op = sync_local_state(ctx.graph, ctx.analysis, ctx.plan, ctx.backend, ctx.constants)
        return Rewiring(outputs={"after_step": op}) if op else None

    def check(self, analysis, plan, config):
        read = [s for s in analysis.state if s.kind == "local" and s.read_by_loss]
        if read and plan.num_workers > 1 and plan.sync_local_state == "none":
            s = read[0]
            raise UnsupportedGraphError(
                f"the loss reads '{s.name}', state each worker writes from its own batch "
                f"('{s.update_ops[0]}'): on {plan.num_workers} workers each replica would hold "
                "values of its own share, not one device's of the global batch, and train on "
                "them (a memory bank of the batch's embeddings, a running mean the inputs "
                "are normalised by). Compute it from the batch inside the step, or set "
                "Config(sync_local_state=\"average\") to replace it by its mean over the "
                "workers after every step (one device's only where the state is linear in "
                "the batch's mean and read after the step)")

    def report_fields(self, analysis, plan):
        return {"sync_local_state": plan.sync_local_state}


def sync_local_state(graph, analysis: "Analysis", plan: "Plan", backend,
                     constants: ConstantPool) -> str | None:
    """With sync_local_state="average": an op replacing every batch-local
    state variable (kind "local", e.g. batch-norm moving statistics) by its
    mean over workers, one all-reduce per dtype. It has no feed and does not
    run the state's own updates: the runner runs it after each step, so every
    replica then holds the same values (the mean of the workers' values, not
    the statistics one device would compute on the global batch)."""
    if plan.sync_local_state != "average":
        return None
    local = {s.name for s in analysis.state if s.kind == "local"}
    groups = _variables_by_dtype(graph, lambda name: name in local)
    if not groups:
        return None
    assigns, previous = [], []
    with tf.name_scope("autopar/sync_local"):
        for i, variables in enumerate(groups):
            with tf.control_dependencies(previous):   # one launch order on every worker
                mean = backend.allreduce_mean(_flatten(variables, constants),
                                              plan.local_state_key + i)
            previous = [mean]
            assigns += _assign_pieces(variables, mean, constants)
    return tf.group(*assigns, name=SYNC_LOCAL_STATE_OP).name


def _variables_by_dtype(graph, keep) -> list[list]:
    """The global variables whose op name ``keep`` accepts, one list per
    dtype, in dtype-name order: one flat collective per list, keyed by its
    position, identically on every worker."""
    by_dtype: dict[str, list] = {}
    for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES):
        if keep(v.op.name):
            by_dtype.setdefault(v.dtype.base_dtype.name, []).append(v)
    return [by_dtype[dtype] for dtype in sorted(by_dtype)]


def _flatten(variables, constants: ConstantPool):
    """The variables' values as one flat tensor, in list order."""
    return tf.concat([tf.reshape(v.value(), constants.get([-1])) for v in variables], axis=0)


def _assign_pieces(variables, flat, shapes: ConstantPool) -> list:
    """Assign ops giving each variable its piece of ``flat`` (as _flatten laid it out)."""
    sizes = [int(v.shape.num_elements()) for v in variables]
    return [v.assign(tf.reshape(piece, shapes.get(v.shape.as_list(), tf.int32))).op
            for v, piece in zip(variables, tf.split(flat, sizes))]


