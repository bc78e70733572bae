# Copyright (C) 2018 Seoul National University
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
#
# Ported from Parallax (github.com/snuspl/parallax, parallax/examples/lm1b) to
# autopar on TensorFlow 2.21's tf.compat.v1; every change is marked
# "autopar port":
# - parallax.parallel_run(graph, resource_info, sync, parallax_config) ->
#   autopar.get_runner(graph, resource_info, config) with
#   Config(loss_reduction="parallax"): Parallax's average_sparse=False (sparse
#   gradients summed over workers, dense ones averaged), which is why the
#   model multiplies the embedding gradient by the per-worker batch size;
# - one replica per worker process (Parallax's num_replicas_per_worker lists
#   are a single array each);
# - no 1B Word Benchmark data here: synthetic data only, a deterministic
#   global batch per step of which worker i takes rows i, i+N, i+2N, ... (as
#   autopar.shard deals examples), so a run on N workers with --batch_size b
#   sees the batches of one device with --batch_size N*b, dropout masks
#   included;
# - --resource_info_file is an autopar resource spec (YAML or Parallax's
#   "host: ids" format; empty: one device), --save_npz saves every variable.
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # autopar port

import autopar  # autopar port
import language_model_graph

tf1 = tf.compat.v1  # autopar port
flags = tf1.app.flags  # autopar port
flags.DEFINE_string("logdir", "/tmp/lm1b", "Logging directory.")
flags.DEFINE_string('resource_info_file', '',
                    'autopar resource spec (empty: one device)')  # autopar port
flags.DEFINE_integer('max_steps', 1000000,
                     """Number of iterations to run for each workers.""")
flags.DEFINE_integer('log_frequency', 100,
                     """How many steps between two runop logs.""")
flags.DEFINE_string('run_option', 'hybrid', 'autopar run option')  # autopar port
flags.DEFINE_string('save_npz', '', 'save every variable to this file')  # autopar port
FLAGS = flags.FLAGS


def synthetic_batch(step, rows, vocab_size, num_steps):  # autopar port
    """The global batch of `rows` sequences of step `step` (x, y, w)."""
    rng = np.random.default_rng(1000 + step)
    x = rng.integers(0, vocab_size, size=(rows, num_steps)).astype(np.int32)
    y = rng.integers(0, vocab_size, size=(rows, num_steps)).astype(np.int32)
    return x, y, np.ones((rows, num_steps), np.int32)


def main(_):

    single_gpu_graph = tf.Graph()
    with single_gpu_graph.as_default():
        tf1.set_random_seed(1)  # autopar port: every process builds the same initial values
        with tf1.variable_scope("model"):
            model = language_model_graph.build_model()

    def run(sess, num_workers, worker_id, num_replicas_per_worker):

        state_c = np.zeros([FLAGS.batch_size, model.state_size], dtype=np.float32)
        state_h = np.zeros([FLAGS.batch_size, model.projected_size], dtype=np.float32)

        prev_global_step = sess.run(model.global_step)
        prev_time = time.time()
        fetches = {
            'global_step': model.global_step,
            'loss': model.loss,
            'train_op': model.train_op,
            'final_state_c': model.final_state_c,
            'final_state_h': model.final_state_h
        }

        for local_step in range(FLAGS.max_steps):
            # autopar port: this worker's rows of the step's global batch
            x, y, w = synthetic_batch(local_step, FLAGS.batch_size * num_workers,
                                      model.vocab_size, FLAGS.num_steps)
            mine = slice(worker_id, None, num_workers)
            feeds = {}
            feeds[model.x] = x[mine]
            feeds[model.y] = y[mine]
            feeds[model.w] = w[mine]
            feeds[model.initial_state_c] = state_c
            feeds[model.initial_state_h] = state_h
            fetched = sess.run(fetches, feeds)

            state_c = fetched['final_state_c']
            state_h = fetched['final_state_h']

            if local_step % FLAGS.log_frequency == 0:
                cur_time = time.time()
                elapsed_time = cur_time - prev_time
                num_words = FLAGS.batch_size * FLAGS.num_steps * num_workers
                wps = (fetched['global_step'] - prev_global_step) * num_words / elapsed_time
                prev_global_step = fetched['global_step']
                print("Iteration %d, time = %.2fs, wps = %.0f, train loss = %.4f" % (
                    fetched['global_step'], cur_time - prev_time, wps, fetched['loss']),
                    flush=True)
                prev_time = cur_time

    # autopar port: was parallax.parallel_run(...)
    config = autopar.Config(run_option=FLAGS.run_option, loss_reduction="parallax",
                            log_every_steps=0)
    with autopar.get_runner(single_gpu_graph, FLAGS.resource_info_file or None,
                            config) as runner:
        run(runner, runner.num_workers, runner.worker_index, 1)
        if FLAGS.save_npz:
            with single_gpu_graph.as_default():
                variables = tf1.global_variables()
            values = runner.run({v.op.name: v for v in variables})
            np.savez(FLAGS.save_npz.format(worker=runner.worker_index), **values)

if __name__ == "__main__":
    tf1.app.run()
