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
