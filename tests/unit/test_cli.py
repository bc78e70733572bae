"""`autopar launch` rejects a malformed spec before anything starts: the
message names the problem and the training command never runs."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
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


def test_command_is_required(tmp_path, capsys):
    assert cli.main(["launch", "--spec", str(tmp_path / "x.yaml")]) == 2
    assert capsys.readouterr().err == ("autopar: give the training command, e.g. autopar launch "
                                       "-np 2 -- python train.py\n")


# -- the command as people type it ----------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def _typed(*args: str) -> subprocess.CompletedProcess:
    """`autopar ARGS` run as a user runs it (its own process)."""
    return subprocess.run([sys.executable, "-m", "autopar.cli", *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("-h",)])
def test_bare_autopar_and_h_print_the_help(args):
    done = _typed(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: autopar [-h] [--version] {launch,report} ...")
    assert "autopar launch -np 4 -- python train.py" in done.stdout
    assert done.stderr == ""


@pytest.mark.slow
def test_version():
    done = _typed("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"autopar {autopar.__version__}\n", "")


@pytest.mark.slow
def test_a_misspelled_config_keyword_is_a_usage_error_without_traceback(tmp_path):
    marker = tmp_path / "started"
    done = _typed("launch", "-np", "2", "--config", "stal_timeout_s=5", "--", sys.executable,
                  "-c", f"open({str(marker)!r}, 'w').close()")
    assert done.returncode == 2
    assert done.stderr.startswith("autopar: --config stal_timeout_s=5: "), done.stderr
    assert "'stal_timeout_s'" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and not marker.exists()


@pytest.mark.slow
def test_a_missing_command_is_a_usage_error():
    done = _typed("launch", "-np", "2")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("autopar: give the training command, e.g. autopar launch -np 2 -- "
                           "python train.py\n")


@pytest.mark.parametrize("argv, message", [
    (["launch", "-np", "2", "-u", "train.py"], "autopar: unrecognized arguments: -u (autopar "
     "launch -h lists the options; a training command that starts with an option goes after '--')"),
    (["launch", "python", "train.py"], "autopar: give the workers: -np N (on this machine), "
     "-H host:slots,..., --hostfile FILE or --spec FILE"),
    (["launch", "-np", "0", "python", "train.py"], "autopar: -np must be a number of workers >= 1, "
     "got 0"),
    (["launch", "-np", "5", "-H", "a:2,b:2", "python", "train.py"], "autopar: -np 5, but the hosts "
     "give 4 slot(s): give more slots (host:slots) or a smaller -np"),
    (["launch", "-np", "2", "--run-option", "psx", "python", "t.py"], "autopar: --run-option psx: "
     "Config.run_option must be 'hybrid', 'ps', 'allreduce' or 'herring', got 'psx'"),
    (["launch", "-np", "2", "--stall-timeout", "5", "--config", "stall_timeout_s=6", "python",
      "t.py"], "autopar: --stall-timeout and --config stall_timeout_s=... both set "
     "Config.stall_timeout_s: give one"),
    (["launch", "-np", "2", "--config", "busy_timeout_s=5", "--config", "stall_timeout_s=9",
      "python", "t.py"], "autopar: --config busy_timeout_s=5: Config.busy_timeout_s must be 0 "
     "(never) or at least stall_timeout_s (9), got 5"),
    (["report", "-np", "2", "--config", "nokey", "python", "t.py"], "autopar: --config 'nokey': "
     "write KEY=VALUE, e.g. --config stall_timeout_s=120"),
    (["bogus"], "autopar: argument {launch,report}: invalid choice: 'bogus' (choose from "
     "'launch', 'report')"),
])
def test_usage_errors_are_one_autopar_line_with_status_2(argv, message, capsys):
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", message + "\n")


@pytest.mark.parametrize("argv, hosts, command", [
    (["-np", "3", "--", "python", "t.py"], [("127.0.0.1", 3)], ["python", "t.py"]),
    (["-np", "3", "python", "t.py", "--steps", "2", "-np", "9"], [("127.0.0.1", 3)],
     ["python", "t.py", "--steps", "2", "-np", "9"]),
    (["-np", "3", "-H", "a:2,b:2", "python", "t.py", "--", "x"], [("a", 2), ("b", 1)],
     ["python", "t.py", "--", "x"]),
    (["-H", "a:2,b:2", "python", "t.py"], [("a", 2), ("b", 2)], ["python", "t.py"]),
])
def test_np_takes_this_machine_or_the_first_slots_and_the_command_needs_no_dashes(
        argv, hosts, command):
    args = cli._parse(cli._parser(), ["launch", *argv])
    spec = cli._spec(args)
    assert [(h.address, h.workers) for h in spec.hosts] == hosts
    assert args.command == command


def test_config_fields_from_the_options_reach_the_scripts_config(monkeypatch):
    """--config KEY=VALUE (literals or text) and the options for common
    fields become AUTOPAR_CONFIG, which get_runner applies over the
    script's own Config."""
    from autopar import overrides
    args = cli._parse(cli._parser(), [
        "launch", "-np", "2", "--run-option", "ps", "--config", "partitions={'emb': 4}",
        "--config", "total_steps=None", "--config", "dropcompute_warmup=(1, 3)",
        "--stall-timeout", "5", "--", "python", "t.py"])
    fields, _ = cli._config_fields(args)
    assert fields == {"run_option": "ps", "partitions": {"emb": 4}, "total_steps": None,
                      "dropcompute_warmup": (1, 3), "stall_timeout_s": 5.0}
    monkeypatch.setenv("AUTOPAR_CONFIG", overrides.to_env(fields))
    config = overrides.apply(autopar.Config(run_option="allreduce", total_steps=7,
                                            log_every_steps=3))
    assert (config.run_option, config.partitions, config.total_steps, config.dropcompute_warmup,
            config.stall_timeout_s, config.log_every_steps) == ("ps", {"emb": 4}, None, (1, 3),
                                                                5.0, 3)


@pytest.mark.slow
def test_ctrl_c_before_the_job_starts_is_one_line_with_status_130():
    """A script interrupted after it first used autopar's API, before
    get_runner (as while it builds its model): `autopar: interrupted`, exit
    status 130, no traceback."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, signal, time\nimport autopar\n"
                               "config = autopar.Config()\n"
                               "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=60,
        # SIGINT as a terminal gives it: a run started in the background of a
        # non-interactive shell inherits it ignored, and Python keeps that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stderr) == (130, "autopar: interrupted\n")


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
