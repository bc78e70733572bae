"""Horovod 0.28.1 with Gloo, TensorFlow 2.12 graph mode (run by the interpreter
of bench/.venv-horovod, which bench/horovod_env.py builds).

`hvd.DistributedOptimizer` wraps the same plain SGD: dense gradients are
all-reduced (averaged) with Gloo's ring, IndexedSlices (the LM embedding) are
all-gathered (Horovod's default, sparse_as_dense=False). The chief's initial
variables are broadcast with `hvd.broadcast_global_variables(0)`.

horovodrun would start remote ranks over ssh, which the emulated hosts do not
have; the harness starts every rank itself inside its host's namespace with
the environment gloo_run would give it (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*,
HOROVOD_HOSTNAME, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo and the
address of a rendezvous server it runs on host 0: role "rendezvous" below).
The Gloo interface is the one holding this host's address, found here.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peers import common  # noqa: E402


def interface_of(address: str) -> str:
    """Name of this namespace's interface that holds `address`."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE, text=True,
                         check=True, timeout=10).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "inet" and fields[3].split("/")[0] == address:
            return fields[1]
    raise RuntimeError(f"no interface holds {address} in this namespace:\n{out}")


def pin_hostname(address: str) -> None:
    """Give this process its own UTS namespace whose hostname is `address`.

    Horovod 0.28.1 creates the Gloo device of its global process set
    (GlooContext::InitializeForProcessSet) without HOROVOD_GLOO_IFACE: Gloo
    then binds to whatever gethostname() resolves to. On real hosts that is
    the host's address; in an emulated host (a network namespace sharing the
    machine's hostname) it is loopback, and the peers are told to connect to
    127.0.0.1. A private hostname equal to the address resolves to exactly
    this host's address, and changes nothing outside this process."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    clone_newuts = 0x04000000
    if libc.unshare(clone_newuts) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS) failed (needs root)")
    name = address.encode()
    if libc.sethostname(name, len(name)) != 0:
        raise OSError(ctypes.get_errno(), "sethostname failed")


def rank_env(index: int, addresses: list[str]) -> dict[str, str]:
    """gloo_run's per-slot environment for one rank per host, ranks in host order."""
    n = len(addresses)
    return {"HOROVOD_HOSTNAME": addresses[index], "HOROVOD_RANK": str(index), "HOROVOD_SIZE": str(n),
            "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
            "HOROVOD_CROSS_RANK": str(index), "HOROVOD_CROSS_SIZE": str(n)}


def serve_rendezvous(job: common.Job) -> None:
    """The HTTP rendezvous (key-value store) horovodrun runs in the launcher."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    addresses = [a.rsplit(":", 1)[0] for a in job.cluster["worker"]]
    plan = get_host_assignments(parse_hosts(",".join(f"{a}:1" for a in addresses)), len(addresses))
    for slot in plan:   # the environment we hand each rank must be the plan's
        expect = rank_env(slot.rank, addresses)
        got = {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank),
               "HOROVOD_SIZE": str(slot.size), "HOROVOD_LOCAL_RANK": str(slot.local_rank),
               "HOROVOD_LOCAL_SIZE": str(slot.local_size), "HOROVOD_CROSS_RANK": str(slot.cross_rank),
               "HOROVOD_CROSS_SIZE": str(slot.cross_size)}
        if got != expect:
            raise RuntimeError(f"host assignment differs from the ranks' environment: {got} != {expect}")
    host, port = job.options["rendezvous"].rsplit(":", 1)
    server = RendezvousHTTPServer((host, int(port)), RendezvousHandler, False)
    server.init(plan)
    print(f"{common.PHASE} serving rendezvous 0", flush=True)
    server.serve_forever()


def run(job: common.Job) -> None:
    if job.role == "rendezvous":
        serve_rendezvous(job)
        return
    common.quiet_tensorflow()
    addresses = [a.rsplit(":", 1)[0] for a in job.cluster["worker"]]
    host, port = job.options["rendezvous"].rsplit(":", 1)
    pin_hostname(job.address)
    os.environ.update(rank_env(job.index, addresses))
    os.environ.update({"HOROVOD_GLOO_RENDEZVOUS_ADDR": host, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                       "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
                       "HOROVOD_GLOO_IFACE": interface_of(job.address)})
    import tensorflow as tf
    import horovod
    import horovod.tensorflow as hvd
    from bench.peers import graph_model
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    hvd.init()
    if hvd.size() != job.num_workers or hvd.rank() != job.index:
        raise RuntimeError(f"horovod says rank {hvd.rank()} of {hvd.size()}, expected "
                           f"{job.index} of {job.num_workers}")
    model = graph_model.build(job.workload, wrap_optimizer=lambda opt: hvd.DistributedOptimizer(opt))
    with model.graph.as_default():
        init = tf1.global_variables_initializer()
        broadcast = hvd.broadcast_global_variables(0)
    config = tf1.ConfigProto(intra_op_parallelism_threads=0, inter_op_parallelism_threads=0)
    session = tf1.Session(graph=model.graph, config=config)
    session.run(init)
    session.run(broadcast)
    eval_feed = model.eval_feed(job.workload.eval_batch())
    common.run_training(
        job,
        step=lambda k: session.run(model.train_op, feed_dict=model.feed(job.batch(k))),
        evaluate=lambda: session.run(model.eval_loss, feed_dict=eval_feed),
        tensorflow=tf.__version__, horovod=horovod.__version__, gloo_built=bool(hvd.gloo_built()))


if __name__ == "__main__":
    common.main_wrapper(run)
