"""runtime.session.share_cores: a process's intra-op threads when several of
the job's processes share its machine (every loopback address is one machine)."""
import os

from autopar.runtime.session import local_processes, session_config, share_cores

import tensorflow as tf

LOOPBACK = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.2:5000", "127.0.0.2:5001"],
            "ps": ["127.0.0.1:6000", "127.0.0.2:6000"]}
HOSTS = {"worker": ["10.0.0.1:5000", "10.0.0.1:5001", "10.0.0.2:5000"],
         "ps": ["10.0.0.3:6000"]}


def test_processes_on_one_machine_are_counted():
    assert local_processes(LOOPBACK, "worker", 2) == 6     # 127.0.0.1 and .2: one machine
    assert local_processes(LOOPBACK, "ps", 0) == 6
    assert local_processes(HOSTS, "worker", 0) == 2
    assert local_processes(HOSTS, "worker", 2) == 1
    assert local_processes(HOSTS, "ps", 0) == 1


def test_shared_machine_gets_its_share_and_a_lone_process_the_default():
    cores = os.cpu_count()
    config = tf.compat.v1.ConfigProto()
    share_cores(config, LOOPBACK, "ps", 1)
    assert config.intra_op_parallelism_threads == max(1, cores // 6)
    alone = tf.compat.v1.ConfigProto()
    share_cores(alone, HOSTS, "ps", 0)
    assert alone.intra_op_parallelism_threads == 0           # TensorFlow's default: all cores
    assert session_config(HOSTS, 0).intra_op_parallelism_threads == max(1, cores // 2)
    assert session_config(HOSTS, 2).intra_op_parallelism_threads == 0


def test_worker_session_filters_devices_as_before():
    config = session_config(LOOPBACK, 1)
    assert list(config.device_filters) == ["/job:worker/task:1", "/job:ps"]
    config = session_config({"worker": HOSTS["worker"]}, 0, all_workers=True)
    assert list(config.device_filters) == ["/job:worker"]
