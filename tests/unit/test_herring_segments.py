"""The segment size of a herring buffer (transforms/transport.segment_elements_for):
the unit a summation server sums and returns, so a shard of few segments
returns nothing until most of it is sent."""
from __future__ import annotations

import pytest

from autopar.transforms.methods.herring import transport
from autopar.transforms.methods.herring.bfb import FusionBuffer


def _buffer(shard_lengths: list[int]) -> FusionBuffer:
    shards, offset = [], 0
    for server, length in enumerate(shard_lengths):
        shards.append((server, offset, length))
        offset += length
    return FusionBuffer.of_shards(0, shards)


@pytest.mark.parametrize("shards, expected", [
    # a large shard keeps the transport's 64 KiB segments
    ([800_000] * 8, transport.SEGMENT_ELEMENTS),
    # the sparse LM's dense buffer over 8 servers: 16 segments per shard, not 3
    ([40_960] * 8, 2_560),
    # the largest shard decides (every shard of one op has one segment size)
    ([100, 64_000, 30_000], 4_000),
    # ... never below MIN_SEGMENT_ELEMENTS (8 KiB of float32 per frame)
    ([5_000] * 4, transport.MIN_SEGMENT_ELEMENTS),
])
def test_a_buffers_largest_shard_has_at_least_its_share_of_segments(shards, expected):
    assert transport.segment_elements_for(_buffer(shards)) == expected


def test_the_op_gets_the_buffers_segment_size_unless_given():
    import tensorflow as tf
    buffer = _buffer([40_960] * 2)
    with tf.Graph().as_default():
        x = tf.zeros([81_920])
        chosen = transport.push_pull(x, buffer, num_contributors=2, contributor_index=0)
        given = transport.push_pull(x, buffer, num_contributors=2, contributor_index=0,
                               segment_elements=777)
    assert chosen.op.get_attr("segment_elements") == transport.segment_elements_for(buffer) == 2_560
    assert given.op.get_attr("segment_elements") == 777
