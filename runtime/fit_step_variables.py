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
    any trace)."""

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
        self._keras_variables = []
        self.variables = []      # their tf.Variables, which a trace captures
        self._add([*model.variables, *model.metrics_variables,
                   *(v for o in found for v in o.variables)])
        self._before = len(self.variables)

    def _add(self, variables) -> None:
        """Add the ones not yet known (a Keras variable's tf.Variable)."""
        known = {id(v) for v in self.variables}
        for v in variables:
            captured = v.value if isinstance(v, self._keras.Variable) else v
            if id(captured) not in known:
                known.add(id(captured))
                self._keras_variables.append(v)
                self.variables.append(captured)

    def made_by_trace(self) -> tuple[list, list]:
        """After the trace: ([optimizer place, places of the variables it
        was built for] for each optimizer the trace built, the variables
        that building made, in order); the same at every call (a launcher
        compiles a job's plan again for a restart)."""
        place = {id(v): i for i, v in enumerate(self.variables[:self._before])}
        built = []
        for i in self._unbuilt:
            optimizer = self.optimizers[i]
            if not optimizer.built:
                continue
            places = [place.get(id(v.value if isinstance(v, self._keras.Variable) else v))
                      for v in optimizer._trainable_variables]  # pylint: disable=protected-access
            if None in places:
                raise NotPortable(f"the optimizer '{optimizer.name}' was built for variables the "
                                  "trace made")
            built.append([i, places])
            self._add(optimizer.variables)
        return built, self.variables[self._before:]

    def remake(self, built: list) -> list:
        """Build the optimizers as `made_by_trace` says the trace built
        them (in their name scope, as Optimizer.apply builds one); returns
        the variables building made, in order."""
        from keras.src import backend   # Optimizer.apply's name scope: no public API
        for i, places in built:
            if i >= len(self.optimizers) or self.optimizers[i].built or \
                    any(p >= self._before for p in places):
                raise NotPortable(f"this process's optimizer {i} is not one left for the trace "
                                  "to build for its variables")
        for i, places in built:
            optimizer = self.optimizers[i]
            with backend.name_scope(optimizer.name, caller=optimizer):
                optimizer.build([self._keras_variables[p] for p in places])
            optimizer.built = True
            self._add(optimizer.variables)
        return self.variables[self._before:]
