"""The collectives the methods' rewrites build: the backend over TensorFlow's
collective ops (the rewrite context's `backend`), the only code building
collectives. A method's own transport lives in its package (herring's
push/pull: transforms/methods/herring/transport.py).
"""
from __future__ import annotations

import tensorflow as tf

from autopar.transforms.ops import constant, new_op, rows_where

MAX_GATHERED_ROWS = 1 << 40


def rank_order(members) -> list[int]:
    """The workers `members` in the order TensorFlow ranks them in a
    collective group, the order of a gather's blocks, an all-to-all's rows
    and a ring's visits: their device names in lexicographic order
    (CollectiveParamResolverLocal's SortDevicesAndTasks, across processes),
    so task 10 comes before task 2."""
    return sorted(members, key=lambda m: f"/job:worker/replica:0/task:{m}/")


def collective_rank(worker: int, members) -> int:
    """`worker`'s rank in a collective group of the workers `members` (rank_order)."""
    return rank_order(members).index(worker)


def _row_ladder(limit: int = MAX_GATHERED_ROWS) -> tuple[int, ...]:
    """Padded row counts a variable-size gather may use: 1, 2, ..., 8, 10, 12,
    15, 18, 22, ... (each rung the previous plus a quarter, at least 1) up to
    `limit`. Integer arithmetic, so every process on every machine derives the
    same rungs. Padding the longest member's rows up to the next rung costs
    at most 25% more bytes than gathering exactly that many, and the ladder
    stays short (124 rungs up to 2^40), i.e. few instance keys."""
    rungs = [1]
    while rungs[-1] < limit:
        rungs.append(rungs[-1] + max(1, rungs[-1] // 4))
    return tuple(rungs)


ROW_LADDER = _row_ladder()


def row_gather_keys(first: int, prefix: str) -> tuple[dict[str, int], int]:
    """Instance keys of one variable-size row gather (allgather_rows) from
    `first` on, named prefix + count/values/indices, and the next free key."""
    rungs = len(ROW_LADDER)
    keys = {f"{prefix}count": first, f"{prefix}values": first + 1,
            f"{prefix}indices": first + 1 + rungs}
    return keys, first + 1 + 2 * rungs


class CollectiveOpsBackend:
    """TensorFlow's own collective ops (CollectiveReduceV2 & co.), always available.

    All workers form one group; workers agree on instance keys because the plan
    derives them deterministically, so nothing is negotiated at run time.
    """

    def __init__(self, group_size: int, group_key: int, communication_hint: str = "ring",
                 _constants: dict | None = None, timeout_s: float = 0.0):
        self.group_size = group_size
        self.group_key = group_key
        self.hint = communication_hint
        self._constants = {} if _constants is None else _constants
        # > 0: reduce and broadcast ops fail with DeadlineExceeded after
        # waiting this long for the group (TensorFlow's timeout_seconds).
        self.timeout_s = timeout_s

    def subgroup(self, group_size: int, group_key: int,
                 timeout_s: float = 0.0) -> "CollectiveOpsBackend":
        """The same transport over another group (e.g. the workers of one host)."""
        return CollectiveOpsBackend(group_size, group_key, self.hint, self._constants, timeout_s)

    def _group(self) -> dict:
        return {"group_size": self._int(self.group_size), "group_key": self._int(self.group_key)}

    def _int(self, value: int) -> tf.Tensor:
        """Group sizes and keys as one constant each per graph, shared by every
        collective (a constant per collective and argument was a large part
        of a rewritten graph), created outside any control dependency."""
        return self._const(value, tf.int32, "collective_param")

    def _const(self, value, dtype: tf.DType, name: str = "Const") -> tf.Tensor:
        """One constant per value and dtype in the default graph (see _int)."""
        graph = tf.compat.v1.get_default_graph()
        key = (id(graph), value) if name == "collective_param" else (id(graph), repr(value), dtype)
        if key not in self._constants:
            with tf.control_dependencies(None):
                self._constants[key] = constant(value, dtype, name=name)
        return self._constants[key]

    def barrier(self, instance_key: int) -> tf.Tensor:
        """A scalar all-reduce: completes once every member reached it."""
        return self.allreduce_sum(tf.constant(0.0), instance_key)

    def allreduce_mean(self, tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
        return self._reduce(tensor, instance_key, "Div")

    def allreduce_sum(self, tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
        return self._reduce(tensor, instance_key, "Id")

    def _reduce(self, tensor: tf.Tensor, instance_key: int, final_op: str) -> tf.Tensor:
        """CollectiveReduceV2 as tf.raw_ops builds it, with its attributes
        given (ops.new_op: raw_ops' inference of them cost ~1 ms per
        collective, one per variable in ps mode) and the instance key from
        the graph's constants."""
        tensor = tf.convert_to_tensor(tensor)
        group = self._group()
        return new_op("CollectiveReduceV2", [tensor, group["group_size"], group["group_key"],
                                             self._int(instance_key)],
                      T=tensor.dtype.base_dtype, merge_op="Add", final_op=final_op,
                      communication_hint=self.hint, timeout_seconds=float(self.timeout_s),
                      Nordering_token=0).outputs[0]

    def allreduce_sum_node(self, nodes, tensor, dtype: tf.DType, instance_key: int) -> str:
        """allreduce_sum written as a NodeDef by `nodes` (a
        ops.NodeWriter): `tensor` a node input string or tf.Tensor,
        the group and key constants from the writer's pool. For collectives
        built by the hundred (one per variable); the name of the node."""
        ints = [nodes.pooled_const(v, tf.int32) for v in
                (self.group_size, self.group_key, instance_key)]
        return nodes.add("CollectiveReduceV2", [tensor, *ints], T=dtype, merge_op="Add",
                         final_op="Id", communication_hint=self.hint,
                         timeout_seconds=float(self.timeout_s), Nordering_token=0)

    def allgather(self, tensor: tf.Tensor, instance_key: int | tf.Tensor) -> tf.Tensor:
        """Concatenate along dim 0 in the members' ranks (collective_rank, not
        worker order); every worker must pass the same shape."""
        return tf.raw_ops.CollectiveGatherV2(
            input=tensor, **self._group(),
            instance_key=instance_key, ordering_token=[], communication_hint=self.hint)

    def alltoall(self, tensor: tf.Tensor, instance_key: int | tf.Tensor) -> tf.Tensor:
        """Row i of `tensor` (dim 0: the group's size) to member i; row i of
        the result is what member i sent this member."""
        if isinstance(instance_key, int):
            instance_key = self._int(instance_key)
        return tf.raw_ops.CollectiveAllToAllV2(
            input=tensor, **self._group(), instance_key=instance_key,
            ordering_token=[], communication_hint=self.hint, timeout_seconds=self.timeout_s)

    def broadcast(self, tensor: tf.Tensor, instance_key: int, is_source: bool) -> tf.Tensor:
        """The source's value of `tensor` on every worker."""
        if is_source:
            return tf.raw_ops.CollectiveBcastSendV2(
                input=tensor, **self._group(),
                instance_key=instance_key, communication_hint=self.hint,
                timeout_seconds=self.timeout_s)
        return tf.raw_ops.CollectiveBcastRecvV2(
            **self._group(), instance_key=instance_key,
            shape=tf.shape(tensor), T=tensor.dtype, communication_hint=self.hint,
            timeout_seconds=self.timeout_s)

    def allgather_rows(self, values: tf.Tensor, indices: tf.Tensor,
                       keys: tuple[int, int, int]) -> tuple[tf.Tensor, tf.Tensor]:
        """Every member's IndexedSlices rows, concatenated in the members' ranks
        (collective_rank).

        Members may hold different numbers of rows, and a different number at
        every step, down to none. CollectiveGather needs equal shapes on all
        members, and TensorFlow pins an instance key's shape at its first use
        (a later step with another shape fails "Shape mismatch in the
        collective instance"). So: gather the counts (fixed shape [1], key
        keys[0]); pad every member's rows to the ladder rung at or above
        the largest count, which all members compute alike; gather values and
        indices with the instance keys of that rung (instance keys of the V2
        ops are run-time tensors), so each key only ever sees one shape; drop
        the padding. The keys [first_key, first_key + ROW_GATHER_KEYS) belong
        to this gather (transforms.plan reserves them)."""
        # Built op by op with every attribute given (ops.new_op): the
        # same computation through tf.shape/searchsorted/pad/sequence_mask/
        # boolean_mask cost ~30 ms per gather, a fixed cost per sparse
        # variable that dominated the rewrite of small graphs.
        i32 = tf.int32
        c = self._const
        rank = values.shape.rank
        count = new_op("StridedSlice", [new_op("Shape", [indices], T=indices.dtype.base_dtype,
                                               out_type=i32).outputs[0],
                                        c((0,), i32), c((1,), i32), c((1,), i32)],
                       T=i32, Index=i32).outputs[0]                     # [1]
        counts = self._gather(count, c(keys[0], i32))                   # [members]
        largest = new_op("Max", [counts, c((0,), i32)], T=i32, Tidx=i32,
                         keep_dims=True).outputs[0]                      # [1]
        rung, padded = self._rung(largest)
        pad = new_op("Sub", [padded, new_op("Reshape", [count, c((), i32)], T=i32,
                                            Tshape=i32).outputs[0]], T=i32).outputs[0]

        def padding(r: int) -> tf.Tensor:   # [[0, pad], [0, 0], ...] for rank r
            return _padding(pad, r, c)

        padded_values = new_op("Pad", [values, padding(rank)], T=values.dtype.base_dtype,
                               Tpaddings=i32).outputs[0]
        # (TensorFlow's shape function cannot see that only the first
        # dimension grows; tf.pad sets the rest as here)
        padded_values.set_shape(tf.TensorShape([None]).concatenate(values.shape[1:]))
        padded_indices = new_op("Pad", [indices, padding(1)], T=indices.dtype.base_dtype,
                                Tpaddings=i32).outputs[0]
        # The real rows of the gathered block: member m's first counts[m] of
        # its `padded` (sequence_mask, flattened), as positions (boolean_mask).
        keep = new_op("Less", [
            new_op("Range", [c(0, i32), padded, c(1, i32)], Tidx=i32).outputs[0],
            new_op("ExpandDims", [counts, c(-1, i32)], T=i32, Tdim=i32).outputs[0]],
            T=i32).outputs[0]
        keep = new_op("Reshape", [keep, c((-1,), i32)], T=tf.bool, Tshape=i32).outputs[0]
        gathered = [self._gather(tensor, new_op("AddV2", [c(key, i32), rung], T=i32).outputs[0])
                    for tensor, key in ((padded_values, keys[1]), (padded_indices, keys[2]))]
        rows, ids = rows_where(keep, gathered, c(0, i32))
        return rows, ids

    def _rung(self, count: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(index, rows) of the ROW_LADDER rung at or above `count` (an int32
        of one element), as int32 scalars: searchsorted(ROW_LADDER, count)."""
        i32, i64, c = tf.int32, tf.int64, self._const
        rung = new_op("Reshape", [new_op("LowerBound", [
            c((ROW_LADDER,), i64),
            new_op("Reshape", [new_op("Cast", [count], SrcT=i32, DstT=i64,
                                      Truncate=False).outputs[0], c((1, 1), i32)],
                   T=i64, Tshape=i32).outputs[0]], T=i64, out_type=i32).outputs[0],
            c((), i32)], T=i32, Tshape=i32).outputs[0]
        padded = new_op("Cast", [new_op("GatherV2", [c(ROW_LADDER, i64), rung, c(0, i32)],
                                        Tparams=i64, Tindices=i32, Taxis=i32,
                                        batch_dims=0).outputs[0]],
                        SrcT=i64, DstT=i32, Truncate=False).outputs[0]
        return rung, padded

    def scatter_rows(self, rows: tf.Tensor | None, counts: tf.Tensor, rank: int, source: int,
                     row_shape: list[int], dtype: tf.DType, first_key: int) -> tf.Tensor:
        """Each member's own rows, sent by the member of rank `source`: there
        `rows` holds every member's rows one member after the other in the
        members' ranks (collective_rank), counts[r] of them for rank r; None
        elsewhere. Every member passes the same `counts` (int32, one per
        member) and gets its counts[`rank`] rows.

        One all-to-all (TensorFlow's collectives have no scatter): the
        source's block r goes to rank r, every block padded to the ladder rung
        at or above the largest count, and with that rung's instance key
        (first_key + rung: the keys [first_key, first_key + len(ROW_LADDER))
        belong to this scatter), so each key only ever sees one shape, as in
        allgather_rows. The other members send blocks of zeros (an
        all-to-all's members pass equal shapes), so each link carries g - 1
        blocks of one member's rows each way, where a broadcast of the
        union carries the union up to fan-out x depth times on one link."""
        i32 = tf.int32
        g = self.group_size
        rung, padded = self._rung(tf.reshape(tf.reduce_max(counts), [1]))
        shape = tf.concat([tf.stack([g, padded]), self._const(tuple(row_shape), i32)], 0)
        if rows is not None:
            # the j-th row of member r to block r, place j
            owner = tf.repeat(tf.range(g, dtype=i32), counts)
            place = tf.range(tf.size(owner), dtype=i32) - tf.gather(tf.cumsum(counts, exclusive=True),
                                                                    owner)
            blocks = tf.scatter_nd(tf.stack([owner, place], 1), rows, shape)
        else:
            blocks = tf.zeros(shape, dtype)
        received = self.alltoall(blocks, self._const(first_key, i32) + rung)
        received.set_shape([g, None, *row_shape])
        return received[source][:counts[rank]]

    def _gather(self, tensor: tf.Tensor, instance_key: tf.Tensor) -> tf.Tensor:
        """allgather with the instance key a tensor (as new_op builds it)."""
        group = self._group()
        return new_op("CollectiveGatherV2", [tensor, group["group_size"], group["group_key"],
                                             instance_key],
                      T=tensor.dtype.base_dtype, communication_hint=self.hint,
                      timeout_seconds=float(self.timeout_s), Nordering_token=0).outputs[0]


def _padding(pad: tf.Tensor, rank: int, const) -> tf.Tensor:
    """[[0, pad], [0, 0], ...] for a tensor of `rank`: `pad` more rows."""
    return new_op("Mul", [pad, const(((0, 1),) + ((0, 0),) * (rank - 1), tf.int32)],
                  T=tf.int32).outputs[0]
