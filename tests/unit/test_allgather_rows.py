"""CollectiveOpsBackend.allgather_rows and scatter_rows, run for real: three
members on three CPU devices of one session (collectives between local
devices need no cluster). Every member must get every member's rows in
member order (a scatter: its own rows from the source), for row counts that
differ by member and by step, down to none, across several rungs of the
padding ladder, with the static shape of the rows kept."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.transforms.comm import ROW_LADDER, CollectiveOpsBackend, row_gather_keys

tf1 = tf.compat.v1

MEMBERS = 3
WIDTH = 4
# Per step, each member's row count: uneven, empty members, an all-empty step,
# and counts on both sides of several rungs (8 -> 10 -> 12 -> 15 ...).
COUNTS = [(3, 0, 7), (12, 1, 0), (0, 0, 0), (9, 9, 16), (1, 2, 3), (40, 0, 11)]


def _on_members(group_key, build):
    """A session of MEMBERS CPU devices, build(m, backend) run for member m
    on device m: the members' results and the session."""
    graph = tf.Graph()
    with graph.as_default():
        members = []
        for m in range(MEMBERS):
            with tf.device(f"/device:CPU:{m}"):
                members.append(build(m, CollectiveOpsBackend(MEMBERS, group_key=group_key)))
    return members, tf1.Session(graph=graph,
                                config=tf1.ConfigProto(device_count={"CPU": MEMBERS}))


@pytest.fixture(scope="module")
def gather():
    keys, _ = row_gather_keys(100, "")

    def member(m, backend):
        values = tf1.placeholder(tf.float32, [None, WIDTH])
        indices = tf1.placeholder(tf.int64, [None])
        rows, ids = backend.allgather_rows(
            values, indices, (keys["count"], keys["values"], keys["indices"]))
        return values, indices, rows, ids
    members, session = _on_members(7, member)
    yield members, session
    session.close()


def test_rows_keep_their_static_width(gather):
    members, _ = gather
    for _, _, rows, ids in members:
        assert rows.shape.as_list() == [None, WIDTH]
        assert ids.shape.as_list() == [None]


def test_every_member_gets_all_rows_in_member_order(gather):
    members, session = gather
    rng = np.random.default_rng(0)
    assert max(sum(c) for c in COUNTS) > ROW_LADDER[8]   # several rungs are used
    for step, counts in enumerate(COUNTS):
        data = [(rng.standard_normal((n, WIDTH)).astype(np.float32),
                 rng.integers(0, 1000, n).astype(np.int64)) for n in counts]
        feed = {}
        for (values, indices, _, _), (v, i) in zip(members, data):
            feed[values], feed[indices] = v, i
        results = session.run([(rows, ids) for _, _, rows, ids in members], feed)
        want_rows = np.concatenate([v for v, _ in data])
        want_ids = np.concatenate([i for _, i in data])
        for m, (rows, ids) in enumerate(results):
            np.testing.assert_array_equal(rows, want_rows, err_msg=f"step {step} member {m}")
            np.testing.assert_array_equal(ids, want_ids, err_msg=f"step {step} member {m}")


# scatter_rows: the member of rank 1 sends; rows of two dimensions each
SOURCE = 1
ROW = [2, 3]


@pytest.fixture(scope="module")
def scatter():
    def member(m, backend):
        # the counts gathered, as a grouped lookup has them (a session sets up
        # collectives for a step only for the ops it knows as such, and an
        # all-to-all is not one of them)
        count = tf1.placeholder(tf.int32, [1])
        counts = backend.allgather(count, 299)
        rows = tf1.placeholder(tf.float32, [None, *ROW]) if m == SOURCE else None
        return count, rows, backend.scatter_rows(rows, counts, m, SOURCE, ROW, tf.float32, 300)
    members, session = _on_members(8, member)
    yield members, session
    session.close()


def test_each_member_gets_its_own_rows_from_the_source(scatter):
    members, session = scatter
    rng = np.random.default_rng(1)
    for _, _, mine in members:
        assert mine.shape.as_list() == [None, *ROW]
    for step, counts in enumerate(COUNTS):
        blocks = [rng.standard_normal((n, *ROW)).astype(np.float32) for n in counts]
        feed = {c: [n] for (c, _, _), n in zip(members, counts)}
        feed[members[SOURCE][1]] = np.concatenate(blocks)
        results = session.run([mine for _, _, mine in members], feed)
        for m, got in enumerate(results):
            np.testing.assert_array_equal(got, blocks[m], err_msg=f"step {step} member {m}")
