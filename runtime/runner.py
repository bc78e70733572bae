"""The session-like object a training script drives (Parallax's runner).

`run()` takes the user's *original* tensors, ops, variables or names and runs
their counterparts in this worker's rewritten graph. It accepts every fetch and
feed a plain `tf.compat.v1.Session.run` accepts: tensors, ops, variables and
names; SparseTensor and IndexedSlices fetches and feed keys (fed a
SparseTensorValue / IndexedSlicesValue or a plain tuple); nested fetches
(lists, tuples, namedtuples, dicts); nested feed keys (a tuple of tensors fed a
tuple of values). A fetch that reaches a variable update counts as one
training step: the chief then logs progress and saves checkpoints.

With Config(micro_batches=M) (transforms.accumulate, runtime.dropcompute) a
training-step run is M accumulate runs, one per micro-batch, then one run of
the step's fetches (the update). Micro-batches come from the input as the
script wrote it: a graph reading a tf.data iterator pulls one element per
micro-batch; a feed_dict is split along axis 0 into `micro_batches` equal
parts (scalar feeds go to every run unchanged). Other fetches of that run
(the loss, metrics) are evaluated on every computed micro-batch and returned
as their mean when they are floating-point arrays of one shape, else the
last micro-batch's value. Under a compute threshold a worker stops taking
micro-batches once its compute time in the step reaches tau.

A stop request (SIGINT to the chief: Ctrl-C on a single-device run, or the
launcher passing on its own SIGINT/SIGTERM; or SIGTERM, as a cluster sends
it to every process of a job) is acted on at the next step boundary: the
chief saves a final checkpoint (when checkpointing is on) and leaves by
raising TrainingStopped, a SystemExit, so the script's ``with`` and
``finally`` blocks run and no traceback is printed. A second SIGINT raises
KeyboardInterrupt at once; a second SIGTERM ends the process at once. Other
workers train on after a SIGTERM, until the job stops (runtime/stopping.py).
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator

import networkx as nx
import numpy as np
import tensorflow as tf

from autopar.common.env import STOPPED_LINE
from autopar.common.errors import AutoparError
from autopar.common.roles import SERVER_JOB
from autopar.runtime import stopping
from autopar.runtime.dropcompute.records import StepRecord
from autopar.transforms.analysis import Analysis
from autopar.transforms.batch_weights import weighs_batches
from autopar.transforms.features.registry import feature_fetches
from autopar.transforms.graph_utils import (is_restore_assignment, op_digraph,
                                            staged_initializers)
from autopar.transforms.lift import CALL_OP

tf1 = tf.compat.v1
log = logging.getLogger("autopar.runner")


class TrainingStopped(SystemExit):
    """Raised by Runner.run once a requested stop has been carried out; exits
    the script with status 128 + the signal that asked (130 for Ctrl-C, 143
    for SIGTERM), as the shell reports them."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(128 + signum)


class Runner:
    def __init__(self, session, graph: tf.Graph, analysis: Analysis | None, *, worker_index: int = 0,
                 num_workers: int = 1, progress=None, checkpointer=None,
                 batch_size_tensor: tf.Tensor | None = None, step_fetches=(), on_close=(),
                 after_step=None, monitor=None, accumulate=None, dropcompute=None,
                 totals_allreduce=None, lifted=None, timeline=None, meter=None,
                 lockstep_lookups=(), lookup_barriers=None, loss_reduction: str = "mean",
                 step_feeds=None, constant_copies=None):
        self.session = session
        self.graph = graph
        self.analysis = analysis
        self.worker_index = worker_index
        self.num_workers = num_workers
        # How workers' gradients combine (Plan.loss_reduction): "sum" when the
        # loss is a sum over the batch, so one device's loss is the sum of
        # the workers' (autopar.fit logs it so).
        self.loss_reduction = loss_reduction
        self._progress = progress
        self._checkpointer = checkpointer
        self._batch_size = batch_size_tensor
        # [(train groups, op)]: a step updating some train groups fetches the
        # ops of those groups with it, its end-of-step barriers and the server
        # ops it runs without waiting for them (transforms.methods.ps.rewrite).
        self._step_fetches = list(step_fetches)
        self._after_step_op = after_step   # e.g. averaging batch-local state
        # fed in every training step's run (WorkerGraph.in_step)
        self._step_feeds = dict(step_feeds or {})
        # a worker constant's name -> its servers' copies (WorkerGraph.constant_copies)
        self._constant_copies = dict(constant_copies or {})
        self._on_close = list(on_close)
        # length -> (placeholder, sum over workers) for evaluate(); built on
        # first use by `totals_allreduce(length)`. None: one worker, no combining.
        self._totals_allreduce = totals_allreduce
        self._totals_ops: dict[int, tuple] = {}
        # Variables whose lookups are collectives of a group of workers
        # (Config.aggregation_group): evaluate() cannot run them apart.
        self._lockstep_lookups = list(lockstep_lookups)
        # ... each such lookup (an op of `graph`) -> the barrier a run that is
        # not a training step fetches with it (transforms.rewrite.WorkerGraph)
        self._lookup_barriers = {name: graph.get_operation_by_name(barrier)
                                 for name, barrier in (lookup_barriers or {}).items()}
        self._barriers_of: dict[tuple[str, ...], list[tf.Operation]] = {}
        # Told before and after every run (runtime.coordinator_client.ProgressHook).
        self._monitor = monitor
        # (first micro-batch op, later micro-batches op) with micro_batches > 1.
        self._accumulate = accumulate
        self.dropcompute = dropcompute   # runtime.dropcompute.worker_state.DropCompute
        self._timeline = timeline        # runtime.timeline.Recorder, or None
        self._meter = meter              # runtime.measured.Meter (the chief), or None
        if dropcompute is not None:
            self._on_close.insert(0, dropcompute.close)
        self._variables = {v.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                           + graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)}
        # A traced function's (transforms.lift): its Python variables by id,
        # -> the lifted variable's op name.
        self._lifted = lifted
        self._python = ({id(v): name for name, v in lifted.python_variables.items()}
                        if lifted is not None else {})
        self._broadcast_op = None   # start()'s: every replica made equal to the chief's
        self._reload_ops = None     # load_python_variables(), built on first use
        # A traced function's scalar settings (a learning rate) a program
        # may assign from Python between steps, as a custom loop decays it:
        # name -> the value last seen in Python (_carry_python_writes).
        self._watched = self._python_settings()
        # The traced function's state the step writes besides the
        # optimizer's (the Keras metrics a step updates: a Mean of the
        # loss, an accuracy): their Python variables get this worker's
        # values after every call, as a program reads them
        # (`train_loss.result()`), and a reset from Python
        # (`reset_state()`) reaches the graph's copies.
        self._local_python = self._local_state(analysis)
        # Cleared by a caller that reads that state itself when it needs it
        # (autopar.fit: at each epoch's end, its compiled metrics in Python)
        self.sync_state_each_call = True
        self._watched.update({name: self._lifted.python_variables[name].numpy()
                              for name in self._local_python})
        # Lifted name -> (this worker's value, the view), of the Python
        # variables that hold a view of Python's own rather than this
        # worker's values (combine_metrics: the state summed over workers):
        # neither a write for the graph nor overwritten by a read of it
        # (close(), sync_python_variables) until a step changes the graph's
        # copy, whose values are this worker's again, or Python writes
        # another value (_view).
        self._views: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._assign_ops: dict[str, tuple] = {}
        self._input_free: list[tf.Operation] | None = None   # run_input_free_writes'
        self._init_ops = _initializer_ops(graph)
        # The loss of each train group, fetched with the steps that update it.
        self._losses = ([graph.get_tensor_by_name(g.loss) if g.loss else None
                         for g in analysis.train_groups] if analysis is not None else [])
        # The losses' counts of the batch's values (transforms.loss_counts),
        # this worker's, fetched with every step: last_loss_counts.
        self._loss_counts = [graph.get_tensor_by_name(c)
                             for c in feature_fetches(analysis).get("loss_counts", [])]
        self.last_loss_counts: list[float] = []
        # Without an Analysis (single device, a graph autopar cannot
        # distribute) a step is any run that writes a trainable variable: a
        # hand-written update is one step, a gradient-accumulation run that only
        # adds into non-trainable accumulators is not, the run applying them is.
        self._step_ops = (analysis.step_ops if analysis is not None
                          else _trainable_writer_step_ops(graph, self._init_ops))
        self._global_step = tf1.train.get_global_step(graph)
        self._first_step = 0
        self._steps = 0
        # The examples of this worker's first training step, and whether a
        # step of another size was warned about (_note_batch_size).
        self._first_batch: int | None = None
        self._batch_warned = False
        # Set by a caller that splits every step's batch into equal shares
        # itself (autopar.fit): steps of other sizes are then nothing to warn of.
        self.equal_shares = False
        self._closed = False
        self._warned_init = False
        self._stop_requested = False
        self._stop_signal = signal.SIGINT    # the signal that asked for the stop
        self._previous_sigint = self._install_stop_handler() if self.is_chief else None
        self._sigterm = self._watch_sigterm()

    def start(self, init_ops, broadcast_op=None, init_feed=None) -> None:
        """Initialise (`init_ops`: an op, or ops run one after the other, fed
        `init_feed`), restore the latest checkpoint (chief), make every
        replica equal to the chief's, and note the global step training
        resumes from."""
        self._broadcast_op = broadcast_op
        for op in init_ops if isinstance(init_ops, (list, tuple)) else [init_ops]:
            self.session.run(op, init_feed or None)
        if self._checkpointer is not None:
            self._checkpointer.restore(self.session)
        if broadcast_op is not None:
            self.session.run(broadcast_op)
        # Steps are counted from here: reading the global step in the same run
        # as the update could see either value.
        if self._global_step is not None:
            self._first_step = int(self.session.run(self._global_step))
            if self._monitor is not None:
                # Known from here on: a restarted job's stall messages name
                # global steps (runtime/health.py).
                self._monitor.global_step = self._first_step

    @property
    def resumed_step(self) -> int:
        """The global step training (re)started from."""
        return self._first_step

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    @property
    def micro_batches(self) -> int:
        """Micro-batches a training step computes at most (a fed batch is
        split into this many parts; drop_compensation="batch" raises it once
        the threshold is chosen)."""
        return self.dropcompute.micro_batches if self.dropcompute is not None else 1

    @property
    def stop_requested(self) -> bool:
        """True once a stop was requested: the next training step will not run."""
        return self._stop_requested

    def _install_stop_handler(self):
        # Only where Python lets us (main thread) and the script has not set
        # its own SIGINT handling.
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return None
        return signal.signal(signal.SIGINT, self._on_sigint)

    def _watch_sigterm(self) -> stopping.SigtermWatch:
        """SIGTERM: the chief's stop request, another worker's cue to train
        on until the job stops (runtime/stopping.py)."""
        if self.is_chief:
            watch = stopping.SigtermWatch(
                "the chief", lambda: self._request_stop(signal.SIGTERM), stopping.CHIEF_STOP_S)
        else:
            watch = stopping.SigtermWatch(
                f"worker {self.worker_index}", lambda: log.warning(
                    "worker %d: SIGTERM: training on while the chief finishes its step and "
                    "saves; exiting when the job stops, at the latest %.0f s from now",
                    self.worker_index, stopping.PEER_STOP_S), stopping.PEER_STOP_S)
        watch.install()
        return watch

    def _on_sigint(self, signum, frame) -> None:
        if self._stop_requested and self._stop_signal == signal.SIGINT:
            raise KeyboardInterrupt
        # The launcher passes a SIGTERM it got on as SIGINT: after this
        # process's own SIGTERM, the same request.
        self._request_stop(signal.SIGINT)

    def _request_stop(self, signum: int) -> None:
        """The first stop request, by SIGINT or SIGTERM: the chief stops
        after its current training step (called from a signal handler or
        the SIGTERM watch's thread)."""
        if self._stop_requested:
            return
        self._stop_signal = signum
        self._stop_requested = True
        again = "interrupt again" if signum == signal.SIGINT else "SIGTERM again"
        log.warning("stop requested (%s): stopping after the current training step%s "
                    "(%s to stop at once)", signal.Signals(signum).name,
                    " with a final checkpoint" if self._checkpointer is not None else "", again)

    def _stop(self) -> None:
        step = self._first_step + self._steps
        if self._checkpointer is None:
            where = "no checkpoint_dir is set, nothing was saved"
        else:
            if step != self._checkpointer.last_saved:
                self._checkpointer.save(self.session, step)
            where = f"checkpoint {self._checkpointer.prefix}-{step}"
        log.warning("%s%d; %s", STOPPED_LINE, step, where)
        raise TrainingStopped(self._stop_signal)

    # -- running -------------------------------------------------------------
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if self._closed:
            raise RuntimeError("this Runner is closed")
        if self._watched:
            self._carry_python_writes()
        mapped = tf.nest.map_structure(self._map_fetch, fetches)
        is_step = any(self._is_step(leaf) for leaf in tf.nest.flatten(mapped) if leaf is not None)
        if is_step:
            self._views.clear()
        if is_step and self._accumulate is not None:
            return self._monitored(is_step, lambda: self._run_accumulated(
                mapped, feed_dict or {}, options, run_metadata))
        feeds, batch = self._map_feeds(feed_dict or {})
        return self._monitored(is_step, lambda: self._run(mapped, feeds, batch, options,
                                                          run_metadata, is_step))

    def _monitored(self, is_step: bool, call):
        if self._monitor is None:
            return call()
        self._monitor.before_run(is_step)
        result = call()
        self._monitor.after_run(is_step, self._first_step + self._steps)
        return result

    def _run(self, mapped, feeds, batch: int | None, options, run_metadata, is_step: bool):
        if not is_step:
            # (a training step ends with its own barrier)
            return self._run_plain(mapped, feeds, options, run_metadata, lookup_barriers=True)
        if self._stop_requested:
            self._stop()
        groups = self._groups_of(mapped)
        extra = self._step_extras(groups, fed=bool(feeds))
        if self._step_feeds:
            feeds = {**(feeds or {}), **self._step_feeds}
        with_step = self._fetched_with(groups)
        if with_step:
            extra["with_step"] = with_step
        measure = self._meter.fetches(self._next_step, groups) if self._meter else None
        if measure is not None:
            extra["measure"] = measure
        traced = self._traced(options, run_metadata)
        if traced:
            options, run_metadata = _trace_options()
        start = time.time()
        try:
            result, got = self._run_plain((mapped, extra), feeds, options, run_metadata)
        except (tf.errors.AbortedError, tf.errors.CancelledError) as aborted:
            ended = self._ended_iterator(mapped)
            if ended is not None:
                raise ended from aborted
            raise
        if traced:
            self._timeline.record_step(self._next_step, start, time.time(), run_metadata)
        if measure is not None:
            self._meter.measured(self._next_step, got["measure"])
        examples = int(got["batch"]) if "batch" in got else batch
        self._after_step(got, examples)
        self._note_batch_size(examples)
        if self._stop_requested:
            self._stop()
        return result

    def _ended_iterator(self, mapped) -> tf.errors.OutOfRangeError | None:
        """After a training step was aborted or cancelled: the OutOfRangeError
        of the tf.data iterator it reads, when that iterator has ended. A
        step whose servers read the batch (the ids of a server variable's
        lookup) is cleaned up on them when the iterator ends, and TensorFlow
        may report their abort ("Cleanup") or the cancelled get-next instead
        of the end of the data,
        which a program's `except tf.errors.OutOfRangeError` would not
        catch. Running the iterator alone tells: an ended one raises at
        once (a live one gives up a batch, but the step failed anyway)."""
        iterator = iterator_read_by([x for x in tf.nest.flatten(mapped) if x is not None])
        if iterator is None:
            return None
        try:
            self.session.run(iterator)
        except tf.errors.OutOfRangeError as ended:
            return ended
        except tf.errors.OpError:
            return None
        return None

    def combines_unequal_batches(self) -> bool:
        """Whether the workers' gradients combine as one device's when their
        batches of a step differ in size: a loss summed over the batch, one
        divided by a count summed over workers (transforms.loss_counts), or
        one whose gradients the workers weigh by their batches' sizes
        (transforms.batch_weights: a batch whose size the graph leaves
        unknown; not with micro-batches)."""
        return self.loss_reduction != "mean" or (self.analysis is not None and bool(
            self.analysis.loss_counts or weighs_batches(
                self.analysis, self.loss_reduction, self.num_workers, self.micro_batches)))

    def _note_batch_size(self, examples: int | None) -> None:
        """Warn, once, when a training step's batch is not the size of this
        worker's first: workers' gradients of a loss averaged over each one's
        batch are combined with equal weights, which is one device's mean
        over the step's examples only when every worker's batch of the step
        has the same size (a dataset's last, partial batch, split over the
        workers, may not). A worker cannot see the others' sizes without
        another exchange in every step, so it says what it sees (not where
        the gradients combine exactly whatever the sizes)."""
        if (examples is None or self.num_workers == 1 or self.equal_shares
                or self.combines_unequal_batches()):
            return
        if self._first_batch is None:
            self._first_batch = examples
        elif examples != self._first_batch and not self._batch_warned:
            self._batch_warned = True
            log.warning(
                "worker %d: training step %d had %d examples where its first had %d. Each "
                "worker's gradients of the loss, a mean over its own batch, are averaged with "
                "equal weights: if the %d workers' batches of a step differ in size (a "
                "dataset's last, partial batch split over them), that step is not one device's "
                "mean over their examples (autopar weighs each worker's gradients by its batch's "
                "size when the graph leaves that size unknown, without micro-batches). Batch "
                "with drop_remainder=True after autopar.shard, or give every worker equally "
                "many examples, to train as one device does (warned once)", self.worker_index, self._next_step - 1, examples,
                self._first_batch, self.num_workers)

    def _run_accumulated(self, mapped, feed_dict, options, run_metadata):
        """One training step of up to `micro_batches` accumulate runs, then the
        update (module docstring)."""
        if self._stop_requested:
            self._stop()
        dc = self.dropcompute
        common, parts = _split_feed(feed_dict, dc.micro_batches)
        flat = tf.nest.flatten(mapped)
        step_at = [i for i, x in enumerate(flat) if x is not None and self._is_step(x)]
        other_at = [i for i, x in enumerate(flat) if x is not None and not self._is_step(x)]
        groups = self._groups_of(mapped)
        extra = self._step_extras(groups, fed=bool(feed_dict))
        start = time.perf_counter()
        compute, latencies, outputs, examples = 0.0, [], [], 0
        first, add = self._accumulate
        traced, spans, wall = self._traced(options, run_metadata), [], time.time()
        while dc.may_compute(len(latencies), compute):
            m = len(latencies)
            feeds, batch = self._map_feeds({**common, **parts[m]} if parts else common)
            t0 = time.perf_counter()
            out = self.session.run((first if m == 0 else add, [flat[i] for i in other_at], extra),
                                   feed_dict=feeds or None)
            latency = time.perf_counter() - t0 + dc.delay()
            if traced:
                spans.append(self._timeline.span(f"micro-batch {m}", "micro-batch",
                                                 wall + t0 - start, wall + t0 - start + latency))
            compute += latency
            latencies.append(latency)
            outputs.append(out)
            examples += int(out[2]["batch"]) if "batch" in out[2] else (batch or 0)
        computed = len(latencies)
        # The update reads the accumulators only: no batch feed, no input pulled.
        feeds, _ = self._map_feeds(common)
        step_fetches = [flat[i] for i in step_at] + self._fetched_with(groups)
        if traced:
            options, run_metadata = _trace_options()
        t0 = time.perf_counter()
        applied = self.session.run(step_fetches, feed_dict=feeds or None, options=options,
                                   run_metadata=run_metadata)
        end = time.perf_counter()
        if traced:
            if computed < dc.micro_batches and dc.tau is not None:
                at = wall + t0 - start
                spans.append(self._timeline.span(f"dropped {dc.micro_batches - computed}",
                                                 "micro-batch", at, at))
            self._timeline.record_step(self._next_step, wall, wall + end - start, run_metadata,
                                       spans)
        values: list = [None] * len(flat)
        for i, v in zip(step_at, applied):
            values[i] = v
        for k, i in enumerate(other_at):
            values[i] = _combine([out[1][k] for out in outputs])
        got = {}
        if "loss" in extra:
            got["loss"] = _combine([out[2]["loss"] for out in outputs])
        # Recorded first, so the step's progress line (and TensorBoard) count it.
        dc.record(StepRecord(step=self._steps, computed=computed,
                             dropped=dc.micro_batches - computed if dc.tau is not None else 0,
                             compute_s=compute, step_s=end - start, apply_s=end - t0,
                             latencies=latencies))
        self._after_step(got, examples)
        if self._stop_requested:
            self._stop()
        return tf.nest.pack_sequence_as(mapped, values)

    def _groups_of(self, mapped) -> set[int]:
        """The train groups the training-step leaves of `mapped` update."""
        groups: set[int] = set()
        if self.analysis is None:
            return groups
        for leaf in tf.nest.flatten(mapped):
            if leaf is None or not self._is_step(leaf):
                continue
            op = leaf if isinstance(leaf, tf.Operation) else leaf.op
            found = self.analysis.groups_of(op.name)
            if op.name not in self.analysis.trains and self.num_workers > 1 and found:
                members = self.analysis.train_groups[found[0]].variables
                if len(members) > 1:
                    raise AutoparError(
                        f"the fetch '{op.name}' updates one of the variables its train op "
                        f"updates together ({', '.join(members[:3])}"
                        f"{', ...' if len(members) > 3 else ''}): a distributed step applies a "
                        "train op's aggregated gradients as one, so fetch the train op "
                        "(e.g. what minimize() or apply_gradients() returned)")
            groups.update(found)
        return groups

    def _step_extras(self, groups: set[int], fed: bool) -> dict:
        """What a training step fetches besides the user's fetches: the loss
        of the first train group it updates (for progress), the losses'
        counts of the batch's values and, with no feed, the input batch's
        size."""
        extra = {}
        if self._loss_counts:
            extra["counts"] = self._loss_counts
        loss = next((self._losses[g] for g in sorted(groups) if self._losses[g] is not None),
                    None)
        if loss is not None:
            extra["loss"] = loss
        if self._batch_size is not None and not fed:
            extra["batch"] = self._batch_size
        return extra

    def _fetched_with(self, groups: set[int]) -> list:
        """The ops a step updating `groups` fetches with it: every one of a
        set of groups among them."""
        return [op for op_groups, op in self._step_fetches if set(op_groups) <= groups]

    def _run_plain(self, mapped, feeds, options, run_metadata, lookup_barriers=False):
        # None leaves are skipped fetches (initializers autopar already ran).
        flat = tf.nest.flatten(mapped)
        real = [x for x in flat if x is not None]
        barriers = self._lookup_barriers_of(real) if lookup_barriers else []
        values = iter(self.session.run([real, barriers], feed_dict=feeds or None, options=options,
                                       run_metadata=run_metadata)[0]) if real else iter(())
        return tf.nest.pack_sequence_as(mapped, [None if x is None else next(values) for x in flat])

    def _lookup_barriers_of(self, fetches) -> list[tf.Operation]:
        """The barriers of the grouped lookups (Config.aggregation_group)
        that `fetches` run."""
        if not self._lookup_barriers:
            return []
        ops = [x if isinstance(x, tf.Operation) else getattr(x, "op", None) for x in fetches]
        key = tuple(sorted(op.name for op in ops if op is not None))
        if key not in self._barriers_of:
            seen = {op.name for op in _upstream(op for op in ops if op is not None)}
            self._barriers_of[key] = [b for name, b in sorted(self._lookup_barriers.items())
                                      if name in seen]
        return self._barriers_of[key]

    def _after_step(self, got: dict, examples: int | None) -> None:
        """After a training step of `examples` examples (None: unknown)."""
        if "counts" in got:
            self.last_loss_counts = [float(np.sum(c)) for c in got["counts"]]
        if self._after_step_op is not None:
            self.session.run(self._after_step_op)
        self._steps += 1
        step = self._first_step + self._steps
        if self._progress is not None:
            loss = float(np.mean(got["loss"])) if "loss" in got else None
            self._progress.step(step, loss, examples)
        if self._checkpointer is not None:
            started = time.time()
            self._checkpointer.maybe_save(self.session, step)
            if self._timeline is not None and self._checkpointer.last_saved == step:
                # Kept with the step's trace, if the step was traced.
                self._timeline.add(step, self._timeline.span("checkpoint save", "checkpoint",
                                                             started, time.time()))

    def _traced(self, options, run_metadata) -> bool:
        """Whether the step about to run is one the timeline traces (not when
        the caller asked for its own trace)."""
        return (self._timeline is not None and options is None and run_metadata is None
                and self._timeline.traced(self._next_step))

    @property
    def _next_step(self) -> int:
        """The global step the next training step makes."""
        return self._first_step + self._steps + 1

    # -- distributed evaluation -----------------------------------------------
    def evaluate(self, metrics: dict, feed_dict=None, *, initializer=None,
                 max_batches: int | None = None, totals: bool = False) -> dict:
        """Evaluate `metrics` over this worker's shard of an eval set and
        combine them over all workers: the result is that of one device
        evaluating the whole set.

        `metrics`: {name: (sum, count)}, two scalar tensors per metric computed
        on one batch, e.g. ``(tf.reduce_sum(correct), tf.size(labels))`` for an
        accuracy or ``(tf.reduce_sum(losses), tf.size(losses))`` for a mean
        loss. Batches come from a tf.data iterator over a dataset sharded with
        ``autopar.shard`` (before ``.batch``): batches are run until it ends
        (OutOfRangeError), or for at most `max_batches`. `initializer`: run
        first, e.g. an initializable iterator's initializer, so the set can
        be evaluated again. `feed_dict`: fed with every batch.

        Returns {name: total sum / total count} over every worker's batches
        (sums and counts added in float64, then one all-reduce of the totals),
        or {name: (total sum, total count)} with ``totals=True``. Every worker
        must call evaluate at the same point with the same metrics (the
        all-reduce waits for all of them); evaluation is not a training step."""
        if self._lockstep_lookups:
            raise AutoparError(
                "Runner.evaluate: the plan's aggregation groups (Config.aggregation_group, or "
                "the cost model's choice when it is None: see the plan report) make each "
                f"lookup of {', '.join(self._lockstep_lookups[:3])} a collective of a group of "
                "workers, and workers evaluating their own shards run different numbers of "
                "batches; evaluate in a job with Config(aggregation_group=0) (the hosts)")
        names, fetches = self._eval_fetches(metrics)
        if max_batches is None and not _reads_iterator(fetches):
            raise AutoparError(
                "Runner.evaluate runs batches until the eval set's tf.data iterator ends, but "
                f"the metrics {names} read no iterator: build them on an iterator over "
                "autopar.shard(eval_dataset).batch(b), or pass max_batches")
        if initializer is not None:
            self._run_plain(self._map_fetch(initializer), {}, None, None)
        feeds, _ = self._map_feeds(feed_dict or {})
        local = np.zeros(2 * len(names), np.float64)
        batches = 0
        while max_batches is None or batches < max_batches:
            try:
                values = self.session.run(fetches, feed_dict=feeds or None)
            except tf.errors.OutOfRangeError:
                break
            local += np.asarray(values, np.float64)
            batches += 1
        combined = self.sum_over_workers(local)
        log.debug("worker %d evaluated %d batches: %s", self.worker_index, batches, local)
        out = {}
        for k, name in enumerate(names):
            total, count = float(combined[2 * k]), float(combined[2 * k + 1])
            if totals:
                out[name] = (total, count)
            elif count == 0:
                log.warning("evaluate: metric %r counted no examples on any worker", name)
                out[name] = float("nan")
            else:
                out[name] = total / count
        return out

    def _eval_fetches(self, metrics) -> tuple[list[str], list[tf.Tensor]]:
        """Metric names and [sum0, count0, sum1, count1, ...] in this graph."""
        if not isinstance(metrics, dict) or not metrics:
            raise AutoparError("Runner.evaluate takes a non-empty dict {name: (sum, count)} of "
                               f"scalar tensors, got {type(metrics).__name__}")
        names, fetches = [], []
        for name, pair in metrics.items():
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise AutoparError(f"Runner.evaluate: metric {name!r} must be a pair (sum, count) "
                                   "of scalar tensors computed on one batch")
            for t in pair:
                mapped = self._map_fetch(t)
                if not isinstance(mapped, tf.Tensor) or mapped.shape.rank not in (0, None):
                    raise AutoparError(f"Runner.evaluate: metric {name!r}: {t!r} is not a scalar "
                                       "tensor (sum or count over one batch)")
                if self._is_step(mapped):
                    raise AutoparError(f"Runner.evaluate: metric {name!r} runs a training step "
                                       f"({mapped.name} depends on a variable update); evaluate "
                                       "tensors that only read the model")
                fetches.append(mapped)
            names.append(str(name))
        return names, fetches

    def sum_over_workers(self, local: np.ndarray) -> np.ndarray:
        """The element-wise sum of a float64 vector over all workers (each
        passes its own; every worker must call it with the same length, in
        the same order). Distributed evaluation's collective; DropCompute's
        agreement without a job coordinator uses it too."""
        if self._totals_allreduce is None or self.num_workers == 1:
            return local
        n = len(local)
        if n not in self._totals_ops:
            self._totals_ops[n] = self._totals_allreduce(n)
        placeholder, summed = self._totals_ops[n]
        return np.asarray(self.session.run(summed, {placeholder: local}), np.float64)

    def _is_step(self, element) -> bool:
        op = element if isinstance(element, tf.Operation) else getattr(element, "op", None)
        return op is not None and op.name in self._step_ops

    def _python_settings(self) -> dict:
        """{lifted name: its Python variable's value now} of the traced
        function's non-trainable scalars kept on this worker (a server's
        one copy is no worker's to set)."""
        if self._lifted is None:
            return {}
        return {name: variable.numpy()
                for name, variable in self._lifted.python_variables.items()
                if variable.shape.num_elements() == 1 and not variable.trainable
                and self._on_this_worker(name)}

    def _on_this_worker(self, name: str) -> bool:
        """Whether the lifted variable `name` has a copy on this worker (a
        server's one copy is no worker's to set)."""
        ours = self._variables.get(name + ":0")
        return ours is not None and f"/job:{SERVER_JOB}" not in ours.device

    def _local_state(self, analysis) -> list[str]:
        """Lifted names of the Python variables that are state the step
        writes besides the optimizer's (Analysis.state of kind "local",
        from each worker's own batch, or "other": a metric's count, the
        optimizer's iteration), kept on this worker."""
        if self._lifted is None or analysis is None:
            return []
        local = {s.name for s in analysis.state if s.kind in ("local", "other") and s.update_ops}
        return sorted(name for name in self._lifted.python_variables
                      if name in local and self._on_this_worker(name))

    def combine_metrics(self, metrics) -> None:
        """Give the Python variables of Keras `metrics` a traced step
        updates their state summed over workers (every worker calls it at
        the same point), so that `metric.result()` is the global batches'
        (a metric whose state adds up: Mean, Sum, accuracies, AUC's
        counts). They keep the sums until the next step (close() and
        sync_python_variables leave them, so a combine as the last thing
        inside `with runner:` holds after it), which goes on counting from
        this worker's own values; their Python variables hold those after
        it."""
        variables = [v for m in metrics for v in m.variables]
        if not variables:
            return
        names = [self._lifted_name(v) for v in variables]
        # this worker's own values (a second call sums them again, not the
        # sums the first gave)
        mine = [self._own_value(name, v) for v, name in zip(variables, names)]
        total = self.sum_over_workers(np.concatenate(
            [np.ravel(m).astype(np.float64) for m in mine]))
        offset = 0
        for v, name, own in zip(variables, names, mine):
            size = int(np.prod(v.shape))
            dtype = getattr(v.dtype, "as_numpy_dtype", v.dtype)   # tf's or Keras's
            v.assign(total[offset:offset + size].reshape(v.shape).astype(dtype))
            offset += size
            if name is not None:
                self._views[name] = (own, v.numpy())
            if name in self._watched:
                # the sum is Python's view, not a write for the graph
                self._watched[name] = v.numpy()

    def _own_value(self, name: str | None, variable) -> np.ndarray:
        """This worker's value of the Python `variable` (lifted as `name`):
        its value, or the one it had before combine_metrics gave it a view
        that it still holds."""
        value = variable.numpy()
        own, view = self._views.get(name, (None, None))
        return own if view is not None and np.array_equal(value, view) else value

    def _carry_python_writes(self) -> None:
        """Assign to this worker's copy each watched setting the program
        changed in Python since it was last seen (`opt.learning_rate.assign
        (lr)` between calls): every worker runs the same script, so each
        makes the same change to its own copy. Without this the lifted
        graph's copy would keep training with the old value."""
        for name, seen in self._watched.items():
            value = self._lifted.python_variables[name].numpy()
            if not np.array_equal(value, seen):
                self._assign_from_python(name, value)

    def assign_python_values(self, variables) -> None:
        """Give this worker's copies of the traced function's Python
        `variables` their Python values now, each worker its own (no
        broadcast): autopar.fit resets the metrics a model's own train_step
        updates at each epoch's start. A variable the function does not
        capture is skipped."""
        for variable in variables:
            name = self._lifted_name(variable)
            if name is not None:
                self._assign_from_python(name, variable.numpy())

    def _lifted_name(self, variable) -> str | None:
        """The lifted name of a Python variable the traced function
        captures: a tf.Variable, or a Keras 3 variable, whose tf.Variable
        (`.value`) is what the function captured. None for another."""
        for candidate in (variable, getattr(variable, "value", None)):
            name = self._python.get(id(candidate))
            if name is not None:
                return name
        return None

    def _assign_from_python(self, name: str, value) -> None:
        if name not in self._assign_ops:
            ours = self._variables[name + ":0"]
            with self.graph.as_default(), tf.device(ours.device):
                fed = tf1.placeholder(ours.dtype.base_dtype, ours.shape)
                self._assign_ops[name] = (fed, ours.assign(fed).op)
        fed, assign = self._assign_ops[name]
        self.session.run(assign, {fed: value})
        self._views.pop(name, None)
        if name in self._watched:
            self._watched[name] = value

    def _saw_python_values(self) -> None:
        for name in self._watched:
            self._watched[name] = self._lifted.python_variables[name].numpy()

    def take_chief_values(self, variables) -> None:
        """Give the Python `variables` (of the traced function's, or any:
        every worker passes the same ones, in the same order, at the same
        point) the values the chief's hold now, and training's copies of
        them too: what code run on the chief alone changed (a Keras
        callback under autopar.fit). Every worker assigns its own copies;
        a server's one copy the chief assigns before the others go on. The
        values travel as float64, exactly; one float64 cannot hold (a
        64-bit count beyond 2**53), or a variable split over servers,
        reloads every variable from the chief's values instead
        (load_python_variables)."""
        if not variables:
            return
        names = [self._lifted_name(v) for v in variables]
        mine = [np.asarray(v.numpy()) for v in variables]
        sizes = [value.size for value in mine]
        whole = all(name is None or name + ":0" in self._variables for name in names)
        if self.is_chief:
            try:
                values = [value.astype(np.float64) for value in mine]
                exact = all(np.array_equal(f.astype(value.dtype), value)
                            for f, value in zip(values, mine))
            except (TypeError, ValueError):   # (not a number)
                values, exact = [np.zeros(size) for size in sizes], False
            if exact and whole:
                for name, value in zip(names, mine):
                    if name is not None and not self._on_this_worker(name):
                        self._assign_from_python(name, value)
            local = np.concatenate([np.ravel(f) for f in values] + [[float(exact)]])
        else:
            local = np.zeros(sum(sizes) + 1)
        got = self.sum_over_workers(local)
        if not (got[-1] and whole):
            self.load_python_variables()
            return
        offset = 0
        for variable, name, value in zip(variables, names, mine):
            chiefs = got[offset:offset + value.size].reshape(value.shape).astype(value.dtype)
            offset += value.size
            if not self.is_chief:
                variable.assign(chiefs)
            if name is not None and self._on_this_worker(name):
                self._assign_from_python(name, chiefs)

    def load_python_variables(self) -> None:
        """Give training the traced function's Python variables' values as
        the chief holds them now (a Keras callback's new learning rate,
        restored weights): the chief initialises every variable from them
        again, as at start, and the start's broadcast makes every replica
        equal to the chief's. Every worker calls it at the same point (the
        broadcast is a collective); the chief's Python variables hold the
        graph's values but for the changes (sync_python_variables first)."""
        if not self._python:
            return
        if self.is_chief:
            if self._reload_ops is None:
                with self.graph.as_default():
                    self._reload_ops = staged_initializers(
                        self.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
            feed = self._lifted.initial_feed()
            for placeholder, variable in self._lifted.initial_values.items():
                # a view (combine_metrics) is no value for training: this
                # worker's own is
                feed[placeholder] = self._own_value(self._python.get(id(variable)), variable)
            for op in self._reload_ops:
                self.session.run(op, feed)
            self._saw_python_values()
        if self._broadcast_op is not None:
            self.session.run(self._broadcast_op)

    # -- mapping user objects to the rewritten graph ----------------------------
    def call(self, *inputs):
        """One run of the traced function this Runner was made from
        (get_runner(concrete_function, ...)): `inputs` fed to its inputs in
        order, its outputs returned as it returns them (numpy values). A
        training step like any other run that updates variables."""
        function = self._lifted.function if self._lifted is not None else None
        if function is None:
            raise AutoparError("Runner.call runs a traced function: make the Runner with "
                               "autopar.get_runner(train_step.get_concrete_function(...), ...)")
        # (a tf.data dataset's batches are eager tensors: a session feeds arrays)
        inputs = [v.numpy() if isinstance(v, tf.Tensor) else v for v in inputs]
        fed = function.graph.inputs[:len(inputs)]
        if len(inputs) != len(function.graph.inputs) - len(function.graph.captures):
            raise AutoparError(f"Runner.call: the function takes "
                               f"{len(function.graph.inputs) - len(function.graph.captures)} "
                               f"inputs, got {len(inputs)}")
        outputs = tf.nest.flatten(function.structured_outputs, expand_composites=True)
        tensors = [t for t in outputs if isinstance(t, tf.Tensor)]
        # the chief writes the function's summaries (Python's writers are
        # this process's; every worker's would write the same steps)
        summaries = self._lifted.summaries if self.is_chief else []
        written = [name for write in summaries for name in write.inputs]
        values = iter(self.run([t.name for t in tensors] + [CALL_OP] + written,
                               {t.name: v for t, v in zip(fed, inputs)}))
        if self._local_python and self.sync_state_each_call:
            self._read_into_python(self._local_python)
        result = tf.nest.pack_sequence_as(
            function.structured_outputs,
            [next(values) if isinstance(t, tf.Tensor) else t for t in outputs],
            expand_composites=True)
        next(values)   # CALL_OP's
        for write in summaries:
            write.write([next(values) for _ in write.inputs])
        return result

    def run_input_free_writes(self) -> None:
        """Run, once, the traced function's writes that wait for none of
        what a step reads or exchanges (an optimizer's iteration count, a
        dropout's seed): what a call of the function runs when its batch
        cannot be read. Keras's fit ends each pass over a dataset of
        unknown length with such a call, whose writes count (autopar.fit).
        Each worker runs its own copies' writes, the chief a server's."""
        if self._input_free is None:
            self._input_free = _input_free_writes(self.graph, self.is_chief)
        if self._input_free:
            self.session.run(self._input_free)

    def loss_counts_of(self, *inputs) -> list[float] | None:
        """This worker's counts of the batch's values that the losses
        divide by (transforms.loss_counts: computed from the input alone) for
        `inputs` fed to the traced function's inputs as call() feeds them,
        without a step; None when there are none or `inputs` are not all of
        the function's inputs."""
        function = self._lifted.function if self._lifted is not None else None
        if not self._loss_counts or function is None or \
                len(inputs) != len(function.graph.inputs) - len(function.graph.captures):
            return None
        fed = function.graph.inputs[:len(inputs)]
        values = self.run(list(self._loss_counts), {t.name: v for t, v in zip(fed, inputs)})
        return [float(np.sum(v)) for v in values]

    def sync_python_variables(self, variables=None) -> None:
        """Give the traced function's Python variables (a Keras model's and
        optimizer's; `variables` of them alone, when given) this worker's
        current values, so model.save(), model.evaluate() and checkpoints of
        them see the trained model. Done by close() too. What the program
        wrote to them in Python since the last step (a metric's
        reset_state(), a learning rate) goes into training first, and the
        results combine_metrics gave stay until the next step: neither is
        overwritten."""
        if not self._python:
            return
        self._read_into_python(list(self._lifted.python_variables) if variables is None else
                               [n for n in map(self._lifted_name, variables) if n is not None])

    def _read_into_python(self, names: list[str]) -> None:
        """This worker's values of the lifted variables `names` into their
        Python variables (seen there: no write for the graph), but for
        views (combine_metrics) and after Python's own writes went into the
        graph."""
        if self._watched:
            self._carry_python_writes()
        python = self._lifted.python_variables
        names = [name for name in names if name not in self._views
                 or not np.array_equal(python[name].numpy(), self._views[name][1])]
        if not names:
            return
        values = self._run_plain({name: self._map_fetch(self._variables[name + ":0"])
                                  for name in names}, {}, None, None)
        for name, value in values.items():
            self._lifted.python_variables[name].assign(value)
            if name in self._watched:
                self._watched[name] = self._lifted.python_variables[name].numpy()

    def _map_fetch(self, fetch):
        if fetch is None:
            return None
        if self._python and not isinstance(fetch, (str, tf.Tensor, tf.Operation)):
            # A traced function's Python variable (a tf.Variable, or a Keras
            # 3 variable holding one): its lifted counterpart.
            name = self._lifted_name(fetch)
            if name is not None:
                return self._map_fetch(self._variables[name + ":0"])
        if isinstance(fetch, tf.SparseTensor):
            # Session fetches it as a SparseTensorValue of its three parts.
            with self.graph.as_default():
                return tf.SparseTensor(*(self._map_tensor(t) for t in
                                         (fetch.indices, fetch.values, fetch.dense_shape)))
        if isinstance(fetch, tf.IndexedSlices):
            return tf.IndexedSlices(self._map_tensor(fetch.values), self._map_tensor(fetch.indices),
                                    None if fetch.dense_shape is None
                                    else self._map_tensor(fetch.dense_shape))
        if isinstance(fetch, tf.Variable) and getattr(fetch, "initializer", None) is None:
            # What an assign returns (`global_step.assign_add(1)`, as
            # tf_cnn_benchmarks fetches it): the value read after the
            # assignment, the element Session.run itself fetches for it.
            return self._map_fetch(fetch._as_graph_element())  # pylint: disable=protected-access
        if isinstance(fetch, tf.Variable):
            # Its snapshot tensor, by name: for a variable split into partitions
            # that node computes the whole value (a Variable object would read
            # one partition through it).
            with fetch.graph.as_default():   # to_proto needs graph mode
                snapshot = fetch.to_proto().snapshot_name
            return self.graph.get_tensor_by_name(snapshot)
        name = fetch if isinstance(fetch, str) else getattr(fetch, "name", None)
        if name is None:
            raise TypeError(f"cannot fetch {fetch!r}: pass a tensor, op, variable or name")
        if name in self._variables:
            return self._variables[name]
        element = self.graph.as_graph_element(name)
        if isinstance(element, tf.Operation) and element.name in self._init_ops:
            if not self._warned_init:
                log.info("variables were initialised (and restored) by autopar; "
                         "skipping '%s' so replicas stay identical", element.name)
                self._warned_init = True
            return None
        return element

    def _map_tensor(self, tensor) -> tf.Tensor:
        """This graph's tensor of the same name (a tensor, or its name)."""
        name = tensor if isinstance(tensor, str) else getattr(tensor, "name", None)
        if name is None:
            raise TypeError(f"cannot interpret feed_dict key {tensor!r} as a tensor: pass a "
                            "tensor, a SparseTensor, a tensor name or a tuple of them")
        try:
            return self.graph.as_graph_element(name, allow_tensor=True, allow_operation=False)
        except (KeyError, ValueError) as e:
            raise TypeError(f"cannot interpret feed_dict key {name!r} as a tensor: {e}") from e

    def _map_feeds(self, feed_dict) -> tuple[dict, int | None]:
        """The feed for this graph's tensors, and the batch size it holds (the
        first fed leading dimension, for examples/s)."""
        feeds: dict = {}
        batch = None
        for key, value in feed_dict.items():
            for leaf, leaf_value in _flatten_feed(key, value):
                if batch is None:
                    batch = _leading_dim(leaf, leaf_value)
                if isinstance(leaf, tf.SparseTensor):
                    parts = [leaf.indices, leaf.values, leaf.dense_shape]
                elif isinstance(leaf, tf.IndexedSlices):
                    parts = [leaf.values, leaf.indices] + (
                        [] if leaf.dense_shape is None else [leaf.dense_shape])
                else:
                    mapped = self._map_tensor(leaf)
                    self._check_feed_shape(mapped, leaf_value)
                    feeds[mapped] = leaf_value
                    # a fed constant's copies on the servers read the value fed too
                    for copy in self._constant_copies.get(mapped.name, ()):
                        feeds[self._map_tensor(copy)] = leaf_value
                    continue
                # As Session: a SparseTensorValue / IndexedSlicesValue or a
                # plain tuple, zipped with the component tensors.
                for part, part_value in zip(parts, leaf_value):
                    feeds[self._map_tensor(part)] = part_value
        return feeds, batch

    def _check_feed_shape(self, tensor, value) -> None:
        """Refuse, by name, a value whose shape the input cannot take: most
        often an input traced or declared with the global batch size, which
        each worker feeds with its own share of the batch."""
        shape = getattr(value, "shape", None)
        static = getattr(tensor, "shape", None)
        if shape is None or static is None or static.is_compatible_with(tuple(shape)):
            return
        name = tensor.name.split(":")[0]
        hint = ""
        if static.rank and len(shape) == static.rank and static[0] is not None \
                and static[0] != shape[0]:
            hint = (f"; its batch dimension is fixed at {static[0]}, and each of the "
                    f"{self.num_workers} worker(s) feeds its own rows of a step's batch: "
                    "declare it None (tf.compat.v1.placeholder(dtype, [None, ...]), "
                    "tf.TensorSpec([None, ...]) for a traced step) or the per-worker batch")
        raise AutoparError(f"input '{name}' has the shape {static}, worker {self.worker_index} "
                           f"fed one of shape {tuple(shape)}{hint}")

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.sync_python_variables()
            except tf.errors.OpError as e:
                log.warning("the Python variables keep their values from before training: "
                            "reading the trained ones failed (%s)", e.message.splitlines()[0])
            if self._checkpointer is not None and self._steps:
                step = self._first_step + self._steps
                if step != self._checkpointer.last_saved:
                    self._checkpointer.save(self.session, step)
        finally:
            if self._previous_sigint is not None:
                signal.signal(signal.SIGINT, self._previous_sigint)
            self._sigterm.uninstall()
            self.session.close()
            for fn in self._on_close:
                fn()

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _trace_options():
    """(RunOptions, RunMetadata) of a step traced for the timeline."""
    return tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), tf1.RunMetadata()


def _split_feed(feed_dict, parts: int) -> tuple[dict, list[dict]]:
    """A step's feed as (what every run gets: scalars, [micro-batch i's
    feed]): every other leaf split along axis 0 into `parts` equal parts."""
    common: dict = {}
    arrays: list[tuple] = []     # (leaf, its value as an array), checked before any split
    for key, value in feed_dict.items():
        for leaf, leaf_value in _flatten_feed(key, value):
            if isinstance(leaf, (tf.SparseTensor, tf.IndexedSlices)):
                raise AutoparError(
                    f"with Config(micro_batches={parts}) the step's feed is split into "
                    f"micro-batches along axis 0, which a SparseTensor/IndexedSlices feed "
                    f"({getattr(leaf, 'name', leaf)!r}) cannot be: feed dense arrays or read "
                    "the input from a tf.data iterator (one element per micro-batch)")
            array = np.asarray(leaf_value)
            if array.ndim == 0:
                common[leaf] = leaf_value
                continue
            if array.shape[0] % parts:
                raise AutoparError(
                    f"with Config(micro_batches={parts}) the step's feed is split into {parts} "
                    f"equal micro-batches along axis 0, but the value fed to "
                    f"{getattr(leaf, 'name', leaf)!r} has {array.shape[0]} rows: feed a "
                    f"multiple of {parts} rows (Runner.micro_batches)")
            arrays.append((leaf, array))
    if not arrays:
        return common, []
    split: list[dict] = [{} for _ in range(parts)]
    for leaf, array in arrays:
        for i, piece in enumerate(np.split(array, parts)):
            split[i][leaf] = piece
    return common, split


def _combine(values: list):
    """Micro-batches' values of one fetch: the mean of floating-point arrays
    of one shape, else the last value."""
    arrays = [np.asarray(v) if isinstance(v, (np.ndarray, np.generic, float)) else None
              for v in values]
    if (all(a is not None and np.issubdtype(a.dtype, np.floating) for a in arrays)
            and len({a.shape for a in arrays}) == 1):
        mean = np.mean(np.stack(arrays), axis=0)
        return mean.astype(arrays[0].dtype) if mean.shape else arrays[0].dtype.type(mean)
    return values[-1]


def _initializer_ops(graph: tf.Graph) -> frozenset[str]:
    """Variable initializers and the grouping ops made only of them
    (tf.compat.v1.global_variables_initializer() and friends)."""
    variables = (graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
                 + graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES))
    names = {v.initializer.name for v in variables}
    for op in graph.get_operations():
        if (op.type == "NoOp" and op.control_inputs and not op.inputs
                and all(c.name in names for c in op.control_inputs)):
            names.add(op.name)
    return frozenset(names)


def _flatten_feed(key, value) -> Iterator[tuple]:
    """(key, value) pairs of a feed whose key may be a nested list/tuple of
    tensors fed the same structure of values (Session.run's feed_dict
    flattening); a SparseTensor or IndexedSlices key stays one leaf."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError(f"feed_dict key {key!r} is a structure of {len(key)} tensors, "
                             f"so its value must be a list or tuple of {len(key)} values, "
                             f"got {type(value).__name__}")
        for k, v in zip(key, value):
            yield from _flatten_feed(k, v)
    else:
        yield key, value


def _leading_dim(key, value) -> int | None:
    try:
        if isinstance(key, tf.SparseTensor):
            return int(np.asarray(value[2])[0])      # dense_shape[0]
        shape = np.shape(value)
    except (ValueError, IndexError, TypeError):
        return None                                  # ragged lists, scalar shapes
    return int(shape[0]) if shape else None


_ITERATOR_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})


# Ops that write state: a variable, or a random generator's.
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                     "RngReadAndSkip", "RngSkip"})


def _input_free_writes(graph: tf.Graph, is_chief: bool) -> list[tf.Operation]:
    """The writes among the traced function's stateful ops (CALL_OP's
    inputs) that depend, by data or control, on no fed value (its inputs,
    the runner's own feeds), no dataset and no collective; those of a
    server's variable on the chief alone."""
    if CALL_OP not in {op.name for op in graph.get_operations()}:
        return []
    # everything downstream of what a step reads or exchanges
    tainted: set[str] = set()
    stack = [op for op in graph.get_operations()
             if op.type in ("Placeholder", "PlaceholderWithDefault", "IteratorGetNext",
                            "IteratorGetNextSync") or op.type.startswith("Collective")]
    while stack:
        op = stack.pop()
        if op.name in tainted:
            continue
        tainted.add(op.name)
        stack.extend(c for t in op.outputs for c in t.consumers())
        stack.extend(op._control_outputs)  # pylint: disable=protected-access  (no public API)
    return [op for op in _upstream([graph.get_operation_by_name(CALL_OP)])
            if op.type in _WRITES and op.name not in tainted
            and (is_chief or f"/job:{SERVER_JOB}" not in op.device)]


def _upstream(ops):
    """`ops` and every op they depend on (by data or control edges), each once."""
    seen: set[str] = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        yield op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)


def iterator_read_by(tensors) -> tf.Operation | None:
    """A tf.data iterator's get-next op that `tensors` (or ops) depend on (by
    data or control edges), or None."""
    return next((op for op in _upstream(getattr(t, "op", t) for t in tensors)
                 if op.type in _ITERATOR_OPS), None)


def _reads_iterator(tensors) -> bool:
    return iterator_read_by(tensors) is not None


_UPDATE_PREFIXES = ("Assign", "Apply", "ResourceApply", "SparseApply", "ResourceSparseApply",
                    "Scatter", "ResourceScatter")


def _trainable_writer_step_ops(graph: tf.Graph, init_ops: frozenset[str]) -> frozenset[str]:
    """Ops whose run writes a trainable variable (the writers and everything
    depending on them by data or control edges), initialisers and checkpoint
    restores excluded."""
    trainable = {v.op.name for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)}
    writers = [op.name for op in graph.get_operations()
               if op.type.startswith(_UPDATE_PREFIXES) and op.inputs
               and op.inputs[0].op.name in trainable and op.name not in init_ops
               and not is_restore_assignment(op)]
    if not writers:
        return frozenset()
    full = op_digraph(graph, control=True)
    return frozenset(writers).union(*(nx.descendants(full, w) for w in writers))
