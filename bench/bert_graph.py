"""A BERT-style encoder training graph in tf.compat.v1, the shape of graph real
users bring: token/position/segment embeddings, L transformer layers
(multi-head self-attention, hand-written layer norm, GELU feed-forward,
dropout), a dense vocabulary head, Adam with clip_by_global_norm and a
global step. BERT-large is layers=24, hidden=1024, heads=16.

Used by bench/transform_scale.py (analysis and rewrite time vs op count) and
runnable as a training script under autopar:

    .venv/bin/python bench/bert_graph.py --layers 24 --hidden 64 --steps 2 \\
        --spec resource_specs/localhost_2workers.yaml

With --phase-times each worker prints one line "PHASES {json}": seconds spent
importing TensorFlow, building the graph, in autopar's analysis, plan,
rewrite, TensorFlow's import_meta_graph, server start, waiting for peers,
runner start (session creation, initialisation and the chief's broadcast:
the first session runs) and each step (bench/transform_scale.py
--end-to-end collects them).
"""
from __future__ import annotations

import time

_STARTED = time.time()   # before TensorFlow's import, which the phases include

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_TF_IMPORTED = time.time()

tf1 = tf.compat.v1

VOCAB = 30522
MAX_POSITIONS = 512


def _dense(x, units, name, seed):
    w = tf1.get_variable(f"{name}/kernel", [int(x.shape[-1]), units],
                         initializer=tf1.truncated_normal_initializer(stddev=0.02, seed=seed))
    b = tf1.get_variable(f"{name}/bias", [units], initializer=tf1.zeros_initializer())
    return tf.matmul(x, w) + b


def _layer_norm(x, name):
    """Hand-written, as in the original BERT code."""
    with tf1.variable_scope(name):
        gamma = tf1.get_variable("gamma", [int(x.shape[-1])], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [int(x.shape[-1])], initializer=tf1.zeros_initializer())
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * gamma + beta


def _gelu(x):
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


def build(layers: int, hidden: int = 1024, heads: int = 16, batch: int = 8, seq: int = 128,
          dropout: float = 0.1, vocab: int = VOCAB):
    """Returns (graph, ids placeholder, labels placeholder, loss, train_op)."""
    graph = tf.Graph()
    head_dim = hidden // heads
    with graph.as_default():
        tf1.set_random_seed(1)
        gs = tf1.train.get_or_create_global_step()
        ids = tf1.placeholder(tf.int32, [batch, seq], name="ids")
        labels = tf1.placeholder(tf.int32, [batch, seq], name="labels")
        init = tf1.truncated_normal_initializer(stddev=0.02, seed=3)
        word = tf1.get_variable("embeddings/word", [vocab, hidden], initializer=init)
        position = tf1.get_variable("embeddings/position", [MAX_POSITIONS, hidden], initializer=init)
        segment = tf1.get_variable("embeddings/segment", [2, hidden], initializer=init)
        h = (tf.nn.embedding_lookup(word, ids) + position[:seq]
             + tf.nn.embedding_lookup(segment, tf.zeros_like(ids)))
        h = tf.nn.dropout(_layer_norm(h, "embeddings/norm"), rate=dropout, seed=5)
        h = tf.reshape(h, [batch * seq, hidden])
        for i in range(layers):
            with tf1.variable_scope(f"layer_{i}"):
                def split(t):
                    return tf.transpose(tf.reshape(t, [batch, seq, heads, head_dim]), [0, 2, 1, 3])
                q = split(_dense(h, hidden, "query", i))
                k = split(_dense(h, hidden, "key", i))
                v = split(_dense(h, hidden, "value", i))
                scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(head_dim)
                probs = tf.nn.dropout(tf.nn.softmax(scores), rate=dropout, seed=i)
                context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]),
                                     [batch * seq, hidden])
                attention = tf.nn.dropout(_dense(context, hidden, "output", i), rate=dropout, seed=i)
                h = _layer_norm(h + attention, "attention_norm")
                ff = _dense(_gelu(_dense(h, 4 * hidden, "intermediate", i)), hidden, "ffn_output", i)
                h = _layer_norm(h + tf.nn.dropout(ff, rate=dropout, seed=i), "output_norm")
        logits = _dense(h, vocab, "head", 99)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(labels, [-1]), logits=logits), name="loss")
        opt = tf1.train.AdamOptimizer(1e-4)
        grads, variables = zip(*opt.compute_gradients(loss))
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        train_op = opt.apply_gradients(zip(clipped, variables), global_step=gs)
    return graph, ids, labels, loss, train_op


class _PhaseTimes:
    """Wall seconds per phase of a worker's start, by wrapping the functions
    autopar's worker calls (those it has: the library may add or rename
    steps) and TensorFlow's import_meta_graph. Measurement only."""

    WORKER_FUNCTIONS = ("analyze_graph", "make_plan", "rewrite_for_worker", "compile_worker",
                        "compile_for_worker", "start_worker_server", "wait_for_peers")

    def __init__(self):
        self.phases: dict[str, float] = {"import tensorflow": _TF_IMPORTED - _STARTED}
        self.stack: list[str] = []   # a call inside another is recorded as "outer > inner"

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def wrap(self, owner, attribute: str, name: str | None = None) -> None:
        fn = getattr(owner, attribute, None)
        if fn is None:
            return

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.stack.append(name or attribute)
            key = " > ".join(self.stack)
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(key, time.time() - start)
                self.stack.pop()
        setattr(owner, attribute, timed)

    def install(self) -> None:
        import autopar.api
        from autopar.runtime import launcher, runner, worker
        self.wrap(autopar.api, "analyze", "autopar.analyze (report)")
        launch = launcher.launch

        def launch_reported(*args, **kwargs):
            # The launcher's part ends where the workers' begins.
            print("LAUNCHER " + json.dumps({"since_process_start_s": time.time() - _STARTED,
                                            "phases_s": self.phases}), flush=True)
            return launch(*args, **kwargs)
        launcher.launch = launch_reported
        for attribute in self.WORKER_FUNCTIONS:
            self.wrap(worker, attribute)
        self.wrap(tf.compat.v1.train, "import_meta_graph")
        self.wrap(runner.Runner, "start", "runner start (session, init, broadcast)")

    def report(self, worker_index: int) -> None:
        print("PHASES " + json.dumps({"worker": worker_index, "pid": os.getpid(),
                                      "since_process_start_s": time.time() - _STARTED,
                                      "phases_s": self.phases}), flush=True)


def main() -> None:
    import autopar
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--phase-times", action="store_true", help="print where a worker's start-up goes")
    args = p.parse_args()
    phases = _PhaseTimes() if args.phase_times else None
    built = time.time()
    graph, ids, labels, loss, train_op = build(args.layers, args.hidden, args.heads, args.batch,
                                               args.seq, vocab=args.vocab)
    if phases:
        phases.add("build graph", time.time() - built)
        phases.install()
    started = time.time()
    with autopar.get_runner(graph, args.spec, autopar.Config(run_option=args.run_option)) as runner:
        ready = time.time()
        rng = np.random.default_rng(runner.worker_index)
        for step in range(args.steps):
            batch = rng.integers(0, args.vocab, size=(args.batch, args.seq)).astype(np.int32)
            step_start = time.time()
            runner.run(train_op, {ids: batch, labels: batch})
            if phases:
                phases.add(f"step {step + 1}", time.time() - step_start)
        print(f"worker {runner.worker_index}: runner ready after {ready - started:.1f} s, "
              f"{args.steps} steps done after {time.time() - started:.1f} s", flush=True)
        if phases:
            phases.report(runner.worker_index)


if __name__ == "__main__":
    main()
