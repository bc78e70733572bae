"""User-facing options. Every field has a default that works on one machine."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from autopar.common.errors import AutoparError


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
    # where the graph does not show it (the report says so).
    loss_reduction: str = "auto"
    # State each worker updates from its own batch (batch-norm moving
    # statistics...): "none" leaves every replica with its own values;
    # "average" replaces them by their mean over workers after every step
    # (identical replicas; not equal to one device's statistics of the
    # global batch).
    sync_local_state: str = "none"
    # Deprecated alias of loss_reduction: True = "mean", False = "sum".
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

    def __post_init__(self) -> None:
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
            warnings.warn("Config.average_sparse is deprecated: use loss_reduction='mean' or 'sum' "
                          "(it now applies to dense and sparse gradients alike)",
                          DeprecationWarning, stacklevel=3)
            if self.loss_reduction == "auto":
                object.__setattr__(self, "loss_reduction", "mean" if self.average_sparse else "sum")
        if self.loss_reduction not in ("auto", "mean", "sum"):
            raise AutoparError(f"Config.loss_reduction must be 'auto', 'mean' or 'sum', "
                               f"got {self.loss_reduction!r}")
        if self.sync_local_state not in ("none", "average"):
            raise AutoparError(f"Config.sync_local_state must be 'none' or 'average', "
                               f"got {self.sync_local_state!r}")
        if self.stall_timeout_s < 0:
            raise AutoparError(f"Config.stall_timeout_s must be >= 0 (0 disables), "
                               f"got {self.stall_timeout_s}")
        if self.log_every_steps < 0:
            raise AutoparError(f"Config.log_every_steps must be >= 0, got {self.log_every_steps}")
