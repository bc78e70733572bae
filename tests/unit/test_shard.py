"""autopar.shard: disjoint, deterministic slices whose union is the dataset."""
import json

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
