"""Why a variable cannot live on the parameter servers, or be split into
row partitions there, from data flow: a function body reads it, the program
writes it besides its update, its update runs under a tf.cond, or its
update uses the whole variable's value. The analysis sets
VariableInfo.ps_blocker and partition_blocker from them; the policies keep
such a variable replicated (transforms.methods.policy).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.transforms.graph_utils import initialization_guard

if TYPE_CHECKING:   # annotations only: the analysis imports this module
    from autopar.transforms.analysis import VariableInfo
    from autopar.transforms.graph_index import GraphIndex


# Ops running a function body (functional control flow, calls).
FUNCTION_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                           "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})


def read_in_a_function(graph, var: str) -> str:
    """Why variable `var` cannot live on a server because a function body
    reads it ("" when none does): its handle enters a While loop (a Keras
    LSTM's), a cond or a call, whose body reads it across the network inside
    the op, where the step's barrier (transforms.methods.ps.rewrite) cannot order
    the read against a peer's end of step (seen: 'Aborted: Cleanup <step
    id>' on the server). An initialization guard (graph_utils) is replaced
    by the rewrite and does not count."""
    frontier, seen = [graph.get_operation_by_name(var)], set()
    while frontier:
        op = frontier.pop()
        for c in op.outputs[0].consumers() if op.outputs else []:
            if c.name in seen:
                continue
            seen.add(c.name)
            if c.type == "Identity":
                frontier.append(c)
            elif c.type in FUNCTION_OPS and initialization_guard(c) is None:
                return (f"read inside '{c.name}' ({c.type}): a function body's read of a server "
                        "variable is not ordered by the step's end-of-step barrier")
    return ""


def written_outside_update(graph, info: VariableInfo, writers: dict[str, list[str]]) -> str:
    """Why variable `info` cannot live on a server because the program
    writes it besides its update ("" when it does not): Keras's weight decay
    (w -= w * wd * lr before the update), a constraint's projection after
    it, a hand-written assign. Every worker runs such a write, so on a
    server's single copy it would apply once per worker, where one device
    applies it once; replicated, each worker applies it to its own copy."""
    update = set(info.update_ops)
    for name in writers.get(info.name, []):
        if name not in update:
            op = graph.get_operation_by_name(name)
            return (f"'{name}' ({op.type}) writes it outside its update: every worker would "
                    "apply that write to the server's one copy")
    return ""


def conditional_ops(index: GraphIndex) -> dict[str, str]:
    """{op: the Switch it runs under} for every op that runs only when a
    Switch's output is live: reached from a Switch along data or control
    edges without passing the Merge (or a loop's Exit) that ends its
    conditional. A tf.cond in control flow v1, and a functional one lowered
    to it (transforms.lower_cond)."""
    out: dict[str, str] = {}
    ends = ("Merge", "RefMerge", "Exit", "RefExit")
    for i, op in enumerate(index.ops):
        if op.type not in ("Switch", "RefSwitch"):
            continue
        frontier = [i]
        while frontier:
            j = frontier.pop()
            for k in index.succs[j] + index.control_succs[j]:
                name = index.names[k]
                if name not in out and index.ops[k].type not in ends:
                    out[name] = op.name
                    frontier.append(k)
    return out


def updated_conditionally(info: VariableInfo, conditional: dict[str, str]) -> str:
    """Why variable `info` cannot live on a server because its update runs
    under a condition ("" when it does not): Keras's LossScaleOptimizer
    applies the update only when every gradient is finite. The servers'
    protocol takes the aggregate and applies it every step."""
    for name in info.update_ops:
        if name in conditional:
            return (f"its update '{name}' runs only when '{conditional[name]}' (Switch) lets it "
                    "(a tf.cond around the update: a loss-scale optimizer skipping steps whose "
                    "gradients are not finite, gradient accumulation): a server applies its "
                    "update every step")
    return ""


# Ops a whole-variable value may pass through on its way into an update
_SHAPE_PASSING = frozenset({"Identity", "StridedSlice", "Slice", "Cast", "Shape", "Pack",
                            "ConcatV2", "Reshape", "ExpandDims", "Squeeze"})


def whole_values_in_update(graph, info: VariableInfo) -> str:
    """Why the update cannot run once per row partition ("" when it can): it
    takes, from outside the ops that write the variable, a value or the shape
    of the whole variable or of a slot (Keras 3's SGD with momentum reads its
    momentum before the write, and makes a sparse gradient dense to the
    variable's shape). A partition's copy of the update would then combine
    its own rows with every row."""
    region = set(info.update_ops) | set(info.own_path_ops)
    handles = {info.name, *info.slots}
    for name in sorted(region):
        stack, seen = [t.op for t in graph.get_operation_by_name(name).inputs], set()
        while stack:
            op = stack.pop()
            if op.name in seen or op.name in region:
                continue
            seen.add(op.name)
            if (op.type in ("ReadVariableOp", "VariableShape")
                    and op.inputs[0].op.name in handles):
                return (f"its update '{name}' uses '{op.name}' ({op.type}) of the whole "
                        "variable or a slot, computed outside the ops that write it")
            if op.type in _SHAPE_PASSING:
                stack.extend(t.op for t in op.inputs)
    return ""
