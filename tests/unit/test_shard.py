"""autopar.shard: disjoint, deterministic slices whose union is the dataset; a
step reading a dataset with no shard on its way is refused."""
import json

import pytest
import tensorflow as tf

import autopar
from autopar.common import env


def _worker_elements(monkeypatch, n, i, dataset):
    monkeypatch.setenv(env.ROLE, "worker")
    monkeypatch.setenv(env.TASK_INDEX, str(i))
    monkeypatch.setenv(env.CLUSTER, json.dumps({"worker": [f"127.0.0.1:{9000 + k}" for k in range(n)]}))
    return [int(x) for x in autopar.shard(dataset).as_numpy_iterator()]


def test_slices_are_disjoint_and_cover_the_dataset(monkeypatch):
    data = tf.data.Dataset.range(23)
    for n in (2, 3, 4):
        slices = [_worker_elements(monkeypatch, n, i, data) for i in range(n)]
        flat = sorted(x for s in slices for x in s)
        assert flat == list(range(23))
        # Deterministic: the same call gives the same slice.
        assert _worker_elements(monkeypatch, n, 1, data) == slices[1]


def test_batches_of_all_workers_form_the_single_device_batch(monkeypatch):
    data = tf.data.Dataset.range(24)
    single = [list(b) for b in data.batch(6).as_numpy_iterator()]
    per_worker = []
    for i in range(3):
        _worker_elements(monkeypatch, 3, i, data)   # sets the env for worker i
        per_worker.append([list(b) for b in autopar.shard(data).batch(2).as_numpy_iterator()])
    for step, batch in enumerate(single):
        assert sorted(x for w in per_worker for x in w[step]) == sorted(batch)


def test_outside_a_job_the_dataset_is_unchanged(monkeypatch):
    monkeypatch.delenv(env.ROLE, raising=False)
    assert [int(x) for x in autopar.shard(tf.data.Dataset.range(5)).as_numpy_iterator()] == list(range(5))


def _elements(dataset):
    return [int(x) for x in autopar.shard(dataset).as_numpy_iterator()]


def test_a_process_joined_through_tf_config_gets_its_slice_before_get_runner(monkeypatch):
    """TF_CONFIG: the chief is worker 0, the `worker` tasks follow; a ps task
    trains nothing and gets the dataset as it is."""
    for name in (env.ROLE, env.TASK_INDEX, env.CLUSTER):
        monkeypatch.delenv(name, raising=False)
    cluster = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
               "ps": ["10.0.0.4:2222"]}
    data = tf.data.Dataset.range(10)
    got = {}
    for task, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                    "task": {"type": task, "index": index}}))
        got[(task, index)] = _elements(data)
    assert got[("chief", 0)] == [0, 3, 6, 9]
    assert got[("worker", 0)] == [1, 4, 7]
    assert got[("worker", 1)] == [2, 5, 8]
    assert got[("ps", 0)] == list(range(10))


def test_an_mpi_rank_gets_its_slice(monkeypatch):
    for name in (env.ROLE, env.TASK_INDEX, env.CLUSTER, "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    data = tf.data.Dataset.range(7)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert _elements(data) == [1, 3, 5]
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")      # OpenMPI's variables win
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert _elements(data) == [0, 3, 6]


# -- a step reading a dataset with no shard on its way is refused ------------

tf1 = tf.compat.v1


def _step_graph(pipeline, iterator="one_shot", eval_pipeline=None):
    """A linear model trained from `pipeline(Dataset)` read through a one-shot
    or initializable iterator (or a fed string handle); `eval_pipeline`: a
    second dataset only an evaluation metric reads."""
    graph = tf.Graph()
    with graph.as_default():
        data = tf.data.Dataset.from_tensor_slices((tf.zeros([8, 2]), tf.zeros([8, 1])))
        ds = pipeline(data).batch(2).repeat()
        if iterator == "one_shot":
            x, y = tf1.data.make_one_shot_iterator(ds).get_next()
        elif iterator == "initializable":
            x, y = tf1.data.make_initializable_iterator(ds).get_next()
        else:
            handle = tf1.placeholder(tf.string, [])
            feedable = tf1.data.Iterator.from_string_handle(
                handle, tf1.data.get_output_types(ds), tf1.data.get_output_shapes(ds))
            tf1.data.make_initializable_iterator(ds)
            tf1.data.make_initializable_iterator(autopar.shard(data).batch(2))
            x, y = feedable.get_next()
        w = tf1.get_variable("w", [2, 1])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        if eval_pipeline is not None:
            ex, ey = tf1.data.make_one_shot_iterator(eval_pipeline(data).batch(4)).get_next()
            tf.reduce_mean(tf.square(tf.matmul(ex, w) - ey), name="eval_loss")
    return graph


def _compile(graph, **config):
    from autopar.transforms.compile import compile_for_config
    from autopar.transforms.topology import Topology
    return compile_for_config(graph, Topology(("127.0.0.1",), 0), autopar.Config(**config))


@pytest.mark.parametrize("iterator", ["one_shot", "initializable", "string_handle"])
def test_a_step_reading_an_unsharded_dataset_is_refused_naming_it(monkeypatch, iterator):
    monkeypatch.delenv(env.ROLE, raising=False)
    with pytest.raises(autopar.UnsupportedGraphError) as refused:
        _compile(_step_graph(lambda d: d.shuffle(8, seed=0), iterator))
    message = str(refused.value)
    assert message.startswith("the training step reads its batches through 'IteratorGetNext' "
                              "from a tf.data pipeline that starts at 'TensorSliceDataset'")
    assert "with no shard on its way: every worker would read the same examples" in message
    assert "ds = autopar.shard(ds) before .batch()" in message
    assert "Config(allow_unsharded_input=True)" in message
    # The switch lets it train as it is.
    _compile(_step_graph(lambda d: d.shuffle(8, seed=0), iterator), allow_unsharded_input=True)


@pytest.mark.parametrize("iterator", ["one_shot", "initializable", "string_handle"])
def test_a_dataset_sharded_by_autopar_or_by_hand_is_accepted(monkeypatch, iterator):
    """In the launcher (no worker position) autopar.shard leaves the
    pipeline a shard of one, which shows it sharded; ds.shard(n, i) written
    by hand counts too."""
    monkeypatch.delenv(env.ROLE, raising=False)
    _compile(_step_graph(lambda d: autopar.shard(d).shuffle(8, seed=0), iterator))
    _compile(_step_graph(lambda d: d.shard(2, 0).map(lambda x, y: (x + 1, y)), iterator))


def test_only_the_steps_input_counts_and_every_branch_must_be_sharded(monkeypatch):
    monkeypatch.delenv(env.ROLE, raising=False)
    # An evaluation set only a metric reads is not the step's input.
    _compile(_step_graph(autopar.shard, eval_pipeline=lambda d: d))
    # Zipped with an unsharded dataset, the sharded one does not cover it.
    with pytest.raises(autopar.UnsupportedGraphError, match="starts at 'RangeDataset'"):
        _compile(_step_graph(lambda d: tf.data.Dataset.zip(
            (autopar.shard(d), tf.data.Dataset.range(8))).map(lambda xy, i: xy)))
