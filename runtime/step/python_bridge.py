"""A traced TensorFlow 2 step's Python variables (a Keras model's and
optimizer's) and the lifted graph's copies of them (transforms/lift.py):
the bridge between what the program holds in Python and what trains.

Before every run, what the program assigned in Python since (a learning
rate it decays, a metric's reset_state()) goes into this worker's copies;
after a call the step's own state (its metrics) comes back to Python; when
the Runner closes every Python variable gets this worker's trained value.
The Runner's public methods on Python variables (call, sync_python_variables,
combine_metrics, take_chief_values, load_python_variables, ...) are this
module's."""
from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.common.roles import SERVER_JOB
from autopar.runtime.step.executor import run_plain
from autopar.runtime.step.graph_queries import input_free_writes, variables_computed_from
from autopar.runtime.step.hook import RunHook, StepRun
from autopar.transforms.graph_utils import staged_initializers
from autopar.transforms.lift import CALL_OP

tf1 = tf.compat.v1
log = logging.getLogger("autopar.runner")


class PythonVariables(RunHook):
    """`lifted`: the transforms.lift.LiftedGraph the Runner's graph was
    lifted from, or None (then only combine_metrics and take_chief_values,
    which take any Python variables, do anything). `run`: the Runner's run
    (a call is a run like any other); `sum_over_workers`: the Runner's;
    `mapper`: the Runner's runtime.step.fetch_map.FetchMapper."""

    def __init__(self, lifted, analysis, session, mapper, *, is_chief: bool,
                 run: Callable, sum_over_workers: Callable, loss_counts=()) -> None:
        self.lifted = lifted
        self.session = session
        self.graph = mapper.graph
        self.is_chief = is_chief
        self._run = run
        self._sum_over_workers = sum_over_workers
        self._loss_counts = list(loss_counts)
        self._mapper = mapper
        self._variables = mapper.variables
        # A traced function's: its Python variables by id -> the lifted
        # variable's op name.
        self._python = ({id(v): name for name, v in lifted.python_variables.items()}
                        if lifted is not None else {})
        self.broadcast_op = None      # Runner.start's: every replica made equal to the chief's
        self._reload_ops = None       # load_python_variables(), built on first use
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
        self._watched.update({name: self.lifted.python_variables[name].numpy()
                              for name in self._local_python})
        # Cleared by a caller that reads that state itself when it needs it
        # (autopar.fit: at each epoch's end, its compiled metrics in Python)
        self.sync_state_each_call = True
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

    def lifted_name(self, variable) -> str | None:
        """The lifted name of a Python variable the traced function
        captures: a tf.Variable, or a Keras 3 variable, whose tf.Variable
        (`.value`) is what the function captured. None for another."""
        for candidate in (variable, getattr(variable, "value", None)):
            name = self._python.get(id(candidate))
            if name is not None:
                return name
        return None

    # -- the hook ---------------------------------------------------------------
    def before_run(self, run: StepRun) -> None:
        if self._watched:
            self._carry_python_writes()
        if run.is_step:
            self._views.clear()

    def end(self, session) -> None:
        try:
            self.sync_python_variables()
        except tf.errors.OpError as e:
            log.warning("the Python variables keep their values from before training: "
                        "reading the trained ones failed (%s)", e.message.splitlines()[0])

    def _python_settings(self) -> dict:
        """{lifted name: its Python variable's value now} of the traced
        function's non-trainable scalars kept on this worker (a server's
        one copy is no worker's to set)."""
        if self.lifted is None:
            return {}
        return {name: variable.numpy()
                for name, variable in self.lifted.python_variables.items()
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
        if self.lifted is None or analysis is None:
            return []
        local = {s.name for s in analysis.state if s.kind in ("local", "other") and s.update_ops}
        return sorted(name for name in self.lifted.python_variables
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
        names = [self.lifted_name(v) for v in variables]
        # this worker's own values (a second call sums them again, not the
        # sums the first gave)
        mine = [self._own_value(name, v) for v, name in zip(variables, names)]
        total = self._sum_over_workers(np.concatenate(
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
            value = self.lifted.python_variables[name].numpy()
            if not np.array_equal(value, seen):
                self._assign_from_python(name, value)

    def assign_python_values(self, variables) -> None:
        """Give this worker's copies of the traced function's Python
        `variables` their Python values now, each worker its own (no
        broadcast): autopar.fit resets the metrics a model's own train_step
        updates at each epoch's start. A variable the function does not
        capture is skipped."""
        for variable in variables:
            name = self.lifted_name(variable)
            if name is not None:
                self._assign_from_python(name, variable.numpy())

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
            self._watched[name] = self.lifted.python_variables[name].numpy()

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
        names = [self.lifted_name(v) for v in variables]
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
        got = self._sum_over_workers(local)
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
            feed = self.lifted.initial_feed()
            for placeholder, variable in self.lifted.initial_values.items():
                # a view (combine_metrics) is no value for training: this
                # worker's own is
                feed[placeholder] = self._own_value(self._python.get(id(variable)), variable)
            for op in self._reload_ops:
                self.session.run(op, feed)
            self._saw_python_values()
        if self.broadcast_op is not None:
            self.session.run(self.broadcast_op)

    def call(self, *inputs):
        """One run of the traced function this Runner was made from
        (get_runner(concrete_function, ...)): `inputs` fed to its inputs in
        order, its outputs returned as it returns them (numpy values). A
        training step like any other run that updates variables."""
        arguments = self.lifted.inputs if self.lifted is not None else None
        if arguments is None:
            raise AutoparError("Runner.call runs a traced function: make the Runner with "
                               "autopar.get_runner(train_step.get_concrete_function(...), ...)")
        # (a tf.data dataset's batches are eager tensors: a session feeds arrays)
        inputs = [v.numpy() if isinstance(v, tf.Tensor) else v for v in inputs]
        if len(inputs) != len(arguments):
            raise AutoparError(f"Runner.call: the function takes {len(arguments)} "
                               f"inputs, got {len(inputs)}")
        structured = self.lifted.outputs
        outputs = tf.nest.flatten(structured, expand_composites=True)
        tensors = [t for t in outputs if isinstance(t, tf.Tensor)]
        # the chief writes the function's summaries (Python's writers are
        # this process's; every worker's would write the same steps)
        summaries = self.lifted.summaries if self.is_chief else []
        written = [name for write in summaries for name in write.inputs]
        values = iter(self._run([t.name for t in tensors] + [CALL_OP] + written,
                               dict(zip(arguments, inputs))))
        if self._local_python and self.sync_state_each_call:
            self._read_into_python(self._local_python)
        result = tf.nest.pack_sequence_as(
            structured,
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
            self._input_free = input_free_writes(self.graph, self.is_chief)
        if self._input_free:
            self.session.run(self._input_free)

    def outputs_of_variables(self):
        """The traced function's outputs as it returns them, each a tensor's
        replaced by the lifted names of the variables alone it is computed
        from (graph_queries.variables_computed_from: a metric's result(),
        its total over its count), or by None when it depends on anything
        else (the step's batch); None without a traced function."""
        if self.lifted is None or self.lifted.inputs is None:
            return None
        structured = self.lifted.outputs
        outputs = tf.nest.flatten(structured, expand_composites=True)
        graph = self.lifted.graph
        return tf.nest.pack_sequence_as(structured, [
            variables_computed_from(graph.get_tensor_by_name(t.name))
            if isinstance(t, tf.Tensor) else None for t in outputs], expand_composites=True)

    def loss_counts_of(self, *inputs) -> list[float] | None:
        """This worker's counts of the batch's values that the losses
        divide by (transforms.loss_counts: computed from the input alone) for
        `inputs` fed to the traced function's inputs as call() feeds them,
        without a step; None when there are none or `inputs` are not all of
        the function's inputs."""
        arguments = self.lifted.inputs if self.lifted is not None else None
        if not self._loss_counts or arguments is None or len(inputs) != len(arguments):
            return None
        values = self._run(list(self._loss_counts), dict(zip(arguments, inputs)))
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
        self._read_into_python(list(self.lifted.python_variables) if variables is None else
                               [n for n in map(self.lifted_name, variables) if n is not None])

    def _read_into_python(self, names: list[str]) -> None:
        """This worker's values of the lifted variables `names` into their
        Python variables (seen there: no write for the graph), but for
        views (combine_metrics) and after Python's own writes went into the
        graph."""
        if self._watched:
            self._carry_python_writes()
        python = self.lifted.python_variables
        names = [name for name in names if name not in self._views
                 or not np.array_equal(python[name].numpy(), self._views[name][1])]
        if not names:
            return
        values = run_plain(self.session, {name: self._mapper.fetch(self._variables[name + ":0"])
                                          for name in names}, {})
        for name, value in values.items():
            self.lifted.python_variables[name].assign(value)
            if name in self._watched:
                self._watched[name] = self.lifted.python_variables[name].numpy()
