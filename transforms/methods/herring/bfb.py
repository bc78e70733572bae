"""Balanced fusion buffers (Herring §III-B): the layout of every dense
gradient the `herring` method averages, derived from the graph alone so every
process computes the same table with no negotiation.

Order. Herring numbers gradients in the order worker 0 produced them in its
first iteration and broadcasts that list. Here the order is read from the
graph instead: a gradient's position is the creation position of its op
(Analysis `grad_position`). tf.gradients builds an op's gradient only once
all of its output gradients exist, i.e. in an order the backward pass can run
in, so the last layer's gradients come first. Every process imports the same
graph, so every process derives the same order; ties (none in practice) go
to the variable name.

Layout. The gradients, flattened, are concatenated in that order into one
stream of M elements, cut into buffers of B elements each (the last may be
smaller); a gradient may span two (or more) buffers. Each buffer is cut into
S equal contiguous shards, shard i to server i; B is a multiple of S so every
full buffer splits exactly; the last buffer's shards differ by at most one
element (the first ones are larger) and empty shards are left out.

Buffer size. From model and cluster size (Herring: "automatically computed
based on the cluster size and model size"): B = M / TARGET_BUFFERS, so
about that many buffers can travel while the rest of the backward pass
runs, but no smaller than S x MIN_SHARD_BYTES (a shard much smaller than
that costs more in per-message overhead than it moves) and no larger than
MAX_BUFFER_BYTES (one buffer's worth waits for its last gradient), then
rounded up to a multiple of S elements and capped at M rounded up the same
way. Config(herring_buffer_bytes=...) overrides it (rounded the same way).

Elements are counted in float32, the precision of the transport's
summation; the bytes a buffer puts on the wire depend on the wire dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ELEMENT_BYTES = 4                # float32: what the summation servers add
TARGET_BUFFERS = 8
MIN_SHARD_BYTES = 256 << 10
MAX_BUFFER_BYTES = 64 << 20


@dataclass
class Segment:
    """Elements [start, start + length) of one flattened gradient, at
    `offset` in its buffer."""
    variable: str
    start: int
    offset: int
    length: int


@dataclass
class Shard:
    """Elements [offset, offset + length) of a buffer, summed by `server`."""
    server: int
    offset: int
    length: int


@dataclass
class FusionBuffer:
    index: int
    elements: int
    segments: list[Segment]
    shards: list[Shard]
    # Host-local collectives of this buffer with local aggregation (reduce
    # within the host at la_key, share the result back at la_key + 1).
    la_key: int = 0

    @property
    def variables(self) -> list[str]:
        return [s.variable for s in self.segments]

    @classmethod
    def of_shards(cls, index: int, shards) -> "FusionBuffer":
        """A buffer given only its (server, offset, length) shards and no
        gradients (the transport's own tests and benchmark)."""
        shards = [Shard(*s) for s in shards]
        return cls(index=index, elements=sum(s.length for s in shards), segments=[], shards=shards)

    def to_proto(self, pb=None):
        """This buffer as a transforms/fusion_layout.proto FusionBuffer
        message (what the push/pull kernel reads its shard table from)."""
        msg = (pb or _proto_module()).FusionBuffer(index=self.index, elements=self.elements,
                                                   la_key=self.la_key)
        for s in self.segments:
            msg.segments.add(variable=s.variable, start=s.start, offset=s.offset, length=s.length)
        for s in self.shards:
            msg.shards.add(server=s.server, offset=s.offset, length=s.length)
        return msg


@dataclass
class FusionLayout:
    buffer_elements: int          # B: every buffer but the last has this many
    order: list[str]              # variables in gradient production order
    sizes: list[int]              # their element counts, same order
    buffers: list[FusionBuffer]
    num_servers: int
    wire_dtype: str = "float32"
    size_why: str = ""            # how B was chosen

    @property
    def total_elements(self) -> int:
        return sum(self.sizes)

    def buffers_of(self, variable: str) -> list[int]:
        return [b.index for b in self.buffers if variable in b.variables]

    def to_proto(self):
        """The table as a transforms/fusion_layout.proto FusionLayout message."""
        pb = _proto_module()
        msg = pb.FusionLayout(buffer_elements=self.buffer_elements, num_servers=self.num_servers,
                              wire_dtype=self.wire_dtype, size_why=self.size_why)
        for name, size in zip(self.order, self.sizes):
            msg.gradients.add(variable=name, elements=size)
        msg.buffers.extend(b.to_proto(pb) for b in self.buffers)
        return msg

    @classmethod
    def from_proto(cls, msg) -> "FusionLayout":
        return cls(buffer_elements=msg.buffer_elements,
                   order=[g.variable for g in msg.gradients],
                   sizes=[g.elements for g in msg.gradients],
                   buffers=[FusionBuffer(
                       index=b.index, elements=b.elements, la_key=b.la_key,
                       segments=[Segment(s.variable, s.start, s.offset, s.length) for s in b.segments],
                       shards=[Shard(s.server, s.offset, s.length) for s in b.shards])
                       for b in msg.buffers],
                   num_servers=msg.num_servers, wire_dtype=msg.wire_dtype, size_why=msg.size_why)


def production_order(variables) -> list:
    """`variables` (Analysis VariableInfo) in the order the backward pass
    produces their gradients (see the module docstring)."""
    return sorted(variables, key=lambda v: (v.grad_position, v.name))


def buffer_elements(total_elements: int, num_servers: int,
                    override_bytes: int | None = None) -> tuple[int, str]:
    """(B, why) for a model of `total_elements` gradient elements over
    `num_servers` servers (see the module docstring for the rule)."""
    s = max(1, num_servers)
    cap = _round_up(max(total_elements, 1), s)
    if override_bytes is not None:
        b = _round_up(max(1, override_bytes // ELEMENT_BYTES), s)
        return min(b, cap), f"Config(herring_buffer_bytes={override_bytes})"
    target = math.ceil(total_elements / TARGET_BUFFERS)
    low = s * MIN_SHARD_BYTES // ELEMENT_BYTES
    high = MAX_BUFFER_BYTES // ELEMENT_BYTES
    b = _round_up(min(max(target, low), high), s)
    return min(b, cap), (f"model/{TARGET_BUFFERS}, at least {s} servers x "
                         f"{MIN_SHARD_BYTES >> 10} KiB, at most {MAX_BUFFER_BYTES >> 20} MiB")


def layout(gradients: list[tuple[str, int]], num_servers: int, buffer_size: int,
           wire_dtype: str = "float32", size_why: str = "") -> FusionLayout:
    """The buffers of `gradients` ([(variable, elements)] in production order)
    for `num_servers` servers, `buffer_size` elements per buffer (a multiple
    of num_servers)."""
    if buffer_size <= 0 or buffer_size % max(1, num_servers):
        raise ValueError(f"buffer size {buffer_size} must be a positive multiple of the "
                         f"server count {num_servers}")
    total = sum(n for _, n in gradients)
    buffers = [FusionBuffer(index=k, elements=min(buffer_size, total - k * buffer_size),
                            segments=[], shards=[])
               for k in range(math.ceil(total / buffer_size))]
    position = 0   # of the gradient's first element in the stream
    for name, n in gradients:
        done = 0
        while done < n:
            k, offset = divmod(position + done, buffer_size)
            length = min(n - done, buffer_size - offset)
            buffers[k].segments.append(Segment(name, done, offset, length))
            done += length
        position += n
    for b in buffers:
        b.shards = shards(b.elements, num_servers)
    return FusionLayout(buffer_elements=buffer_size, order=[g for g, _ in gradients],
                        sizes=[n for _, n in gradients], buffers=buffers,
                        num_servers=num_servers, wire_dtype=wire_dtype, size_why=size_why)


def shards(elements: int, num_servers: int) -> list[Shard]:
    """`elements` cut into num_servers contiguous pieces differing by at most
    one element, the larger first; empty pieces are left out."""
    base, extra = divmod(elements, num_servers)
    out, offset = [], 0
    for server in range(num_servers):
        length = base + (1 if server < extra else 0)
        if length:
            out.append(Shard(server, offset, length))
        offset += length
    return out


def plan_layout(analysis, names: set[str], num_servers: int, wire_dtype: str = "float32",
                override_bytes: int | None = None) -> FusionLayout:
    """The layout of the variables `names` of `analysis` (dense gradients).
    Each train group (Analysis.train_groups) has buffers of its own, laid
    out as its own stream and numbered after the previous group's: a step
    of one train op must not need another's gradients."""
    ordered = production_order([v for v in analysis.variables if v.name in names])
    gradients = [(v.name, math.prod(v.shape)) for v in ordered]
    b, why = buffer_elements(sum(n for _, n in gradients), num_servers, override_bytes)
    groups = sorted({v.group for v in ordered})
    if len(groups) <= 1:
        return layout(gradients, num_servers, b, wire_dtype, why)
    parts = [layout([(v.name, math.prod(v.shape)) for v in ordered if v.group == g],
                    num_servers, b, wire_dtype, why) for g in groups]
    buffers = []
    for part in parts:
        for buffer in part.buffers:
            buffer.index = len(buffers)
            buffers.append(buffer)
    return FusionLayout(buffer_elements=b, order=[n for p in parts for n in p.order],
                        sizes=[n for p in parts for n in p.sizes], buffers=buffers,
                        num_servers=num_servers, wire_dtype=wire_dtype, size_why=why)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _proto_module():
    """The generated fusion_layout_pb2 (made at install, like the coordinator's)."""
    try:
        from autopar.transforms import fusion_layout_pb2
    except ImportError as exc:
        from autopar.common.errors import AutoparError
        raise AutoparError("transforms/fusion_layout_pb2.py is generated at install: run "
                           "`make native` (python -m autopar.runtime.native)") from exc
    return fusion_layout_pb2
