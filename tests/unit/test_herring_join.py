"""A TF_CONFIG job running herring needs TensorFlow ps tasks only for
variables that live on servers: with no ps task and AUTOPAR_SUMSERVERS set,
the plan's servers are the summation servers (runtime/membership.cluster_topology),
and a plan that would still put a variable on a server is refused."""
from dataclasses import replace

import pytest

from autopar.common import env
from autopar.common.errors import LaunchError, SpecError
from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.runtime import membership, worker
from autopar.transforms.compile import compile_plan
from autopar.transforms.plan import PlanOptions
from autopar.transforms.topology import Topology
from autopar.transforms.methods.registry import METHODS
from tests import models

WORKERS = {WORKER_JOB: ["10.0.0.1:2222", "10.0.0.2:2222"]}
SUMSERVERS = "10.0.0.3:2300,10.0.0.4:2300,10.0.0.5:2300"


def _joined(cluster):
    """Worker 0's place in `cluster`, joined through TF_CONFIG, with the
    topology its environment gives it now."""
    return membership.Membership("TF_CONFIG", "worker", 0, cluster,
                                 membership.cluster_topology(cluster),
                                 membership.PlanSource.OWN)


def test_without_ps_tasks_the_summation_servers_are_the_servers(monkeypatch):
    monkeypatch.delenv(env.SUMSERVERS, raising=False)
    assert membership.cluster_topology(WORKERS).num_servers == 0
    monkeypatch.setenv(env.SUMSERVERS, SUMSERVERS)
    t = membership.cluster_topology(WORKERS)
    assert t.num_servers == 3 and t.worker_hosts == ("10.0.0.1", "10.0.0.2")
    # With ps tasks they count (the launcher starts one summation server per ps task).
    with_ps = dict(WORKERS, **{SERVER_JOB: ["10.0.0.3:2223"]})
    assert membership.cluster_topology(with_ps).num_servers == 1


def test_the_link_speed_and_shared_cores_of_a_tf_config_job(monkeypatch):
    """What a spec's network section tells the planner, a TF_CONFIG job's
    starter sets in every process's environment."""
    monkeypatch.delenv(env.LINK_GBPS, raising=False)
    monkeypatch.delenv(env.SHARED_CORES, raising=False)
    t = membership.cluster_topology(WORKERS)
    assert (t.link_gbps, t.shared_cores) == (None, None)
    monkeypatch.setenv(env.LINK_GBPS, "0.1")
    monkeypatch.setenv(env.SHARED_CORES, "2")
    t = membership.cluster_topology(WORKERS)
    assert (t.link_gbps, t.shared_cores) == (0.1, 2.0)
    for bad in ("0", "-1", "fast", "inf"):
        monkeypatch.setenv(env.SHARED_CORES, bad)
        with pytest.raises(SpecError, match="AUTOPAR_SHARED_CORES"):
            membership.cluster_topology(WORKERS)


def test_a_dense_herring_plan_fits_a_cluster_without_ps_tasks(monkeypatch):
    monkeypatch.setenv(env.SUMSERVERS, SUMSERVERS)
    model = models.build("cnn_momentum")
    c = compile_plan(model.graph, membership.cluster_topology(WORKERS), PlanOptions(run_option="herring"))
    assert METHODS["herring"].state(c.plan).layout is not None and not c.plan.server_variables
    assert METHODS["herring"].state(c.plan).layout.num_servers == 3
    worker._check_fits(c.plan, _joined(WORKERS))          # accepted: nothing lives on a ps task
    monkeypatch.setenv(env.SUMSERVERS, "10.0.0.3:2300")
    with pytest.raises(LaunchError, match="3 servers, but the cluster has 2 and 1"):
        worker._check_fits(c.plan, _joined(WORKERS))      # another number of summation servers


def test_a_plan_with_server_variables_needs_ps_tasks(monkeypatch):
    monkeypatch.setenv(env.SUMSERVERS, SUMSERVERS)
    model = models.build("lm_adam_clip")         # sparse embedding: on the servers under herring
    c = compile_plan(model.graph, membership.cluster_topology(WORKERS), PlanOptions(run_option="herring"))
    assert c.plan.server_variables
    with pytest.raises(SpecError, match="add one 'ps' task per summation server"):
        worker._check_fits(c.plan, _joined(WORKERS))


def test_without_summation_servers_hybrid_keeps_the_ring_and_herring_is_refused(monkeypatch):
    """A TF_CONFIG job with ps tasks but no AUTOPAR_SUMSERVERS has no one to
    sum herring's buffers: hybrid must not pick herring for dense gradients
    (it would fail at the first step), and run_option='herring' says what to
    start."""
    # 4 workers on 4 hosts, 4 servers: herring's busiest link moves M, the
    # ring's 1.5 M, so the cost model favours herring for a dense model whose
    # bytes matter (on a 10 Mbit/s link).
    with_ps = {WORKER_JOB: [f"10.0.0.{i}:2222" for i in range(1, 5)],
               SERVER_JOB: [f"10.0.0.{i}:2223" for i in range(5, 9)]}
    model = models.build("cnn_momentum")
    monkeypatch.delenv(env.SUMSERVERS, raising=False)
    topology = replace(membership.cluster_topology(with_ps), link_gbps=0.01)
    c = compile_plan(model.graph, topology, PlanOptions(run_option="hybrid"))
    assert METHODS["herring"].state(c.plan).layout is None and "AUTOPAR_SUMSERVERS" in METHODS["herring"].state(c.plan).why
    assert {v.method for v in c.plan.variables} == {"allreduce"}
    with pytest.raises(SpecError, match="needs summation servers.*AUTOPAR_SUMSERVERS"):
        compile_plan(model.graph, topology, PlanOptions(run_option="herring"))
    # The same cluster with its summation servers named: hybrid picks herring.
    monkeypatch.setenv(env.SUMSERVERS, ",".join(f"10.0.0.{i}:2300" for i in range(5, 9)))
    c = compile_plan(model.graph, replace(membership.cluster_topology(with_ps), link_gbps=0.01),
                     PlanOptions(run_option="hybrid"))
    assert METHODS["herring"].state(c.plan).layout is not None


def test_a_plan_with_nothing_on_servers_runs_on_a_cluster_without_them():
    """The launcher starts no server for a plan that puts nothing on them (a
    dense model on one machine, herring declined): the plan, compiled for the
    spec's servers, fits the cluster without its ps job; a plan that uses
    servers does not."""
    model = models.build("mlp_sgd")
    topology = Topology(("127.0.0.1", "127.0.0.1"), 1)
    dense = compile_plan(model.graph, topology, PlanOptions(run_option="hybrid")).plan
    cluster = {WORKER_JOB: ["127.0.0.1:1", "127.0.0.1:2"]}
    worker._check_fits(dense, _joined(cluster))
    on_servers = compile_plan(model.graph, topology, PlanOptions(run_option="ps")).plan
    with pytest.raises(LaunchError, match="for 2 workers and 1 server,"):
        worker._check_fits(on_servers, _joined(cluster))
