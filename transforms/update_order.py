"""When a worker's update ops run relative to the step's gradients.

Three orders are added to a worker's rewritten graph (not with
micro-batches, where the run that updates computes no gradient):

- Each update op waits for its own variable's gradient, this worker's
  (`_updates_wait_for_gradients`).
- Each update of a reference variable (tf.compat.v1 without resource
  variables: VariableV2, what every graph built after
  `tf.compat.v1.disable_v2_behavior()` holds) waits for every gradient of
  its train group (`_reference_updates_after_the_gradients`). A reference
  variable's reads (`v/read`, an Identity) share the variable's buffer, and
  its update ops (ApplyMomentum, Assign...) write that buffer in place. The
  backward pass reads a layer's weights (the input gradient of a MatMul or
  Conv2D) after the weights' own gradient exists, so on one device TensorFlow
  may apply a layer's update while the layers below it are still being
  differentiated through the same buffer: which values they read is decided
  by thread timing (ResNet-20 from tf_cnn_benchmarks, float64, one step: two
  single-device runs differ by up to 1.1 in a momentum slot). A program's
  meaning is the gradient at the step's weights, which is what resource
  variables give (their reads copy before a write) and what one device gives
  when no update overtakes a read. Every op reading a variable in the step
  leads to one of its train group's gradients, so once all of them exist no
  read is left for an update to overtake.
- A reference variable's other reads in the step (another train group's
  backward pass through the layer, two train ops run together) read a copy
  taken before the update, which the update waits for
  (`_reference_reads_before_the_updates`).
"""
from __future__ import annotations

from collections import defaultdict

from autopar.transforms.analysis import Analysis
from autopar.transforms.graph_utils import op_name_of, readers_of

_REFERENCE_VARIABLE_TYPES = frozenset({"VariableV2", "Variable"})


def _gradient_node(variable) -> str:
    return op_name_of(variable.grad_tensor or variable.grad_values or "")


def _add_control_input(node, name: str) -> None:
    if "^" + name not in node.input:
        node.input.append("^" + name)


def order_updates(graph_def, analysis: Analysis, server_variables: set[str]) -> None:
    """The orders of the module docstring, in this worker's `graph_def`."""
    by_name = {node.name: node for node in graph_def.node}
    _updates_wait_for_gradients(by_name, analysis)
    _reference_updates_after_the_gradients(graph_def, by_name, analysis, server_variables)
    _reference_reads_before_the_updates(graph_def, by_name, analysis, server_variables)


def _updates_wait_for_gradients(by_name: dict, analysis: Analysis) -> None:
    """Each update op waits for its variable's gradient, this worker's. An
    update may write a slot from no gradient (tf.compat.v1's Adam decays m
    of a sparse gradient's variable, m *= beta1, then adds the rows): a run
    that fails before the gradient exists (a tf.data iterator at its end:
    OutOfRangeError) could run that write on some workers and not on
    others, and replicas would differ from then on (a server's copy would
    have decayed or not, by chance). Waiting, the write runs in no such
    run; a step that runs an update computes this worker's gradient anyway."""
    for v in analysis.variables:
        gradient = _gradient_node(v)
        if gradient not in by_name:
            continue
        for name in v.update_ops:
            node = by_name.get(name)
            if node is not None:
                _add_control_input(node, gradient)


def _reference_updates_after_the_gradients(graph_def, by_name: dict, analysis: Analysis,
                                           server_variables: set[str]) -> None:
    """Each update op of a reference variable this worker updates (not one
    on a server: a server's variable reaches workers as a copy) waits for
    every gradient of its train group, except one computed after the update
    (a gradient under the update's control dependencies)."""
    gradients_of_group = _gradients_of_groups(analysis, by_name)
    updates = [(name, v.group) for v, names in _own_reference_updates(analysis, by_name,
                                                                      server_variables)
               for name in names]
    if not updates:
        return
    consumers = {op: [node.name for node in nodes] for op, nodes in readers_of(graph_def).items()}
    for name, group in updates:
        after = _descendants(name, consumers)
        node = by_name[name]
        for gradient in gradients_of_group[group]:
            if gradient not in after:
                _add_control_input(node, gradient)


def _gradients_of_groups(analysis: Analysis, by_name: dict) -> dict[int, list[str]]:
    """{train group: the ops of its variables' gradients in this graph}."""
    gradients_of_group: dict[int, list[str]] = defaultdict(list)
    for v in analysis.variables:
        if _gradient_node(v) in by_name:
            gradients_of_group[v.group].append(_gradient_node(v))
    return gradients_of_group


def _own_reference_updates(analysis: Analysis, by_name: dict, server_variables: set[str]
                           ) -> list:
    """(variable, its update ops in this graph) for each reference variable
    this worker updates (not one on a server: a server's variable reaches
    workers as a copy) that has update ops here."""
    out = []
    for v in analysis.variables:
        updates = [name for name in v.update_ops if name in by_name]
        if updates and v.name not in server_variables and v.name in by_name \
                and by_name[v.name].op in _REFERENCE_VARIABLE_TYPES:
            out.append((v, updates))
    return out


def _descendants(name: str, consumers: dict[str, list[str]]) -> set[str]:
    seen, stack = set(), [name]
    while stack:
        for c in consumers.get(stack.pop(), ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return seen


def _reference_reads_before_the_updates(graph_def, by_name: dict, analysis: Analysis,
                                        server_variables: set[str]) -> None:
    """A reference variable's reads that its update need not wait for (no
    gradient of its train group is computed from them: another train
    group's backward pass through the layer, when a step runs two train
    ops, `tf.group(train_head, train_encoder)`) read a copy of the
    variable taken before the update instead of its buffer, and the update
    waits for the copy. Otherwise such a read sees the step's weights or the
    updated ones as thread timing decides, on one device too; what the
    step means is its weights'. Reads under the update's control
    dependencies (after it) keep the buffer."""
    gradients_of_group = _gradients_of_groups(analysis, by_name)
    consumers = None
    covered_by_group: dict[int, set[str]] = {}
    for v, updates in _own_reference_updates(analysis, by_name, server_variables):
        read = by_name.get(f"{v.name}/read")
        if read is None:
            continue
        # (the graph as the orders before left it)
        if consumers is None:
            consumers = {op: [node.name for node in nodes]
                         for op, nodes in readers_of(graph_def).items()}
        if v.group not in covered_by_group:
            covered_by_group[v.group] = _ancestors(gradients_of_group[v.group], by_name)
        after = set().union(*(_descendants(name, consumers) for name in updates))
        uncovered = [name for name in consumers.get(read.name, ())
                     if name not in covered_by_group[v.group] and name not in after
                     and name not in updates]
        if not uncovered:
            continue
        copy = graph_def.node.add()
        copy.name = f"{v.name}/autopar_read_before_update"
        copy.op = "Snapshot"
        copy.input.append(read.name)
        copy.attr["T"].CopyFrom(read.attr["T"])
        copy.device = read.device
        for name in uncovered:
            node = by_name[name]
            for i, inp in enumerate(node.input):
                if inp in (read.name, f"{read.name}:0"):
                    node.input[i] = copy.name
        for name in updates:
            _add_control_input(by_name[name], copy.name)
        by_name[copy.name] = copy


def _ancestors(names: list[str], by_name: dict) -> set[str]:
    """The ops `names` are computed from (data or control inputs), and them."""
    seen, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        stack.extend(op_name_of(inp.lstrip("^")) for inp in by_name[name].input)
    return seen
