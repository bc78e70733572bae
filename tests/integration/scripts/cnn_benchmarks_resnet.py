"""ResNet-20 (CIFAR-10) of tf_cnn_benchmarks, ported under
tests/programs/tf_cnn_benchmarks, trained for --steps steps as
tf_cnn_benchmarks trains it: Nesterov momentum 0.9, L2 weight decay on every
non-batch-norm variable, batch norm in training mode (the builder's
use_tf_layers=False path: FusedBatchNormV3 in float32, tf.nn.moments in
float64), the model's learning-rate schedule, the moving statistics updated
with the step and the global step incremented after it.

Single-device without --spec (autopar.get_runner(graph, None, config)), else
under autopar with the spec; worker i of N feeds rows [i*B/N, (i+1)*B/N) of a
deterministic global batch (normalised random images, random labels), so the
N workers together see exactly the single-device batch. Every worker saves
all global variables (np.savez, out/workerI.npz).

Diagnostics (not used by the tests): --use-tf-layers builds with
tf.compat.v1.layers (tf_cnn_benchmarks' default; needs tf_keras, which the
project does not install); --activation softplus builds the model
with a smooth activation in place of ReLU; --dump-relu saves, for the first
step, every ReLU's output on this worker's rows (out/reluI.npz); --permute
feeds the rows of each global batch in another order; --save-init and
--init-from let a float64 single-device run start where a float32 one did.
"""
import argparse
import collections
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)
# tf_cnn_benchmarks imports its modules top-level (import convnet_builder, from
# models import model), as when run from its own directory.
sys.path.insert(0, os.path.join(REPO, "tests", "programs", "tf_cnn_benchmarks"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402

tf1 = tf.compat.v1
NCLASS = 10

Params = collections.namedtuple("Params", "use_tf_layers fp16_vars use_fp16 data_format "
                                          "resnet_base_lr")


def build(dtype, image_size: int, weight_decay: float, activation: str = "relu",
          use_tf_layers: bool = False):
    """The training graph; (graph, images, labels, fetch of one step, relus)."""
    from models import resnet_model   # noqa: E402 (the ported tf_cnn_benchmarks)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1234)
        if activation != "relu":      # diagnostic: a smooth activation
            relu, tf1.nn.relu = tf1.nn.relu, getattr(tf.nn, activation)
        try:
            model = resnet_model.create_resnet20_cifar_model(
                Params(use_tf_layers=use_tf_layers, fp16_vars=False, use_fp16=False,
                       data_format="NHWC", resnet_base_lr=None))
            model.data_type = dtype
            model.image_size = image_size
            global_step = tf1.train.get_or_create_global_step()
            images = tf1.placeholder(dtype, [None, image_size, image_size, model.depth],
                                     name="images")
            labels = tf1.placeholder(tf.int32, [None], name="labels")
            inputs = [images, labels]
            result = model.build_network(inputs, phase_train=True, nclass=NCLASS)
        finally:
            if activation != "relu":
                tf1.nn.relu = relu
        # As benchmark_cnn's forward_pass_and_gradients (one device, no loss scale).
        base_loss = model.loss_function(inputs, result)
        params = tf1.trainable_variables()
        with tf.name_scope("l2_loss"):
            filtered_params = model.filter_l2_loss_vars(params)
            l2_loss = tf.add_n([tf.nn.l2_loss(v) for v in filtered_params])
        total_loss = base_loss + weight_decay * l2_loss
        grads = tf.gradients(total_loss, params)
        learning_rate = model.get_learning_rate(global_step, model.get_batch_size())
        opt = tf1.train.MomentumOptimizer(learning_rate, 0.9, use_nesterov=True)
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        train_op = tf.group(opt.apply_gradients(list(zip(grads, params))), *update_ops,
                            name="train_ops_group")
        with tf.control_dependencies([train_op]):
            # benchmark_cnn fetches the assign_add itself; its result (an
            # _UnreadVariable) is not a fetch autopar's Runner maps, its op is.
            inc_global_step = global_step.assign_add(1).op
        relus = [op.outputs[0] for op in graph.get_operations() if op.type == "Relu"]
    return graph, images, labels, inc_global_step, relus


def global_batch(step: int, batch: int, image_size: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Normalised images (standard normal per pixel and channel), labels."""
    rng = np.random.default_rng(1000 + step)
    # float32 values in either dtype: a float64 run can replay a float32 one.
    x = rng.standard_normal((batch, image_size, image_size, 3)).astype(np.float32).astype(dtype)
    y = rng.integers(0, NCLASS, size=batch).astype(np.int32)
    return x, y


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=6, help="global batch")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--batch-norm-group", default="auto",
                   help="'auto' (Config's default), 'all', a group size or 'none'")
    p.add_argument("--activation", default="relu", help="diagnostic: e.g. softplus")
    p.add_argument("--dump-relu", action="store_true")
    p.add_argument("--use-tf-layers", action="store_true",
                   help="diagnostic: the builder's tf.compat.v1.layers path (needs the tf_keras "
                        "package and TF_USE_LEGACY_KERAS=1)")
    p.add_argument("--permute", action="store_true",
                   help="diagnostic: feed each global batch's rows in another order "
                        "(the same training, another summation order)")
    p.add_argument("--save-init", action="store_true",
                   help="diagnostic: also save the initial variables (out/initI.npz)")
    p.add_argument("--init-from", help="diagnostic, single-device: start from these saved "
                                       "variables (e.g. a float32 run's init0.npz)")
    p.add_argument("--out", required=True)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="allreduce")
    args = p.parse_args(argv)
    dtype = tf.float64 if args.dtype == "float64" else tf.float32

    graph, images, labels, step_op, relus = build(dtype, args.image_size, args.weight_decay,
                                                  args.activation, args.use_tf_layers)
    if args.init_from:
        assert not args.spec, "--init-from is for a single-device run"
        with np.load(args.init_from) as saved, graph.as_default():
            restore = tf.group(*[v.assign(saved[v.op.name].astype(v.dtype.as_numpy_dtype))
                                 for v in tf1.global_variables()])
    group = args.batch_norm_group
    config = autopar.Config(run_option=args.run_option, log_every_steps=0,
                            batch_norm_group=None if group == "none"
                            else group if group in ("all", "auto") else int(group))
    with autopar.get_runner(graph, args.spec, config) as runner:
        n, i = runner.num_workers, runner.worker_index
        per = args.batch // n
        mine = slice(i * per, (i + 1) * per)
        os.makedirs(args.out, exist_ok=True)
        with graph.as_default():
            variables = tf1.global_variables()
        if args.init_from:
            runner.run(restore)
        if args.save_init:
            np.savez(os.path.join(args.out, f"init{i}.npz"),
                     **runner.run({v.op.name: v for v in variables}))
        for step in range(args.steps):
            x, y = global_batch(step, args.batch, args.image_size, dtype.as_numpy_dtype)
            if args.permute:
                order = np.random.default_rng(5000 + step).permutation(args.batch)
                x, y = x[order], y[order]
            feed = {images: x[mine], labels: y[mine]}
            if step == 0 and args.dump_relu:
                _, values = runner.run([step_op, relus], feed)
                np.savez(os.path.join(args.out, f"relu{i}.npz"),
                         **{t.op.name: v for t, v in zip(relus, values)})
            else:
                runner.run(step_op, feed)
        values = runner.run({v.op.name: v for v in variables})
        np.savez(os.path.join(args.out, f"worker{i}.npz"), **values)
        print(f"worker {i} done at global step {int(values['global_step'])}", flush=True)


if __name__ == "__main__":
    main()
