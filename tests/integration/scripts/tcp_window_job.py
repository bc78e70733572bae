"""One process of a three-task TensorFlow cluster on 127.0.0.1 (two workers
and a parameter server), started as `python tcp_window_job.py JOB INDEX
WORKER0_PORT WORKER1_PORT PS_PORT`. The ps and worker 1 serve until killed;
worker 0 moves a tensor over each kind of connection (reads a variable on
the ps, a tensor computed on worker 1, and assigns the variable a value
computed on worker 0, which the ps takes from it), prints "MOVED", and
serves until its stdin closes, so that its connections can be read from the
kernel."""
import sys

import tensorflow as tf

tf1 = tf.compat.v1
job, index = sys.argv[1], int(sys.argv[2])
w0, w1, ps = (int(p) for p in sys.argv[3:6])
cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"],
                                "ps": [f"127.0.0.1:{ps}"]})
server = tf.distribute.Server(cluster, job_name=job, task_index=index)
if (job, index) != ("worker", 0):
    server.join()
tf1.disable_eager_execution()
with tf.device("/job:ps/task:0"):
    v = tf1.get_variable("v", initializer=tf.zeros([64 << 10]), use_resource=True)
with tf.device("/job:worker/task:1"):
    remote = tf.ones([64 << 10]) * 3.0               # taken by worker 0 from worker 1
with tf.device("/job:worker/task:0"):
    computed = v.read_value() * 2.0 + remote         # pulled by worker 0 from the ps
with tf.device("/job:ps/task:0"):
    assign = v.assign(computed)                      # taken by the ps from worker 0
with tf1.Session(server.target) as sess:
    sess.run(v.initializer)
    sess.run(assign)
    sess.run(assign)
    print("MOVED", flush=True)
    sys.stdin.read()
