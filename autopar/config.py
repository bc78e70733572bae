"""User-facing options. Every field has a default that works on one machine."""
from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import AutoparError


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
    # servers (sparse by all-gather). Hybrid with no sparse variables is
    # all-reduce; PS methods need servers in the spec.
    run_option: str = "hybrid"
    # Sparse aggregate = mean of the workers' gradients (what one device with
    # the global batch computes for a mean loss); False sums them (Parallax's
    # default, for losses summed over the batch).
    average_sparse: bool = True
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
        if self.run_option not in ("hybrid", "ps", "allreduce"):
            raise AutoparError(f"Config.run_option must be 'hybrid', 'ps' or 'allreduce', "
                               f"got {self.run_option!r}")
        for name, n in self.partitions.items():
            if not isinstance(n, int) or n < 1:
                raise AutoparError(f"Config.partitions[{name!r}] must be an integer >= 1, got {n!r}")
        if self.stall_timeout_s < 0:
            raise AutoparError(f"Config.stall_timeout_s must be >= 0 (0 disables), "
                               f"got {self.stall_timeout_s}")
        if self.log_every_steps < 0:
            raise AutoparError(f"Config.log_every_steps must be >= 0, got {self.log_every_steps}")
