"""runtime/membership.py: each way of joining a job gives the same
Membership record (cluster, role and index, topology, where the plan comes
from), the first resolver that applies wins, and shard()'s position comes
from the same resolvers."""
import json

import pytest

from autopar.common import env
from autopar.common.errors import SpecError
from autopar.common.roles import REPORT_ROLE, SERVER_ROLE, WORKER_ROLE
from autopar.runtime import membership
from autopar.runtime.membership import PlanSource

CLUSTER = {"worker": ["127.0.0.1:5001", "127.0.0.1:5002"], "ps": ["127.0.0.1:5003"]}
TF_CONFIG = json.dumps({"cluster": {"chief": ["127.0.0.1:5001"], "worker": ["127.0.0.1:5002"],
                                    "ps": ["127.0.0.1:5003"]},
                        "task": {"type": "worker", "index": 0}})


def _launched(index: int, **extra) -> dict:
    return {env.ROLE: WORKER_ROLE, env.CLUSTER: json.dumps(CLUSTER),
            env.TASK_INDEX: str(index), **extra}


def test_a_launched_worker_gets_its_plan_from_the_launcher_or_the_chief():
    got = membership.resolve(None, _launched(1, **{env.PLAN: "plan", env.TTY: "1",
                                                   env.GPUS: "0", env.LINK_GBPS: "0.5"}))
    assert (got.how, got.role, got.index, got.cluster) == ("launcher", WORKER_ROLE, 1, CLUSTER)
    assert (got.plan_source, got.plan_key) == (PlanSource.LAUNCHER, "plan")
    assert got.gpus == (0,) and got.tty and not got.print_report
    assert (got.topology.num_workers, got.topology.num_servers) == (2, 1)
    assert got.topology.link_gbps == 0.5
    chief = membership.resolve(None, _launched(0))
    assert chief.plan_source is PlanSource.CHIEF and chief.print_report   # no launcher printed it
    assert not membership.resolve(None, _launched(0, **{env.REPORT_PRINTED: "1"})).print_report


def test_tf_config_workers_compile_their_own_plan_and_servers_plan_nothing():
    got = membership.resolve(None, {"TF_CONFIG": TF_CONFIG,
                                    env.SUMSERVERS: "127.0.0.1:2300,127.0.0.1:2301"})
    # (the chief is worker 0, TF_CONFIG's worker 0 worker 1)
    assert (got.how, got.role, got.index, got.plan_source) == ("TF_CONFIG", WORKER_ROLE, 1,
                                                               PlanSource.OWN)
    assert got.cluster["worker"] == ["127.0.0.1:5001", "127.0.0.1:5002"]
    # The ps task counts as the server, the summation servers make herring possible.
    assert got.topology.num_servers == 1 and got.topology.missing("sumserver") is None
    server = TF_CONFIG.replace('"type": "worker"', '"type": "ps"')
    got = membership.resolve(None, {"TF_CONFIG": server})
    assert (got.role, got.index, got.topology) == (SERVER_ROLE, 0, None)


def test_an_mpi_rank_needs_the_spec_and_is_that_worker_of_it():
    ranks = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(SpecError, match="pass the resource spec"):
        membership.resolve(None, ranks)
    spec = {"hosts": [{"address": "127.0.0.1", "workers": 2, "worker_ports": [5001, 5002]}]}
    got = membership.resolve(spec, ranks)
    assert (got.how, got.index, got.num_workers, got.plan_source) == ("mpirun", 1, 2,
                                                                      PlanSource.OWN)
    assert got.topology.num_servers == 0


def test_an_srun_task_is_a_worker_of_its_step():
    task = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_PROCID": "1", "SLURMD_NODENAME": "localhost", "SLURM_LOCALID": "1"}
    got = membership.resolve({"hosts": []}, task)    # (the spec is not used)
    assert (got.how, got.index, got.num_workers, got.plan_source) == ("srun", 1, 2,
                                                                      PlanSource.OWN)
    assert membership.worker_position(task) == (2, 1)


def test_the_first_resolver_that_applies_wins_and_gives_the_position():
    both = _launched(1, TF_CONFIG=TF_CONFIG)     # a launched job inside a TF_CONFIG one
    assert membership.resolve(None, both).how == "launcher"
    assert membership.worker_position(both) == (2, 1)
    assert membership.worker_position({"TF_CONFIG": TF_CONFIG}) == (2, 1)
    assert membership.worker_position({env.ROLE: REPORT_ROLE, "TF_CONFIG": TF_CONFIG}) is None
    assert membership.resolve(None, {}) is None and membership.worker_position({}) is None
