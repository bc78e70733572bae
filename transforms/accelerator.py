"""A worker's replica on its GPU (docs/gpus.md): the last GraphDef pass of a
GPU worker's rewrite (transforms.rewrite), applied only when the worker owns
a GPU, so a CPU worker's graph is what it always was.

Everything the rewrite placed on the worker's CPU moves to its GPU, except:

- the native transport's ops (herring's push/pull: a CPU kernel, its
  sockets on the host), and whatever the spec's servers hold (variables
  and the ops placed with them), which stay where they are;
- collectives of a dtype NCCL does not sum (integers, bfloat16: counts,
  row indices, the global step's broadcast), which stay on the CPU in their
  group, as on a CPU worker.

TensorFlow completes a collective group with one device type for all its
members, so the collectives that move keep their instance keys but join
their group's GPU twin (keys.ACCELERATOR_GROUPS.first + its key). Those
whose every worker launches them in one order (the fused gradient
all-reduces, chained: SyncMethod.ordered_collectives) ask for NCCL; the
others stay on the ring implementation, which has no such requirement. TF
inserts the copies between devices; ops with no GPU kernel (input
pipelines, accumulators) stay on the CPU by soft placement, which a GPU
worker's session turns on (runtime/session.py).

Where the process sees no GPU (a spec declaring GPUs on a machine without
them) the same graph runs on its CPU by soft placement, with the ring
instead of NCCL: the job trains as on CPUs, and the worker says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.common.roles import WORKER_JOB
from autopar.transforms.graph_utils import op_name_of
from autopar.transforms.keys import ACCELERATOR_GROUPS

COLLECTIVES = {  # op type -> (input index of the group key, of the instance key)
    "CollectiveReduceV2": (2, 3), "CollectiveGatherV2": (2, 3), "CollectiveAllToAllV2": (2, 3),
    "CollectiveBcastSendV2": (2, 3), "CollectiveBcastRecvV2": (1, 2)}
# What NCCL sums (and TensorFlow's GPU collectives keep in device memory).
GPU_DTYPES = {tf.float16.as_datatype_enum, tf.float32.as_datatype_enum,
              tf.float64.as_datatype_enum}
# Ops with a CPU kernel only, which talk to the host's sockets.
HOST_OPS = {"AutoparHerringPushPull"}


@dataclass(frozen=True)
class Accelerator:
    """A worker's GPU: where its replica runs and which implementation its
    launch-ordered collectives ask for ("nccl"; "ring" where the process
    sees no GPU and soft placement runs everything on the CPU)."""
    hint: str = "nccl"


def accelerator_device(worker_index: int) -> str:
    """The first GPU the worker sees (its CUDA_VISIBLE_DEVICES' first id)."""
    return f"/job:{WORKER_JOB}/task:{worker_index}/device:GPU:0"


def place_on_accelerator(graph_def, cpu: str, gpu: str, ordered_keys: set[int],
                         accelerator: Accelerator) -> None:
    """Move `graph_def`'s ops from the worker's `cpu` to its `gpu` (module
    docstring), in place."""
    by_name = {node.name: node for node in graph_def.node}
    twins: dict[int, str] = {}
    for node in list(graph_def.node):
        if node.device != cpu or node.op in HOST_OPS:
            continue
        if node.op not in COLLECTIVES:
            node.device = gpu
            continue
        if node.attr["T"].type not in GPU_DTYPES:
            continue     # stays on the CPU, in its group
        group_at, key_at = COLLECTIVES[node.op]
        group = _const_int(by_name, node.input[group_at], node)
        node.input[group_at] = twins.get(group) or _twin(graph_def, twins, group, gpu)
        node.device = gpu
        key = _const_int(by_name, node.input[key_at], node, required=False)
        hint = accelerator.hint if key in ordered_keys else "ring"
        node.attr["communication_hint"].s = hint.encode()


def _twin(graph_def, twins: dict[int, str], group: int, device: str) -> str:
    """The Const of group `group`'s GPU twin key, added once."""
    name = f"autopar/accelerator/group_key_{group}"
    value = tf.make_tensor_proto(ACCELERATOR_GROUPS.key(group), tf.int32)
    node = graph_def.node.add(name=name, op="Const", device=device)
    node.attr["dtype"].type = tf.int32.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(value)
    twins[group] = name
    return name


def _const_int(by_name: dict, tensor: str, consumer, required: bool = True) -> int | None:
    """The integer a Const feeds `consumer` through `tensor` (None if it is
    no Const and not `required`)."""
    node = by_name.get(op_name_of(tensor))
    if node is None or node.op != "Const":
        if not required:
            return None
        raise AutoparError(f"cannot place collective {consumer.name} on the worker's GPU: its "
                           f"group key {tensor} is not a constant; please report this")
    return int(tf.make_ndarray(node.attr["value"].tensor))
