"""`autopar launch` rejects a malformed spec before anything starts: the
message names the problem and the training command never runs."""
import sys

import pytest

from autopar import cli

BAD_SPECS = {
    "unknown_key": ("hosts:\n  - address: 127.0.0.1\n    workers: 1\n    wrokers: 2\n", "wrokers"),
    "unknown_top_key": ("hosts:\n  - address: 127.0.0.1\n    workers: 1\nextra: 1\n", "extra"),
    "missing_address": ("hosts:\n  - workers: 2\n", "address"),
    "zero_workers": ("hosts:\n  - address: 127.0.0.1\n    workers: 0\n    servers: 1\n", "worker"),
    "negative_count": ("hosts:\n  - address: 127.0.0.1\n    workers: 1\n    servers: -1\n", "servers"),
    "duplicate_port": ("hosts:\n  - {address: 127.0.0.1, workers: 1, worker_ports: [24001]}\n"
                       "  - {address: 127.0.0.1, workers: 1, worker_ports: [24001]}\n", "24001"),
    "port_out_of_range": ("hosts:\n  - {address: 127.0.0.1, workers: 1, ports: [70000, 70010]}\n",
                          "70000"),
    "not_yaml": ("hosts: [unclosed\n", "YAML"),
}
BAD_PARALLAX = {
    "malformed_line": ("127.0.0.1: 0,1\n127.0.0.2: a,b\n", "line 2"),
    "negative_device": ("127.0.0.1: -1\n", "line 1"),
}
# (file name, text, what the message must name): YAML specs, then Parallax host files.
CASES = {f"yaml-{k}": ("spec.yaml", *v) for k, v in BAD_SPECS.items()} | \
        {f"parallax-{k}": ("hosts.txt", *v) for k, v in BAD_PARALLAX.items()}


def _launch(spec_path, marker):
    # The command would create `marker` if it were ever started.
    return cli.main(["launch", "--spec", str(spec_path), "--", sys.executable, "-c",
                     f"open({str(marker)!r}, 'w').close()"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_spec_starts_nothing(case, tmp_path, capsys):
    name, text, fragment = CASES[case]
    spec = tmp_path / name
    spec.write_text(text)
    marker = tmp_path / "started"
    assert _launch(spec, marker) == 2
    err = capsys.readouterr().err
    assert fragment in err and name in err, err
    assert not marker.exists()


def test_unreadable_spec_starts_nothing(tmp_path, capsys):
    marker = tmp_path / "started"
    assert _launch(tmp_path / "missing.yaml", marker) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert not marker.exists()


def test_command_is_required(tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["launch", "--spec", str(tmp_path / "x.yaml")])


def test_spec_command_writes_a_spec_the_launcher_loads(tmp_path, capsys):
    """`autopar spec --workers 4 > spec.yaml`: the file is a resource spec
    (loaded as `autopar launch --spec` would) with those processes; a count
    no spec may have is refused by the spec's own check, nothing written."""
    from autopar.runtime.spec import load_spec
    assert cli.main(["spec", "--workers", "4", "--servers", "1",
                     "--hosts", "node1,10.0.0.2"]) == 0
    path = tmp_path / "spec.yaml"
    path.write_text(capsys.readouterr().out)
    spec = load_spec(str(path))
    assert [(h.address, h.workers, h.servers) for h in spec.hosts] == [
        ("node1", 4, 1), ("10.0.0.2", 4, 1)]
    assert cli.main(["spec", "--workers", "2", "--gpus-per-worker", "2"]) == 0
    path.write_text(capsys.readouterr().out)
    assert load_spec(str(path)).hosts[0].worker_gpus() == [(0, 1), (2, 3)]
    assert cli.main(["spec", "--workers", "-1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "workers" in err and "must not be negative" in err
