"""The session-like object a training script drives (Parallax's runner).

`run()` takes the user's *original* tensors, ops, variables or names and runs
their counterparts in this worker's rewritten graph. It accepts every fetch and
feed a plain `tf.compat.v1.Session.run` accepts (runtime/step/fetch_map.py).
A fetch that reaches a variable update counts as one training step
(runtime/step/training_step.py): it runs as one run, or as micro-batches
accumulated then the update (runtime/step/executor.py), and the step loop's
hooks act around it (runtime/step/hook.py: the chief logs progress and saves
checkpoints, a stop request is acted on at a step's boundary, the timeline
and the measured bytes record it, DropCompute takes its record); the worker
builds the hooks from its plan (runtime/step/hooks.py). A traced TensorFlow
2 step's Python variables are bridged to their lifted copies
(runtime/step/python_bridge.py).
"""
from __future__ import annotations

import contextlib
import logging

import tensorflow as tf

from autopar.runtime.step.evaluate import Evaluator
from autopar.runtime.step.executor import AccumulatedStep, PlainStep, run_plain
from autopar.runtime.step.fetch_map import FetchMapper
from autopar.runtime.step.hook import RunHook, StepRun
from autopar.runtime.step.hooks import step_hooks
from autopar.runtime.step.python_bridge import PythonVariables
from autopar.runtime.step.stop import StopHook
from autopar.runtime.step.training_step import StepFetches
from autopar.transforms.analysis import Analysis
from autopar.transforms.batch_weights import weighs_batches

log = logging.getLogger("autopar")

tf1 = tf.compat.v1


def _doc_of(source):
    """A method's docstring taken from the part that does its work."""
    def take(method):
        method.__doc__ = source.__doc__
        return method
    return take


class Runner:
    """`hooks`: the step loop's (runtime/step/hooks.py; None: a stop hook
    alone); `training`: what a training step fetches and feeds besides the
    user's (None: only what the analysis says); `accumulate`: (first
    micro-batch op, later micro-batches op) with micro_batches > 1, and
    `dropcompute` the worker's DropCompute state; `totals_allreduce` and
    `lockstep_lookups`: runtime/step/evaluate.py's; `lifted`: the
    transforms.lift.LiftedGraph a traced step was lifted to;
    `constant_copies`: a worker constant's name -> its servers' copies
    (WorkerGraph.constant_copies), fed what it is fed."""

    def __init__(self, session, graph: tf.Graph, analysis: Analysis | None, *, worker_index: int = 0,
                 num_workers: int = 1, hooks: list[RunHook] | None = None,
                 training: StepFetches | None = None, accumulate=None, dropcompute=None,
                 totals_allreduce=None, lockstep_lookups=(), lifted=None,
                 loss_reduction: str = "mean", constant_copies=None):
        self.session = session
        self.graph = graph
        self.analysis = analysis
        self.worker_index = worker_index
        self.num_workers = num_workers
        # How workers' gradients combine (Plan.loss_reduction): "sum" when the
        # loss is a sum over the batch, so one device's loss is the sum of
        # the workers' (autopar.fit logs it so).
        self.loss_reduction = loss_reduction
        # Set by a caller that splits every step's batch into equal shares
        # itself (autopar.fit): steps of other sizes are then nothing to warn of.
        self.equal_shares = False
        self._mapper = FetchMapper(
            graph, worker_index=worker_index, num_workers=num_workers,
            constant_copies=constant_copies,
            python_name=(lambda v: self._python.lifted_name(v)) if lifted is not None else None)
        self._training = training or StepFetches(graph, analysis, num_workers=num_workers)
        self._executor = (PlainStep(session, self._mapper, self._training) if accumulate is None
                          else AccumulatedStep(session, self._mapper, self._training, accumulate,
                                               dropcompute))
        self._evaluator = Evaluator(session, self._mapper, self._training,
                                    worker_index=worker_index, num_workers=num_workers,
                                    totals_allreduce=totals_allreduce,
                                    lockstep_lookups=lockstep_lookups)
        self._python = PythonVariables(lifted, analysis, session, self._mapper,
                                       is_chief=self.is_chief, run=self.run,
                                       sum_over_workers=self.sum_over_workers,
                                       loss_counts=self._training.loss_counts)
        self._hooks = list(step_hooks(worker_index) if hooks is None else hooks) + [self._python]
        self._stop = next((h for h in self._hooks if isinstance(h, StopHook)), None)
        self._global_step = tf1.train.get_global_step(graph)
        self._first_step = 0
        self.steps_run = 0       # training steps run (read by hooks)
        # The losses' counts of the batch's values of the last step
        # (transforms.loss_counts), this worker's.
        self.last_loss_counts: list[float] = []
        self._closed = False
        self._warned_draws: set[str] = set()   # (_warn_of_draws)
        for hook in self._hooks:
            hook.begin(self)

    def start(self, init_ops, broadcast_op=None, init_feed=None) -> None:
        """Initialise (`init_ops`: an op, or ops run one after the other, fed
        `init_feed`), restore the latest checkpoint (chief), make every
        replica equal to the chief's, and note the global step training
        resumes from."""
        self._python.broadcast_op = broadcast_op
        for op in init_ops if isinstance(init_ops, (list, tuple)) else [init_ops]:
            self.session.run(op, init_feed or None)
        for hook in self._hooks:
            hook.after_create_session(self.session)
        if broadcast_op is not None:
            self.session.run(broadcast_op)
        # Steps are counted from here: reading the global step in the same run
        # as the update could see either value.
        if self._global_step is not None:
            self._first_step = int(self.session.run(self._global_step))
            for hook in self._hooks:
                hook.after_start(self._first_step)

    @property
    def resumed_step(self) -> int:
        """The global step training (re)started from."""
        return self._first_step

    @property
    def global_step(self) -> int:
        """The global step the last training step made (read by hooks)."""
        return self._first_step + self.steps_run

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    @property
    def micro_batches(self) -> int:
        """Micro-batches a training step computes at most (a fed batch is
        split into this many parts; drop_compensation="batch" raises it once
        the threshold is chosen)."""
        return self._executor.micro_batches

    @property
    def dropcompute(self):
        """The worker's runtime.dropcompute.worker_state.DropCompute, or None."""
        return getattr(self._executor, "dropcompute", None)

    @property
    def stop_requested(self) -> bool:
        """True once a stop was requested: the next training step will not run."""
        return self._stop is not None and self._stop.requested

    @property
    def sync_state_each_call(self) -> bool:
        """Whether call() gives the step's own state (its metrics) to Python
        after each call; cleared by a caller that reads that state itself
        when it needs it (autopar.fit)."""
        return self._python.sync_state_each_call

    @sync_state_each_call.setter
    def sync_state_each_call(self, value: bool) -> None:
        self._python.sync_state_each_call = value

    # -- running -------------------------------------------------------------
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if self._closed:
            raise RuntimeError("this Runner is closed")
        mapped = self._mapper.fetches(fetches)
        is_step = self._training.any_step(mapped)
        run = StepRun(is_step, self.global_step + is_step, index=self.steps_run,
                      options=options, run_metadata=run_metadata)
        if is_step:
            run.groups = self._training.groups_of(mapped)
        for hook in self._hooks:
            hook.before_run(run)
        if is_step:
            result = self._executor.step(run, mapped, feed_dict or {})
            self.steps_run += 1
            counts = self._training.counts_of(run.got)
            if counts is not None:
                self.last_loss_counts = counts
        else:
            # (a training step ends with its own barrier)
            feeds, _ = self._mapper.feeds(feed_dict or {})
            fetched = [x for x in tf.nest.flatten(mapped) if x is not None]
            self._warn_of_draws(self._training.stateful_draws(fetched))
            barriers = self._training.lookup_barriers(fetched)
            result = run_plain(self.session, mapped, feeds, options, run_metadata, barriers)
        for hook in reversed(self._hooks):
            hook.after_run(run)
        return result

    def _warn_of_draws(self, draws: list[str]) -> None:
        """Say, once for each, that a run which is no training step drew
        per example from a generator this worker keeps: unless every worker
        runs it alike, this worker's generator is ahead of the others' from
        then on (one device's advanced once, for the whole batch)."""
        new = [d for d in draws if d not in self._warned_draws]
        if new:
            self._warned_draws.update(new)
            log.warning(
                "autopar: worker %d drew per example outside a training step (a run of no "
                "train op): its random ops per example ('%s') ran, so this worker's generators "
                "moved on; "
                "unless every worker makes the same run, the next training steps' draws per "
                "example (dropout masks) are no longer one device's. Fetch what the run "
                "computes with a training step, or make it on every worker",
                self.worker_index, "', '".join(new))

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

    # -- distributed evaluation (runtime/step/evaluate.py) --------------------
    @_doc_of(Evaluator.evaluate)
    def evaluate(self, metrics: dict, feed_dict=None, *, initializer=None,
                 max_batches: int | None = None, totals: bool = False) -> dict:
        return self._evaluator.evaluate(metrics, feed_dict, initializer=initializer,
                                        max_batches=max_batches, totals=totals)

    @_doc_of(Evaluator.sum_over_workers)
    def sum_over_workers(self, local):
        return self._evaluator.sum_over_workers(local)

    # -- a traced step's Python variables (runtime/step/python_bridge.py) -----
    @_doc_of(PythonVariables.call)
    def call(self, *inputs):
        return self._python.call(*inputs)

    @_doc_of(PythonVariables.sync_python_variables)
    def sync_python_variables(self, variables=None) -> None:
        self._python.sync_python_variables(variables)

    @_doc_of(PythonVariables.combine_metrics)
    def combine_metrics(self, metrics) -> None:
        self._python.combine_metrics(metrics)

    @_doc_of(PythonVariables.assign_python_values)
    def assign_python_values(self, variables) -> None:
        self._python.assign_python_values(variables)

    @_doc_of(PythonVariables.take_chief_values)
    def take_chief_values(self, variables) -> None:
        self._python.take_chief_values(variables)

    @_doc_of(PythonVariables.load_python_variables)
    def load_python_variables(self) -> None:
        self._python.load_python_variables()

    @_doc_of(PythonVariables.run_input_free_writes)
    def run_input_free_writes(self) -> None:
        self._python.run_input_free_writes()

    @_doc_of(PythonVariables.outputs_of_variables)
    def outputs_of_variables(self):
        return self._python.outputs_of_variables()

    @_doc_of(PythonVariables.lifted_name)
    def lifted_name(self, variable) -> str | None:
        return self._python.lifted_name(variable)

    @_doc_of(PythonVariables.loss_counts_of)
    def loss_counts_of(self, *inputs) -> list[float] | None:
        return self._python.loss_counts_of(*inputs)

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        """Every hook's end (the Python variables get the trained values, the
        chief saves a last checkpoint), the session closed, then every
        hook's last act; each runs even if one before it failed."""
        if self._closed:
            return
        self._closed = True
        with contextlib.ExitStack() as closing:   # (run in the reverse order)
            for hook in self._hooks:
                closing.callback(hook.closed)
            closing.callback(self.session.close)
            for hook in self._hooks:
                closing.callback(hook.end, self.session)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
