"""`autopar launch` refuses every absurd count, unwritable path and
contradiction before anything starts: one line `autopar: ...` naming it,
exit status 2, and the training command never runs (each of these had
started the job's namespace and fork server, and ran for minutes, died of
MemoryError, or failed only after the plan)."""
import sys

import pytest

from autopar import cli

SPEC_PORT_TWICE = ("hosts:\n  - {address: localhost, workers: 1, worker_ports: [24001]}\n"
                   "  - {address: 127.0.0.1, workers: 1, worker_ports: [24001]}\n")
SLURM = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "1"}

# (arguments before '--', files to write, environment, what the line names)
CASES = {
    "slots": (["-H", "127.0.0.1:100000000"], {}, {},
              "'100000000' slots, more than the 1024 processes one host can have"),
    "hostfile slots": (["--hostfile", "{hosts}"], {"hosts": "node1 slots=100000000\n"}, {},
                       "'100000000' slots, more than the 1024"),
    "slots twice": (["--hostfile", "{hosts}"], {"hosts": "node1 slots=1 slots=2\n"}, {},
                    "slots given twice"),
    "servers per host": (["-H", "127.0.0.1:1", "--servers-per-host", "100000000"], {}, {},
                         "--servers-per-host must be from 0 to 1024"),
    "slurm tasks": (["--spec", "slurm"], {}, {"SLURM_TASKS_PER_NODE": "100000000"},
                    "SLURM_TASKS_PER_NODE='100000000': '100000000' tasks on a node"),
    "slurm nodes": (["--spec", "slurm"], {},
                    {"SLURM_JOB_NODELIST": "n[1-100000]", "SLURM_TASKS_PER_NODE": "1(x100000)"},
                    "SLURM_JOB_NODELIST: node list item 'n[1-100000]': range '1-100000' has "
                    "more than 4096 nodes"),
    "slurm servers": (["--spec", "slurm", "--servers-per-host", "100000000"], {}, {},
                      "--servers-per-host must be from 0 to 1024"),
    "slurm no task": (["--spec", "slurm"], {}, {"SLURM_TASKS_PER_NODE": "0"},
                      "SLURM_TASKS_PER_NODE='0' gives no node a task"),
    "spec workers": (["--spec", "{spec.yaml}"],
                     {"spec.yaml": "hosts:\n  - {address: 127.0.0.1, workers: 100000000}\n"}, {},
                     "runs 100000000 workers and 0 servers, more than the 1024 processes"),
    "infinite bandwidth": (["--spec", "{spec.yaml}"],
                           {"spec.yaml": "hosts: [{address: 127.0.0.1, workers: 1}]\n"
                                         "network: {bandwidth_gbps: .inf}\n"}, {},
                           "network.bandwidth_gbps: must be a positive finite number"),
    "one port, two names": (["--spec", "{spec.yaml}"], {"spec.yaml": SPEC_PORT_TWICE}, {},
                            "duplicate address:port 127.0.0.1:24001 (also "
                            "hosts[0].worker_ports[0], as localhost)"),
    "min workers alone": (["-H", "127.0.0.1:2", "--min-workers", "1"], {}, {},
                          "min_workers=1 drops a host only when the job restarts"),
    "min workers above": (["-H", "127.0.0.1:2", "--max-restarts", "1", "--min-workers", "3"],
                          {}, {}, "min_workers=3 is more than the 2 worker(s)"),
    "timeline under /proc": (["-H", "127.0.0.1:1", "--timeline", "/proc/version/t.json"], {}, {},
                             "timeline /proc/version/t.json cannot be written: /proc/version "
                             "is not a directory"),
    "timeline a directory": (["-H", "127.0.0.1:1", "--timeline", "{dir}"], {"dir/x": ""}, {},
                             "cannot be written: it is a directory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line_before_anything_starts(case, tmp_path, monkeypatch, capsys):
    args, files, environ, named = CASES[case]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    args = [a.replace("{", "").replace("}", "") for a in args]
    args = [str(tmp_path / a) if (tmp_path / a).exists() else a for a in args]
    for key, value in {**(SLURM if "slurm" in args else {}), **environ}.items():
        monkeypatch.setenv(key, value)
    marker = tmp_path / "started"
    status = cli.main(["launch", *args, "--", sys.executable, "-c",
                       f"open({str(marker)!r}, 'w').close()"])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    assert err.startswith("autopar: ") and err.count("\n") == 1, err
    assert named in err, err
    assert not marker.exists() and "started" not in out, out
