"""The options that shape a job's plan: the fields of autopar.Config the
planner reads, each declared once, here, with its default, its
documentation (docs/config.md is generated from these docstrings too) and
its check. autopar.Config extends PlanOptions with the job's other fields
(autopar/config.py), so a Config is the PlanOptions its plan is made with;
the transforms read them without importing the API layer. A bad value is
refused when the object is made, an AutoparError naming the Config field;
what needs the graph or the cluster (a partitioned variable's name, a group
size against the workers) is checked when the plan is made (plan.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from autopar.common.checks import boolean, choice, count, is_int
from autopar.common.errors import AutoparError, shown
from autopar.transforms.methods.policy import RUN_OPTIONS
from autopar.transforms.methods.wire import WIRE_DTYPES

# Upper bound of a variable's partition count, far above what a job uses and
# low enough that nothing sized by it runs out of memory (a variable's
# partitions are ops per step each). docs/config.md and
# docs/launching.md#limits state it.
MAX_PARTITIONS = 4096


@dataclass(frozen=True)
class PlanOptions:
    """The Config fields that shape the plan (every one has a default that
    works on one machine)."""
    fusion_bytes: int = 64 * 1024 * 1024
    """Dense gradients are averaged in fused buckets of at most this many bytes
    (Horovod-style tensor fusion): fewer, larger collectives. An integer >= 1."""
    communication_hint: str = "ring"
    """The TensorFlow collective implementation the collective ops ask for:
    ``"ring"`` or ``"auto"``."""
    run_option: str = "hybrid"
    """How gradients travel (Parallax): ``"hybrid"`` = dense by all-reduce,
    sparse on parameter servers; ``"ps"`` = every variable on servers;
    ``"allreduce"`` = no servers (sparse by all-gather); ``"herring"`` = dense
    float32 gradients in balanced fusion buffers summed by sharded summation
    servers (sparse as in hybrid). Hybrid with no sparse variables is
    all-reduce, or herring when the spec has servers and the cost model
    predicts it faster than the ring; PS methods and herring need servers in
    the spec (docs/run-options.md)."""
    wire_dtype: str = "float32"
    """The dtype dense float gradients travel in (``"float32"``, ``"float16"``,
    ``"bfloat16"``). ``"float16"`` on the ring all-reduce (flat or 2-D): a
    float32 or float64 bucket is cast to float16, summed in it and cast
    back, then averaged in full precision, as Horovod's fp16 compression
    (half the bytes of float32, about 3 significant digits per gradient,
    overflow past 65504); the report shows each bucket's wire dtype. The ring
    has no bfloat16 (TensorFlow's collective ops carry none): ``"bfloat16"``
    compresses herring only. Herring's servers sum in float32."""
    herring_buffer_bytes: int | None = None
    """herring: the fusion buffer size in bytes of float32 (an integer >= 1),
    or ``None``: chosen from model and cluster size."""
    loss_reduction: str = "auto"
    """How workers' gradients combine, dense and sparse alike: ``"mean"`` (the
    loss is a mean over the batch: one device's gradient is the mean over the
    global batch), ``"sum"`` (the loss is summed over the batch), or
    ``"auto"``: what the analysis reads from the graph (reduce_mean /
    reduce_sum, the tf.compat.v1.losses reductions, a division by the batch
    size); a graph that does not show it (an op between the loss and the
    batch's reduction the analysis has no rule for) is refused on several
    workers, naming the op, as is one where neither can match one device (a
    summed loss plus a batch-independent term). ``"parallax"``: Parallax's
    semantics, not one device's: dense gradients averaged, sparse
    (IndexedSlices) ones summed, as Parallax's average_sparse=False did
    (docs/parallax.md)."""
    sync_local_state: str = "none"
    """State each worker updates from its own batch (batch-norm moving
    statistics...): ``"none"`` leaves every replica with its own values;
    ``"average"`` replaces them by their mean over workers after every step
    (identical replicas; not equal to one device's statistics of the global
    batch)."""
    batch_norm_group: str | int | None = "auto"
    """Distributed batch normalisation: training-mode batch-norm layers
    (tf.nn.moments / Keras BatchNormalization, FusedBatchNorm) take their
    batch statistics over a group of workers in every training step:
    ``"all"`` (one device's statistics of the global batch, moving
    statistics included), a group size k >= 1 (workers [0,k), [k,2k)...;
    must divide the worker count), ``"auto"`` (the default: ``"all"`` where
    the graph has such a layer, nothing to say where it has none; per worker
    with a Config.compute_threshold, whose workers may compute different
    numbers of micro-batches), or ``None`` (each worker normalises by its
    own batch, not one device's; the report says so). A run that is not a
    training step (the chief's forward pass alone, an evaluation)
    normalises by the batch it is given, as one device does. A group with
    Config.micro_batches > 1 is refused (a micro-batch's run is no step)."""
    shard_weight_update: bool = False
    """Weight-update sharding (TPU-pod scaling paper §3): each all-reduce
    variable is updated by one owner worker, which alone holds its optimizer
    slots; the new values are all-gathered from the owners."""
    hierarchical_allreduce: bool | None = None
    """2-D summation of the all-reduce buckets (TPU-pod scaling paper §2): sum
    within each host, all-reduce among one worker per host, broadcast within
    the host. ``True`` forces it, ``False`` keeps the flat ring, ``None``
    (default) chooses it when some host has several workers and it moves
    fewer bytes over host links (transforms.methods.allreduce.method.two_dimensional_choice)."""
    allreduce_group: int | None = None
    """2-D summation of the all-reduce buckets over groups of workers, for
    clusters so large that a flat ring's 2(N-1) steps bind: with d, workers
    [0,d), [d,2d), ... each exchange the d pieces of their sum within their
    group (an all-to-all), the workers at place j of every group all-reduce
    piece j (a ring of N/d), and each group gathers its pieces: the flat
    ring's bytes, 2(N-1)/N of the gradients (plus a bucket's padding to d
    pieces), in 1 + 2(N/d - 1) + (d - 1) steps instead of 2(N - 1). d must
    divide the number of workers (a job going on with fewer workers,
    Config.min_workers, is refused at its restart where d no longer divides
    them; None chooses again). ``0``: the flat ring (or the hosts' 2-D summation,
    Config.hierarchical_allreduce). ``None`` (default): unless
    Config.hierarchical_allreduce is set, the planner's cost model chooses,
    for a job on a network (not loopback) with one worker per host, a group
    size of a power of 2 that divides N, and keeps the flat ring unless one
    is predicted 1.1x faster; the report says what it chose and why
    (transforms.plan.allreduce_structure)."""
    local_aggregation: bool = True
    """LA: workers of a host send one contribution (Parallax §7.4; can be
    turned off for ablation)."""
    aggregation_group: int | None = None
    """Workers that meet the parameter servers together, for clusters so
    large that a server's messages bind (each serves a pull and a push of
    every group per step: 2N/k instead of 2N): with k, workers [0,k),
    [k,2k), ... (the last group may be smaller) replace the hosts of local
    aggregation, and a group also pulls the rows of a partitioned sparse
    server variable once: its workers gather their ids, its first worker
    reads the union from the servers and the group shares the rows. Those
    lookups are then collectives of the group, so every worker of a group
    must run each of them (train and fetch the same steps; Runner.evaluate
    refuses; not with micro_batches > 1). ``0``: the hosts, pushes only.
    ``None`` (default): the planner's cost model chooses, for a hybrid job
    whose sparse variables are split over the servers on a network (not
    loopback), the group size (groups only with one worker per host and
    micro_batches=1) and how many of the servers hold those variables, and
    keeps the hosts and every server unless another choice is predicted
    1.1x faster; the report says what it chose and why
    (transforms.plan.aggregation_structure)."""
    opau: bool = True
    """Place post-aggregation ops next to their inputs (Parallax §7.4; can be
    turned off for ablation)."""
    opsw: bool = True
    """Move light boundary ops to the side that saves bytes (Parallax §7.4;
    can be turned off for ablation)."""
    partitions: dict = field(default_factory=dict)
    """Partition count per PS variable name, overriding the automatic rule:
    ``{variable name: count from 1 to 4096}``, e.g. ``{"embedding": 8}``. A
    name that is no trainable variable of the graph, or a count above the
    variable's rows, is refused when the plan is compiled."""

    @property
    def collective_timeout_s(self) -> float:
        """Seconds a 2-D summation collective may wait for its peers (0: no
        bound). A Config's is its peer_timeout_s; plain PlanOptions have none."""
        return 0.0

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step: a grouped lookup cannot run in each, so the
        planner forms no groups then. A Config's is its field (DropCompute);
        plain PlanOptions plan one."""
        return 1

    def __post_init__(self) -> None:
        # Types first (so a wrong type is named, not a TypeError from a
        # comparison); each message names the Config field.
        count("fusion_bytes", self.fusion_bytes, 1)
        choice("communication_hint", self.communication_hint, ("ring", "auto"))
        choice("run_option", self.run_option, RUN_OPTIONS)
        choice("wire_dtype", self.wire_dtype, WIRE_DTYPES)
        if self.herring_buffer_bytes is not None:
            count("herring_buffer_bytes", self.herring_buffer_bytes, 1, "or None")
        if not isinstance(self.partitions, dict):
            raise AutoparError(f"Config.partitions must be a dict {{variable name: count}}, "
                               f"got {shown(self.partitions)}")
        for name, n in self.partitions.items():
            if not isinstance(name, str):
                raise AutoparError(f"Config.partitions: keys must be variable names (strings), "
                                   f"got {shown(name)}")
            if not is_int(n) or not 1 <= n <= MAX_PARTITIONS:
                raise AutoparError(f"Config.partitions[{shown(name)}] must be an integer from 1 "
                                   f"to {MAX_PARTITIONS}, got {shown(n)}")
        choice("loss_reduction", self.loss_reduction, ("auto", "mean", "sum", "parallax"))
        choice("sync_local_state", self.sync_local_state, ("none", "average"))
        if not (self.batch_norm_group is None or self.batch_norm_group in ("all", "auto")
                or (is_int(self.batch_norm_group) and self.batch_norm_group >= 1)):
            raise AutoparError(f"Config.batch_norm_group must be 'all', 'auto', a group size >= 1 "
                               f"or None, got {shown(self.batch_norm_group)}")
        if not (self.aggregation_group is None
                or (is_int(self.aggregation_group) and self.aggregation_group >= 0)):
            raise AutoparError(f"Config.aggregation_group must be a group size >= 1, 0 (the "
                               f"hosts) or None (chosen), got {shown(self.aggregation_group)}")
        for name in ("shard_weight_update", "local_aggregation", "opau", "opsw"):
            boolean(name, getattr(self, name))
        boolean("hierarchical_allreduce", self.hierarchical_allreduce, "automatic")
        if not (self.allreduce_group is None
                or (is_int(self.allreduce_group) and self.allreduce_group >= 0)):
            raise AutoparError(f"Config.allreduce_group must be a group size >= 1, 0 (the flat "
                               f"ring) or None (chosen), got {shown(self.allreduce_group)}")
        if self.allreduce_group and self.allreduce_group > 1 and self.hierarchical_allreduce:
            raise AutoparError("Config.allreduce_group and Config.hierarchical_allreduce=True are "
                               "two kinds of 2-D summation: set one of them")
        if self.aggregation_group and not self.local_aggregation:
            raise AutoparError("Config.aggregation_group sets the groups of local aggregation: it "
                               "needs Config.local_aggregation=True")
