"""Herring's transport: push/pull of balanced fusion buffers to the
summation servers (cpp_ops/herring_ops.cc, the op; cpp_ops/sum_server.cc,
the server). The op library is built for the TensorFlow imported on its
first use (runtime/native.py); server addresses are not in the graph (the
kernel reads AUTOPAR_SUMSERVERS at run time)."""
from __future__ import annotations

import threading

import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.transforms.methods.herring.bfb import FusionBuffer
from autopar.transforms.methods.wire import WIRE_DTYPES

# Elements per segment on the wire (64 KiB of float32): the server sums a
# segment as soon as every contributor's copy is in, so sending, summing and
# returning overlap segment by segment. A shard of a small model is only a
# few hundred KiB (the sparse LM's 1.3 MB of dense gradients over 4 servers
# in 2 buffers: 164 KiB), so 1 MiB segments made each shard one segment and
# nothing came back before everything was sent: at 100 Mbit/s a herring step
# took 392-455 ms with 1 MiB segments and 337-349 ms with 64 KiB ones. A
# 100 MiB buffer at 1 Gbit/s averages as fast with either (1.10-1.22 s
# against 1.14-1.15 s, 4 workers, 4 servers).
SEGMENT_ELEMENTS = 1 << 14
# ... but a shard of few segments still sends a large part of itself before
# anything comes back: with 8 servers the sparse LM's 1.3 MB buffer has
# 163 KiB shards, 3 segments, and at 25 Mbit/s a worker sent for 200 ms
# before its first result arrived. So a buffer's segments are at most
# 1/SEGMENTS_PER_SHARD of its largest shard, down to MIN_SEGMENT_ELEMENTS.
SEGMENTS_PER_SHARD = 16
MIN_SEGMENT_ELEMENTS = 1 << 11


def segment_elements_for(fusion_buffer: FusionBuffer) -> int:
    """Elements per segment on the wire for ``fusion_buffer`` (the same on
    every contributor: it depends on the plan's layout only)."""
    largest = max((s.length for s in fusion_buffer.shards), default=0)
    return max(MIN_SEGMENT_ELEMENTS, min(SEGMENT_ELEMENTS, -(-largest // SEGMENTS_PER_SHARD)))


_herring_module = None
_herring_lock = threading.Lock()


def herring_ops():
    """The loaded op library (tf.load_op_library, once per process), built
    for the TensorFlow this process imported on its first use
    (runtime/native.py; the one build step a graph transform may start)."""
    global _herring_module
    with _herring_lock:
        if _herring_module is None:
            from autopar.runtime import native
            try:
                path = native.herring_ops_path(native.TensorFlowBuild.of_imported())
            except native.BuildError as exc:
                raise AutoparError(f"autopar's Herring transport is unavailable: {exc}") from exc
            _herring_module = tf.load_op_library(str(path))
        return _herring_module


def push_pull(buffer: tf.Tensor, fusion_buffer: FusionBuffer, *, num_contributors: int,
              contributor_index: int, wire_dtype: str = "float32", average: bool = True,
              timeout_s: float = 0.0, segment_elements: int | None = None,
              name: str | None = None) -> tf.Tensor:
    """The element-wise mean (sum if not ``average``) of the 1-D float32
    ``buffer`` over ``num_contributors`` processes, each of which runs this op
    with the same ``fusion_buffer`` and options and its own
    ``contributor_index``.

    ``fusion_buffer`` is the buffer's entry of the Plan's fusion layout
    (bfb.py): the op gets it as a serialized FusionBuffer message
    (transforms/fusion_layout.proto) and the kernel reads the buffer's index
    (which contributions meet), size and shard table from it. Shards
    (server index, offset, length) are contiguous from offset 0 and cover
    the buffer; a shard goes to the summation server at position ``server``
    of AUTOPAR_SUMSERVERS (read by the kernel at run time, so the graph names
    no host). ``wire_dtype`` float16/bfloat16 halves the bytes sent (workers
    convert, servers accumulate in float32). ``timeout_s`` (0:
    AUTOPAR_HERRING_TIMEOUT_S, else 60 s) bounds the wait for a result; a
    lost server connection fails the op at once. ``segment_elements``: the
    unit the server sums and returns (None: segment_elements_for). Every
    process must run its pushes of one buffer index in the same order (the
    n-th meets the n-th)."""
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES}, not {wire_dtype!r}")
    if not 0 <= contributor_index < num_contributors:
        raise ValueError(f"contributor_index {contributor_index} not in [0, {num_contributors})")
    shards = [(s.server, s.offset, s.length) for s in fusion_buffer.shards]
    offset = 0
    for server, start, length in shards:
        if start != offset or length < 0 or server < 0:
            raise ValueError(f"shards must be contiguous from offset 0: {shards}")
        offset += length
    if not shards or offset != fusion_buffer.elements:
        raise ValueError(f"the shards {shards} must cover the buffer's {fusion_buffer.elements} elements")
    size = buffer.shape[0] if buffer.shape.rank == 1 else None
    if size is not None and size != offset:
        raise ValueError(f"shards cover {offset} elements but the buffer has {size}")
    return herring_ops().autopar_herring_push_pull(
        buffer=buffer, fusion_buffer=fusion_buffer.to_proto().SerializeToString(),
        num_contributors=num_contributors, contributor_index=contributor_index,
        wire_dtype=wire_dtype, average=average, timeout_s=timeout_s,
        segment_elements=segment_elements or segment_elements_for(fusion_buffer), name=name)
