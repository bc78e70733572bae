"""Loops that map each example alone: tf.map_fn over the batch, a tf.scan
whose step reads its carry's shape only (keras-io's CTC label
densification), as TensorFlow 2's control flow builds them.

Such a loop unstacks the batch's rows into a TensorList, and iteration i
reads element i (example i), computes from it and from values every worker
holds alike, and writes element i of an output list; stacked, the output's
row i is example i's alone, whatever the loop's body computes. A worker's
loop runs over its share of the examples, and its output rows are one
device's rows of those examples.

What makes a While such a map, read from its functions' data flow (names
are not looked at):
- a counter: a loop variable from 0, its next value itself + 1;
- the condition: `counter < n` (or several such terms and-ed), every n a
  loop variable holding the batch's size (tf.shape(x)[0]), so the loop
  runs once per example of the worker's share;
- each loop variable holding a list of the batch's rows (TensorListFromTensor
  of a tensor whose examples run along axis 0, one row each) is read only
  at the counter (TensorListGetItem) or passed on unchanged;
- what those reads reach in the body reaches the loop's outputs only as the
  item written at the counter into an output list (TensorListSetItem) or
  pushed onto one (the tape's accumulators of intermediates, which its
  backward loop pops), or as a carried value the next iteration reads the
  shape of alone: never a carried value read otherwise (a scan's running
  sum), an index, or any other output; no item written is computed from
  the counter's value (the example's place in the worker's share);
- the output lists are not read back (an earlier example's item), every
  other loop variable is passed on unchanged (one not of the batch's
  values: a bound, a variable) or is such a carry, and every term of the
  condition bounds a counter (a variable stepping otherwise could end the
  loop before the batch's end; a value changed every iteration, a power
  of 2, is the place again);
- the body runs no stateful op but variable reads (a random draw per iteration would be
  the i-th draw of the worker's loop, not of one device's) nor a
  functional op (If, While, a call) the reads reach.

Anything else is left to the generic rule (ExampleRows._while), which
reads a list of the batch's rows as values of no known example
(`elems`)."""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.graph_utils import OF_SHAPES_ALONE, static_int

_PASS = ("Identity", "Snapshot")
_LIST_READS = frozenset({"TensorListGetItem"})
_LIST_WRITES = frozenset({"TensorListSetItem", "TensorListPushBack"})
_LIST_SHAPES = frozenset({"TensorListLength", "TensorListElementShape"})
_STATELESS_READS = frozenset({"ReadVariableOp", "ResourceGather", "NoOp"})
_FUNCTIONAL = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall",
                         "StatefulPartitionedCall", "Case", "StatelessCase"})


def _through(t: tf.Tensor) -> tf.Tensor:
    while t.op.type in _PASS and t.op.inputs:
        t = t.op.inputs[0]
    return t


def mapped_outputs(op: tf.Operation, forms: dict, body, cond,
                   batch_rows: tuple, size_form: tuple) -> list[int]:
    """The indices of `op`'s outputs (a functional While) that are lists
    whose element i is example i's alone, when the loop maps the examples
    as the module says; else []. `forms`: {tensor name: form} of the graph
    `op` is in; `body`, `cond`: its functions' graphs; `batch_rows`: the
    rows form of a tensor of the batch's examples, one row each, along
    axis 0; `size_form`: the form of their count."""
    outer_forms = [forms.get(t.name, ("shared",)) for t in op.inputs]
    if body is None or cond is None or len(body.inputs) != len(op.inputs) \
            or len(body.outputs) != len(op.inputs) or len(cond.inputs) != len(op.inputs):
        return []
    args = list(body.inputs)
    counters = {k for k, arg in enumerate(args)
                if static_int(op.inputs[k]) == 0 and _adds_one(_through(body.outputs[k]), arg)}
    if not counters or not _bounded_by_the_batch(cond, counters, outer_forms, size_form):
        return []
    counter_args = {args[k].name for k in counters}
    example_lists = {k for k in range(len(args))
                     if _lists_the_examples(op.inputs[k], forms, batch_rows)}
    # the lists are read at the counter only; reads' items are the seeds
    reads = []
    for k in example_lists:
        for consumer in _uses(args[k]):
            if consumer.type in _LIST_READS and _through(consumer.inputs[1]).name in counter_args:
                reads.append(consumer.outputs[0])
            elif consumer.type not in _LIST_SHAPES:
                return []
    if not reads:
        return []
    reached = _reached(reads)
    # the counter's value is the example's place in the worker's share, not
    # in one device's batch: no item written may be computed from it
    by_place = _reached(list(args[k] for k in counters), skip_index_of=_LIST_READS | _LIST_WRITES)
    written = {}
    for k, out in enumerate(body.outputs):
        source = _through(out)
        if k in counters:
            continue
        if source.op.type in _LIST_WRITES and source.op.inputs[0] is args[k]:
            item = source.op.inputs[2 if source.op.type == "TensorListSetItem" else 1]
            index_ok = source.op.type == "TensorListPushBack" or \
                _through(source.op.inputs[1]).name in counter_args
            # (the tape's accumulators keep their generic forms: they push
            # the counter too, the indices its backward loop reads at)
            if not index_ok or any(t.name in reached for t in source.op.inputs if t is not item) \
                    or source.op.type == "TensorListSetItem" and item.name in by_place \
                    or any(use is not source.op and use.type not in _LIST_SHAPES
                           for use in _uses(args[k])):   # an earlier item read back
                return []
            if outer_forms[k] not in (("shared",), ("list", ("shared",))):
                return []
            written[k] = source.op.type
        elif source is args[k]:
            # passed on unchanged: a bound, a variable, the examples' list
            if k not in example_lists and outer_forms[k][0] not in ("shared", "size", "shape"):
                return []   # another value of the batch's, read whole
        elif source.name in reached and _shape_alone_read(args[k]):
            # a carry the next iteration reads the shape of alone (a scan
            # whose step reads its carry's shape): its value, the last
            # example's, is left to the generic rule
            continue
        else:
            # a value changed from iteration to iteration otherwise (a scan's
            # running sum, a power of 2 per step): what depends on it depends
            # on the examples before, or on the place
            return []
    for body_op in body.get_operations():
        if body_op.type in _FUNCTIONAL and any(t.name in reached for t in body_op.inputs):
            return []
        if body_op.op_def.is_stateful and body_op.type not in _STATELESS_READS \
                and not body_op.type.startswith("TensorList"):
            return []
    return [k for k, kind in written.items() if kind == "TensorListSetItem"]


def _uses(t: tf.Tensor) -> list:
    """The ops of a function's graph reading `t`, through identities."""
    uses, stack = [], [t]
    while stack:
        for consumer in stack.pop().consumers():
            if consumer.type in _PASS:
                stack.extend(consumer.outputs)
            else:
                uses.append(consumer)
    return uses


def _shape_alone_read(arg: tf.Tensor) -> bool:
    """Whether the body reads `arg` only through its shape."""
    return all(use.type in OF_SHAPES_ALONE for use in _uses(arg))


def _adds_one(t: tf.Tensor, arg: tf.Tensor) -> bool:
    if t.op.type not in ("AddV2", "Add"):
        return False
    a, b = (_through(x) for x in t.op.inputs)
    return (a is arg and static_int(b) == 1) or (b is arg and static_int(a) == 1)


def _bounded_by_the_batch(cond, counters: set, outer_forms: list, size_form: tuple) -> bool:
    """Whether the condition is `counter < n` terms and-ed, every n the
    batch's size and one counter among them."""
    args = {t.name: k for k, t in enumerate(cond.inputs)}
    stack, terms = [_through(cond.outputs[0])], []
    while stack:
        t = _through(stack.pop())
        if t.op.type == "LogicalAnd":
            stack.extend(t.op.inputs)
        elif t.op.type == "Less":
            terms.append((_through(t.op.inputs[0]), _through(t.op.inputs[1])))
        else:
            return False
    if not terms:
        return False
    # (every term's: a variable stepping otherwise could end the loop early)
    return all(args.get(left.name) in counters and args.get(right.name) is not None
               and outer_forms[args[right.name]] == size_form for left, right in terms)


def _lists_the_examples(t: tf.Tensor, forms: dict, batch_rows: tuple) -> bool:
    """A TensorList of the batch's rows, one element per example."""
    source = _through(t)
    return source.op.type == "TensorListFromTensor" and \
        forms.get(source.op.inputs[0].name) == batch_rows


def _reached(seeds: list, skip_index_of=frozenset()) -> set:
    """Names of the tensors of a function's graph computed from `seeds`
    (not through the index input of the op types `skip_index_of`)."""
    reached, stack = set(), list(seeds)
    while stack:
        t = stack.pop()
        if t.name in reached:
            continue
        reached.add(t.name)
        for consumer in t.consumers():
            if consumer.type in skip_index_of and len(consumer.inputs) > 1 \
                    and consumer.inputs[1] is t and consumer.inputs[0] is not t:
                continue
            stack.extend(consumer.outputs)
    return reached
