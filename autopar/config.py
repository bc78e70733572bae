"""User-facing options. Every field has a default that works on one machine."""
from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass, fields

from autopar.common.checks import choice as _choice, count as _count, is_int as _is_int
from autopar.common.checks import is_number as _is_number, seconds as _seconds
from autopar.common.errors import AutoparError, shown
from autopar.common.timeouts import peer_timeout_s
from autopar.transforms.options import PlanOptions

# Upper bound of micro-batches, far above what a job uses and low enough that
# nothing sized by it runs out of memory (a feed split into micro-batches
# holds a dict per part). docs/config.md and docs/launching.md#limits state
# it (and the partitions' bound, transforms/options.py).
MAX_MICRO_BATCHES = 4096


@dataclass(frozen=True)
class SimulatedDelay:
    """A benchmarking aid (DropCompute appendix B.1): after every micro-batch a
    worker sleeps for a bounded log-normal delay, min(max_s, exp(N(log(median_s),
    sigma^2))), drawn from its own generator seeded with seed + worker index, so
    compute variance can be reproduced on one machine. `workers`: the worker
    indices that are delayed (None: all). sigma=0 gives a fixed delay."""
    median_s: float = 0.05
    """The delay's median in seconds (finite, > 0)."""
    sigma: float = 1.0
    """The standard deviation of the delay's logarithm (finite, >= 0; 0 gives
    a fixed delay)."""
    max_s: float = 1.0
    """The bound on one delay in seconds (finite, > 0)."""
    seed: int = 0
    """Each worker's generator is seeded with seed + worker index."""
    workers: tuple[int, ...] | None = None
    """The worker indices that are delayed (``None``: all); a list is accepted
    and kept as a tuple."""

    def __new__(cls, *args, **kwargs):
        _known_keywords(cls, kwargs)     # as Config's
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name, zero_ok in (("median_s", False), ("sigma", True), ("max_s", False)):
            _seconds(name, getattr(self, name), zero_ok=zero_ok, owner="SimulatedDelay")
        if not _is_int(self.seed):
            raise AutoparError(f"SimulatedDelay.seed must be an integer, got {shown(self.seed)}")
        if self.workers is not None:
            if (not isinstance(self.workers, (tuple, list))
                    or not all(_is_int(w) and w >= 0 for w in self.workers)):
                raise AutoparError(f"SimulatedDelay.workers must be worker indices (integers "
                                   f">= 0) or None, got {shown(self.workers)}")
            object.__setattr__(self, "workers", tuple(self.workers))


@dataclass(frozen=True)
class Config(PlanOptions):
    """Options of a job, passed as ``get_runner(graph, spec, config)``.

    Every field has a default that works on one machine, and every field is
    checked when the Config is made (types first; an ``AutoparError`` naming
    the field; a keyword that is no field is one too, naming the field it
    may mean). The fields that shape the plan (run_option, wire_dtype,
    loss_reduction, partitions...) are PlanOptions' (transforms/options.py),
    declared and checked there; the others are declared here. Each field's
    documentation is the string literal after it (an attribute docstring):
    docs/config.md is generated from them by ``python -m docs.generate``.
    """
    checkpoint_dir: str | None = None
    """Directory of the chief-only checkpoints (a path, ``os.PathLike``
    accepted and kept as a string); ``None`` disables checkpointing. A
    restarted job restores the newest checkpoint in it and continues at its
    global step (docs/checkpoints.md)."""
    save_every_steps: int = 100
    """With ``checkpoint_dir``: the chief saves a checkpoint every this many
    global steps (and on ``close()`` and when the job is stopped). An integer
    >= 1."""
    keep_checkpoints: int = 5
    """How many of the newest checkpoints to keep (older ones are deleted). An
    integer >= 1."""
    log_every_steps: int = 10
    """Progress on the chief: one line every this many steps (0 disables)."""
    total_steps: int | None = None
    """Optional, only used when the launcher's output is a terminal: the
    chief's progress is then one line redrawn in place, a bar with the step
    out of this total, the rate and the time left. An integer >= 1 or
    ``None``."""
    startup_timeout_s: float = 60.0
    """Seconds a worker waits for its peers' servers (and for the job's plan
    from the job coordinator) before giving up. Finite, > 0."""
    batch_mixing: str = "refuse"
    """A loss that mixes the examples of a batch otherwise than batch
    normalisation (in-batch negatives, a statistic of the batch fed back into
    each example, the batch's hardest examples; transforms/batch_mixing.py)
    cannot equal one device on several workers: ``"refuse"`` (default) stops
    the job at start, naming the op; ``"per_worker"`` trains it with each
    worker mixing only the examples of its own share (what other
    data-parallel tools do), said in the report and the chief's log."""
    average_sparse: bool | None = None
    """Parallax's option, kept for programs ported from it (a
    DeprecationWarning): ``True`` = loss_reduction ``"mean"``, ``False`` =
    ``"parallax"`` (sparse gradients summed, dense averaged). It applies only
    while loss_reduction is ``"auto"``."""
    stall_timeout_s: float = 60.0
    """The launcher ends the job when some workers have waited this long
    inside a step for a process that has stopped answering (killed,
    stopped, cut off) or has failed; a process still reporting from outside
    a step (the chief evaluating or saving) is busy, not stuck: see
    busy_timeout_s. Before, and every this many seconds while they wait for
    a busy one, the launcher warns (Horovod's stall inspector); 0 disables
    the timed checks. Finite, >= 0 (docs/stalls.md)."""
    busy_timeout_s: float = 3600.0
    """How long workers may wait inside a step for a process that is busy
    outside one (still reporting: the chief evaluating, saving a checkpoint,
    logging) before the launcher ends the job as stalled; 0: never (they
    wait as long as it takes, warned of every stall_timeout_s). Finite,
    0 or >= stall_timeout_s. Every wait for peers inside an operation is
    bounded by the longer of the two (Config.peer_timeout_s), so the
    coordinator's diagnosis comes first."""
    micro_batches: int = 1
    """DropCompute (docs/dropcompute.md): every training step computes up to
    micro_batches micro-batches per worker, accumulating their gradients,
    then aggregates and applies once. An integer from 1 to 4096."""
    compute_threshold: float | str | None = None
    """Seconds of compute after which a worker stops taking micro-batches and
    joins the aggregation; ``"auto"`` picks it from the latencies measured
    in dropcompute_warmup; ``None`` never drops. Needs micro_batches >= 2,
    and cannot be combined with batch_norm_group."""
    dropcompute_warmup: tuple[int, int] = (5, 50)
    """Steps [first, last) whose micro-batch latencies choose the ``"auto"``
    threshold (0 <= first < last)."""
    drop_compensation: str = "none"
    """Making up for dropped micro-batches (DropCompute §4.5): ``"none"``,
    ``"steps"`` (runner.dropcompute.extra_steps(base): how many more steps
    make up the dropped samples), ``"batch"`` (micro_batches is raised once
    tau is chosen, so the average computed batch stays that of
    micro_batches without drops). Needs a compute_threshold."""
    simulated_delay: SimulatedDelay | None = None
    """A benchmarking aid only: see SimulatedDelay (needs micro_batches >= 2).
    ``None`` (default) adds nothing."""
    dropcompute_log_dir: str | None = None
    """Directory of the per-worker CSV of DropCompute steps (``None``: no
    CSV)."""
    max_restarts: int = 0
    """Start the job again, at most this many times, when a worker or server
    dies, fails or stalls once training has begun: every process anew on
    fresh ports, the chief restoring its last checkpoint (``checkpoint_dir``,
    saved every ``save_every_steps``; without one training starts over). A
    usage error (exit status 2) and a stop asked for (Ctrl-C) end the job."""
    min_workers: int = 0
    """With ``max_restarts``: when a restart cannot reach a host (ssh fails),
    drop it and go on with the hosts that remain, re-planned, if they run at
    least this many workers (0: never drop a host; the job fails). The global
    batch shrinks with the workers; the learning rate is the script's to
    rescale (``autopar.num_workers()``, docs/cluster.md). Refused without
    ``max_restarts``, and above the spec's worker count."""
    timeline: str | None = None
    """A Chrome trace-event file the launcher writes when the job ends (None:
    none; a path no file can be written at is refused before anything
    starts, as are unwritable ``checkpoint_dir``, ``tensorboard_dir`` and
    ``dropcompute_log_dir``): every worker's and server's lane with the phases of the last
    ``timeline_steps`` traced steps (forward, backward, each all-reduce
    bucket, pushes and pulls, server updates, barriers, micro-batches,
    checkpoint saves), clocks aligned on the launcher's. Open it in
    chrome://tracing or ui.perfetto.dev ([inside a job](inside-a-job.md))."""
    timeline_steps: int = 10
    """With ``timeline``: how many traced steps the file keeps (the last)."""
    timeline_every: int = 10
    """With ``timeline``: one step in this many is traced (a traced step
    collects every op's timing, which costs time)."""
    tensorboard_dir: str | None = None
    """Directory the chief writes a TensorBoard event file to (``None``:
    none): at every logged step (``log_every_steps``) the loss it fetched,
    examples/s, seconds per step, the plan's bytes sent and received per
    worker per step for each method, the stall warnings the launcher has
    issued so far, and with micro-batches DropCompute's
    threshold τ and drop rate; at the first, the plan report as text."""
    allow_unsharded_input: bool = False
    """A training step that reads a tf.data pipeline with no shard on its way
    (``autopar.shard(ds)`` before ``.batch()``, or ``ds.shard(n, i)``) is
    refused: every worker would read the same examples, which is not one
    device's global batch. ``True`` lets it train, for a program whose
    workers read what they should by other means (each its own files).
    Arrays fed through ``runner.run``'s feed_dict or ``runner.call`` are
    the program's to split (docs/programs.md)."""
    measure_steps: int = 10
    """Over its first this many training steps the chief measures how many
    rows each sparse gradient really carried (and how many distinct ids they
    were) and then logs, per method, the bytes the steps moved beside the
    plan's estimate, which for sparse gradients is an upper bound; in a
    private network namespace also every byte the job's processes sent (0
    disables; [inside a job](inside-a-job.md))."""

    def __new__(cls, *args, **kwargs):
        # A misspelled keyword would be a TypeError from the generated
        # __init__, with a traceback; it is an autopar error like any bad value
        # (a launched script then ends as `autopar: ...`, exit status 2).
        _known_keywords(cls, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        # Every field is checked, types first (so a wrong type is named, not a
        # TypeError from a comparison), and each message names the field and
        # shows the value at most briefly (common.errors.shown).
        _set_path(self, "checkpoint_dir")
        _set_path(self, "tensorboard_dir")
        _set_path(self, "timeline")
        _count("timeline_steps", self.timeline_steps, 1)
        _count("timeline_every", self.timeline_every, 1)
        _count("max_restarts", self.max_restarts, 0)
        _count("min_workers", self.min_workers, 0, "(0: never drop a host)")
        if self.min_workers and not self.max_restarts:
            raise AutoparError(f"Config.min_workers={self.min_workers} drops a host only when the "
                               "job restarts, and max_restarts is 0: give max_restarts >= 1 too, "
                               "or leave min_workers at 0")
        _count("save_every_steps", self.save_every_steps, 1)
        _count("keep_checkpoints", self.keep_checkpoints, 1)
        _count("log_every_steps", self.log_every_steps, 0, "(0 disables)")
        _count("measure_steps", self.measure_steps, 0, "(0 disables)")
        if self.total_steps is not None:
            _count("total_steps", self.total_steps, 1, "or None")
        _seconds("startup_timeout_s", self.startup_timeout_s, zero_ok=False)
        if self.average_sparse is not None:
            warnings.warn("Config.average_sparse is Parallax's option: use loss_reduction='mean' "
                          "(average_sparse=True) or 'parallax' (average_sparse=False)",
                          DeprecationWarning, stacklevel=3)
            if self.loss_reduction == "auto":
                object.__setattr__(self, "loss_reduction",
                                   "mean" if self.average_sparse else "parallax")
        super().__post_init__()     # the plan's fields (transforms/options.py)
        _choice("batch_mixing", self.batch_mixing, ("refuse", "per_worker"))
        if not isinstance(self.allow_unsharded_input, bool):
            raise AutoparError(f"Config.allow_unsharded_input must be True or False, "
                               f"got {shown(self.allow_unsharded_input)}")
        _seconds("stall_timeout_s", self.stall_timeout_s, zero_ok=True)
        _seconds("busy_timeout_s", self.busy_timeout_s, zero_ok=True)
        if 0 < self.busy_timeout_s < self.stall_timeout_s:
            raise AutoparError(f"Config.busy_timeout_s must be 0 (never) or at least "
                               f"stall_timeout_s ({self.stall_timeout_s:g}), got "
                               f"{shown(self.busy_timeout_s)}")
        _set_path(self, "dropcompute_log_dir")
        self._check_dropcompute()

    @property
    def collective_timeout_s(self) -> float:
        """The plan's bound on 2-D summation's collectives: peer_timeout_s."""
        return float(self.peer_timeout_s)

    @property
    def peer_timeout_s(self) -> float:
        """How long an operation may wait for its peers before it gives up (0:
        no bound): the longest the launcher lets workers wait inside a step
        (busy_timeout_s, or stall_timeout_s when that is longer), so that
        the coordinator's diagnosis naming the process comes first. Bounds
        2-D summation's collectives, herring's transport (twice it, at
        least 60 s) and DropCompute's agreement (plus startup_timeout_s)."""
        return peer_timeout_s(self.stall_timeout_s, self.busy_timeout_s)

    def _check_dropcompute(self) -> None:
        _count("micro_batches", self.micro_batches, 1)
        if self.micro_batches > MAX_MICRO_BATCHES:
            raise AutoparError(f"Config.micro_batches must be at most {MAX_MICRO_BATCHES}, got "
                               f"{shown(self.micro_batches)}")
        tau = self.compute_threshold
        if tau is not None and tau != "auto" and not (_is_number(tau) and 0 < tau < math.inf):
            raise AutoparError(f"Config.compute_threshold must be seconds > 0, 'auto' or None, "
                               f"got {shown(tau)}")
        if tau is not None and self.micro_batches < 2:
            raise AutoparError("Config.compute_threshold drops micro-batches, so it needs "
                               f"Config.micro_batches >= 2 (got {self.micro_batches})")
        if self.micro_batches > 1 and self.aggregation_group not in (None, 0, 1):
            raise AutoparError("Config.aggregation_group is not supported with "
                               "Config.micro_batches > 1 (a micro-batch's grouped lookups would "
                               "need a barrier of their own): use one of them")
        if tau is not None and self.batch_norm_group == "auto":
            # A worker that drops micro-batches computes fewer forward passes
            # than its group: statistics stay each worker's (reported).
            object.__setattr__(self, "batch_norm_group", None)
        if tau is not None and self.batch_norm_group not in (None, 1):
            # Group statistics are all-reduced in the forward pass: a worker
            # that drops micro-batches would leave its peers waiting there.
            raise AutoparError("Config.batch_norm_group computes batch-norm statistics with "
                               "collectives in every micro-batch, so every worker must compute "
                               "the same number of them: it cannot be combined with "
                               "Config.compute_threshold")
        warm = (tuple(self.dropcompute_warmup)
                if isinstance(self.dropcompute_warmup, (tuple, list)) else ())
        if len(warm) != 2 or not all(_is_int(w) for w in warm) or not 0 <= warm[0] < warm[1]:
            raise AutoparError(f"Config.dropcompute_warmup must be (first, last) steps with "
                               f"0 <= first < last, got {shown(self.dropcompute_warmup)}")
        object.__setattr__(self, "dropcompute_warmup", warm)
        _choice("drop_compensation", self.drop_compensation, ("none", "steps", "batch"))
        if self.drop_compensation != "none" and tau is None:
            raise AutoparError("Config.drop_compensation makes up for dropped micro-batches: "
                               "it needs a Config.compute_threshold")
        if self.simulated_delay is not None:
            if not isinstance(self.simulated_delay, SimulatedDelay):
                raise AutoparError("Config.simulated_delay must be an autopar.SimulatedDelay "
                                   f"or None, got {shown(self.simulated_delay)}")
            if self.micro_batches < 2:
                raise AutoparError("Config.simulated_delay is added after each micro-batch: "
                                   "it needs Config.micro_batches >= 2")


def _known_keywords(cls, kwargs: dict) -> None:
    """AutoparError naming the first keyword that is not a field of ``cls``,
    with the closest field name if one is close."""
    names = [f.name for f in fields(cls)]
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=2)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise AutoparError(f"{cls.__name__} has no field {shown(key, 60)}{hint}; its fields "
                               "are listed in docs/config.md")


def _set_path(config: "Config", name: str) -> None:
    """A path field (a directory, or the timeline's file): None, or a non-empty path
    (str or os.PathLike, kept as str)."""
    value = getattr(config, name)
    if value is None:
        return
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise AutoparError(f"Config.{name} must be a path or None, got {shown(value)}")
    object.__setattr__(config, name, value)
