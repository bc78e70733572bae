"""runtime/slurm.py: Slurm's node lists and task counts read as Slurm writes
them, the spec of an allocation, the cluster of an srun step, and every
malformed value refused naming the variable and the item."""
import pytest

from autopar.common.errors import SpecError
from autopar.runtime import join, slurm
from autopar.runtime.commands import SRUN, plan_children


@pytest.mark.parametrize("text, nodes", [
    ("n1", ["n1"]),
    ("node[01-03,7],gpu3", ["node01", "node02", "node03", "node7", "gpu3"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("c[098-100]-ib", ["c098-ib", "c099-ib", "c100-ib"]),
])
def test_node_lists_expand_as_slurm_writes_them(text, nodes):
    assert slurm.expand_nodelist(text, "SLURM_JOB_NODELIST") == nodes


@pytest.mark.parametrize("text, item", [
    ("n[1-3", "'[' without its closing ']'"),
    ("n1-3]", "']' without its '['"),
    ("n[[1-2]]", "nested '['"),
    ("n[1-x]", "'1-x' is not a number or a range"),
    ("n[3-1]", "range '3-1' runs backwards"),
    ("n[]", "'' is not a number"),
    ("n1,,n2", "an empty item between commas"),
    ("n 1", "a character a node name cannot have"),
    ("", "is empty"),
    ("n[1-100000]", "range '1-100000' has more than 4096 nodes"),
    ("r[1-1000]n[1-1000]", "names more than 4096 nodes"),
    ("n[1-" + "9" * 5000 + "]", "is not a number or a range"),
])
def test_unknown_node_list_syntax_is_refused_naming_the_item(text, item):
    with pytest.raises(SpecError) as caught:
        slurm.expand_nodelist(text, "SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST" in str(caught.value) and item in str(caught.value)


def test_tasks_per_node_repeat_counts_and_refuse_other_forms():
    assert slurm.tasks_per_node("2(x3),1", "V") == [2, 2, 2, 1]
    assert slurm.tasks_per_node("4", "V") == [4]
    for bad in ("2(3)", "x", "2,", "2(x0)"):
        with pytest.raises(SpecError, match="is not a count"):
            slurm.tasks_per_node(bad, "V")
    with pytest.raises(SpecError, match=r"V='100000000': '100000000' tasks on a node, more "
                                        r"than the 1024 processes one host can have"):
        slurm.tasks_per_node("100000000", "V")
    with pytest.raises(SpecError, match="counts more than 4096 nodes"):
        slurm.tasks_per_node("1(x100000000000000000000)", "V")


ALLOCATION = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-2]",
              "SLURM_TASKS_PER_NODE": "2,1"}


def _addresses(nodes):
    return {"n1": "127.0.0.1", "n2": "127.0.0.2"}


def test_an_allocation_becomes_a_spec_of_its_nodes_and_tasks():
    spec = slurm.spec_from_allocation(ALLOCATION, 1, addresses=_addresses)
    assert [(h.address, h.slurm_node, h.workers, h.servers) for h in spec.hosts] == [
        ("127.0.0.1", "n1", 2, 1), ("127.0.0.2", "n2", 1, 1)]
    # Every process then starts as a one-task step on its node.
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.2:5000"],
               "ps": ["127.0.0.1:5002", "127.0.0.2:5001"]}
    plans = plan_children(spec, cluster, ["python", "train.py"])
    assert {p.via for p in plans} == {SRUN}
    assert [next(a for a in p.command if a.startswith("--nodelist=")) for p in plans] == [
        "--nodelist=n1", "--nodelist=n2", "--nodelist=n1", "--nodelist=n1", "--nodelist=n2"]
    assert plans[-1].command[-2:] == ["python", "train.py"]


@pytest.mark.parametrize("environ, message", [
    ({}, "needs a Slurm allocation"),
    ({**ALLOCATION, "SLURM_TASKS_PER_NODE": "2(x2),1"}, "names 2 node(s)"),
    ({**ALLOCATION, "SLURM_JOB_NODELIST": "n[1-2"}, "without its closing"),
    ({"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n1"}, "SLURM_TASKS_PER_NODE is not set"),
    ({**ALLOCATION, "SLURM_TASKS_PER_NODE": "0(x2)"},
     "SLURM_TASKS_PER_NODE='0(x2)' gives no node a task"),
])
def test_an_allocation_that_cannot_be_read_is_refused(environ, message):
    with pytest.raises(SpecError) as caught:
        slurm.spec_from_allocation(environ, addresses=_addresses)
    assert message in str(caught.value)


STEP = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NUM_TASKS": "3"}


def test_an_srun_task_is_a_worker_in_block_order_on_derived_ports():
    task = {**STEP, "SLURM_PROCID": "2", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0"}
    assert join.external_rank(task) == ("slurm", 2, 3)
    base = slurm.port_base(task, 3)
    assert slurm.FIRST_PORT <= base < 65535 - slurm.PORTS_PER_STEP
    # Task i on base + i: distinct even where the nodes share one machine.
    assert slurm.step_cluster(task, 2, 3, addresses=_addresses) == {"worker": [
        f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}", f"127.0.0.2:{base + 2}"]}
    # The job's next step gets other ports; AUTOPAR_PORT_BASE decides when set.
    later = slurm.port_base({**task, "SLURM_STEP_ID": "1"}, 3)
    assert abs(later - base) >= slurm.PORTS_PER_STEP
    assert slurm.port_base({**task, slurm.PORT_BASE: "30000"}, 3) == 30000
    # However many tasks, the step's ports stay below 65536.
    assert slurm.port_base({**task, "SLURM_JOB_ID": "999999"}, 4000) + 4000 <= 65536


def test_srun_tasks_are_told_apart_from_batch_scripts_and_mpi_ranks():
    # A batch script has no numeric step id; srun --mpi=pmi2 sets PMI_* to
    # the same rank; mpirun's ranks under Slurm carry their daemon's step.
    assert slurm.step_position({**STEP, "SLURM_STEP_ID": "batch", "SLURM_PROCID": "0"}) is None
    assert join.external_rank({**STEP, "SLURM_PROCID": "1", "PMI_RANK": "1",
                               "PMI_SIZE": "3"}) == ("slurm", 1, 3)
    assert join.external_rank({**STEP, "SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "5",
                               "OMPI_COMM_WORLD_SIZE": "8"}) == ("mpi", 5, 8)


@pytest.mark.parametrize("environ, message", [
    ({**STEP, "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0"},
     "srun --distribution=block"),
    ({**STEP, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"}, "counts 3 tasks"),
    ({**STEP, "SLURM_PROCID": "0", slurm.PORT_BASE: "80"}, "AUTOPAR_PORT_BASE='80'"),
])
def test_a_step_autopar_cannot_place_is_refused(environ, message):
    rank, size = slurm.step_position(environ)
    with pytest.raises(SpecError) as caught:
        slurm.step_cluster(environ, rank, size, addresses=_addresses)
    assert message in str(caught.value)


@pytest.mark.parametrize("environ, named", [
    ({**ALLOCATION, "SLURM_JOB_NODELIST": "n[1-2"}, "SLURM_JOB_NODELIST='n[1-2'"),
    ({**ALLOCATION, "SLURM_TASKS_PER_NODE": "2(3)"}, "'2(3)' is not a count"),
    ({}, "needs a Slurm allocation"),
])
def test_cli_refuses_an_unreadable_allocation_with_exit_2_and_starts_nothing(
        environ, named, monkeypatch, capsys):
    from autopar import cli
    from autopar.runtime import launcher

    def never(*a, **k):
        raise AssertionError("launch must not be reached")
    monkeypatch.setattr(launcher, "launch", never)
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    assert cli.main(["launch", "--spec", "slurm", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: ") and "Traceback" not in err and named in err, err
