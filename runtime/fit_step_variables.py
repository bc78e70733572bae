"""The Python variables autopar.fit's traced step may capture, for a worker
that takes the step's graph from the plan instead of tracing it
(runtime/step_graph.py, transforms/portable_step.py).

Before any trace: the model's variables (weights, seed generators), its
metrics' and its optimizers', in the order every process running the script
makes them. Keras builds an optimizer in its first `apply_gradients`, which
runs inside the traced step (the compiled optimizer in Keras's train step, a
GAN's two in a model's own): the process that traces records which variables
each optimizer the trace built was built for (`made_by_trace`), and a worker
that takes the graph builds its own optimizers for its variables at the same
places, as `apply_gradients` builds them (`remake`), so its optimizers hold
the same slots, by the same names, for the lifted graph's to stand for.
"""
from __future__ import annotations

from autopar.transforms.portable_step import NotPortable


class StepVariables:
    """The state of `model` a traced step may capture, taken now (before
    any trace): `variables`, the tf.Variables a trace captures."""

    def __init__(self, model) -> None:
        import keras
        self._keras = keras
        optimizer = getattr(model, "optimizer", None)
        # the optimizers of the model: the compiled one, then those it holds
        # as attributes (a GAN's), by attribute name
        found = [optimizer] if isinstance(optimizer, keras.optimizers.Optimizer) else []
        for _, value in sorted(vars(model).items()):
            if isinstance(value, keras.optimizers.Optimizer) and \
                    all(value is not o for o in found):
                found.append(value)
        self.optimizers = found
        self._unbuilt = [i for i, o in enumerate(found) if not o.built]
        # each once, the Keras variable beside the tf.Variable it holds
        self._keras_variables = self._new(
            [*model.variables, *model.metrics_variables, *(v for o in found for v in o.variables)],
            set())
        self.variables = [self._captured(v) for v in self._keras_variables]

    def _captured(self, variable):
        """What a trace captures of `variable`: a Keras variable's tf.Variable."""
        return variable.value if isinstance(variable, self._keras.Variable) else variable

    def _new(self, variables, known: set) -> list:
        """`variables` whose captured tf.Variable is not in `known` (ids),
        each once; `known` gets theirs."""
        new = []
        for v in variables:
            if id(self._captured(v)) not in known:
                known.add(id(self._captured(v)))
                new.append(v)
        return new

    def made_by_trace(self) -> tuple[list, list]:
        """After the trace: ([optimizer place, places of the variables it
        was built for] for each optimizer the trace built, the tf.Variables
        that building made, in order); the same at every call (a launcher
        compiles a job's plan again for a restart)."""
        place = {id(v): i for i, v in enumerate(self.variables)}
        known, built, made = set(place), [], []
        for i in self._unbuilt:
            optimizer = self.optimizers[i]
            if not optimizer.built:
                continue
            places = [place.get(id(self._captured(v)))
                      for v in optimizer._trainable_variables]  # pylint: disable=protected-access
            if None in places:
                raise NotPortable(f"the optimizer '{optimizer.name}' was built for variables the "
                                  "trace made")
            built.append([i, places])
            made += self._new(optimizer.variables, known)
        return built, [self._captured(v) for v in made]

    def remake(self, built: list) -> list:
        """Build the optimizers as `made_by_trace` says the trace built
        them (in their name scope, as Optimizer.apply builds one); returns
        the tf.Variables building made, in order."""
        from keras.src import backend   # Optimizer.apply's name scope: no public API
        for i, places in built:
            if i >= len(self.optimizers) or self.optimizers[i].built or \
                    any(p >= len(self.variables) for p in places):
                raise NotPortable(f"this process's optimizer {i} is not one left for the trace "
                                  "to build for its variables")
        known, made = {id(v) for v in self.variables}, []
        for i, places in built:
            optimizer = self.optimizers[i]
            with backend.name_scope(optimizer.name, caller=optimizer):
                optimizer.build([self._keras_variables[p] for p in places])
            optimizer.built = True
            made += self._new(optimizer.variables, known)
        return [self._captured(v) for v in made]
