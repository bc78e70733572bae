"""The one model definition per workload that every peer trains.

Each workload is written once, with raw TensorFlow ops only, so the very same
code builds a tf.compat.v1 graph (autopar, TF parameter servers, Horovod under
TensorFlow 2.12) and runs inside a tf.function (MultiWorkerMirroredStrategy).
Variables are created through a callback the peer passes in (`tf1.get_variable`
in graph mode, `tf.Variable` under a strategy scope) and initialised from
*stateless* random ops with fixed seeds, so every framework and TensorFlow
version starts from the same parameters. The data of worker w at step k is a
deterministic numpy function of (workload, k, w): every peer sees the same
examples, and the single-device reference trains on the concatenation of the N
workers' batches, which synchronous data parallelism must reproduce.

Workloads (sizes in float32 bytes; per-worker batch fixed):

- ``dense``  : a CNN whose gradients are >= 25 MiB: a strided 5x5 conv, then a
  wide fully connected layer (8192 -> 800, 25 MiB) and a 10-way classifier.
- ``sparse`` : a language model sized like Parallax's LM (800K x 512, §7) in
  the ways that matter for communication: a 204800 x 256 embedding (200 MiB),
  a mean-pooled context of 8 Zipf(1.1)-distributed token ids, a 256-unit tanh
  layer and a softmax over a 1024-word shortlist (the 1023 most frequent ids
  plus one out-of-shortlist class) — compute stays small, the embedding is
  large and sparsely touched: a worker's step touches ~0.25 % of its rows.
- ``avg``    : the gradient-averaging microbenchmark: one float32 vector w of G
  bytes (100 MiB by default), loss = s/2 * sum(w^2) with s a per-worker
  scalar, so the gradient s*w is G dense bytes and a training step is exactly
  one averaging of G bytes plus two elementwise passes.

This module must import under TensorFlow 2.12 and 2.21 alike and depends on
nothing of autopar.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

MiB = 1 << 20


@dataclass(frozen=True)
class VarSpec:
    name: str
    shape: tuple[int, ...]
    scale: float          # initial values ~ U(-scale, scale)
    seed: int
    sparse: bool = False  # gradient is IndexedSlices (embedding rows)
    partitionable: bool = False   # large enough that a TF-PS user partitions it over servers

    @property
    def bytes(self) -> int:
        return 4 * math.prod(self.shape)


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str            # "float32" / "int32"
    shape: tuple[int, ...]   # per-worker batch shape (static)


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int                  # examples per worker per step
    lr: float
    unit: str                   # what throughput counts: "images", "words", "averagings"
    params: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ shapes
    def variables(self) -> list[VarSpec]:
        p = self.params
        if self.name == "dense":
            s, c, h = p["image"], p["conv_channels"], p["hidden"]
            flat = (s // 2) * (s // 2) * c
            return [VarSpec("conv/kernel", (5, 5, 3, c), math.sqrt(6 / (75 + c)), 11),
                    VarSpec("conv/bias", (c,), 0.0, 12),
                    VarSpec("fc1/kernel", (flat, h), math.sqrt(6 / (flat + h)), 13, partitionable=True),
                    VarSpec("fc1/bias", (h,), 0.0, 14),
                    VarSpec("fc2/kernel", (h, p["classes"]), math.sqrt(6 / (h + p["classes"])), 15),
                    VarSpec("fc2/bias", (p["classes"],), 0.0, 16)]
        if self.name == "sparse":
            v, d, h, k = p["vocab"], p["dim"], p["hidden"], p["shortlist"]
            return [VarSpec("embedding", (v, d), 0.5, 21, sparse=True, partitionable=True),
                    VarSpec("hidden/kernel", (d, h), math.sqrt(6 / (d + h)), 22),
                    VarSpec("hidden/bias", (h,), 0.0, 23),
                    VarSpec("softmax/kernel", (h, k), math.sqrt(6 / (h + k)), 24),
                    VarSpec("softmax/bias", (k,), 0.0, 25)]
        if self.name == "avg":
            return [VarSpec("buffer", (p["floats"],), 1.0, 31, partitionable=True)]
        raise ValueError(f"unknown workload {self.name!r}")

    def inputs(self) -> list[InputSpec]:
        p, b = self.params, self.batch
        if self.name == "dense":
            return [InputSpec("images", "float32", (b, p["image"], p["image"], 3)),
                    InputSpec("labels", "int32", (b,))]
        if self.name == "sparse":
            return [InputSpec("context", "int32", (b, p["context"])),
                    InputSpec("target", "int32", (b,))]
        return [InputSpec("scale", "float32", (b,))]

    @property
    def dense_bytes(self) -> int:
        return sum(v.bytes for v in self.variables() if not v.sparse)

    @property
    def sparse_bytes(self) -> int:
        return sum(v.bytes for v in self.variables() if v.sparse)

    def sparse_rows_per_step(self) -> int:
        """Embedding rows in one worker's gradient per step: one per looked-up
        id, duplicates included (tf.gather's gradient does not deduplicate)."""
        return self.batch * self.params["context"] if self.name == "sparse" else 0

    def sparse_touched_bytes(self) -> int:
        """alpha*b of Parallax Table 3 for one worker and step: bytes of the
        embedding rows (values) its gradient carries."""
        if self.name != "sparse":
            return 0
        return self.sparse_rows_per_step() * self.params["dim"] * 4

    def examples_per_step(self) -> int:
        """Units of `unit` one worker processes per step."""
        return 1 if self.name == "avg" else self.batch

    # ------------------------------------------------------------------ TF
    def initializer(self, spec: VarSpec):
        """A callable usable as a tf1.get_variable initializer (partition-aware)
        or called with no argument for the full initial value. Stateless:
        identical values in every framework and TF version."""
        import tensorflow as tf

        def init(shape=None, dtype=None, partition_info=None, **_):
            if spec.scale == 0.0:
                full = tf.zeros(spec.shape, tf.float32)
            else:
                full = tf.random.stateless_uniform(spec.shape, seed=[spec.seed, 7],
                                                   minval=-spec.scale, maxval=spec.scale,
                                                   dtype=tf.float32)
            if partition_info is not None and shape is not None and tuple(shape) != spec.shape:
                offset = partition_info.var_offset
                return tf.slice(full, offset, list(shape))
            return full
        return init

    def build_variables(self, create: Callable[[VarSpec, Callable], object]) -> dict:
        """{name: variable} with `create(spec, initializer)` making each one."""
        return {v.name: create(v, self.initializer(v)) for v in self.variables()}

    def loss(self, variables: dict, inputs: dict):
        """Mean loss over the batch in `inputs` ({input name: tensor})."""
        import tensorflow as tf
        if self.name == "dense":
            x = tf.nn.conv2d(inputs["images"], variables["conv/kernel"], strides=2, padding="SAME")
            x = tf.nn.relu(x + variables["conv/bias"])
            x = tf.reshape(x, [tf.shape(x)[0], -1])
            x = tf.nn.relu(tf.matmul(x, variables["fc1/kernel"]) + variables["fc1/bias"])
            logits = tf.matmul(x, variables["fc2/kernel"]) + variables["fc2/bias"]
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=inputs["labels"], logits=logits))
        if self.name == "sparse":
            emb = variables["embedding"]
            # A PartitionedVariable (TF parameter servers) is looked up by parts,
            # rows split contiguously ("div"), exactly fixed_size_partitioner's split.
            table = list(emb) if _is_partitioned(emb) else emb
            rows = tf.nn.embedding_lookup(table, inputs["context"])
            h = tf.reduce_mean(rows, axis=1)
            h = tf.tanh(tf.matmul(h, variables["hidden/kernel"]) + variables["hidden/bias"])
            logits = tf.matmul(h, variables["softmax/kernel"]) + variables["softmax/bias"]
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=inputs["target"], logits=logits))
        buf = variables["buffer"]
        parts = list(buf) if _is_partitioned(buf) else [buf]
        squares = [tf.reduce_sum(tf.square(part)) for part in parts]
        total = tf.add_n(squares) if len(squares) > 1 else squares[0]
        # d loss / d buffer = mean(scale) * buffer: a dense G-byte gradient that
        # needs the whole buffer on the worker (a parameter server must send it,
        # as Table 3's 2b assumes; a gradient independent of the parameters
        # would let TensorFlow prune the read).
        return 0.5 * tf.reduce_mean(inputs["scale"]) * total

    # ------------------------------------------------------------------ data
    def batch_for(self, step: int, worker: int) -> dict[str, np.ndarray]:
        """Worker `worker`'s batch at step `step` (deterministic)."""
        rng = np.random.default_rng([self._seed(), step, worker, 1])
        return self._make_batch(rng, self.batch)

    def global_batch(self, step: int, num_workers: int) -> dict[str, np.ndarray]:
        """The N workers' batches of `step`, concatenated in worker order: the
        single-device batch synchronous data parallelism reproduces."""
        parts = [self.batch_for(step, w) for w in range(num_workers)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def eval_batch(self) -> dict[str, np.ndarray]:
        """A fixed held-out batch every peer evaluates its final loss on."""
        rng = np.random.default_rng([self._seed(), 999_983, 0, 2])
        return self._make_batch(rng, self.batch)

    def _seed(self) -> int:
        return {"dense": 101, "sparse": 202, "avg": 303}[self.name]

    def _make_batch(self, rng, b: int) -> dict[str, np.ndarray]:
        p = self.params
        if self.name == "dense":
            patterns = np.random.default_rng(self._seed()).normal(
                size=(p["classes"], p["image"], p["image"], 3)).astype(np.float32)
            labels = rng.integers(0, p["classes"], b)
            images = rng.normal(size=(b, p["image"], p["image"], 3)).astype(np.float32)
            return {"images": (images + patterns[labels]).astype(np.float32),
                    "labels": labels.astype(np.int32)}
        if self.name == "sparse":
            ids = zipf_ids(rng, (b, p["context"] + 1), p["vocab"], p["zipf_a"])
            target = ids[:, -1]
            shortlist = p["shortlist"]
            target = np.where(target < shortlist - 1, target, shortlist - 1)
            # Make the next word depend on the context (so there is something
            # to learn): with probability 1/2 it repeats the first context id.
            copy = rng.random(b) < 0.5
            first = ids[:, 0]
            target = np.where(copy & (first < shortlist - 1), first, target)
            return {"context": ids[:, :-1].astype(np.int32), "target": target.astype(np.int32)}
        return {"scale": rng.uniform(0.5, 1.5, b).astype(np.float32)}


_ZIPF_CDF: dict = {}


def zipf_ids(rng, shape, vocab: int, a: float) -> np.ndarray:
    """Zipf(a)-distributed ids in [0, vocab), truncated: P(id = r) ~ (r+1)^-a.
    Inverse-CDF sampling from rng.random(), whose stream numpy keeps stable
    across versions (Generator.zipf's is not: numpy 1.23 and 2.x differ, and
    the Horovod peer runs numpy 1.23)."""
    key = (vocab, a)
    if key not in _ZIPF_CDF:
        weights = np.arange(1, vocab + 1, dtype=np.float64) ** -a
        cdf = np.cumsum(weights)
        _ZIPF_CDF[key] = cdf / cdf[-1]
    ids = np.searchsorted(_ZIPF_CDF[key], rng.random(size=shape), side="right")
    return np.minimum(ids, vocab - 1).astype(np.int64)


def _is_partitioned(v) -> bool:
    return type(v).__name__ == "PartitionedVariable"


# ---------------------------------------------------------------------- presets

DENSE = Workload("dense", batch=32, lr=0.01, unit="images",
                 params={"image": 32, "conv_channels": 32, "hidden": 800, "classes": 10})
SPARSE = Workload("sparse", batch=128, lr=0.5, unit="words",
                  params={"vocab": 204_800, "dim": 256, "context": 8, "hidden": 256,
                          "shortlist": 1024, "zipf_a": 1.1})
AVG = Workload("avg", batch=1, lr=0.1, unit="averagings",
               params={"floats": 100 * MiB // 4})

PRESETS = {"dense": DENSE, "sparse": SPARSE, "avg": AVG}


def get(name: str, **overrides) -> Workload:
    """A preset, optionally resized: batch=, lr=, or any params key
    (e.g. get("avg", floats=...), get("sparse", vocab=...))."""
    base = PRESETS[name]
    fields = {k: overrides.pop(k) for k in ("batch", "lr") if k in overrides}
    unknown = set(overrides) - set(base.params)
    if unknown:
        raise ValueError(f"workload {name}: unknown parameters {sorted(unknown)}")
    return replace(base, params={**base.params, **overrides}, **fields)


def to_dict(w: Workload) -> dict:
    return {"name": w.name, "batch": w.batch, "lr": w.lr, "unit": w.unit, "params": dict(w.params),
            "dense_bytes": w.dense_bytes, "sparse_bytes": w.sparse_bytes,
            "sparse_rows_per_step": w.sparse_rows_per_step(),
            "sparse_touched_bytes": w.sparse_touched_bytes()}


def from_dict(d: dict) -> Workload:
    return replace(PRESETS[d["name"]], batch=d["batch"], lr=d["lr"], params=dict(d["params"]))
