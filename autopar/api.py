"""get_runner, fit, shard and analyze: the public entry points. They only decide
which role this process plays and wire the layers below."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys

import tensorflow as tf

from autopar import overrides
from autopar.config import Config
from autopar.runtime.console import debug_errors, report_error, setup_logging
from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.common import env, procs, script
from autopar.common.roles import REPORT_ROLE, SERVER_ROLE
from autopar.transforms.compile import CompiledPlan, compile_for_config
from autopar.transforms.methods.registry import processes
from autopar.transforms.report import Report

log = logging.getLogger("autopar")



def get_runner(graph, resource_info=None, config: Config | None = None):
    """Make `graph` train on the cluster `resource_info` describes.

    `graph`: a tf.compat.v1 training graph, or a traced TensorFlow 2 training
    step: a ConcreteFunction (`train_step.get_concrete_function(specs...)`)
    or its FuncGraph (`cf.graph`), lifted into such a graph
    (transforms.lift). Then `runner.call(*inputs)` runs one step as the
    function would, tensors of the FuncGraph may be fed and fetched, the
    Python variables (a Keras model's and optimizer's) are fetched by
    themselves, and they receive the trained values when the Runner closes
    (or on `runner.sync_python_variables()`).

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
    procs.skip_final_gc_at_exit()
    try:
        # `autopar launch --config KEY=VALUE` (autopar/overrides.py).
        return _get_runner(graph, resource_info, overrides.apply(config or Config()))
    except AutoparError as e:
        if debug_errors():
            raise
        sys.exit(report_error(e))


def _get_runner(graph, resource_info, config: Config):
    # runtime is heavy; import on use
    from autopar.runtime import (launcher, membership, outputs, script_plan, server_main,
                                 spec as specs, worker)
    from autopar.runtime.step_graph import StepGraph
    step = StepGraph(graph, check=lambda lifted: _refuse_summaries(lifted, config))
    role = env.current_role()
    if role == REPORT_ROLE:
        spec = specs.ResourceSpec.from_dict(json.loads(os.environ[env.SPEC]))
        if os.environ.get(env.PLAN_OUT):      # `autopar launch`, before it starts anything
            outputs.check_job_outputs(config, spec)
        compiled = step.packed_into(_compile(step.graph(), spec, config))
        if os.environ.get(env.PLAN_OUT):      # for `autopar launch` (runtime/script_plan.py)
            plan, roles, table = _plan_of(compiled)
            with open(os.environ[env.PLAN_OUT], "w", encoding="utf-8") as f:
                f.write(script_plan.encode(plan, roles, table, config))
        else:
            sys.stdout.write(compiled.report().table() + "\n")
        sys.exit(0)
    # A process started by autopar's launcher, TF_CONFIG, srun or mpirun joins
    # its job and spawns nothing (runtime/membership.py).
    member = membership.resolve(resource_info)
    if member is not None and member.role == SERVER_ROLE:
        server_main.serve(member.cluster, member.index)
        sys.exit(0)
    if member is not None:
        if member.how == membership.LaunchedResolver.name:   # (forked: its title is set)
            procs.set_title(procs.role_title(os.environ, sys.argv) or "worker")
        return worker.distributed_runner(step, member, config)
    if resource_info is None:
        graph, lifted = step.made()
        return worker.single_device_runner(graph, config, lifted=lifted)
    # The launcher: compile once, print the report from it, serve it to
    # every process of the job from the coordinator.
    step.made()    # (a step the launcher cannot lift is refused before the spec is read)
    spec = specs.load_spec(resource_info)
    outputs.check_job_outputs(config, spec)     # before anything starts
    # The script again as it was started, where it started (it may have
    # changed directory since, or run through runpy: common/script.py); the
    # spec was read, and the timeline's path is taken, where it is now.
    command, start_directory = script.command()
    launched = (dataclasses.replace(config, timeline=os.path.abspath(config.timeline))
                if config.timeline else config)
    os.chdir(start_directory)
    try:
        code = launcher.run_job(spec, command,
                                lambda s, _: (*_plan_of(step.packed_into(
                                    _compile(step.graph(), s, config))), launched))
    except KeyboardInterrupt:
        # Ctrl-C before the job's own handling (launcher.run_job installs it
        # before anything starts): nothing started, nothing to save.
        if debug_errors():
            raise
        sys.stderr.write("autopar: interrupted\n")
        code = 130
    # The job is over: a Ctrl-C now would only print a traceback from exiting.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def _plan_of(compiled: CompiledPlan) -> tuple[bytes, set[str], str]:
    """What the launcher needs of a compiled plan (launcher.CompilePlan): its
    bytes, the processes its methods need besides the workers, its report."""
    return compiled.to_bytes(), processes(compiled.plan), compiled.report().table()


def _refuse_summaries(lifted, config: Config) -> None:
    if lifted is not None and lifted.summaries and config.micro_batches > 1:
        raise UnsupportedGraphError(
            f"the traced step writes tf.summary records, which its runner writes after each "
            f"step from what the step computed; with Config(micro_batches="
            f"{config.micro_batches}) a step is several runs, whose values are no step's: use "
            "micro_batches=1, or write the summaries from Python with what the step returns")


def fit(model, x, y=None, resource_info=None, config: Config | None = None, **options):
    """Train a compiled Keras 3 model as ``model.fit(x, y, **options)`` trains
    it, on the cluster `resource_info` describes, with one device's result;
    returns its History (``history.history``, the same on every worker).
    ``options`` are fit()'s: epochs, batch_size (the global batch),
    validation_data, callbacks (run on the chief), shuffle, seed, verbose,
    sample_weight, class_weight, validation_split, validation_freq,
    validation_batch_size, initial_epoch, steps_per_epoch,
    validation_steps; another is refused naming it (docs/tf2-keras.md,
    runtime/keras_fit.py). Launches and joins as get_runner does.
    Batch normalisation takes one device's statistics of the global batch
    unless `config` sets batch_norm_group otherwise (its default "auto")."""
    from autopar.runtime import keras_fit
    job = keras_fit.prepare(model, x, y, **options)
    return keras_fit.train_on(job, get_runner(job.deferred_step(), resource_info, config))


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """This worker's disjoint, deterministic slice of `dataset` (element i goes
    to worker i mod N). Call it before .batch(): each worker then batches its
    own elements, and the N per-worker batches of a step together are the
    single-device batch N times as large. A worker started by autopar's
    launcher, through TF_CONFIG, by an MPI launcher or by srun knows its
    place before get_runner is called. Outside a job (the launcher, one
    device): every element, as `dataset.shard(1, 0)`, so the launcher's
    graph shows the pipeline sharded (a step reading a dataset with no shard
    on its way is refused, transforms/input_shards.py)."""
    from autopar.runtime import membership
    num_workers, index = membership.worker_position() or (1, 0)
    return dataset.shard(num_workers, index)


def num_workers() -> int:
    """The number of workers of the job this process is a worker of (1
    outside a job), known before get_runner: a script scales its learning
    rate by it when a job may go on with fewer workers (Config.min_workers)."""
    from autopar.runtime import membership
    position = membership.worker_position()
    return 1 if position is None else position[0]


def analyze(graph, resource_info, config: Config | None = None) -> Report:
    """The Report for training `graph` on `resource_info`, without running anything."""
    from autopar.runtime import spec as specs
    from autopar.runtime.step_graph import StepGraph
    step = StepGraph(graph)
    return _compile(step.graph(), specs.load_spec(resource_info),
                    config or Config()).report()


def _compile(graph, spec, config: Config) -> CompiledPlan:
    from autopar.runtime.membership import spec_topology
    return compile_for_config(graph, spec_topology(spec), config)
