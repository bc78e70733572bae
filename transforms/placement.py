"""Where ops next to server variables run (Parallax §5.3.2).

OPAU — ops after gradient aggregation, before the update, on the chief:
  a variable's own ops (clipping by the shared scale) run on its server, next
  to its aggregated gradient; another op runs where its non-scalar inputs are
  when they are all in one process ("local"), and on the first server when
  they come from several ("shared", e.g. the global norm of gradients held by
  different servers).
OPSW — light ops at the worker/server boundary (slice, cast, gather, size,
  l2_loss) that read a server variable move to its server when their output
  is smaller than the variable, so fewer bytes cross the network; otherwise
  they stay with their consumers on the worker.

Pure: a function of the graph, the Analysis and the Plan; the rewrite applies
the result and the Report lists every move with the bytes it saves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import tensorflow as tf

from autopar.common.roles import SERVER_JOB

if TYPE_CHECKING:   # annotations only: the plan imports the methods, which place ops here;
    # the analysis imports the features, of which weight-update sharding the methods
    from autopar.transforms.analysis import Analysis
    from autopar.transforms.plan import Plan

_LIGHT = frozenset({"Slice", "StridedSlice", "Cast", "Gather", "GatherV2", "ResourceGather",
                    "Size", "L2Loss", "Shape"})


def server_device(server: int) -> str:
    return f"/job:{SERVER_JOB}/task:{server}/device:CPU:0"   # see rewrite.worker_device


@dataclass(frozen=True)
class Place:
    """A process an op runs in: server `server`, or (server None) the worker
    whose graph is being rewritten."""
    server: int | None = None

    def device(self, worker_device: str) -> str:
        return worker_device if self.server is None else server_device(self.server)

    def __str__(self) -> str:
        return "worker" if self.server is None else f"server {self.server}"


WORKER = Place()


def server_place(index: int) -> Place:
    return Place(index)


@dataclass
class Move:
    op: str
    rule: str           # "OPAU" or "OPSW"
    place: Place
    bytes_saved: int    # per step, for the process that would otherwise send it
    why: str

    def as_dict(self) -> dict:
        """For the Report: the place in words."""
        return {"op": self.op, "rule": self.rule, "place": str(self.place),
                "bytes_saved": self.bytes_saved, "why": self.why}


def ps_devices(graph: tf.Graph, analysis: Analysis, plan: Plan, is_chief: bool,
               worker_device: str, moves: list[Move] | None = None
               ) -> tuple[dict[str, str], set[str]]:
    """(device of every op that leaves the worker, the variables and slots on
    servers) for one worker's graph: server variables with the ops on their
    handles, the chief's updates of them, and the OPAU/OPSW moves (`moves`
    if computed beforehand, else place_ops)."""
    devices: dict[str, str] = {}
    on_servers: set[str] = set()
    for vp in plan.server_variables:
        info = analysis.variable(vp.name)
        device = server_device(vp.servers[0])
        variables = [info.name, *info.slots]
        on_servers.update(variables)
        if len(vp.partitions) > 1:
            continue   # its uses were redirected to the partitions (transforms.partition)
        for name in variables:
            devices[name] = device
            handle = graph.get_operation_by_name(name).outputs[0]
            for consumer in handle.consumers():
                devices[consumer.name] = device   # resource ops live with the resource
        if is_chief:
            for name in info.update_ops:
                devices.setdefault(name, device)
    for move in place_ops(graph, analysis, plan) if moves is None else moves:
        if move.rule == "OPAU" and not is_chief:
            continue   # only the chief runs post-aggregation ops
        devices[move.op] = move.place.device(worker_device)
    return devices, on_servers


def place_ops(graph: tf.Graph, analysis: Analysis, plan: Plan) -> list[Move]:
    moves: list[Move] = []
    if plan.opau:
        moves += _opau(graph, analysis, plan)
    if plan.opsw:
        moves += _opsw(graph, analysis, plan)
    return moves


def _opau(graph, analysis, plan) -> list[Move]:
    ps = {vp.name: vp for vp in plan.server_variables}
    if not ps:
        return []
    where: dict[str, Place] = {}    # tensor -> place, for aggregated gradients and placed ops
    own: dict[str, Place] = {}
    norm_terms: set[str] = set()
    path: set[str] = set()
    for v in analysis.variables:
        vp = ps.get(v.name)
        place = server_place(vp.servers[0]) if vp else WORKER
        for t in (v.grad_tensor, v.grad_values, v.grad_indices):
            if t:
                where[t] = place
        path |= set(v.path_ops)
        if vp:
            for op in v.own_path_ops:
                own[op] = place
            if v.gradient == "sparse":
                norm_terms |= set(v.norm_ops)   # replaced by a worker all-reduce
    moves = []
    for op in graph.get_operations():          # creation order is topological
        if op.name not in path:
            continue
        if op.name in norm_terms:
            place = WORKER
        elif op.name in own:
            place = own[op.name]
            moves.append(_move(op, "OPAU", place, _tensor_bytes(op.inputs[0]),
                               "uses only its variable's aggregated gradient (and scalars)"))
        else:
            place, why = _rule(op, where)
            if place != WORKER:
                moves.append(_move(op, "OPAU", place, _tensor_bytes(op.inputs[0]), why))
        for t in op.outputs:
            where[t.name] = place
    return moves


def _rule(op, where: dict[str, Place]) -> tuple[Place, str]:
    """Local ops go where their (non-scalar, else any) placed inputs are;
    shared ops, fed from several processes, go to the first server."""
    places = {where[t.name] for t in op.inputs if t.name in where and t.shape.rank != 0}
    if not places:
        places = {where[t.name] for t in op.inputs if t.name in where}
    if len(places) == 1:
        return places.pop(), "local: all its inputs are in that process"
    if places:
        return server_place(0), "shared: inputs from several processes, placed on the first server"
    return WORKER, "no aggregated input"


def _opsw(graph, analysis, plan) -> list[Move]:
    moves = []
    for vp in plan.server_variables:
        if len(vp.partitions) > 1:
            continue   # reads are assembled from partitions on the worker
        info = analysis.variable(vp.name)
        place = server_place(vp.servers[0])
        for name in info.boundary_ops:
            op = graph.get_operation_by_name(name)
            if op.type not in _LIGHT or op.type == "ResourceGather":
                continue   # a gather on the handle always runs with the variable
            source = max(_tensor_bytes(t) for t in op.inputs)
            result = sum(_tensor_bytes(t) for t in op.outputs)
            if result < source:
                moves.append(_move(op, "OPSW", place, source - result,
                                   f"output ({result} B) smaller than the variable it reads ({source} B)"))
            else:
                moves.append(_move(op, "OPSW", WORKER, 0,
                                   f"output ({result} B) not smaller than its input ({source} B): stays"))
    return moves


def _move(op, rule, place, saved, why) -> Move:
    return Move(op=op.name, rule=rule, place=place, bytes_saved=int(saved), why=why)


def _tensor_bytes(t: tf.Tensor) -> int:
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        # Unknown rows (a batch): count the known part once, a lower bound.
        dims = [d for d in (shape.as_list() if shape.rank is not None else []) if d]
        n = 1
        for d in dims:
            n *= d
        return n * (t.dtype.size if t.dtype.is_numpy_compatible else 4)
    return int(shape.num_elements()) * (t.dtype.size if t.dtype.is_numpy_compatible else 4)
