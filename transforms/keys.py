"""Every collective group key and instance-key range a job uses, in one
table; below them the job coordinator's keys and the port ranges autopar
derives ports from without probing, each checked as strictly.

TensorFlow's collectives match the members of one collective by (group key,
instance key), and pin an instance key to the shape of its first use: two
features drawing keys from overlapping ranges in one group make a worker's
batch-norm reduction meet another's evaluation totals ("Shape mismatch in the
collective instance ..."). So no module invents a key: each takes its keys
from its range here, and `check_disjoint` (run on import and by a unit test)
proves no two ranges of one kind overlap.

Instance keys:
  plan         the Plan's per-variable and per-step keys, allocated in order by
               make_plan: fusion buckets, row gathers and their ladders,
               server-side aggregation and norm keys, herring's host
               collectives, the step barriers, the initial broadcast
  local_state  Config(sync_local_state="average"): one all-reduce per dtype
  batch_norm   distributed batch normalisation: KEYS_PER_LAYER per layer
  wus          weight-update sharding: one all-gather per dtype
  evaluation   Runner.evaluate's totals (and DropCompute's agreement without a
               coordinator): one all-reduce per vector length
  loss_counts  a loss's counts of the batch's values (transforms.loss_counts):
               one all-reduce per count
  batch_weights  the sum of the workers' batch sizes (transforms.batch_weights):
               one all-reduce per batch input
  batch_draws  the sum of the workers' batch sizes for draws per example
               (transforms.random_draws): one all-reduce
  padded_lengths  the sum of the workers' lengths of an input padded per batch,
               or of a boolean of the whole batch a cond decides by
               (transforms.padded_lengths): one all-reduce per such input or cond
Group keys (each later job of a script: all of them JOB_GROUP_STRIDE higher):
  GROUP_KEY          all workers
  LEADERS_GROUP_KEY  the first worker of every host (2-D summation)
  host_groups        the workers of host h (local aggregation): first + h
  batch_norm_groups  batch-norm group g smaller than the job: first + g
  aggregation_groups Config(aggregation_group): the workers of group g, which
                     meet the parameter servers together: first + g
  allreduce_groups   Config(allreduce_group=d), 2-D summation over groups of
                     workers: the d workers of group g: first + g
  allreduce_columns  ... and the workers at place j of every group: first + j
  accelerator_groups on workers with GPUs, the GPU twin of every group above
                     (first + its key): TensorFlow wants one device type per
                     group, and a GPU worker's collectives of other dtypes
                     stay on its CPU (transforms.accelerator)
Coordinator keys (runtime/coordinator.py: Exchange, Publish/Fetch), distinct:
  PLAN_KEY           the compiled plan (the launcher names it in AUTOPAR_PLAN)
  DROPCOMPUTE_*      DropCompute's warm-up records, threshold and summaries
  TIMELINE_KEY_PREFIX  + a lane: a worker's timeline events, a server's clock offset
Port ranges (disjoint):
  REMOTE_PORTS       a remote host's processes when its spec gives no 'ports'
  SLURM_STEP_PORTS   the tasks of an srun step (runtime/slurm.py)
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.common.errors import AutoparError


@dataclass(frozen=True)
class KeyRange:
    name: str
    first: int
    size: int

    @property
    def end(self) -> int:
        return self.first + self.size

    def key(self, offset: int) -> int:
        """The key `offset` places into the range; refused beyond its end."""
        if not 0 <= offset < self.size:
            raise self._too_many(offset + 1)
        return self.first + offset

    def check_end(self, next_free: int) -> None:
        """Refuse an allocation that ran to `next_free` past the range."""
        if next_free > self.end:
            raise self._too_many(next_free - self.first)

    def _too_many(self, needed: int) -> AutoparError:
        return AutoparError(
            f"the job needs more collective keys for {self.name} than its range holds "
            f"({needed} > {self.size}): the graph has unusually many "
            f"{'variables' if self.name == 'plan' else 'uses of it'}")


# Group keys.
GROUP_KEY = 1
LEADERS_GROUP_KEY = 2
HOST_GROUPS = KeyRange("host groups", 1000, 1000)
BATCH_NORM_GROUPS = KeyRange("batch-norm groups", 2000, 1000)
AGGREGATION_GROUPS = KeyRange("aggregation groups", 3000, 1000)
ALLREDUCE_GROUPS = KeyRange("all-reduce groups", 4000, 1000)
ALLREDUCE_COLUMNS = KeyRange("all-reduce columns", 5000, 1000)
# A GPU twin's key is this range's first + the key it twins: every key above.
ACCELERATOR_GROUPS = KeyRange("accelerator groups", 10000, 6000)
GROUP_RANGES = (KeyRange("all workers", GROUP_KEY, 1), KeyRange("leaders", LEADERS_GROUP_KEY, 1),
                HOST_GROUPS, BATCH_NORM_GROUPS, AGGREGATION_GROUPS, ALLREDUCE_GROUPS,
                ALLREDUCE_COLUMNS, ACCELERATOR_GROUPS)

# Instance keys (keys below 100 are left free).
PLAN = KeyRange("plan", 100, (1 << 20) - 100)
LOCAL_STATE = KeyRange("local-state averaging", 1 << 20, 1 << 20)
BATCH_NORM = KeyRange("batch normalisation", 2 << 20, 1 << 20)
WUS = KeyRange("weight-update sharding", 3 << 20, 1 << 20)
EVALUATION = KeyRange("evaluation totals", 4 << 20, (1 << 16) + 1)
LOSS_COUNTS = KeyRange("loss counts", 5 << 20, 1 << 10)
BATCH_WEIGHTS = KeyRange("batch weights", (5 << 20) + (1 << 10), 1 << 10)
BATCH_DRAWS = KeyRange("batch draws", (5 << 20) + (2 << 10), 1)
PADDED_LENGTHS = KeyRange("padded lengths", (5 << 20) + (3 << 10), 1 << 10)
BATCH_STATISTICS = KeyRange("batch statistics", (5 << 20) + (4 << 10), 1 << 10)
INSTANCE_RANGES = (PLAN, LOCAL_STATE, BATCH_NORM, WUS, EVALUATION, LOSS_COUNTS, BATCH_WEIGHTS,
                   BATCH_DRAWS, PADDED_LENGTHS, BATCH_STATISTICS)


def check_disjoint(ranges) -> None:
    """Raise if two of `ranges` share a key."""
    ordered = sorted(ranges, key=lambda r: r.first)
    for a, b in zip(ordered, ordered[1:]):
        if a.end > b.first:
            raise AssertionError(f"collective key ranges overlap: {a} and {b}")


check_disjoint(GROUP_RANGES)
check_disjoint(INSTANCE_RANGES)
# A later job of one script (its processes' second autopar.fit) takes every
# group key this far above its previous job's: TensorFlow pins an instance
# key of a group to its first use's shape in a process, beyond one session.
JOB_GROUP_STRIDE = 100_000
if max(r.end for r in GROUP_RANGES) > JOB_GROUP_STRIDE:
    raise AssertionError(f"group keys reach past JOB_GROUP_STRIDE ({JOB_GROUP_STRIDE})")

# Coordinator keys: two features sharing one would read each other's values.
PLAN_KEY = "compiled-plan"                                 # the compiled plan
DROPCOMPUTE_WARMUP_KEY = "autopar/dropcompute/warmup"      # workers' warm-up records
DROPCOMPUTE_DECISION_KEY = "autopar/dropcompute/decision"  # the chief's threshold
DROPCOMPUTE_SUMMARY_KEY = "autopar/dropcompute/summary"    # workers' totals at close
# + "worker N": a worker's timeline events; + "server N": a server's clock
# offset (runtime/timeline.py)
TIMELINE_KEY_PREFIX = "autopar/timeline/"
COORDINATOR_KEYS = (PLAN_KEY, DROPCOMPUTE_WARMUP_KEY, DROPCOMPUTE_DECISION_KEY,
                    DROPCOMPUTE_SUMMARY_KEY, TIMELINE_KEY_PREFIX)
if len(set(COORDINATOR_KEYS)) != len(COORDINATOR_KEYS):
    raise AssertionError(f"coordinator keys repeat: {COORDINATOR_KEYS}")

# Port ranges autopar hands out without probing: disjoint, so that jobs of
# the two kinds sharing a machine never derive one port.
REMOTE_PORTS = KeyRange("remote host ports", 23000, 1000)
SLURM_STEP_PORTS = KeyRange("srun step ports", 24000, 40000)
check_disjoint((REMOTE_PORTS, SLURM_STEP_PORTS))
if SLURM_STEP_PORTS.end > 65536:
    raise AssertionError(f"{SLURM_STEP_PORTS} runs past port 65535")
