"""User-facing options. Every field has a default that works on one machine."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from autopar.common.errors import AutoparError


@dataclass(frozen=True)
class SimulatedDelay:
    """A benchmarking aid (DropCompute appendix B.1): after every micro-batch a
    worker sleeps for a bounded log-normal delay, min(max_s, exp(N(log(median_s),
    sigma^2))), drawn from its own generator seeded with seed + worker index, so
    compute variance can be reproduced on one machine. `workers`: the worker
    indices that are delayed (None: all). sigma=0 gives a fixed delay."""
    median_s: float = 0.05
    sigma: float = 1.0
    max_s: float = 1.0
    seed: int = 0
    workers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.median_s <= 0 or self.sigma < 0 or self.max_s <= 0:
            raise AutoparError(f"SimulatedDelay needs median_s > 0, sigma >= 0 and max_s > 0, "
                               f"got median_s={self.median_s}, sigma={self.sigma}, "
                               f"max_s={self.max_s}")
        if self.workers is not None:
            object.__setattr__(self, "workers", tuple(int(w) for w in self.workers))


@dataclass(frozen=True)
class Config:
    # Dense gradients are averaged in fused buckets of at most this many bytes
    # (Horovod-style tensor fusion): fewer, larger collectives.
    fusion_bytes: int = 64 * 1024 * 1024
    # TensorFlow collective implementation: "ring" or "auto".
    communication_hint: str = "ring"
    # Chief-only checkpointing; None disables it.
    checkpoint_dir: str | None = None
    save_every_steps: int = 100
    # How many of the newest checkpoints to keep (older ones are deleted).
    keep_checkpoints: int = 5
    # Progress on the chief: one line every this many steps (0 disables).
    log_every_steps: int = 10
    # Optional, only used to draw a progress bar when the output is a terminal.
    total_steps: int | None = None
    # Seconds a worker waits for its peers' servers before giving up.
    startup_timeout_s: float = 60.0
    # How gradients travel (Parallax): "hybrid" = dense by all-reduce, sparse on
    # parameter servers; "ps" = every variable on servers; "allreduce" = no
    # servers (sparse by all-gather); "herring" = dense float32 gradients in
    # balanced fusion buffers summed by sharded summation servers (sparse as
    # in hybrid). Hybrid with no sparse variables is all-reduce, or herring
    # when the spec has servers and the cost model predicts it faster than
    # the ring; PS methods and herring need servers in the spec.
    run_option: str = "hybrid"
    # herring: the dtype gradients travel in ("float32", "float16",
    # "bfloat16"; summed in float32 on the servers), and the fusion buffer
    # size in bytes of float32 (None: chosen from model and cluster size).
    wire_dtype: str = "float32"
    herring_buffer_bytes: int | None = None
    # How workers' gradients combine, dense and sparse alike: "mean" (the loss
    # is a mean over the batch: one device's gradient is the mean over the
    # global batch), "sum" (the loss is summed over the batch), or "auto":
    # what the analysis reads from the graph (reduce_mean / reduce_sum, the
    # tf.compat.v1.losses reductions, a division by the batch size), "mean"
    # where the graph does not show it (the report says so; a graph where
    # neither can match one device, a summed loss plus a batch-independent
    # term, is refused). "parallax": Parallax's semantics, not one device's:
    # dense gradients averaged, sparse (IndexedSlices) ones summed, as
    # Parallax's average_sparse=False did (README "Coming from Parallax").
    loss_reduction: str = "auto"
    # State each worker updates from its own batch (batch-norm moving
    # statistics...): "none" leaves every replica with its own values;
    # "average" replaces them by their mean over workers after every step
    # (identical replicas; not equal to one device's statistics of the
    # global batch).
    sync_local_state: str = "none"
    # Distributed batch normalisation: training-mode batch-norm layers
    # (tf.nn.moments / Keras BatchNormalization, FusedBatchNorm) take their
    # batch statistics over a group of workers: "all" (one device's statistics
    # of the global batch, moving statistics included), a group size k
    # (workers [0,k), [k,2k)...; must divide the worker count), or None
    # (each worker normalises by its own batch).
    batch_norm_group: str | int | None = None
    # Weight-update sharding (TPU-pod scaling paper §3): each all-reduce
    # variable is updated by one owner worker, which alone holds its
    # optimizer slots; the new values are all-gathered from the owners.
    shard_weight_update: bool = False
    # 2-D summation of the all-reduce buckets (TPU-pod scaling paper §2): sum
    # within each host, all-reduce among one worker per host, broadcast within
    # the host. True forces it, False keeps the flat ring, None (default)
    # chooses it when some host has several workers and it moves fewer bytes
    # over host links (transforms.allreduce.two_dimensional_choice).
    hierarchical_allreduce: bool | None = None
    # Parallax's option, kept for programs ported from it: True = loss_reduction
    # "mean", False = "parallax" (sparse gradients summed, dense averaged).
    average_sparse: bool | None = None
    # Optimisations, each can be turned off for ablation (Parallax §7.4):
    local_aggregation: bool = True   # LA: workers of a host send one contribution
    opau: bool = True                # place post-aggregation ops next to their inputs
    opsw: bool = True                # move light boundary ops to the side that saves bytes
    # Partition count per PS variable name, overriding the automatic rule.
    partitions: dict = field(default_factory=dict)
    # The launcher ends the job when some workers have waited this long inside
    # a step for others that have not started it (Horovod's stall inspector,
    # but ending the job instead of warning); 0 disables.
    stall_timeout_s: float = 60.0
    # DropCompute (README "Gradient accumulation and DropCompute"): every
    # training step computes up to micro_batches micro-batches per worker,
    # accumulating their gradients, then aggregates and applies once.
    micro_batches: int = 1
    # Seconds of compute after which a worker stops taking micro-batches and
    # joins the aggregation; "auto" picks it from the latencies measured in
    # dropcompute_warmup; None never drops.
    compute_threshold: float | str | None = None
    # Steps [first, last) whose micro-batch latencies choose the "auto" threshold.
    dropcompute_warmup: tuple[int, int] = (5, 50)
    # Making up for dropped micro-batches (DropCompute §4.5): "none", "steps"
    # (runner.dropcompute.extra_steps(base): how many more steps make up
    # the dropped samples),
    # "batch" (micro_batches is raised once tau is chosen, so the average
    # computed batch stays that of micro_batches without drops).
    drop_compensation: str = "none"
    # A benchmarking aid only: see SimulatedDelay. None (default) adds nothing.
    simulated_delay: SimulatedDelay | None = None
    # Directory of the per-worker CSV of DropCompute steps (None: no CSV).
    dropcompute_log_dir: str | None = None

    def __post_init__(self) -> None:
        self._check_dropcompute()
        if self.fusion_bytes <= 0:
            raise AutoparError(f"Config.fusion_bytes must be > 0, got {self.fusion_bytes}")
        if self.communication_hint not in ("ring", "auto"):
            raise AutoparError(
                f"Config.communication_hint must be 'ring' or 'auto', got {self.communication_hint!r}")
        if self.save_every_steps <= 0:
            raise AutoparError(f"Config.save_every_steps must be > 0, got {self.save_every_steps}")
        if self.keep_checkpoints < 1:
            raise AutoparError(f"Config.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.run_option not in ("hybrid", "ps", "allreduce", "herring"):
            raise AutoparError(f"Config.run_option must be 'hybrid', 'ps', 'allreduce' or "
                               f"'herring', got {self.run_option!r}")
        if self.wire_dtype not in ("float32", "float16", "bfloat16"):
            raise AutoparError(f"Config.wire_dtype must be 'float32', 'float16' or 'bfloat16', "
                               f"got {self.wire_dtype!r}")
        if self.herring_buffer_bytes is not None and (
                isinstance(self.herring_buffer_bytes, bool)
                or not isinstance(self.herring_buffer_bytes, int) or self.herring_buffer_bytes <= 0):
            raise AutoparError(f"Config.herring_buffer_bytes must be a positive integer or None, "
                               f"got {self.herring_buffer_bytes!r}")
        for name, n in self.partitions.items():
            if not isinstance(n, int) or n < 1:
                raise AutoparError(f"Config.partitions[{name!r}] must be an integer >= 1, got {n!r}")
        if self.average_sparse is not None:
            warnings.warn("Config.average_sparse is Parallax's option: use loss_reduction='mean' "
                          "(average_sparse=True) or 'parallax' (average_sparse=False)",
                          DeprecationWarning, stacklevel=3)
            if self.loss_reduction == "auto":
                object.__setattr__(self, "loss_reduction",
                                   "mean" if self.average_sparse else "parallax")
        if self.loss_reduction not in ("auto", "mean", "sum", "parallax"):
            raise AutoparError(f"Config.loss_reduction must be 'auto', 'mean', 'sum' or "
                               f"'parallax', got {self.loss_reduction!r}")
        if self.sync_local_state not in ("none", "average"):
            raise AutoparError(f"Config.sync_local_state must be 'none' or 'average', "
                               f"got {self.sync_local_state!r}")
        if not (self.batch_norm_group is None or self.batch_norm_group == "all"
                or (isinstance(self.batch_norm_group, int)
                    and not isinstance(self.batch_norm_group, bool) and self.batch_norm_group >= 1)):
            raise AutoparError(f"Config.batch_norm_group must be 'all', a group size >= 1 or None, "
                               f"got {self.batch_norm_group!r}")
        if not isinstance(self.shard_weight_update, bool):
            raise AutoparError(f"Config.shard_weight_update must be True or False, "
                               f"got {self.shard_weight_update!r}")
        if not (self.hierarchical_allreduce is None or isinstance(self.hierarchical_allreduce, bool)):
            raise AutoparError(f"Config.hierarchical_allreduce must be True, False or None "
                               f"(automatic), got {self.hierarchical_allreduce!r}")
        if self.stall_timeout_s < 0:
            raise AutoparError(f"Config.stall_timeout_s must be >= 0 (0 disables), "
                               f"got {self.stall_timeout_s}")
        if self.log_every_steps < 0:
            raise AutoparError(f"Config.log_every_steps must be >= 0, got {self.log_every_steps}")

    def _check_dropcompute(self) -> None:
        if not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise AutoparError(f"Config.micro_batches must be an integer >= 1, "
                               f"got {self.micro_batches!r}")
        tau = self.compute_threshold
        if isinstance(tau, str):
            if tau != "auto":
                raise AutoparError(f"Config.compute_threshold must be seconds > 0, 'auto' or "
                                   f"None, got {tau!r}")
        elif tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float))
                                  or tau <= 0):
            raise AutoparError(f"Config.compute_threshold must be seconds > 0, 'auto' or None, "
                               f"got {tau!r}")
        if tau is not None and self.micro_batches < 2:
            raise AutoparError("Config.compute_threshold drops micro-batches, so it needs "
                               f"Config.micro_batches >= 2 (got {self.micro_batches})")
        if tau is not None and self.batch_norm_group not in (None, 1):
            # Group statistics are all-reduced in the forward pass: a worker
            # that drops micro-batches would leave its peers waiting there.
            raise AutoparError("Config.batch_norm_group computes batch-norm statistics with "
                               "collectives in every micro-batch, so every worker must compute "
                               "the same number of them: it cannot be combined with "
                               "Config.compute_threshold")
        warm = tuple(self.dropcompute_warmup)
        if (len(warm) != 2 or not all(isinstance(w, int) for w in warm)
                or not 0 <= warm[0] < warm[1]):
            raise AutoparError(f"Config.dropcompute_warmup must be (first, last) steps with "
                               f"0 <= first < last, got {self.dropcompute_warmup!r}")
        object.__setattr__(self, "dropcompute_warmup", warm)
        if self.drop_compensation not in ("none", "steps", "batch"):
            raise AutoparError(f"Config.drop_compensation must be 'none', 'steps' or 'batch', "
                               f"got {self.drop_compensation!r}")
        if self.drop_compensation != "none" and tau is None:
            raise AutoparError("Config.drop_compensation makes up for dropped micro-batches: "
                               "it needs a Config.compute_threshold")
        if self.simulated_delay is not None:
            if not isinstance(self.simulated_delay, SimulatedDelay):
                raise AutoparError("Config.simulated_delay must be an autopar.SimulatedDelay "
                                   f"or None, got {self.simulated_delay!r}")
            if self.micro_batches < 2:
                raise AutoparError("Config.simulated_delay is added after each micro-batch: "
                                   "it needs Config.micro_batches >= 2")
