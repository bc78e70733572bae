"""The single-device side of the checkpoint tests, with TensorFlow's own
tf.compat.v1.train.Saver in a plain graph-mode script (no autopar).

    saver_compat.py save DIR OUT [MODEL]      train 3 steps, save DIR/model.ckpt-3, dump values to OUT
    saver_compat.py restore DIR OUT [MODEL]   restore DIR's latest checkpoint, dump values and a loss
(MODEL: a tests/models.py name, lm_adam_clip by default)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import models  # noqa: E402

tf1 = tf.compat.v1
MODEL = "lm_adam_clip"


def main(mode: str, directory: str, out: str, name: str = MODEL) -> None:
    tf1.disable_eager_execution()
    model = models.build(name)
    with model.graph.as_default():
        saver = tf1.train.Saver()
        init = tf1.global_variables_initializer()
        variables = tf1.global_variables()
    with tf1.Session(graph=model.graph) as sess:
        if mode == "save":
            sess.run(init)
            for step in range(3):
                x, y = models.global_batch(name, step, 12)
                sess.run(model.train_op, models.feed(model, x, y))
            saver.save(sess, os.path.join(directory, "model.ckpt"), global_step=3)
        else:
            saver.restore(sess, tf1.train.latest_checkpoint(directory))
        x, y = models.global_batch(name, 99, 12)
        values = {v.op.name: sess.run(v) for v in variables}
        values["__loss__"] = np.array(sess.run(model.loss, models.feed(model, x, y)))
        np.savez(out, **values)


if __name__ == "__main__":
    main(*sys.argv[1:])
