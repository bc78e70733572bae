"""get_runner, shard and analyze: the public entry points. They only decide
which role this process plays and wire the layers below."""
from __future__ import annotations

import json
import logging
import os
import sys

import tensorflow as tf

from autopar.config import Config
from autopar.console import debug_errors, report_error, setup_logging
from autopar.common.errors import AutoparError
from autopar.common import env
from autopar.common.roles import REPORT_ROLE, SERVER_ROLE, WORKER_JOB, WORKER_ROLE
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, Topology, make_plan
from autopar.transforms.graph_utils import graph_of
from autopar.transforms.placement import place_ops
from autopar.transforms.report import Report, build_report

log = logging.getLogger("autopar")

REPORT_PRINTED = "AUTOPAR_REPORT_PRINTED"   # the launcher printed it; workers need not


def get_runner(graph: tf.Graph, resource_info=None, config: Config | None = None):
    """Make `graph` train on the cluster `resource_info` describes.

    Run directly, this process is the launcher: it validates the spec, prints
    the report, starts every server and worker (re-running this script) and
    exits with the job's status; it never returns. In a worker it returns a
    Runner. With `resource_info=None` (and no launcher around) it returns a
    Runner over one plain session: the script runs single-device, whatever
    the graph (nothing needs to be distributed).

    An autopar error (bad spec, unsupported graph, launch failure) ends the
    process like `autopar launch` does: its message on stderr, no traceback,
    exit status 2 (a worker's message reaches the launcher's output). With
    AUTOPAR_DEBUG=1 in the environment it is raised instead.
    """
    setup_logging()
    try:
        return _get_runner(graph, resource_info, config or Config())
    except AutoparError as e:
        if debug_errors():
            raise
        sys.exit(report_error(e))


def _get_runner(graph: tf.Graph, resource_info, config: Config):
    from autopar.runtime import launcher, spec as specs, worker   # runtime is heavy; import on use
    role = env.current_role()
    if role == WORKER_ROLE:
        cluster = env.current_cluster()
        index = env.current_task_index()
        if index == 0 and not os.environ.get(REPORT_PRINTED):
            spec = specs.ResourceSpec.from_dict(json.loads(os.environ[env.SPEC]))
            log.info("\n%s", analyze(graph, spec, config).table())
        return worker.distributed_runner(graph, cluster, index, config,
                                         tty=os.environ.get(env.TTY) == "1")
    if role == REPORT_ROLE:
        spec = specs.ResourceSpec.from_dict(json.loads(os.environ[env.SPEC]))
        sys.stdout.write(analyze(graph, spec, config).table() + "\n")
        sys.exit(0)
    if os.environ.get("TF_CONFIG"):
        return _join_external(graph, config)
    if resource_info is None:
        return worker.single_device_runner(graph, config)
    spec = specs.load_spec(resource_info)
    log.info("\n%s", analyze(graph, spec, config).table())
    code = launcher.launch(spec, [sys.executable, *sys.argv], extra_env={REPORT_PRINTED: "1"},
                           stall_timeout_s=config.stall_timeout_s)
    sys.exit(code)


def _join_external(graph, config):
    """A process started by an external launcher (TF_CONFIG): join, spawn nothing."""
    from autopar.runtime import ports, server_main, spec as specs, worker
    spec, task_type, index = specs.spec_from_tf_config(os.environ["TF_CONFIG"])
    cluster = ports.explicit_cluster(spec)
    if task_type == SERVER_ROLE:
        server_main.serve(cluster, index)
        sys.exit(0)
    return worker.distributed_runner(graph, cluster, index, config)


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """This worker's disjoint, deterministic slice of `dataset` (element i goes
    to worker i mod N). Call it before .batch(): each worker then batches its
    own elements, and the N per-worker batches of a step together are the
    single-device batch N times as large. Outside a job: the dataset itself."""
    if env.current_role() != WORKER_ROLE:
        return dataset
    num_workers = len(env.current_cluster()[WORKER_JOB])
    return dataset.shard(num_workers, env.current_task_index())


def analyze(graph, resource_info, config: Config | None = None) -> Report:
    """The Report for training `graph` on `resource_info`, without running anything."""
    from autopar.runtime import spec as specs
    config = config or Config()
    spec = specs.load_spec(resource_info)
    analysis = analyze_graph(graph)
    topology = Topology(tuple(h.address for h in spec.worker_hosts()), spec.num_servers)
    plan = make_plan(analysis, topology, config.fusion_bytes, config.communication_hint,
                     PlanOptions.from_config(config))
    return build_report(analysis, plan, moves=place_ops(graph_of(graph), analysis, plan))
