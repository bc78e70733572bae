"""Ring all-reduce in float16 (as Horovod's fp16 compression): under
Config(wire_dtype="float16") every float32 or float64 bucket is cast to
float16, summed in it on the ring (flat or by 2-D summation) and cast back;
the mean is taken in full precision. Half the bytes on every link, at the
cost of float16's precision (an 11-bit significand, sums overflowing past
65504).

A variant of the ring all-reduce (SyncMethod.refines): the policy sends a
dense gradient to "allreduce", and this method takes the float32/float64
ones over. Its buckets continue the all-reduce's collective chains, so
every worker launches the two methods' collectives in one order.

bfloat16 narrows no bucket here: TensorFlow's collective ops carry no
bfloat16 (herring's transport does, transforms/methods/herring)."""
from __future__ import annotations

from autopar.transforms.methods.allreduce.method import AllReduce

WIRE_DTYPE = "float16"
COMPRESSED = ("float32", "float64")   # the gradient dtypes it narrows


def ring_wire_dtype(dtype: str, wire_dtype: str) -> str:
    """The dtype a ring bucket of `dtype` gradients travels in under
    Config.wire_dtype, "" for its own."""
    return WIRE_DTYPE if wire_dtype == WIRE_DTYPE and dtype in COMPRESSED else ""


class AllReduceFp16(AllReduce):
    name = "allreduce_fp16"
    refines = "allreduce"

    def takes_over(self, v, options):
        if ring_wire_dtype(v.dtype, options.wire_dtype):
            return f"sent as {WIRE_DTYPE} on the ring (Config.wire_dtype)"
        return ""

    def bucket_wire_dtype(self, dtype, options):
        return ring_wire_dtype(dtype, options.wire_dtype)
