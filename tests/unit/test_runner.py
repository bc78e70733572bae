"""The single-device Runner (`get_runner(graph, None)`) accepts every feed and
fetch a plain tf.compat.v1.Session accepts, runs graphs autopar cannot
distribute, and counts training steps; autopar errors from get_runner end the
process cleanly. Each case is checked against a plain Session on an identical
graph."""
from __future__ import annotations

import collections
import logging

import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import AutoparError, UnsupportedGraphError

tf1 = tf.compat.v1

SPARSE = tf1.SparseTensorValue(indices=[[0, 1], [0, 4], [1, 0], [2, 5]],
                               values=[1.0, -2.0, 0.5, 3.0], dense_shape=[3, 6])
Pair = collections.namedtuple("Pair", "loss weights")


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    # These tests are the script run outside any job.
    for var in ("AUTOPAR_ROLE", "TF_CONFIG", "AUTOPAR_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    # get_runner gives the "autopar" logger its own stdout handler; leave the
    # logger as found so other tests' log capture still sees its records.
    logger = logging.getLogger("autopar")
    state = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:] = state[0]
    logger.propagate, logger.level = state[1], state[2]


@pytest.fixture
def steps_logged():
    """The step numbers the Runner's progress reports (every step)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Collect()
    logger = logging.getLogger("autopar.progress")
    logger.addHandler(handler)
    yield lambda: [int(line.split()[1]) for line in lines if line.startswith("step ")]
    logger.removeHandler(handler)


def _sparse_model():
    """A sparse input whose gradient flows into `w` through sparse_dense_matmul,
    a placeholder with a default, and a dense input fed by name."""
    graph = tf.Graph()
    with graph.as_default():
        sp = tf1.sparse_placeholder(tf.float32, [None, 6], name="sp")
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        scale = tf1.placeholder_with_default(tf.constant(1.0), [], name="scale")
        w = tf1.get_variable("w", [6, 2], initializer=tf1.glorot_uniform_initializer(seed=3))
        h = tf.sparse.sparse_dense_matmul(sp, w) * scale + x
        loss = tf.reduce_mean(tf.square(h), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph, sp, x, scale, w, loss, train


def _plain_session(graph):
    with graph.as_default():
        init = tf1.global_variables_initializer()
    sess = tf1.Session(graph=graph)
    sess.run(init)
    return sess


def test_sparse_feed_and_fetch_match_a_plain_session(steps_logged):
    graph, sp, x, scale, w, loss, train = _sparse_model()
    ref_graph, r_sp, r_x, r_scale, r_w, r_loss, r_train = _sparse_model()
    ref = _plain_session(ref_graph)
    xs = np.arange(6, dtype=np.float32).reshape(3, 2) / 10
    with autopar.get_runner(graph, None, autopar.Config(log_every_steps=1)) as runner:
        # SparseTensorValue, then a plain (indices, values, shape) tuple, a
        # tensor fed by name, the default of `scale` and then a fed `scale`.
        feeds = [{sp: SPARSE, "x:0": xs},
                 {sp: tuple(SPARSE), x: xs},
                 {sp: SPARSE, x: xs, scale: 0.5}]
        ref_feeds = [{r_sp: SPARSE, "x:0": xs},
                     {r_sp: tuple(SPARSE), r_x: xs},
                     {r_sp: SPARSE, r_x: xs, r_scale: 0.5}]
        for feed, ref_feed in zip(feeds, ref_feeds):
            got_loss, _ = runner.run([loss, train], feed)
            want_loss, _ = ref.run([r_loss, r_train], ref_feed)
            assert got_loss == pytest.approx(want_loss, rel=1e-6)
        np.testing.assert_allclose(runner.run(w), ref.run(r_w), rtol=1e-6)
        # A SparseTensor fetch comes back as a SparseTensorValue, as from Session.
        fetched = runner.run(sp, {sp: SPARSE})
        assert isinstance(fetched, tf1.SparseTensorValue)
        np.testing.assert_array_equal(fetched.indices, SPARSE.indices)
        np.testing.assert_array_equal(fetched.values, SPARSE.values)
        np.testing.assert_array_equal(fetched.dense_shape, SPARSE.dense_shape)
    # Three training runs, three steps; the fetch-only runs are not steps.
    assert steps_logged() == [1, 2, 3]


def test_nested_feed_keys_and_fetches_match_a_plain_session():
    graph, sp, x, scale, w, loss, train = _sparse_model()
    ref_graph, r_sp, r_x, r_scale, r_w, r_loss, r_train = _sparse_model()
    ref = _plain_session(ref_graph)
    xs = np.ones([3, 2], np.float32)
    with autopar.get_runner(graph, None) as runner:
        # A tuple of tensors as one key, fed a tuple of values (Session flattens
        # both), fetching a dict holding a namedtuple and a list.
        got = runner.run({"pair": Pair(loss, w), "list": [loss, "loss:0"]},
                         {(sp, x): (SPARSE, xs), (scale,): (2.0,)})
        want = ref.run({"pair": Pair(r_loss, r_w), "list": [r_loss, "loss:0"]},
                       {r_sp: SPARSE, r_x: xs, r_scale: 2.0})
        assert isinstance(got["pair"], Pair) and isinstance(got["list"], list)
        assert got["pair"].loss == pytest.approx(want["pair"].loss, rel=1e-6)
        np.testing.assert_allclose(got["pair"].weights, want["pair"].weights, rtol=1e-6)
        assert got["list"] == pytest.approx(want["list"], rel=1e-6)
        with pytest.raises(ValueError, match="structure of 2 tensors"):
            runner.run(loss, {(sp, x): SPARSE})


def test_indexed_slices_feed_and_fetch():
    graph = tf.Graph()
    with graph.as_default():
        values = tf1.placeholder(tf.float32, [None, 3], name="values")
        indices = tf1.placeholder(tf.int64, [None], name="indices")
        dense_shape = tf1.placeholder(tf.int64, [2], name="dense_shape")
        slices = tf.IndexedSlices(values, indices, dense_shape)
        total = tf.reduce_sum(tf.convert_to_tensor(slices), axis=1)
    # Fed as a plain (values, indices, dense_shape) tuple, as Session allows.
    value = (np.ones([2, 3], np.float32), [0, 2], [4, 3])
    with autopar.get_runner(graph, None) as runner:
        got_total, got_slices = runner.run([total, slices], {slices: value})
    np.testing.assert_array_equal(got_total, [3, 0, 3, 0])
    # Fetched as an IndexedSlicesValue, as from Session.
    np.testing.assert_array_equal(got_slices.indices, [0, 2])
    np.testing.assert_array_equal(got_slices.values, np.ones([2, 3]))
    np.testing.assert_array_equal(got_slices.dense_shape, [4, 3])


def test_feeding_an_unknown_name_is_a_clear_type_error():
    graph, sp, *_, loss, _train = _sparse_model()
    with autopar.get_runner(graph, None) as runner:
        with pytest.raises(TypeError, match="no_such_tensor"):
            runner.run(loss, {sp: SPARSE, "no_such_tensor:0": 1.0})


def test_a_batch_the_input_cannot_take_is_refused_by_name():
    """An input declared with a fixed batch: the feed's shape, the input's and
    what to declare instead, before TensorFlow's own ValueError; a feed it
    takes, and a list (no shape to check), run as in a plain Session."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 2], name="x")
        total = tf.reduce_sum(x)
    with autopar.get_runner(graph, None) as runner:
        with pytest.raises(AutoparError, match=r"input 'x' has the shape \(4, 2\), worker 0 fed "
                                               r"one of shape \(2, 2\); its batch dimension is "
                                               r"fixed at 4.*declare it None"):
            runner.run(total, {x: np.ones((2, 2), np.float32)})
        assert runner.run(total, {x: np.ones((4, 2), np.float32)}) == 8.0
        assert runner.run(total, {x: [[1.0, 2.0]] * 4}) == 12.0


# ------------------------------------------------ graphs a plain Session runs
def _hand_written_update():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 3], initializer=tf1.glorot_uniform_initializer(seed=5))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        gw, = tf.gradients(loss, [w])
        train = w.assign_sub(0.1 * gw, name="manual_update").op
    return graph, x, w, loss, train


def _gradient_accumulation():
    """Two micro-batches summed into a non-trainable accumulator, then applied
    by an optimizer through a hand-made gradient: the analysis rejects it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 3], initializer=tf1.glorot_uniform_initializer(seed=5))
        acc = tf1.get_variable("acc", [4, 3], initializer=tf1.zeros_initializer(),
                               trainable=False)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        gw, = tf.gradients(loss, [w])
        accumulate = acc.assign_add(gw).op
        with tf.control_dependencies([tf1.train.GradientDescentOptimizer(0.1).apply_gradients(
                [(acc / 2.0, w)])]):
            apply = acc.assign(tf.zeros_like(acc)).op
    return graph, x, w, loss, accumulate, apply


def test_unsupported_graphs_are_really_unsupported_for_distribution():
    # The premise of the fallback tests below. (A hand-written update is
    # distributed since it is recognised from data flow: tests/unit/test_analysis.py.)
    from autopar.transforms.analysis import analyze_graph
    with pytest.raises(UnsupportedGraphError):
        analyze_graph(_gradient_accumulation()[0])


def test_hand_written_update_runs_single_device(steps_logged):
    graph, x, w, loss, train = _hand_written_update()
    ref_graph, r_x, r_w, r_loss, r_train = _hand_written_update()
    ref = _plain_session(ref_graph)
    data = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
    with autopar.get_runner(graph, None, autopar.Config(log_every_steps=1)) as runner:
        for _ in range(3):
            runner.run(train, {x: data})
            ref.run(r_train, {r_x: data})
        assert runner.run(loss, {x: data}) == pytest.approx(ref.run(r_loss, {r_x: data}),
                                                            rel=1e-6)
        np.testing.assert_allclose(runner.run(w), ref.run(r_w), rtol=1e-6)
    assert steps_logged() == [1, 2, 3]


def test_gradient_accumulation_runs_single_device_and_counts_applies(steps_logged):
    graph, x, w, loss, accumulate, apply = _gradient_accumulation()
    ref_graph, r_x, r_w, r_loss, r_accumulate, r_apply = _gradient_accumulation()
    ref = _plain_session(ref_graph)
    data = np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)
    with autopar.get_runner(graph, None, autopar.Config(log_every_steps=1)) as runner:
        for _ in range(2):
            for half in (data[:3], data[3:]):
                runner.run(accumulate, {x: half})
                ref.run(r_accumulate, {r_x: half})
            runner.run(apply)
            ref.run(r_apply)
        np.testing.assert_allclose(runner.run(w), ref.run(r_w), rtol=1e-6)
        assert not np.allclose(runner.run(w), _plain_session(ref_graph).run(r_w))  # it trained
    # Accumulating writes no trainable variable; each apply is one step.
    assert steps_logged() == [1, 2]


def test_graph_without_optimizer_runs_single_device(steps_logged):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 3], initializer=tf1.ones_initializer())
        y = tf.matmul(x, w)
    with autopar.get_runner(graph, None, autopar.Config(log_every_steps=1)) as runner:
        np.testing.assert_array_equal(runner.run(y, {x: np.ones([2, 4])}), np.full([2, 3], 4.0))
    assert steps_logged() == []


# ------------------------------------------------ errors through get_runner
def _spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("hosts:\n  - address: 127.0.0.1\n    workers: 2\n")
    return str(path)


@pytest.mark.slow
def test_distributing_an_unsupported_graph_exits_2_with_the_message(tmp_path, capsys):
    graph = _gradient_accumulation()[0]
    with pytest.raises(SystemExit) as info:
        autopar.get_runner(graph, _spec(tmp_path))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: ") and "'w'" in err   # the analysis's message
    assert "Traceback" not in err


@pytest.mark.slow
def test_autopar_debug_raises_the_error_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_DEBUG", "1")
    with pytest.raises(UnsupportedGraphError):
        autopar.get_runner(_gradient_accumulation()[0], _spec(tmp_path))


@pytest.mark.slow
def test_launch_failure_exits_2_with_the_message(tmp_path, capsys):
    """Every port of the spec's range is taken: the launcher cannot start the
    job, and says so without a traceback."""
    import socket
    graph = _sparse_model()[0]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        spec = tmp_path / "spec.yaml"
        spec.write_text(f"hosts:\n  - address: 127.0.0.1\n    workers: 1\n"
                        f"    ports: [{port}, {port}]\n")
        with pytest.raises(SystemExit) as info:
            autopar.get_runner(graph, str(spec))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: ") and str(port) in err
    assert "Traceback" not in err


# ------------------------------------------------------------- evaluate
def _eval_graph(size: int, batch: int):
    """A trainable graph and, on a dataset of `size` examples, per-batch
    (sum, count) metrics: the values themselves and how many are > 2."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=1.0)
        loss = tf.square(w - 3.0)
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        ds = autopar.shard(tf.data.Dataset.range(size)).batch(batch)
        iterator = tf1.data.make_initializable_iterator(ds)
        x = tf.cast(iterator.get_next(), tf.float32) * w
        metrics = {"mean": (tf.reduce_sum(x), tf.size(x)),
                   "above2": (tf.reduce_sum(tf.cast(x > 2.0, tf.float32)), tf.size(x))}
    return graph, train, iterator.initializer, metrics, x


def test_evaluate_covers_the_whole_set_once():
    graph, train, init, metrics, _ = _eval_graph(7, 3)
    with autopar.get_runner(graph, None) as runner:
        assert runner.evaluate(metrics, initializer=init, totals=True) == {
            "mean": (21.0, 7.0), "above2": (4.0, 7.0)}
        assert runner.evaluate(metrics, initializer=init) == {"mean": 3.0, "above2": 4 / 7}
        runner.run(train)                        # w: 1 -> 1.4
        got = runner.evaluate(metrics, initializer=init)
        assert got["mean"] == pytest.approx(3.0 * 1.4, rel=1e-6)
        assert got["above2"] == 5 / 7            # 2*1.4 .. 6*1.4 > 2
        assert runner.evaluate(metrics, initializer=init, max_batches=1, totals=True)[
            "mean"][1] == 3.0


def test_evaluate_rejects_what_it_cannot_evaluate():
    graph, train, init, metrics, x = _eval_graph(4, 2)
    with graph.as_default():
        p = tf1.placeholder(tf.float32, [None])
        fed = {"p": (tf.reduce_sum(p), tf.size(p))}
        unpaired = {"x": tf.reduce_sum(x)}
        vector = {"x": (x, tf.size(x))}
    with autopar.get_runner(graph, None) as runner:
        with pytest.raises(autopar.AutoparError, match="read no iterator"):
            runner.evaluate(fed, {p: [1.0]})
        assert runner.evaluate(fed, {p: [1.0, 2.0]}, max_batches=2) == {"p": 1.5}
        with pytest.raises(autopar.AutoparError, match=r"pair \(sum, count\)"):
            runner.evaluate(unpaired, initializer=init)
        with pytest.raises(autopar.AutoparError, match="not a scalar"):
            runner.evaluate(vector, initializer=init)
        with pytest.raises(autopar.AutoparError, match="non-empty dict"):
            runner.evaluate([], initializer=init)


@pytest.mark.slow
def test_each_train_op_runs_with_its_own_inputs_and_logs_its_own_loss(steps_logged):
    """Two train ops over different variables (tests/programs/two_trainers):
    a step of one is fed only its own placeholders; the progress line's loss
    is that train op's (the Runner fetched the first optimizer's loss with
    every step, which needed the other train op's inputs)."""
    from tests.programs import two_trainers
    program = two_trainers.build()
    runner = autopar.get_runner(program.graph, None, autopar.Config(log_every_steps=1))
    rows = slice(0, 6)
    for k in range(4):
        fetch, feed = program.step(k, rows, 6)
        runner.run(fetch, feed)
    assert steps_logged() == [1, 2, 3, 4]
    _, feed_b = program.step(1, rows, 6)
    loss_b = program.graph.get_tensor_by_name(runner.analysis.train_groups[1].loss)
    assert set(t.op.name for t in feed_b) == {"ids_b", "x_b", "y_b"}
    assert np.isfinite(runner.run(loss_b, feed_b))
    runner.close()


def test_a_distributed_step_refuses_a_part_of_a_train_op():
    """Fetching one variable's update op alone, where its train op updates
    several together: a distributed step applies the train op's aggregated
    gradients as one, so it is refused, naming the op."""
    from autopar.runtime.runner import Runner
    from autopar.transforms.analysis import analyze_graph
    graph2 = tf.Graph()
    with graph2.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        w = tf1.get_variable("w", [3, 2])
        b = tf1.get_variable("b", [2])
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(x @ w + b))
    analysis = analyze_graph(graph2)
    update = analysis.variable("w").update_ops[0]
    runner = Runner(tf1.Session(graph=graph2), graph2, analysis, worker_index=1, num_workers=2)
    with pytest.raises(autopar.AutoparError, match=f"'{update}' updates one of the variables"):
        runner.run(graph2.get_operation_by_name(update), {"x:0": np.zeros([4, 3], np.float32)})
    runner.close()


def test_fetching_what_an_assign_returns_runs_the_assignment():
    """`global_step.assign_add(1)` returns a variable-like value with no
    initializer (tf_cnn_benchmarks fetches it): fetched, the assignment runs
    and its new value comes back, as with a plain Session."""
    graph = tf.Graph()
    with graph.as_default():
        step = tf1.train.get_or_create_global_step()
        bumped = step.assign_add(1)
    runner = autopar.get_runner(graph, None)
    assert int(runner.run(bumped)) == 1 and int(runner.run(bumped)) == 2
    assert int(runner.run(step)) == 2
    runner.close()
