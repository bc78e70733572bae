"""The wire dtype: the dtype a dense float gradient travels (and is summed)
in, an axis of its own across the methods. Config.wire_dtype asks for one
for the job; each method says which narrower dtypes its transport carries,
and for gradients of which dtypes (SyncMethod.wire_dtypes), and a gradient
travels in the asked-for dtype where its method carries it, else in its own
(VariablePlan.wire_dtype says which, per variable). The mean is taken in
full precision either way.

Which transport carries what: TensorFlow's collective ops (the ring, flat or
by 2-D summation) carry float16 but no bfloat16; herring's transport carries
both, from float32, the dtype its summation servers add.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# The dtypes a dense float gradient may travel in (Config.wire_dtype).
WIRE_DTYPES = ("float32", "float16", "bfloat16")
# Bytes per element of each.
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# {wire dtype: the gradient dtypes narrowed to it} of TensorFlow's
# collective ops, which carry no bfloat16.
COLLECTIVES = {"float16": ("float32", "float64")}


def narrowed(dtype: str, requested: str, carried: Mapping[str, tuple[str, ...]]) -> str:
    """The dtype a ``dtype`` gradient travels in under
    Config.wire_dtype=``requested`` on a transport carrying ``carried``
    ({wire dtype: the gradient dtypes it narrows to it}); "" for its own."""
    return requested if dtype in carried.get(requested, ()) else ""


def wire_fraction(dtype: str, wire_dtype: str | None) -> float:
    """Bytes on the wire per byte of a ``dtype`` gradient sent as ``wire_dtype``."""
    if not wire_dtype:
        return 1.0
    return WIRE_BYTES[wire_dtype] / np.dtype(dtype).itemsize
