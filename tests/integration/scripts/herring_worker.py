"""A worker process for the Herring transport tests: runs transport.push_pull in
tf.compat.v1 graph mode on commands read from stdin, one JSON object a line,
and answers each with one "RESULT <json>" line on stdout.

    python herring_worker.py INDEX      (AUTOPAR_SUMSERVERS names the servers)

Commands:
  {"cmd": "reduce", "out": DIR, "steps": S, "cases": [case, ...]}
      case: {"buffer_id", "size", "shards": [[server, offset, length], ...],
             "n": contributors, "wire", "average", "kind": "int"|"normal"|"wide",
             "segment": elements per segment, "first", "late": a contributor
             that pushes a second after the others}
      This worker takes part in the cases with first <= INDEX < first + n
      (as contributor INDEX - first; "first" defaults to 0), builds them in an
      order shuffled by INDEX, and runs them all in one session.run per step
      (so several buffers are in flight at once). Writes its inputs and
      outputs to DIR/worker{INDEX}.npz as in_{buffer}_{step}, out_{buffer}_{step}.
  {"cmd": "push", "buffer_id", "warm_buffer_id", "size", "shards", "n", "timeout_s"}
      A push/pull of warm_buffer_id (if not null) by this worker alone (it
      connects to the servers and must succeed), "STARTED", then one push/pull expected to
      fail; RESULT {"error": class name, "message": ..., "seconds": its time}.
"""
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

from autopar.transforms.methods.herring import transport
from autopar.transforms.methods.herring.bfb import FusionBuffer

tf1 = tf.compat.v1
tf1.disable_eager_execution()
INDEX = int(sys.argv[1])


def answer(payload: dict) -> None:
    print("RESULT " + json.dumps(payload), flush=True)


def reduce(session, command: dict) -> None:
    cases = [c for c in command["cases"] if 0 <= INDEX - c.get("first", 0) < c["n"]]
    np.random.default_rng(INDEX).shuffle(cases)
    feeds, outputs = [], []
    for case in cases:
        x = tf1.placeholder(tf.float32, [case["size"]])
        pushed = x
        if case.get("late") == INDEX - case.get("first", 0):
            # This contributor pushes a second after the others.
            pushed = tf1.numpy_function(lambda v: (time.sleep(1.0), v)[1], [x], tf.float32)
            pushed.set_shape(x.shape)
        y = transport.push_pull(pushed, FusionBuffer.of_shards(case["buffer_id"], case["shards"]),
                           num_contributors=case["n"], contributor_index=INDEX - case.get("first", 0),
                           wire_dtype=case["wire"], average=case["average"],
                           segment_elements=case["segment"])
        feeds.append(x)
        outputs.append(y)
    saved = {}
    for step in range(command["steps"]):
        feed = {}
        for case, x in zip(cases, feeds):
            rng = np.random.default_rng([case["buffer_id"], INDEX, step])
            if case["kind"] == "int":
                value = rng.integers(-1000, 1001, case["size"]).astype(np.float32)
            elif case["kind"] == "wide":
                # 1e-9 .. 1e6: float16 subnormals, underflow and overflow.
                value = (rng.standard_normal(case["size"])
                         * 10.0 ** rng.uniform(-9, 6, case["size"])).astype(np.float32)
                value[:4] = [np.inf, -np.inf, np.nan, 65519.0]
            else:
                value = rng.standard_normal(case["size"]).astype(np.float32)
            feed[x] = value
            saved[f"in_{case['buffer_id']}_{step}"] = value
        results = session.run(outputs, feed)
        for case, result in zip(cases, results):
            saved[f"out_{case['buffer_id']}_{step}"] = result
    np.savez(os.path.join(command["out"], f"worker{INDEX}.npz"), **saved)
    answer({"ran": [c["buffer_id"] for c in cases]})


def push(session, command: dict) -> None:
    x = tf.ones([command["size"]])
    if command.get("warm_buffer_id") is not None:
        warm = transport.push_pull(x, FusionBuffer.of_shards(command["warm_buffer_id"], command["shards"]),
                              num_contributors=1, contributor_index=0)
        assert (session.run(warm) == 1).all()
    y = transport.push_pull(x, FusionBuffer.of_shards(command["buffer_id"], command["shards"]),
                       num_contributors=command["n"], contributor_index=INDEX,
                       timeout_s=command["timeout_s"])
    # Ready (connected and warm): the test may stop a server now, then says go.
    print("STARTED", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    try:
        session.run(y)
        answer({"error": None, "seconds": time.monotonic() - start})
    except tf.errors.OpError as exc:
        answer({"error": type(exc).__name__, "message": exc.message,
                "seconds": time.monotonic() - start})


def main() -> None:
    with tf1.Session() as session:
        print("READY", flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            {"reduce": reduce, "push": push}[command["cmd"]](session, command)


if __name__ == "__main__":
    main()
