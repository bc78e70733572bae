"""An LSTM language model with a large word embedding: a plain single-device
tf.compat.v1 training script, plus the two lines marked "autopar" that make it
train on every worker of a cluster.

    python examples/lm.py --vocab 5000 --steps 50                         # one device
    python examples/lm.py --spec resource_specs/loopback_2hosts_4workers.yaml --run-option hybrid

The model: word embedding [vocab, dim] -> one LSTM layer (hidden units,
unrolled over --seq-len steps with plain ops, no tf.while_loop) -> sampled
softmax over the vocabulary (a separate [vocab, hidden] weight and a [vocab]
bias; full softmax when --num-sampled is 0 or not below --vocab). The
embedding and the softmax weights get sparse (IndexedSlices) gradients and
hold almost all of the parameters; the LSTM's are dense. Adagrad (or Adam,
SGD), gradients clipped with clip_by_global_norm, a global step.

Data (--data):
  zipf  (default) token ids drawn from a Zipf distribution over the whole
        vocabulary (p(rank r) ~ 1/r, id 0 the most frequent word), fixed seed.
        The default because it fills any --vocab: no offline corpus here has
        anywhere near 200,000 distinct words, and the point of this example
        is the size of the embedding. The loss falls to the unigram entropy.
  text  English text found on this machine: the docstrings of the Python
        standard library and of every installed package (numpy, scipy,
        scikit-learn, TensorFlow, ...), read from their .py files: about 5.7
        million words and punctuation marks, 43,000 distinct, with the pinned
        packages (--max-words reads the first 5 million). The vocabulary is
        its most frequent words, capped at --vocab (the embedding shrinks to
        fit when there are fewer); rarer words map to <unk>.

--batch-size is per worker; words/s counts every worker's words.
"""
import argparse
import collections
import re
import sys
import sysconfig
import time
from pathlib import Path

import autopar  # autopar: first, so TensorFlow starts quiet
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

EOS, UNK = "<eos>", "<unk>"
DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|[.,;:?!]")


def zipf_tokens(vocab, n, seed=0):
    """n token ids, id r drawn with probability proportional to 1/(r+1)."""
    p = 1.0 / np.arange(1, vocab + 1)
    return np.random.default_rng(seed).choice(vocab, size=n, p=p / p.sum()).astype(np.int32)


def python_docstrings():
    """Every triple-quoted string in the .py files of the standard library and
    the installed packages (tests excluded), in a fixed order."""
    roots = sorted({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]})
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            rel = path.relative_to(root).parts
            if {"test", "tests"} & set(rel) or (root != sysconfig.get_paths()["purelib"]
                                                and "site-packages" in rel):
                continue
            try:
                yield from DOCSTRING.findall(path.read_text(encoding="utf-8", errors="ignore"))
            except OSError:
                continue


def text_tokens(vocab, max_words):
    """(token ids, vocabulary size): lower-cased words and punctuation of the
    docstrings, <eos> after each; ids by frequency rank after <eos>, <unk>."""
    words = []
    for doc in python_docstrings():
        words.extend(TOKEN.findall(doc.lower()))
        words.append(EOS)
        if len(words) >= max_words:
            break
    if len(words) < 1000:
        sys.exit("--data text: found almost no text in this Python installation; use --data zipf")
    counts = collections.Counter(w for w in words if w != EOS)
    ids = {EOS: 0, UNK: 1}
    for word, _ in counts.most_common(vocab - 2):
        ids[word] = len(ids)
    return np.array([ids.get(w, 1) for w in words], dtype=np.int32), len(ids)


def lstm(inputs, hidden):
    """One LSTM layer over a Python list of [batch, dim] tensors, unrolled:
    the four gates from one matmul, forget-gate bias 1. Returns the outputs."""
    dim = inputs[0].shape[-1]
    with tf1.variable_scope("lstm"):
        kernel = tf1.get_variable("kernel", [dim + hidden, 4 * hidden],
                                  initializer=tf1.glorot_uniform_initializer())
        bias = tf1.get_variable("bias", [4 * hidden], initializer=tf1.zeros_initializer())
    batch = tf.shape(inputs[0])[0]
    c = h = tf.zeros([batch, hidden])
    outputs = []
    for x in inputs:
        i, j, f, o = tf.split(tf.matmul(tf.concat([x, h], 1), kernel) + bias, 4, axis=1)
        c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
    return outputs


def language_model_loss(tokens, targets, vocab, dim, hidden, num_sampled):
    """Mean loss per predicted word for a [batch, seq_len] batch."""
    embedding = tf1.get_variable("embedding", [vocab, dim],
                                 initializer=tf1.random_uniform_initializer(-0.05, 0.05))
    x = tf.nn.embedding_lookup(embedding, tokens)                       # [b, t, dim]
    outputs = lstm(tf.unstack(x, axis=1), hidden)                       # t x [b, hidden]
    h = tf.reshape(tf.stack(outputs, axis=1), [-1, hidden])             # [b*t, hidden]
    labels = tf.reshape(targets, [-1, 1])
    softmax_w = tf1.get_variable("softmax/w", [vocab, hidden],
                                 initializer=tf1.random_uniform_initializer(-0.05, 0.05))
    softmax_b = tf1.get_variable("softmax/b", [vocab], initializer=tf1.zeros_initializer())
    if 0 < num_sampled < vocab:
        losses = tf.nn.sampled_softmax_loss(softmax_w, softmax_b, tf.cast(labels, tf.int64), h,
                                            num_sampled=num_sampled, num_classes=vocab)
    else:
        logits = tf.matmul(h, softmax_w, transpose_b=True) + softmax_b
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[:, 0], logits=logits)
    return tf.reduce_mean(losses)


OPTIMIZERS = {   # name -> (default learning rate, constructor)
    "adagrad": (0.2, tf1.train.AdagradOptimizer),
    "adam": (1e-3, tf1.train.AdamOptimizer),
    "sgd": (1.0, tf1.train.GradientDescentOptimizer),
}


def traced_step(runner, train_op, loss, trace_dir: str) -> float:
    """One step under a full trace. The step stats hold every op's start and
    end on every device of the step (this worker and the servers it used);
    the wall time of the whole run call and the step's partition graphs go
    beside them (bench/ps_profile.py and bench/messages.py read them)."""
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)
    metadata = tf1.RunMetadata()
    start = time.perf_counter()
    _, value = runner.run([train_op, loss], options=options, run_metadata=metadata)
    wall_us = int((time.perf_counter() - start) * 1e6)
    out = Path(trace_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"worker{runner.worker_index}.step_stats.pb").write_bytes(
        metadata.step_stats.SerializeToString())
    (out / f"worker{runner.worker_index}.wall_us").write_text(str(wall_us))
    # the graph each process ran for this worker's step, one per task and device
    # (bench/messages.py counts the messages between processes from them)
    graphs = tf1.RunMetadata(partition_graphs=metadata.partition_graphs)
    (out / f"worker{runner.worker_index}.partition_graphs.pb").write_bytes(graphs.SerializeToString())
    return value


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="resource spec (YAML); omit to train on this device only")
    p.add_argument("--run-option", choices=["hybrid", "ps", "allreduce"], default="hybrid",
                   help="how variables are synchronised (autopar.Config.run_option)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of words/s")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per worker per step")
    p.add_argument("--seq-len", type=int, default=20, help="words per sequence (unrolled LSTM steps)")
    p.add_argument("--vocab", type=int, default=200_000, help="vocabulary size (embedding rows)")
    p.add_argument("--dim", type=int, default=256, help="embedding width")
    p.add_argument("--hidden", type=int, default=256, help="LSTM units")
    p.add_argument("--num-sampled", type=int, default=1024,
                   help="negative classes of the sampled softmax; 0 = full softmax")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adagrad")
    p.add_argument("--lr", type=float, help="learning rate (adagrad 0.2, adam 0.001, sgd 1.0)")
    p.add_argument("--clip", type=float, default=5.0, help="clip_by_global_norm threshold")
    p.add_argument("--data", choices=["zipf", "text"], default="zipf")
    p.add_argument("--sequences", type=int, default=20_000, help="--data zipf: corpus size in sequences")
    p.add_argument("--max-words", type=int, default=5_000_000, help="--data text: read at most this many")
    p.add_argument("--log-every", type=int, default=10, help="progress line every N steps (0: none)")
    p.add_argument("--trace-step", type=int,
                   help="run this step with a full TensorFlow trace and write its step stats "
                        "(every device the step ran on, servers included) to --trace-dir")
    p.add_argument("--trace-dir", default="lm_trace",
                   help="with --trace-step: worker i writes worker<i>.step_stats.pb here")
    args = p.parse_args()
    if args.steps < 1 or not 0 <= args.warmup < args.steps:
        p.error("need --steps >= 1 and 0 <= --warmup < --steps")
    if args.vocab < 3:
        p.error("--vocab must be at least 3")
    tf1.disable_eager_execution()  # a tf.compat.v1 graph-mode script

    if args.data == "text":
        tokens, vocab = text_tokens(args.vocab, args.max_words)
    else:
        vocab = args.vocab
        tokens = zipf_tokens(vocab, args.sequences * (args.seq_len + 1))
    # Consecutive non-overlapping windows of seq_len + 1 words: input and next-word target.
    sequences = tokens[:len(tokens) // (args.seq_len + 1) * (args.seq_len + 1)].reshape(-1, args.seq_len + 1)
    print(f"data: {args.data}, {tokens.size:,} words, {len(sequences):,} sequences of {args.seq_len}; "
          f"vocabulary {vocab:,}, embedding {vocab:,} x {args.dim} "
          f"({vocab * args.dim * 4 / 1e6:.1f} MB)", flush=True)

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ds = tf.data.Dataset.from_tensor_slices(sequences).shuffle(len(sequences), seed=0)
        ds = autopar.shard(ds)  # autopar: this worker's disjoint slice of the data
        ds = ds.batch(args.batch_size, drop_remainder=True).repeat().prefetch(2)
        batch = tf1.data.make_one_shot_iterator(ds).get_next()

        loss = language_model_loss(batch[:, :-1], batch[:, 1:], vocab, args.dim, args.hidden,
                                   args.num_sampled)
        global_step = tf1.train.get_or_create_global_step()
        default_lr, make_optimizer = OPTIMIZERS[args.optimizer]
        optimizer = make_optimizer(args.lr or default_lr)
        grads_and_vars = optimizer.compute_gradients(loss)
        grads, variables = zip(*grads_and_vars)
        clipped, _ = tf.clip_by_global_norm(grads, args.clip)
        train_op = optimizer.apply_gradients(zip(clipped, variables), global_step=global_step)

    config = autopar.Config(run_option=args.run_option, total_steps=args.steps,
                            log_every_steps=args.log_every)
    # autopar: a session-like runner; single-device when --spec is omitted
    with autopar.get_runner(graph, args.spec, config) as runner:
        recent = collections.deque(maxlen=10)
        start = time.perf_counter()
        for step in range(args.steps):
            if step == args.warmup:
                start = time.perf_counter()
            if step == args.trace_step:
                value = traced_step(runner, train_op, loss, args.trace_dir)
            else:
                _, value = runner.run([train_op, loss])
            recent.append(value)
        elapsed = time.perf_counter() - start
        if runner.is_chief:
            measured = args.steps - args.warmup
            words = measured * args.batch_size * runner.num_workers * args.seq_len
            print(f"{runner.num_workers} worker{'s' * (runner.num_workers != 1)}, global batch {args.batch_size * runner.num_workers} "
                  f"x {args.seq_len} words, run option {args.run_option if args.spec else 'none'}: "
                  f"{measured} steps after {args.warmup} warm-up steps in {elapsed:.2f} s", flush=True)
            print(f"words/s: {words / elapsed:.1f}", flush=True)
            print(f"final loss: {float(np.mean(recent)):.4f} (mean of the chief's last {len(recent)} steps)",
                  flush=True)


if __name__ == "__main__":
    main()
