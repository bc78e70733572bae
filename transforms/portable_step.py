"""A lifted step (transforms.lift) that the other processes of a job take
instead of tracing the step themselves.

Every process of a job runs the same script, and autopar.fit traced the
model's step in each: seconds of CPU per process for a Keras model (tracing
builds every layer's ops and the backward pass in Python), for the same
graph every time. The process that compiles the job's plan packs its lifted
graph into it (`pack`), and a worker that receives the plan unpacks it
(`unpack`) when its own Python variables are the ones the package names.

A lifted variable stands for one of the process's Python variables: in
another process, for the variable at the same place in a list that both
processes make the same way before any trace (`variables`: autopar.fit's
model, metrics and optimizers, runtime/fit_step_variables.py), or among
those the trace made and the other process makes alike without it (the
slots of an optimizer the trace built), checked by name, shape and dtype. A
step is not packed (every process traces it, as before) when its trace made
another variable, when it writes summaries (to this process's writers), or
when it returns what the package cannot describe (a composite tensor, an
object).
"""
from __future__ import annotations

import base64
import json
import zlib

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.graph_utils import import_meta_graph
from autopar.transforms.lift import LiftedGraph

tf1 = tf.compat.v1


class NotPortable(Exception):
    """Why a lifted step cannot be packed, or a package not taken here."""


def pack(lifted: LiftedGraph, variables: list, made_by_trace=None) -> str:
    """`lifted` as text for another process whose `variables` are made as
    this one's (module docstring); `made_by_trace()`, when given, says what
    the trace built that the other process builds alike without it (a
    JSON value) and the variables that made, which the lifted graph may
    also stand for. Raises NotPortable saying why not."""
    if lifted.inputs is None:
        raise NotPortable("the step was not lifted from a ConcreteFunction")
    if lifted.summaries:
        raise NotPortable("the step writes summaries to this process's writers")
    built, made = made_by_trace() if made_by_trace is not None else (None, [])
    everything = [*variables, *made]
    place = {}
    for index, variable in enumerate(everything):
        place.setdefault(id(variable), index)

    def index_of(lifted_name: str, variable) -> int:
        index = place.get(id(variable))
        if index is None:
            raise NotPortable(f"its variable '{lifted_name}' was made by the trace, or is none "
                              "of the model's, metrics' or optimizers'")
        return index

    python = {name: index_of(name, v) for name, v in lifted.python_variables.items()}
    initial = {name: index_of(name, v) for name, v in lifted.initial_values.items()}
    graph = lifted.graph
    with graph.as_default():   # (export needs the graph's context under eager execution)
        meta = tf1.train.export_meta_graph(graph=graph, graph_def=graph.as_graph_def(),
                                           clear_devices=False)
    return json.dumps({
        # compressed before base64, which hides its repeats from the plan's zlib
        "meta_graph": base64.b64encode(zlib.compress(meta.SerializeToString())).decode("ascii"),
        "built": built,
        "python_variables": python,
        "initial_values": initial,
        "expected": {str(i): _described(everything[i]) for i in sorted(set(python.values()))},
        "inputs": lifted.inputs,
        "outputs": _encoded(lifted.outputs),
        "traced_shapes": lifted.traced_shapes,
    })


def unpack(text: str, variables: list, remake=None) -> LiftedGraph:
    """The LiftedGraph `pack` made, in a new graph, standing for this
    process's `variables` and for those `remake(built)` makes as the trace
    made them (`pack`'s made_by_trace). Raises NotPortable, before changing
    anything, when `variables` are not the ones the package names."""
    data = json.loads(text)
    expected = {int(i): described for i, described in data["expected"].items()}
    _check(variables, {i: d for i, d in expected.items() if i < len(variables)}, NotPortable)
    made = []
    if data["built"]:
        if remake is None:
            raise NotPortable("the trace built what this process cannot build")
        made = remake(data["built"])
    everything = [*variables, *made]
    # What remake built cannot be undone: a process that built it otherwise
    # would trace another step than the plan's. Their names only by the
    # last part: a trace names a variable in TensorFlow's name scopes, made
    # unique within its graph (a second optimizer named "adam_1" builds
    # "adam_1_1/..." after the first's second scope "adam_1"), where Keras's
    # own path of it, and a build outside any trace, keep "adam_1/...".
    _check(everything, {i: d for i, d in expected.items() if i >= len(variables)},
           UnsupportedGraphError, leaf=True,
           why="this process built its optimizers otherwise than the process that traced the "
               "step (every process must build the same model and optimizers): ")
    graph = tf.Graph()
    meta = tf1.MetaGraphDef()
    meta.ParseFromString(zlib.decompress(base64.b64decode(data["meta_graph"])))
    with graph.as_default():
        import_meta_graph(meta)
    for name, shape in data["traced_shapes"].items():
        graph.get_tensor_by_name(name).set_shape(shape)
    return LiftedGraph(
        graph,
        python_variables={n: everything[i] for n, i in data["python_variables"].items()},
        initial_values={n: everything[i] for n, i in data["initial_values"].items()},
        inputs=data["inputs"],
        outputs=_decoded(data["outputs"], graph))


def _check(variables: list, expected: dict, error, leaf: bool = False, why: str = "") -> None:
    for index, described in sorted(expected.items()):
        mine = _described(variables[index]) if index < len(variables) else None
        if leaf and mine is not None:
            mine, described = ([d[0].rsplit("/", 1)[-1], *d[1:]] for d in (mine, described))
        if mine != described:
            raise error(f"{why}this process's variable {index} is {mine}, the traced step's "
                        f"{described}")


def _described(variable) -> list:
    return [variable.name, variable.shape.as_list(), variable.dtype.base_dtype.name]


def _encoded(value):
    """A function's structured outputs as JSON: tensors by name."""
    if isinstance(value, tf.Tensor):
        return {"tensor": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if type(value) in (list, tuple):
        return {type(value).__name__: [_encoded(v) for v in value]}
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _encoded(v)] for k, v in value.items()]}
    raise NotPortable(f"the step returns a {type(value).__name__}")


def _decoded(data, graph: tf.Graph):
    (kind, value), = data.items()
    if kind == "tensor":
        return graph.get_tensor_by_name(value)
    if kind == "value":
        return value
    if kind == "dict":
        return {k: _decoded(v, graph) for k, v in value}
    items = [_decoded(v, graph) for v in value]
    return items if kind == "list" else tuple(items)
