"""Host lists as MPI and Horovod users write them (runtime/hostfile.py):
`-H host:slots,...` and hostfiles of `host slots=N` lines become a resource
spec; bad input is an `autopar: ...` error naming the item, exit 2, and
nothing is launched."""
import pytest

from autopar import cli
from autopar.common.errors import SpecError
from autopar.runtime import hostfile


def test_host_list_items_and_defaults():
    assert hostfile.parse_host_list("node1:4,node2:2") == [("node1", 4), ("node2", 2)]
    assert hostfile.parse_host_list("node1") == [("node1", 1)]      # a bare host is one slot
    assert hostfile.parse_host_list(" 10.0.0.1:3 , [::1]:2 ") == [("10.0.0.1", 3), ("::1", 2)]


def test_hostfile_lines_comments_and_openmpi_keys():
    text = """# the cluster
node1 slots=4
node2 slots=2 max_slots=8   # OpenMPI's cap, ignored

"""
    assert hostfile.parse_hostfile(text, "hosts.txt") == [("node1", 4), ("node2", 2)]


def test_servers_per_host_beyond_a_host_s_processes_are_refused():
    with pytest.raises(SpecError, match=r"--servers-per-host must be from 0 to 1024 \(the "
                                        r"processes one host can have\), got 100000000"):
        hostfile.spec_from_hosts([("127.0.0.1", 1)], servers_per_host=100_000_000)


def test_spec_from_hosts_gives_workers_and_servers_per_host():
    spec = hostfile.spec_from_hosts([("127.0.0.1", 2), ("localhost", 1)], servers_per_host=1)
    assert [(h.address, h.workers, h.servers) for h in spec.hosts] == [
        ("127.0.0.1", 2, 1), ("localhost", 1, 1)]
    assert spec.num_workers == 3 and spec.num_servers == 2


@pytest.mark.parametrize("text, named", [
    ("node1:x", "'node1:x'"),                 # a non-numeric count, the item named
    ("node1:0", "'node1:0'"),
    ("node1:4,,node2:1", "empty item"),
    ("node1:2,node1:2", "listed twice"),
    ("[::1:2", "closing ']'"),
    ("no de:2", "'no de'"),
    ("127.0.0.1:100000000", "'100000000' slots, more than the 1024 processes one host can have"),
])
def test_bad_host_list_names_the_item(text, named):
    with pytest.raises(SpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        hostfile.parse_host_list(text)


@pytest.mark.parametrize("text, named", [
    ("node1 slots=4\nnode2\n", "line 2 ('node2'): no slots"),
    ("node1 slots=four\n", "line 1"),
    ("node1 slots=2 colour=red\n", "unknown key 'colour'"),
    ("node1 4\n", "'4' is not key=value"),
    ("# nothing\n\n", "lists no host"),
    ("node1 slots=100000000\n", "line 1 ('node1 slots=100000000'): '100000000' slots, more than"),
    ("node1 slots=1 slots=2\n", "line 1 ('node1 slots=1 slots=2'): slots given twice"),
])
def test_bad_hostfile_names_the_line(text, named):
    with pytest.raises(SpecError, match=named.replace("(", r"\(").replace(")", r"\)")):
        hostfile.parse_hostfile(text, "hosts.txt")


@pytest.mark.parametrize("args", [
    ["-H", "node1:x"],
    ["-H", "node1:2", "--servers-per-host", "-1"],
    ["--hostfile", "MISSING"],
    ["--hostfile", "BAD"],
])
def test_cli_refuses_bad_hosts_with_exit_2_and_starts_nothing(args, tmp_path, monkeypatch, capsys):
    from autopar.runtime import launcher

    def never(*a, **k):
        raise AssertionError("launch must not be reached")
    monkeypatch.setattr(launcher, "launch", never)
    (tmp_path / "BAD").write_text("node1 slots=2\nnode2\n")
    args = [str(tmp_path / a) if a in ("MISSING", "BAD") else a for a in args]
    assert cli.main(["launch", *args, "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autopar: ") and "Traceback" not in err
    assert any(word in err for word in ("node1:x", "servers-per-host", "cannot be read", "line 2"))
