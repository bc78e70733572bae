"""Inside a worker process: receive the job's compiled plan, rewrite the
graph for this worker with it, start its server, open the session,
initialise/restore, broadcast the chief's state and hand back a Runner.

A worker never analyses or plans by itself when the job has one plan to
give: the launcher compiles it once (transforms/compile.py; `autopar launch`
in one run of the script, runtime/script_plan.py) and serves it from the job
coordinator. A job started by calling runtime.launcher.launch without a plan
has its chief compile and publish it, the others fetch. Only a process with no
coordinator to ask (joined through TF_CONFIG, srun or mpirun) compiles for
itself, by the same deterministic function. Where this process stands and
where its plan comes from is its Membership (runtime/membership.py)."""
from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import tensorflow as tf

from autopar.common.errors import (AutoparError, LaunchError, SpecError, UnsupportedGraphError,
                                   shown)
from autopar.common import env
from autopar.common.roles import SERVER_JOB, WORKER_JOB, WORKER_ROLE, process_name
from autopar.runtime.membership import Membership, PlanSource
from autopar.common.text import plural
from autopar.common.timeouts import NO_TIMEOUT_S
from autopar.runtime.checkpoint import Checkpointer
from autopar.runtime.coordinator_client import CoordinatorClient, ProgressHook
from autopar.runtime.dropcompute.agreement import Agreement, CollectiveAgreement
from autopar.runtime.dropcompute.worker_state import DropCompute
from autopar.runtime.measured import Meter
from autopar.runtime.progress import Progress
from autopar.runtime.rpc import grpc
from autopar.runtime.tensorboard import ChiefBoard
from autopar.runtime.runner import Runner
from autopar.runtime.step.graph_queries import iterator_read_by
from autopar.runtime.step.hooks import step_hooks
from autopar.runtime.step.training_step import StepFetches
from autopar.runtime.session import session_config, start_worker_server, wait_for_peers
from autopar.runtime.timeline import Recorder, options_from_env as timeline_options, write_part
from autopar.transforms.analysis import Analysis, analyze_graph
from autopar.transforms.methods.registry import processes
from autopar.transforms.batch_mixing import mixing_note
from autopar.transforms.compile import CompiledPlan, compile_for_config
from autopar.transforms.graph_utils import (function_calls, import_meta_graph, op_name_of,
                                            staged_initializers)
from autopar.transforms.evaluate import totals_allreduce
from autopar.transforms.keys import JOB_GROUP_STRIDE, PLAN_KEY, TIMELINE_KEY_PREFIX
from autopar.transforms.accelerator import Accelerator
from autopar.transforms.rewrite import rewrite_for_worker, worker_device

tf1 = tf.compat.v1
log = logging.getLogger("autopar.worker")


@dataclass
class _ThisProcess:
    """What a worker process keeps from one job of its script to the next:
    a script may hold several in sequence (autopar.fit called for each of
    its models, get_runner called again). The process's TensorFlow server
    (one, on the port its cluster gives it), its coordinator client and
    progress hook (the launcher's view of it goes on), and how many jobs it
    began."""
    jobs: int = 0
    server: tf.distribute.Server | None = None
    all_workers: bool = False   # the server's session config (weight-update sharding)
    client: CoordinatorClient | None = None
    hook: ProgressHook | None = None


_PROCESS = _ThisProcess()


def distributed_runner(step, member: Membership, config) -> Runner:
    """This process's Runner in the job `member` places it in
    (runtime/membership.py) for `step` (runtime/step_graph.StepGraph): the
    plan comes from where the membership says (module docstring), made for
    its topology, and may carry the step's graph; the chief logs the Report
    when no launcher printed it."""
    cluster, worker_index = member.cluster, member.index
    num_workers = member.num_workers
    accelerator, visible = _accelerator(worker_index, member.gpus)
    _PROCESS.jobs += 1
    job = _PROCESS.jobs
    if job == 1:
        _PROCESS.client = CoordinatorClient.from_env(WORKER_ROLE, worker_index)
        _PROCESS.hook = _register(_PROCESS.client, cluster, worker_index)
    else:
        _refuse_in_later_job(config, job, worker_index)
        if _PROCESS.hook is not None:
            _PROCESS.hook.began_job()
    client, hook = _PROCESS.client, _PROCESS.hook
    compiled = _receive_plan(step, member, config, client, job)
    graph, lifted = step.made_from(compiled, f"worker {worker_index}")
    _check_same_config(compiled, config, worker_index)
    _check_fits(compiled.plan, member)
    compiled.check_graph(graph)
    if member.print_report or (job > 1 and worker_index == 0):   # (no launcher printed a later one)
        log.info("\n%s", compiled.report().table())
    analysis, plan = compiled.analysis, compiled.plan
    if analysis.batch_mixing and worker_index == 0 and num_workers > 1:
        log.warning("%s", mixing_note(analysis.batch_mixing, num_workers))
    rewritten = rewrite_for_worker(graph, analysis, plan, worker_index, moves=compiled.moves,
                                   micro_batches=config.micro_batches, accelerator=accelerator)
    if job > 1:
        # The processes' resources and collective groups outlive a session:
        # an earlier job's variables of the same names (a metric's total)
        # would be this job's, its collectives' shapes this job's
        in_container(rewritten.meta_graph.graph_def, f"autopar-job{job}")
        offset = (job - 1) * JOB_GROUP_STRIDE
        in_groups_above(rewritten.meta_graph.graph_def, offset)
        plan = replace(plan, group_key=plan.group_key + offset)   # (collectives built later)
    is_chief = worker_index == 0

    worker_graph = tf.Graph()
    with worker_graph.as_default(), tf.device(worker_device(worker_index)):
        import_meta_graph(rewritten.meta_graph)   # devices as the rewrite set them
        # Server variables exist once: only the chief initialises them; the
        # broadcast below is the barrier the others pass only after that.
        mine = [v for v in tf1.global_variables()
                if is_chief or v.op.name not in rewritten.server_variables]
        extra = [tf1.local_variables_initializer(), tf1.tables_initializer()]
        if is_chief:   # what the methods' rewrites initialise once (Edits.chief_init)
            extra += [worker_graph.get_operation_by_name(op) for op in rewritten.chief_init]
        init = staged_initializers(mine, extra)
        batch_size = _batch_size_tensor(worker_graph, analysis)
        checkpointer = (Checkpointer(worker_graph, config.checkpoint_dir, config.save_every_steps,
                                     rewritten.partitions, keep=config.keep_checkpoints)
                        if is_chief and config.checkpoint_dir else None)
    server = _server(cluster, worker_index, plan.shard_weight_update, visible, job)
    log.info("worker %d/%d serving on %s; %d variables (%s), %d on servers (%s)%s",
             worker_index, num_workers, cluster[WORKER_JOB][worker_index],
             len(analysis.variables), plan.method_counts(), len(plan.server_variables),
             plan.run_option, f"; replica on GPU {visible[0]} of {','.join(map(str, visible))}"
             if visible else "")
    wait_for_peers(cluster[WORKER_JOB] + cluster.get(SERVER_JOB, []), config.startup_timeout_s)
    session = tf1.Session(server.target, graph=worker_graph,
                          config=session_config(cluster, worker_index, plan.shard_weight_update,
                                                visible))
    micro_batching, agreement = _micro_batching(worker_graph, rewritten, config, worker_index,
                                                num_workers, client)
    dc = micro_batching.get("dropcompute")
    progress = meter = None
    if is_chief:
        board = _board(compiled, config)
        progress = Progress(config.log_every_steps, num_workers, config.total_steps, member.tty,
                            board=board, drops=dc.totals if dc else None,
                            stall_warnings=(lambda: client.stall_warnings) if client else None)
        if config.measure_steps:
            meter = Meter(worker_graph, analysis, plan, num_workers, config.measure_steps,
                          board=board)
    recorder, hand_in = _timeline(client, worker_index, config) if job == 1 else (None, None)
    hooks = step_hooks(worker_index, reports=hook, checkpointer=checkpointer, progress=progress,
                       timeline=recorder, hand_in=hand_in, meter=meter, dropcompute=dc)
    training = StepFetches(
        worker_graph, analysis, num_workers=num_workers, batch_size=batch_size,
        with_step=[(groups, worker_graph.get_operation_by_name(op))
                   for groups, op in rewritten.step_barriers + rewritten.step_targets],
        after_step=(worker_graph.get_operation_by_name(rewritten.after_step)
                    if rewritten.after_step else None),
        step_feeds=({worker_graph.get_tensor_by_name(rewritten.in_step): True}
                    if rewritten.in_step else None),
        lookup_barriers=rewritten.lookup_barriers)
    runner = Runner(session, worker_graph, analysis, worker_index=worker_index,
                    num_workers=num_workers, hooks=hooks, training=training, **micro_batching,
                    totals_allreduce=_totals_allreduce(worker_graph, plan, worker_index),
                    lockstep_lookups=plan.grouped_lookups(), lifted=lifted,
                    loss_reduction=plan.loss_reduction, constant_copies=rewritten.constant_copies)
    if isinstance(agreement, CollectiveAgreement):
        agreement.sum_over_workers = runner.sum_over_workers
    # The Python variables' values (a traced function's) are the chief's to
    # give: server variables are its own, the broadcast gives the rest.
    runner.start(init, worker_graph.get_operation_by_name(rewritten.broadcast_op),
                 init_feed=lifted.initial_feed() if lifted is not None and is_chief else None)
    log.info("worker %d: initial state received from the chief", worker_index)
    if is_chief and os.environ.get(env.RESTART):
        restart, limit, reached = os.environ[env.RESTART].split("/")
        recomputed = (f", recomputing {int(reached) - runner.resumed_step} steps"
                      if int(reached) >= runner.resumed_step else "")
        log.info("restart %s of %s: resumed at global step %d%s", restart, limit,
                 runner.resumed_step, recomputed)
    return runner


def _server(cluster: dict[str, list[str]], worker_index: int, all_workers: bool,
            visible, job: int) -> tf.distribute.Server:
    """This process's TensorFlow server: started by its first job, the
    same for the later ones (its port is the process's)."""
    if _PROCESS.server is None:
        _PROCESS.server = start_worker_server(cluster, worker_index, all_workers, visible)
        _PROCESS.all_workers = all_workers
    elif all_workers != _PROCESS.all_workers:
        raise UnsupportedGraphError(
            f"job {job} of this script {'shards' if all_workers else 'does not shard'} the "
            f"weight update (Config(shard_weight_update)) and an earlier one "
            f"{'did not' if all_workers else 'did'}: a process's server serves every job of "
            "its script one way; give every job of the script the same shard_weight_update")
    return _PROCESS.server


def _refuse_in_later_job(config, job: int, worker_index: int) -> None:
    """What a later job of a script cannot do, by name: DropCompute's
    agreement (micro-batches) and the timeline are keyed per process by the
    coordinator, taken by the first job."""
    if config.micro_batches > 1:
        raise AutoparError(
            f"worker {worker_index}: job {job} of this script (its get_runner or autopar.fit "
            f"number {job}) uses Config(micro_batches={config.micro_batches}), whose workers "
            "agree on DropCompute's threshold through the job coordinator once per process: "
            "only a script's first job may use micro-batches")
    if worker_index == 0 and config.timeline:
        log.warning("worker 0: job %d of this script is not traced (Config.timeline): the "
                    "timeline is the script's first job's", job)


def in_container(graph_def, container: str) -> None:
    """Put every resource the graph's ops make on a device (variables,
    accumulators, queues, tables) in `container`, unless the op names one."""
    from tensorflow.python.framework import op_def_registry   # no public OpDef lookup
    has_container: dict[str, bool] = {}
    for node in graph_def.node:
        if node.op not in has_container:
            op_def = op_def_registry.get(node.op)
            has_container[node.op] = op_def is not None and any(
                a.name == "container" for a in op_def.attr)
        if has_container[node.op] and not node.attr["container"].s:
            node.attr["container"].s = container.encode()


def in_groups_above(graph_def, offset: int) -> None:
    """Give every collective of the graph a group key `offset` higher: a
    new constant for each key (the graph shares one constant per value
    among sizes, keys and instance keys). So too in the graph's functions
    (a feature's collectives run in training steps alone: the calls of a
    cond's branch), each of which changes its name with its body, so that
    one name never means two bodies in the process
    (rewrite._stable_function_names)."""
    _moved_groups(graph_def.node, graph_def.node.add, offset, in_function=False)
    renamed = {}
    for f in graph_def.library.function:
        if _moved_groups(f.node_def, f.node_def.add, offset, in_function=True):
            renamed[f.signature.name] = f"{f.signature.name}_groups{offset}"
            f.signature.name = renamed[f.signature.name]
    if renamed:
        for nodes in [graph_def.node, *(f.node_def for f in graph_def.library.function)]:
            for func in function_calls(nodes):
                func.name = renamed.get(func.name, func.name)


def _moved_groups(nodes, add, offset: int, in_function: bool) -> bool:
    """in_groups_above on `nodes` (a GraphDef's, or a function's, whose
    nodes name a node's output "name:output:0"; `add` makes a node there);
    whether any collective was moved."""
    from tensorflow.python.framework import op_def_registry   # no public OpDef lookup
    by_name = {node.name: node for node in nodes}
    made: dict[tuple[int, str], str] = {}
    moved = False
    for node in list(nodes):
        if not node.op.startswith("Collective"):
            continue
        if "group_key" in node.attr:   # (the first collective ops: attributes)
            node.attr["group_key"].i += offset
            moved = True
            continue
        names = [a.name for a in op_def_registry.get(node.op).input_arg]
        if "group_key" not in names:
            continue
        index = names.index("group_key")
        source = by_name.get(op_name_of(node.input[index]))
        if source is None or source.op != "Const":
            raise UnsupportedGraphError(f"collective '{node.name}' takes its group key from "
                                        f"'{node.input[index]}', no constant: a later job of the "
                                        "script cannot move it to groups of its own")
        key = int(tf.make_ndarray(source.attr["value"].tensor))
        if (key, source.device) not in made:
            name = ("autopar_later_job_" if in_function else "autopar/later_job/") \
                + f"group_key_{key}_{len(made)}"
            const = add()
            const.CopyFrom(source)
            const.name = name
            const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(key + offset, tf.int32))
            made[(key, source.device)] = name
        node.input[index] = made[(key, source.device)] + (":output:0" if in_function else "")
        moved = True
    return moved


def _accelerator(worker_index: int, gpus: tuple[int, ...]
                 ) -> tuple[Accelerator | None, tuple[int, ...] | None]:
    """(how the rewrite places the replica, the ids the session makes
    devices) for a worker owning GPU ids `gpus` (as this process sees them):
    (None, None) for none, today's CPU placement. Where the process sees
    no GPU, the GPU placement runs on the CPU by soft placement, with the
    ring for its collectives (docs/gpus.md)."""
    if not gpus:
        return None, None
    seen = len(tf.config.list_physical_devices("GPU"))
    if not seen:
        log.warning("worker %d was given GPU %s, but TensorFlow sees no GPU in this process "
                    "(CUDA_VISIBLE_DEVICES=%s; a CPU-only TensorFlow, or no driver): it trains on "
                    "its CPU", worker_index, ",".join(map(str, gpus)),
                    os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
        return Accelerator(hint="ring"), ()
    if max(gpus) >= seen:
        raise LaunchError(f"worker {worker_index} was given GPU {','.join(map(str, gpus))}, but "
                          f"this process sees {seen} GPU(s) (ids from 0, after "
                          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
                          ": give ids of its host's GPUs in the spec")
    return Accelerator(hint="nccl"), gpus


def _board(compiled: CompiledPlan, config) -> ChiefBoard | None:
    """The chief's TensorBoard writer (Config.tensorboard_dir), or None."""
    if not config.tensorboard_dir:
        return None
    report = compiled.report()
    return ChiefBoard(config.tensorboard_dir, report.table(), report.bytes_per_method())


def _micro_batching(graph, rewritten, config, worker_index: int, num_workers: int,
                    client: CoordinatorClient | None) -> tuple[dict, object]:
    """(the Runner's accumulate ops and DropCompute state, how the workers
    agree on tau) with micro_batches > 1: through the job coordinator, or,
    for a process that joined through TF_CONFIG, through collectives."""
    if rewritten.accumulate is None:
        return {}, None
    agreement = (Agreement(client, worker_index, num_workers, config.startup_timeout_s
                           + (config.peer_timeout_s or NO_TIMEOUT_S)) if client is not None
                 else CollectiveAgreement(worker_index, num_workers))
    return ({"accumulate": (graph.get_operation_by_name(rewritten.accumulate_first),
                            graph.get_operation_by_name(rewritten.accumulate)),
             "dropcompute": DropCompute(config, worker_index, num_workers, agreement)}, agreement)


def _totals_allreduce(worker_graph: tf.Graph, plan, worker_index: int):
    """Builds, in this worker's graph, the all-reduce Runner.evaluate sums
    its totals with (one per vector length, on first use)."""
    def build(length: int):
        with worker_graph.as_default():
            return totals_allreduce(plan, worker_device(worker_index), length)
    return build


def _timeline(client: CoordinatorClient | None, worker_index: int,
              config) -> tuple[Recorder | None, Callable[[], None] | None]:
    """This worker's timeline recorder (runtime/timeline.py) and how it hands
    its events in when the worker closes, or (None, None): in a job the
    launcher traces, published to the coordinator (the launcher merges the
    parts once the workers are done); in one with Config.timeline that no
    launcher started (TF_CONFIG, mpirun, srun), written beside that path."""
    lane = process_name(WORKER_ROLE, worker_index)
    if client is not None:
        options = timeline_options()
        if options is None:
            return None, None
        recorder = Recorder(lane, *options)
        return recorder, lambda: client.publish(
            TIMELINE_KEY_PREFIX + lane, recorder.payload(client.clock_offset_s, client.clock_rtt_s))
    if not config.timeline:
        return None, None
    recorder = Recorder(lane, config.timeline_steps, config.timeline_every)
    return recorder, lambda: write_part(config.timeline, recorder)


def _receive_plan(step, member: Membership, config, client: CoordinatorClient | None,
                  job: int = 1) -> CompiledPlan:
    """The job's one compiled plan, from where `member` says (module
    docstring). The launcher compiled a script's first job only (it runs the
    script up to it): the chief compiles each later job's and publishes it
    under a key of its own, with the step's graph for the others to take
    (runtime/step_graph.py)."""
    worker_index = member.index
    if client is None or member.plan_source is PlanSource.OWN:
        # No launcher compiled for everyone, so each process compiles the same
        # plan by the same deterministic function.
        log.info("worker %d: no job coordinator to receive the plan from; compiling it here",
                 worker_index)
        return compile_for_config(step.graph(), member.topology, config)
    source = member.plan_source if job == 1 else PlanSource.CHIEF
    published = PLAN_KEY if job == 1 else f"{PLAN_KEY}/job{job}"
    if source is PlanSource.CHIEF and worker_index == 0:
        compiled = step.packed_into(compile_for_config(step.graph(), member.topology, config))
        _rpc(lambda: client.publish(published, compiled.to_bytes()), worker_index,
             "publish the plan to the job coordinator")
        log.debug("worker 0: compiled and published the plan of job %d", job)
        return compiled
    key = member.plan_key if source is PlanSource.LAUNCHER else published
    data = _rpc(lambda: client.fetch(key, config.startup_timeout_s),
                worker_index, f"receive the plan from {source.value}")
    log.info("worker %d: plan received from %s (%d bytes)", worker_index, source.value, len(data))
    return CompiledPlan.from_bytes(data)


def _rpc(call, worker_index: int, what: str):
    try:
        return call()
    except grpc.RpcError as exc:
        raise LaunchError(f"worker {worker_index} could not {what}: "
                          f"{exc.code().name} {exc.details()}") from exc


def _check_same_config(compiled: CompiledPlan, config, worker_index: int) -> None:
    """Every process of a job runs by the plan's Config: options that differ
    between processes would make their graphs or protocols disagree (a hang,
    or silently different training), so one whose own differs is refused."""
    difference = compiled.config_difference(config)
    if difference is not None:
        option, mine, theirs = difference
        raise AutoparError(
            f"worker {worker_index}'s Config has {option}={shown(mine)}, but the job's plan was "
            f"compiled with {option}={shown(theirs)}: every process of a job must use the same "
            "Config (nothing in it may depend on the process's role or index)")


def _check_fits(plan, member: Membership) -> None:
    """A plan made for another cluster shape would hang in its collectives. A
    plan that puts nothing on servers runs without the spec's (the launcher
    does not start them)."""
    cluster = member.cluster
    workers, servers = member.num_workers, member.topology.num_servers
    unused = servers == 0 and not processes(plan)
    if plan.num_workers != workers or (plan.num_servers != servers and not unused):
        raise LaunchError(f"the job's plan is for {plural(plan.num_workers, 'worker')} and "
                          f"{plural(plan.num_servers, 'server')}, but the cluster has {workers} "
                          f"and {servers}: every process of a job must be started from one spec")
    if plan.server_variables and SERVER_JOB not in cluster:
        names = ", ".join(v.name for v in plan.server_variables[:3])
        raise SpecError(f"the plan places {len(plan.server_variables)} variable(s) ({names}) on parameter "
                        f"servers, but the cluster has only summation servers ({env.SUMSERVERS}) and "
                        f"no server tasks: add one 'ps' task per summation server to TF_CONFIG")


def _register(client: CoordinatorClient | None, cluster: dict[str, list[str]],
              worker_index: int) -> ProgressHook | None:
    """Register with the launcher's job coordinator (none outside a launched
    job) and return the hook that reports this worker's progress to it."""
    if client is None:
        return None
    _rpc(lambda: client.register(cluster[WORKER_JOB][worker_index]), worker_index,
         "register with the job coordinator")
    # A script that ends without closing its Runner still reports its last state.
    atexit.register(client.flush)
    return ProgressHook(client)


def single_device_runner(graph: tf.Graph, config, analysis: Analysis | None = None,
                         lifted=None) -> Runner:
    """The same Runner over a plain session on the unmodified graph: the script
    behaves as before autopar when no cluster is asked for. Any graph a plain
    Session runs is accepted: nothing is distributed, so a graph the analysis
    rejects (hand-written updates, gradient accumulation, no optimizer) runs
    as is, and the Runner counts steps without an Analysis."""
    if config.micro_batches > 1:
        log.info("micro_batches=%d applies to distributed jobs; one device runs the graph "
                 "unchanged", config.micro_batches)
    if analysis is None:
        try:
            analysis = analyze_graph(graph)
        except UnsupportedGraphError as e:
            log.debug("single device, graph not analysed (%s); running it unchanged", e)
    with graph.as_default():
        init = staged_initializers(tf1.global_variables(),
                             [tf1.local_variables_initializer(), tf1.tables_initializer()])
        batch_size = _batch_size_tensor(graph, analysis)
        checkpointer = (Checkpointer(graph, config.checkpoint_dir, config.save_every_steps,
                                     keep=config.keep_checkpoints)
                        if config.checkpoint_dir else None)
    session = tf1.Session(graph=graph)
    hooks = step_hooks(0, checkpointer=checkpointer,
                       progress=Progress(config.log_every_steps, 1, config.total_steps))
    runner = Runner(session, graph, analysis, hooks=hooks, lifted=lifted,
                    training=StepFetches(graph, analysis, batch_size=batch_size))
    runner.start(init, init_feed=lifted.initial_feed() if lifted is not None else None)
    return runner


def _batch_size_tensor(graph: tf.Graph, analysis: Analysis | None) -> tf.Tensor | None:
    """Leading dimension of the training batch, for examples/s: of the
    iterator the loss reads when the analysis found one, else of the first
    iterator. Never another one: fetched with every step, it would draw a
    batch from it (an eval set's iterator, Runner.evaluate)."""
    ops = [op for op in graph.get_operations() if op.type == "IteratorGetNext"]
    if analysis is not None and analysis.loss:
        read = iterator_read_by([graph.get_tensor_by_name(analysis.loss)])
        ops = [read] if read is not None else []
    for op in ops[:1]:
        for t in op.outputs:
            if t.shape.rank:
                return tf.shape(t)[0]
    return None
