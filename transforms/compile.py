"""Compile: the one step from a single-device graph to what every process
applies. Analysis, planning and OPAU/OPSW placement run here, once per job
(in the launcher, or in each process of a job joined through TF_CONFIG); the
result travels as JSON and a worker only rewrites its graph with it
(transforms.rewrite.rewrite_for_worker(graph, c.analysis, c.plan, i,
moves=c.moves)). The Report is a view of it (`CompiledPlan.report`).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms import serial
from autopar.transforms.analysis import Analysis, analyze_graph
from autopar.transforms.features.registry import FEATURES
from autopar.transforms.graph_utils import graph_of, op_name_of, transforming
from autopar.transforms.input_shards import unsharded_inputs
from autopar.transforms.loss_reduction import no_loss_found, unread
from autopar.transforms.placement import Move, place_ops
from autopar.transforms.plan import Plan, PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import Report, build_report


@dataclass
class CompiledPlan:
    """Everything a worker needs besides the graph itself (which a traced
    step's plan may carry, `step`): the Analysis (names of gradients, update
    ops, step ops the rewrite and the Runner use), the Plan and the placement
    moves the ps rewrite applies."""
    analysis: Analysis
    plan: Plan
    moves: list[Move] = field(default_factory=list)
    # The autopar.Config it was compiled with, as JSON values: every process
    # of the job must run with the same one (runtime/worker.py refuses one
    # whose own differs, naming the option).
    job_config: dict[str, Any] = field(default_factory=dict)
    # A traced step's lifted graph, packed for the processes that receive
    # the plan to take rather than trace it (transforms/portable_step.py),
    # or None: each process makes its graph itself.
    step: str | None = None

    def report(self) -> Report:
        return build_report(self.analysis, self.plan, moves=self.moves)

    def check_graph(self, graph_or_meta) -> None:
        """Raise UnsupportedGraphError unless every op the plan names is in
        `graph_or_meta`: a process whose script built another graph than the
        one compiled would otherwise fail deep in the rewrite, or hang."""
        a = self.analysis
        names: list[str] = [a.loss] if a.loss else []
        for v in a.variables:
            names += [v.name, *v.update_ops, *v.slots, *v.path_ops, *v.boundary_ops,
                      *(t for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t)]
        for s in a.state:
            names += [s.name, *s.update_ops]
        names += sorted(a.step_ops) + [m.op for m in self.moves]
        names += [*a.batch_draws, *a.shared_draws]   # (given their rows or seeds by name)
        ops = {op.name for op in graph_of(graph_or_meta).get_operations()}
        missing = [n for n in dict.fromkeys(names) if op_name_of(n) not in ops]
        if missing:
            raise UnsupportedGraphError(
                f"this process built another graph than the one the job's plan was compiled "
                f"from: {len(missing)} op(s) the plan names are missing, e.g. "
                f"{', '.join(repr(n) for n in missing[:3])}. Every process must build the same "
                "graph (nothing in it may depend on the process's role or index).")

    def config_difference(self, config) -> tuple[str, Any, Any] | None:
        """(option, its value in ``config``, its value in the plan) for the
        first option of an autopar.Config that differs from the one the plan
        was compiled with; None when they agree (or the plan records none)."""
        if not self.job_config:
            return None
        mine = serial.encode(config)
        for option in sorted(set(mine) | set(self.job_config)):
            if mine.get(option) != self.job_config.get(option):
                return option, mine.get(option), self.job_config.get(option)
        return None

    def to_json(self) -> str:
        return serial.dumps(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> "CompiledPlan":
        return serial.loads(cls, text)

    def to_bytes(self) -> bytes:
        """The JSON, zlib-compressed: what travels to the processes of a job
        (op names repeat a lot; a large model's plan shrinks ~10x)."""
        return zlib.compress(self.to_json().encode("utf-8"))

    @classmethod
    def from_bytes(cls, data: bytes) -> "CompiledPlan":
        return cls.from_json(zlib.decompress(data).decode("utf-8"))


def compile_plan(graph_or_meta, topology: Topology | int,
                 options: PlanOptions | None = None) -> CompiledPlan:
    """Analyse `graph_or_meta`, plan it for `topology` and place its ops.
    Pure and deterministic: the same inputs give an equal CompiledPlan."""
    graph = graph_of(graph_or_meta)   # a MetaGraphDef is imported once
    analysis = analyze_graph(graph)
    with transforming():
        plan = make_plan(analysis, topology, options)
        moves = place_ops(graph, analysis, plan)
    return CompiledPlan(analysis=analysis, plan=plan, moves=moves)


def compile_for_config(graph_or_meta, topology: Topology | int, config) -> CompiledPlan:
    """`compile_plan` with an autopar.Config (its plan fields are PlanOptions';
    the others read by attribute: transforms do not import the API layer),
    and the refusals that need the graph and the job's other fields."""
    compiled = compile_plan(graph_or_meta, topology, config)
    compiled.job_config = serial.encode(config)
    for feature in FEATURES.values():
        feature.check(compiled.analysis, compiled.plan, config)
    if not config.allow_unsharded_input:
        _refuse_unsharded_input(graph_of(graph_or_meta), compiled.analysis)
    analysis = compiled.analysis
    if compiled.plan.num_workers > 1 and analysis.variables \
            and no_loss_found(analysis.loss_reduction_why):
        # without the loss, neither how it reduces over the batch nor
        # whether it keeps each example's terms apart can be read
        first = analysis.variables[0]
        raise UnsupportedGraphError(
            "found no loss the gradients are taken of (the tensor a GradientTape "
            "differentiates, or tf.gradients' ys), so cannot check that the loss keeps each "
            "example's terms to itself, nor how the workers' gradients combine into one "
            f"device's (the gradient of '{first.name}' is "
            f"'{first.grad_tensor or first.grad_values}'). Differentiate the loss itself: "
            "tape.gradient(loss, variables); a gradient given output_gradients=w is "
            "tape.gradient(tf.reduce_sum(target * tf.stop_gradient(w)), variables)")
    if config.loss_reduction == "auto" and compiled.plan.num_workers > 1 \
            and unread(analysis.loss_reduction, analysis.loss_reduction_why):
        raise UnsupportedGraphError(
            f"cannot tell how the loss reduces over the batch ({analysis.loss_reduction_why}), "
            "so not how the workers' gradients combine into one device's: set "
            "Config(loss_reduction='mean') if the loss is a mean of its examples' terms "
            "(the gradients are averaged), 'sum' if it is their sum (added)")
    groups = analysis.train_groups
    if config.micro_batches > 1 and len(groups) > 1:
        raise UnsupportedGraphError(
            f"Config(micro_batches={config.micro_batches}) accumulates every gradient of the "
            f"graph in each micro-batch, but this graph has {len(groups)} train ops updating "
            f"different variables (first variables: "
            f"{', '.join(repr(g.variables[0]) for g in groups)}): use micro_batches=1")
    return compiled


def _refuse_unsharded_input(graph, analysis: Analysis) -> None:
    """Refuse a step whose tf.data input every worker would read whole
    (transforms.input_shards), naming the dataset and the fix."""
    roots = [op for v in analysis.variables for op in v.update_ops]
    found = unsharded_inputs(graph, roots)
    if not found:
        return
    first = found[0]
    kind = f" ({first.source_type})" if first.source_type != first.source else ""
    where = f" (built by the dataset function of '{first.where}')" if first.where else ""
    more = (f"; also {', '.join(repr(f.source) for f in found[1:4])}"
            f"{' ...' if len(found) > 4 else ''}" if len(found) > 1 else "")
    raise UnsupportedGraphError(
        f"the training step reads its batches through '{first.get_next}' from a tf.data "
        f"pipeline that starts at '{first.source}'{kind}{where} with no shard "
        f"on its way{more}: every worker would read the same examples, which is not one "
        "device's global batch. Split it: ds = autopar.shard(ds) before .batch() (each worker "
        "then batches its own elements); or, if every worker must read them all (each "
        "already reads its own files), Config(allow_unsharded_input=True)")
