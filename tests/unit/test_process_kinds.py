"""A method declares the helper processes it needs as process kinds
(transforms/methods/process_kind.py), listed in
transforms/methods/process_registry.py; the launcher's port reservation,
child plans, coordinator and timeline read the declaration and name no kind
themselves. In-process: nothing starts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autopar.common import env as envvars
from autopar.common.roles import SERVER_ROLE, WORKER_ROLE
from autopar.runtime import firewall
from autopar.runtime import timeline
from autopar.runtime.commands import plan_children
from autopar.runtime.coordinator import Coordinator
from autopar.runtime.ports import reserve_cluster
from autopar.runtime.spec import HostSpec, ResourceSpec
from autopar.transforms.compile import compile_plan
from autopar.transforms.methods.herring.sumserver import SUMMATION_SERVER
from autopar.transforms.methods.process_kind import HOST, PORT, ProcessKind
from autopar.transforms.methods.process_registry import PROCESS_KINDS, process_kinds
from autopar.transforms.methods.registry import METHODS, processes
from autopar.transforms.plan import PlanOptions
from autopar.transforms.topology import Topology
from tests import models
from tests.integration.cluster import REPO

SPEC = ResourceSpec(hosts=(HostSpec("127.0.0.1", workers=2, servers=1),
                           HostSpec("127.0.0.2", workers=1, servers=1)), source="test.yaml")


def _launcher_plans(roles):
    """What the launcher plans for a job needing ``roles`` besides the
    workers: the ports it reserves and the child of each process."""
    kinds = process_kinds(roles)
    with reserve_cluster(SPEC, helpers=kinds, servers=SERVER_ROLE in roles) as reservation:
        plans = plan_children(SPEC, reservation.cluster, [sys.executable, "train.py"],
                              cwd="/here", helpers=reservation.helpers)
        return reservation, plans


def test_every_declared_kind_is_in_the_table_and_the_table_holds_nothing_else():
    declared = [k for m in METHODS.values() for k in m.process_kinds]
    assert sorted(k.role for k in declared) == sorted(PROCESS_KINDS)
    assert all(PROCESS_KINDS[k.role] is k for k in declared)
    assert METHODS["herring"].process_kinds == (SUMMATION_SERVER,)


def test_herrings_plan_needs_its_summation_servers_and_the_launcher_plans_them():
    model = models.build("cnn_momentum")
    compiled = compile_plan(model.graph, Topology(("127.0.0.1", "127.0.0.2"), 2),
                            PlanOptions(run_option="herring"))
    roles = processes(compiled.plan)
    assert roles == {SUMMATION_SERVER.role}
    assert process_kinds(roles) == [SUMMATION_SERVER]
    reservation, plans = _launcher_plans(roles)
    sums = reservation.helpers["sumserver"]
    assert [a.rpartition(":")[0] for a in sums] == ["127.0.0.1", "127.0.0.2"]
    helpers = [p for p in plans if p.role == "sumserver"]
    assert [p.name for p in helpers] == ["sumserver 0", "sumserver 1"]
    assert [p.role for p in plans] == ["sumserver"] * 2 + [WORKER_ROLE] * 3   # servers first
    for plan, address in zip(helpers, sums):
        host, _, port = address.rpartition(":")
        assert plan.command == [str(REPO / "runtime" / "autopar_sumserver"),
                                "--host", host, "--port", port]
        assert not plan.titled   # the launcher names it in ps
    assert all(p.env[envvars.SUMSERVERS] == ",".join(sums) for p in plans)
    # Without the role, no summation server and no variable naming them.
    _, plain = _launcher_plans(set())
    assert {p.role for p in plain} == {WORKER_ROLE}
    assert all(envvars.SUMSERVERS not in p.env for p in plain)


ECHO = ProcessKind(role="echo", what="echo servers",
                   command=("/bin/echo-server", "--listen", f"{HOST}:{PORT}"),
                   publishes="AUTOPAR_ECHO", timeline_lane=False, sets_title=True)


def test_a_new_kind_reaches_the_launcher_through_its_declaration_alone(monkeypatch):
    """A kind no runtime module names: declared and listed, it gets ports,
    processes with its command, its variable in every process, coordinator
    states, and (not asking for one) no timeline lane."""
    monkeypatch.setitem(PROCESS_KINDS, ECHO.role, ECHO)
    reservation, plans = _launcher_plans({ECHO.role, SUMMATION_SERVER.role})
    echoes = reservation.helpers["echo"]
    assert len(echoes) == 2 and not set(echoes) & set(reservation.helpers["sumserver"])
    # Table order: the summation servers, then the new kind, then the workers.
    assert [p.role for p in plans] == ["sumserver"] * 2 + ["echo"] * 2 + [WORKER_ROLE] * 3
    echo = [p for p in plans if p.role == "echo"]
    assert [p.command for p in echo] == [["/bin/echo-server", "--listen", a] for a in echoes]
    assert all(p.titled for p in echo)
    assert all(p.env["AUTOPAR_ECHO"] == ",".join(echoes) for p in plans)
    assert all(p.env[envvars.ROLE] == "echo" for p in echo)
    counts = {role: len(a) for role, a in reservation.helpers.items()}
    coordinator = Coordinator("127.0.0.1", 3, 0, helpers=counts)
    assert {"echo 0", "echo 1", "sumserver 0", "sumserver 1"} <= set(coordinator.snapshot())
    trace = timeline.merge({}, reservation.cluster, counts, job="abc")
    assert trace["otherData"]["lanes"] == ["worker 0", "worker 1", "worker 2",
                                           "sumserver 0", "sumserver 1"]
    environ = {"AUTOPAR_ECHO": ",".join(echoes)}
    assert set(echoes) <= set(firewall.job_endpoints(reservation.cluster, environ))


def test_a_kind_the_launcher_cannot_place_or_probe_is_refused_where_it_is_declared():
    with pytest.raises(ValueError, match="placement 'per worker'"):
        ProcessKind(role="x", what="xs", command=(), publishes="X", placement="per worker")
    with pytest.raises(ValueError, match="probe 'heartbeat'"):
        ProcessKind(role="x", what="xs", command=(), publishes="X", probe="heartbeat")


def test_the_launcher_reads_the_kinds_without_importing_tensorflow():
    """`autopar launch` never imports TensorFlow: the table of kinds is apart
    from the methods' (which imports every method and so TensorFlow)."""
    code = ("import sys, autopar.runtime.launcher, autopar.transforms.methods.process_registry; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_the_planner_learns_which_kinds_a_job_cannot_have_from_their_declarations(monkeypatch):
    """A launched job lacks a kind whose native program cannot be built here;
    a job joined through TF_CONFIG lacks one whose variable names nothing,
    and without server tasks has a server per process of the kinds it has."""
    from autopar.runtime import membership, native
    monkeypatch.setitem(PROCESS_KINDS, ECHO.role, ECHO)
    monkeypatch.setattr(native, "program_unavailable",
                        lambda name: "no compiler" if name == "autopar_sumserver" else None)
    assert membership.spec_topology(SPEC).missing_processes == (("sumserver", "no compiler"),)
    workers = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    joined = membership.cluster_topology(workers, {"AUTOPAR_ECHO": "10.0.0.3:1,10.0.0.4:1"})
    assert joined.missing("sumserver") == "" and joined.missing("echo") is None
    assert joined.num_servers == 2
