"""The interface of a cross-cutting graph feature: something of the user's
graph that is neither a variable's gradient nor its update, but that N
workers must compute differently from one device to give one device's
result (batch normalisation, a loss divided by a count of the batch, a
dropout mask drawn per example...), or an option changing how every worker
runs the step (micro-batch accumulation, weight-update sharding, local-state
averaging). A feature is one GraphFeature subclass in its own module,
registered by one line in transforms/features/registry.py; the analysis,
the planner, the compile step, the rewrite, the report and the runner only
ever call these hooks, in the registry's order.

Hooks (all have working defaults: a feature implements those it needs):
  fields        the Analysis fields `find` fills (each feature its own)
  keys          the instance-key ranges of transforms/keys.py its collectives use
  after         the features that must find and rewrite before it (checked
                when the registry is built)
  find          its part of the graph, from the analysis' Facts: a dict of
                its Analysis fields
  plan_fields   the Plan fields it sets (its keys, group sizes), refusing
                what the plan cannot do
  check         refusals that need the job's Config (compile time)
  reads_collections  whether its rewrite needs the collections' Variables
  rewrite       its ops in the worker's scratch graph, returned as a Rewiring
                (tensors the original nodes read instead, ops exempt from
                that, edits of original nodes, the ops the runner runs)
  edit_graph_def  a GraphDef pass after the original nodes are edited
  notes         the report's notes about it
  report_fields the Report fields it fills
  step_fetches  tensors a training step fetches for it, by name
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import tensorflow as tf

from autopar.transforms.methods.base import Edits, RewriteContext, VariablePlan

if TYPE_CHECKING:   # annotations only
    import tensorflow as tf

    from autopar.transforms.analysis import Analysis
    from autopar.transforms.graph_index import GraphIndex
    from autopar.transforms.keys import KeyRange
    from autopar.transforms.options import PlanOptions
    from autopar.transforms.plan import Plan
    from autopar.transforms.topology import Topology


@dataclass
class Facts:
    """What the analysis knows when the features look for themselves."""
    graph: "tf.Graph"
    index: "GraphIndex"            # consumers, producers, ops by type: built once
    writers: dict[str, list[str]]  # variable -> the ops writing it (not its initializer)
    losses: list[str | None]       # each train group's loss
    every_loss: list[str | None]   # and a traced function's declared losses
    gradients: frozenset[str]      # every variable's gradient tensors (dense, values, indices)
    input_ops: set[str]            # ops fed by the input batch
    batch_local: set[str]          # ops fed by it other than through the gradients
    # (seed op, loss) of the backward passes that train a variable
    trained_seeds: list[tuple[str, str]] = field(default_factory=list)
    # (seed op, loss) of the backward passes the losses are computed from
    # (a gradient penalty's tf.gradients, an inner tape)
    inner_seeds: list[tuple[str, str]] = field(default_factory=list)
    # loss -> the tensor whose reduction over the batch makes it a mean (or None)
    reduced_of: Callable[[str], str | None] | None = None
    # The Analysis fields the features before this one found.
    found: dict[str, Any] = field(default_factory=dict)
    # Objects a feature leaves for later ones and the analysis (example_rows: "rows").
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeatureContext(RewriteContext):
    """A method's rewrite context, and what a feature's rewrite also reads."""
    micro_batches: int = 1
    # The methods' edits so far (their aggregated tensors: edits.replaced).
    edits: Edits | None = None
    # A worker's device by index (the rewrite's worker_device).
    device_of: Callable[[int], str] | None = None


tf1 = tf.compat.v1
IN_STEP = "autopar/in_step"


def in_step_flag(graph: tf.Graph) -> tf.Tensor:
    """The worker graph's flag the runner feeds True in a training step
    alone (WorkerGraph.in_step), False by default: the one flag every
    feature whose ops must run in training steps only (a collective the
    workers' evaluations need not run alike) puts them under."""
    try:
        return graph.get_tensor_by_name(IN_STEP + ":0")
    except KeyError:
        with graph.as_default(), graph.name_scope(None), tf.control_dependencies(None), \
                tf1.device(None):
            return tf1.placeholder_with_default(False, [], name=IN_STEP)


def in_step_cond(flag: tf.Tensor, in_step, otherwise):
    """tf.cond(flag, in_step, otherwise) for a feature's ops that run in
    training steps only (`flag`: in_step_flag), in the current name scope,
    with no control dependencies and no device: the branches' ops run where
    the cond does (a function keeps no device of its own, and the worker's
    graph sets devices only on its own nodes). Its If
    op stays a function call, not lowered into the graph's Switch and Merge
    ops: TensorFlow gives a session run with collective ops in its graph a
    step id from a sequence the workers share, and a run of the lowered
    cond on one worker alone (the chief's evaluation, the untaken
    collective inside) advanced that worker's sequence, so the workers'
    next collective failed ("Delete called on non-empty BufRendezvous");
    inside a function call the collective is not counted. Built by
    cond_v2 itself, TensorFlow's functional cond, because tf.cond builds
    Switch and Merge in a program that called disable_v2_behavior()
    (TensorFlow exports no public way to ask for the functional form)."""
    from tensorflow.python.ops import cond_v2  # pylint: disable=import-outside-toplevel
    graph = flag.graph
    before = len(graph.get_operations())
    with tf.control_dependencies(None), tf1.device(None):
        out = cond_v2.cond_v2(flag, in_step, otherwise)
    for op in graph.get_operations()[before:]:
        if op.type in ("If", "StatelessIf"):
            op._set_attr("_lower_using_switch_merge",   # pylint: disable=protected-access
                         tf1.AttrValue(b=False))
    return out


@dataclass
class Rewiring:
    """What a feature's rewrite asks of the GraphDef pass."""
    # tensor (as a NodeDef input names it) -> the tensor every node but
    # `exempt` reads instead, after the methods' renames
    rewire: dict[str, str] = field(default_factory=dict)
    exempt: set[str] = field(default_factory=set)   # ops that keep reading the originals
    edits: Edits | None = None   # edits of the original nodes, merged with the methods'
    # WorkerGraph fields the runner reads (after_step, in_step, accumulate...)
    outputs: dict[str, Any] = field(default_factory=dict)
    state: Any = None   # what the feature's edit_graph_def needs

    def merge(self, other: "Rewiring") -> None:
        self.rewire.update(other.rewire)
        self.exempt |= other.exempt
        self.outputs.update(other.outputs)

    def apply(self, graph_def) -> None:
        """Point every data input of `graph_def` naming a key of `rewire` at
        its value, in every node but `exempt` (the ops that compute the
        replacements from the originals)."""
        if not self.rewire:
            return
        for node in graph_def.node:
            if node.name in self.exempt:
                continue
            for i, inp in enumerate(node.input):
                if inp in self.rewire:
                    node.input[i] = self.rewire[inp]


class GraphFeature:
    name: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()
    keys: ClassVar[tuple["KeyRange", ...]] = ()
    after: ClassVar[tuple[str, ...]] = ()

    def find(self, facts: Facts) -> dict[str, Any]:
        """{Analysis field: value} for this feature's `fields`."""
        return {}

    def plan_fields(self, analysis: "Analysis", options: "PlanOptions", topology: "Topology",
                    variables: "list[VariablePlan]") -> dict[str, Any]:
        """{Plan field: value} this feature sets; raises what the plan cannot
        do. `variables`: the plan's variables, whose fields it may set."""
        return {}

    def check(self, analysis: "Analysis", plan: "Plan", config) -> None:
        """Refuse (an autopar.errors exception) what the job's Config asks
        and this feature cannot do on this graph."""

    def reads_collections(self, plan: "Plan") -> bool:
        """Whether its rewrite reads the graph's collections (their
        tf.Variables), which the scratch copy then imports too."""
        return False

    def rewrite(self, ctx: FeatureContext) -> Rewiring | None:
        """Its ops in ctx.graph (None: nothing to do for this plan)."""
        return None

    def edit_graph_def(self, graph_def, ctx: FeatureContext, rewiring: Rewiring) -> None:
        """A pass over the worker's GraphDef after the original nodes are
        edited and the rewirings applied (only when rewrite built something)."""

    def notes(self, analysis: "Analysis", plan: "Plan", num_workers: int) -> list[str]:
        """The report's notes (`num_workers`: the report's, usually the plan's)."""
        return []

    def report_fields(self, analysis: "Analysis", plan: "Plan") -> dict[str, Any]:
        return {}

    def step_fetches(self, analysis: "Analysis") -> dict[str, list[str]]:
        """{what: tensors} a worker's training step fetches besides the user's."""
        return {}
