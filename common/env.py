"""The environment contract between the launcher and the processes it starts.

The launcher re-executes the user's script once per worker; these variables
tell a process which role it plays. One place, so launcher and worker agree.
"""
import json
import os

ROLE = "AUTOPAR_ROLE"            # a role name (common/roles.py)
TASK_INDEX = "AUTOPAR_TASK_INDEX"  # index within the role's job
CLUSTER = "AUTOPAR_CLUSTER"      # JSON {job name (common/roles.py): ["host:port", ...]}
SPEC = "AUTOPAR_SPEC"            # JSON of ResourceSpec.to_dict()
TTY = "AUTOPAR_TTY"              # "1" when the launcher's output is a terminal
COORDINATOR = "AUTOPAR_COORDINATOR"   # "host:port" of the job coordinator
COORD_TOKEN = "AUTOPAR_COORD_TOKEN"   # the job's secret token for the coordinator
# "N/M/S" in the processes of the N-th of at most M restarts of a job whose
# previous start reached global step S (-1: unknown); the chief says where it
# resumes and how many steps it recomputes.
RESTART = "AUTOPAR_RESTART"
JOB_ID = "AUTOPAR_JOB_ID"        # the job's short public id, in every process title
BIND = "AUTOPAR_BIND"            # "addr/port,..." for the bind shim (cpp_ops/bind_shim.c)
# The coordinator key under which the launcher published the job's compiled
# plan (transforms.compile.CompiledPlan.to_bytes) before starting any process.
# Unset (runtime.launcher.launch called without a plan): the chief compiles
# and publishes it under transforms.keys.PLAN_KEY, the other workers fetch it.
PLAN = "AUTOPAR_PLAN"
# A file a script run in the report role writes its compiled plan to, for
# `autopar launch` (runtime/script_plan.py).
PLAN_OUT = "AUTOPAR_PLAN_OUT"
# Set by a launcher that logged the plan report: the chief need not print it.
REPORT_PRINTED = "AUTOPAR_REPORT_PRINTED"
# "host:port,..." of the job's summation servers (cpp_ops/sum_server.cc), in
# server-index order, read by the Herring push/pull kernel at first use: the
# graph itself names no host.
SUMSERVERS = "AUTOPAR_SUMSERVERS"
# What a job joined through TF_CONFIG knows of its cluster besides TF_CONFIG
# (a spec's network.bandwidth_gbps and network.shared_cores), set by whoever
# starts its processes, the same in every one: the link speed in Gbit/s and
# the cores every process shares when the hosts are emulated on one machine.
# The planner's cost models read them (runtime.membership.cluster_topology).
LINK_GBPS = "AUTOPAR_LINK_GBPS"
SHARED_CORES = "AUTOPAR_SHARED_CORES"
# Seconds a Herring push/pull (and a summation server holding an incomplete
# shard) waits before failing (default 60; the launcher sets max(60, 2 x
# Config.peer_timeout_s) unless the environment has it).
HERRING_TIMEOUT = "AUTOPAR_HERRING_TIMEOUT_S"
# Bytes each Herring flow may have in flight (its TCP receive window and a
# worker's send buffer; cpp_ops/herring_wire.h): the launcher sets it from the
# spec's link speed (runtime/flow_windows.py) unless the
# environment has it.
HERRING_WINDOW = "AUTOPAR_HERRING_WINDOW_BYTES"
# The receive window of each TensorFlow connection between a job's processes
# (the bind shim, cpp_ops/bind_shim.c, sets it on connect() to an endpoint of
# TCP_WINDOW_PEERS): the launcher sets it from the spec's link speed
# (runtime/flow_windows.py, tcp_window_bytes) unless the
# environment has it; a spec without a link speed, a link fast enough that the
# kernel's autotuning should decide, or AUTOPAR_TCP_WINDOW_BYTES=0 sets none.
TCP_WINDOW = "AUTOPAR_TCP_WINDOW_BYTES"
TCP_WINDOW_PEERS = "AUTOPAR_TCP_WINDOW_PEERS"   # "addr/port,..." (the shim's format)
# "0,1": the GPU ids (as the process sees them) a worker owns, its replica on
# the first (runtime/gpus.py): set by the launcher beside CUDA_VISIBLE_DEVICES,
# or by whoever starts a process joining through TF_CONFIG.
GPUS = "AUTOPAR_GPUS"
# "0": the launcher starts every local process anew instead of forking it
# from the job's fork server (runtime/forkserver.py).
FORK_SERVER = "AUTOPAR_FORK_SERVER"
# Modules a job's fork server imports besides its own list (runtime/forkserver.py):
# heavy libraries the launching script had imported (comma-separated).
FORK_PRELOAD = "AUTOPAR_FORK_PRELOAD"

# JSON {Config field: value}: the fields `autopar launch --config KEY=VALUE`
# (and its --run-option, --stall-timeout...) set, applied over the Config
# every process of the job passes to get_runner (autopar/overrides.py).
CONFIG = "AUTOPAR_CONFIG"
# "1": TensorFlow's C++ and start-up lines and its deprecation warnings are
# kept (`autopar launch --verbose`; common/quiet.py).
VERBOSE = "AUTOPAR_VERBOSE"
# Set by the user or `autopar launch`: every child gets them, on other hosts too.
FORWARDED = (CONFIG, VERBOSE)

# The chief's last line after a requested stop (Ctrl-C); the launcher reports
# what follows it (where the final checkpoint is).
STOPPED_LINE = "stopped at global step "


def current_role() -> str | None:
    """The role this process was started in, or None outside a launched job."""
    return os.environ.get(ROLE) or None


def current_task_index() -> int:
    return int(os.environ.get(TASK_INDEX, "0"))


def current_cluster() -> dict[str, list[str]]:
    return json.loads(os.environ[CLUSTER])
