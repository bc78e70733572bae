"""Communication methods the rewriter calls, one backend per transport.

The rewriter only ever calls these methods; adding a backend (native cpp_ops,
Horovod) means adding a class here, never touching analysis or planning.
"""
from __future__ import annotations

import tensorflow as tf


class CollectiveOpsBackend:
    """TensorFlow's own collective ops (CollectiveReduceV2 & co.), always available.

    All workers form one group; workers agree on instance keys because the plan
    derives them deterministically, so nothing is negotiated at run time.
    """

    def __init__(self, group_size: int, group_key: int, communication_hint: str = "ring"):
        self.group_size = group_size
        self.group_key = group_key
        self.hint = communication_hint

    def allreduce_mean(self, tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
        return tf.raw_ops.CollectiveReduceV2(
            input=tensor, group_size=self.group_size, group_key=self.group_key,
            instance_key=instance_key, ordering_token=[], merge_op="Add", final_op="Div",
            communication_hint=self.hint)

    def allreduce_sum(self, tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
        return tf.raw_ops.CollectiveReduceV2(
            input=tensor, group_size=self.group_size, group_key=self.group_key,
            instance_key=instance_key, ordering_token=[], merge_op="Add", final_op="Id",
            communication_hint=self.hint)

    def allgather(self, tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
        """Concatenate along dim 0; every worker must pass the same shape."""
        return tf.raw_ops.CollectiveGatherV2(
            input=tensor, group_size=self.group_size, group_key=self.group_key,
            instance_key=instance_key, ordering_token=[], communication_hint=self.hint)

    def broadcast(self, tensor: tf.Tensor, instance_key: int, is_source: bool) -> tf.Tensor:
        """The source's value of `tensor` on every worker."""
        if is_source:
            return tf.raw_ops.CollectiveBcastSendV2(
                input=tensor, group_size=self.group_size, group_key=self.group_key,
                instance_key=instance_key, communication_hint=self.hint)
        return tf.raw_ops.CollectiveBcastRecvV2(
            group_size=self.group_size, group_key=self.group_key, instance_key=instance_key,
            shape=tf.shape(tensor), T=tensor.dtype, communication_hint=self.hint)

    def allgather_rows(self, values: tf.Tensor, indices: tf.Tensor,
                       keys: tuple[int, int, int]) -> tuple[tf.Tensor, tf.Tensor]:
        """Every member's IndexedSlices rows, concatenated. Members may hold
        different numbers of rows but CollectiveGather needs equal shapes:
        gather the counts first (keys[0]), pad to the largest, gather values
        and indices (keys[1], keys[2]), then drop the padding."""
        count = tf.shape(indices, out_type=tf.int32)[:1]
        counts = self.allgather(count, keys[0])
        longest = tf.reduce_max(counts)
        pad = longest - count[0]
        padded_values = tf.pad(values, [[0, pad]] + [[0, 0]] * (values.shape.rank - 1))
        padded_indices = tf.pad(indices, [[0, pad]])
        keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])
        return (tf.boolean_mask(self.allgather(padded_values, keys[1]), keep),
                tf.boolean_mask(self.allgather(padded_indices, keys[2]), keep))
