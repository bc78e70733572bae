"""`autopar report` prints the plan without training; `autopar launch` trains;
processes started by an external launcher (TF_CONFIG) join without spawning."""
import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, free_ports,
                                       LineReader, load_worker, run_single_device,
                                       run_to_end, start_job, train_command, write_spec)


def _autopar(*args, timeout=240) -> subprocess.CompletedProcess:
    """`python -m autopar.cli args` run to the end (forked: run_to_end);
    stdout holds its stderr too."""
    command = [sys.executable, "-m", "autopar.cli", *args]
    returncode, output = run_to_end(command, timeout=timeout)
    return subprocess.CompletedProcess(command, returncode, stdout=output)


def test_report_prints_plan_and_trains_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _autopar("report", "--spec", str(write_spec(tmp_path, 3)), "--",
                    *train_command("emb_adam_clip", out))
    assert proc.returncode == 0, proc.stdout
    assert "3 workers" in proc.stdout
    for name in ("embedding", "head/kernel", "head/bias"):
        assert name in proc.stdout
    assert "allgather" in proc.stdout and "allreduce" in proc.stdout
    assert not out.exists()


@pytest.mark.parametrize("hosts", ["spec", "-H", "hostfile"])
def test_launch_command_trains_on_workers(tmp_path, hosts):
    """The same job from a spec, from Horovod's -H and from an OpenMPI
    hostfile: two workers on this machine, equal to one device."""
    out = tmp_path / "out"
    if hosts == "spec":
        where = ["--spec", str(write_spec(tmp_path, 2))]
    elif hosts == "-H":
        where = ["-H", "127.0.0.1:2"]
    else:
        (tmp_path / "hosts.txt").write_text("# this machine\n127.0.0.1 slots=2 max_slots=4\n")
        where = ["--hostfile", str(tmp_path / "hosts.txt")]
    proc = _autopar("launch", *where, "--",
                    *train_command("mlp_sgd", out, "--steps", "3", "--batch", "8"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "[worker 0]" in proc.stdout and "[worker 1]" in proc.stdout
    assert "autopar plan: 2 workers" in proc.stdout     # the chief printed the report
    assert int(load_worker(out, 1)["global_step"]) == 3
    if hosts != "spec":
        single = tmp_path / "single"
        run_single_device("mlp_sgd", single, "--steps", "3", "--batch", "8")
        assert_same_parameters(load_worker(single, 0), load_worker(out, 1),
                               what=f"mlp_sgd launched with {hosts}")


def test_launch_np_with_a_virtualenvs_python_forks_and_sets_config_fields(tmp_path):
    """`autopar launch -np 2 --run-option allreduce --config log_every_steps=1
    -- python train.py` as typed in an activated virtualenv, the launcher
    itself started by the virtualenv's python3.X (another name of the same
    interpreter, as its `autopar` script is): the workers are forked from the
    fork server (their parent), the run option reaches the plan and the
    --config field every worker's Config; training equals one device."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "pyvenv.cfg").exists() or (bin_dir.parent / "pyvenv.cfg").exists(), \
        "the tests run in the project's virtualenv (make test)"
    versioned = bin_dir / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert versioned.exists() and (bin_dir / "python").exists()
    out = tmp_path / "out"
    env = {**child_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(versioned), "-m", "autopar.cli", "launch", "-np", "2", "--run-option", "allreduce",
         "--config", "log_every_steps=1", "--", "python",
         *train_command("mlp_sgd", out, "--steps", "3", "--batch", "8")[1:]],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    parents = re.findall(r"\[worker \d\] worker \d pid \d+, parent (.*)", proc.stdout)
    assert len(parents) == 2 and all(re.fullmatch(r"autopar\[[0-9a-f]{6}\] fork server", p)
                                     for p in parents), proc.stdout[-3000:]
    assert "autopar plan: 2 workers, 0 servers, run_option=allreduce" in proc.stdout
    assert [int(s) for s in re.findall(r"\[worker 0\] step (\d+) ", proc.stdout)] == [1, 2, 3]
    run_single_device("mlp_sgd", tmp_path / "single", "--steps", "3", "--batch", "8")
    for i in range(2):
        assert_same_parameters(load_worker(tmp_path / "single", 0), load_worker(out, i),
                               what=f"worker {i}")


def test_an_unsharded_dataset_is_refused_before_training_unless_allowed(tmp_path):
    """A script reading its tf.data pipeline without autopar.shard: run with a
    spec, its launcher refuses before starting any process, naming the
    dataset and the fix; with the switch given on `autopar launch`'s command
    line it trains, each worker reading the same examples."""
    script = [sys.executable, str(REPO / "tests/integration/scripts/tfdata_accumulate.py"),
              str(tmp_path / "out"), "4"]
    refused = subprocess.run([*script, str(write_spec(tmp_path, 2)), "1", "unsharded"], cwd=REPO,
                             env=child_env(), capture_output=True, text=True, timeout=240)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.splitlines()[-1].startswith(
        "autopar: the training step reads its batches through 'IteratorGetNext' from a tf.data "
        "pipeline that starts at 'TensorSliceDataset'"), refused.stderr
    assert "autopar.shard(ds) before .batch()" in refused.stderr
    assert "Traceback" not in refused.stderr and "started worker" not in refused.stdout
    allowed = _autopar("launch", "-np", "2", "--config", "allow_unsharded_input=True", "--",
                       *script, "-", "1", "unsharded")
    assert allowed.returncode == 0, allowed.stdout[-3000:]
    losses = re.findall(r"\[worker (\d)\] worker \1 losses (.*)", allowed.stdout)
    assert len(losses) == 2 and losses[0][1] == losses[1][1], allowed.stdout[-3000:]


def _run_tf_config_workers(command: list[str], workers: int = 2,
                           extra_env: dict[str, str] | None = None,
                           drop: tuple[str, ...] = (), fresh: bool = False) -> list[str]:
    """Start `command` once per worker with TF_CONFIG describing a loopback
    cluster (as an external launcher would), wait for all, and return their
    outputs; every one must exit 0. `drop`: variables left out of their
    environment. `fresh`: in new interpreters, which import TensorFlow
    themselves (else forked, as the same command started anew would run:
    cluster.start_job)."""
    ports = free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(workers):
        env = child_env()
        env.update(extra_env or {})
        for name in drop:
            env.pop(name, None)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
                     if fresh else start_job(command, env))
    with contextlib.ExitStack() as stack:
        readers = [stack.enter_context(LineReader(proc)) for proc in procs]
        logs = [reader.rest(timeout=180) for reader in readers]
    assert [p.returncode for p in procs] == [0] * workers, "\n".join(logs)[-3000:]
    return logs


def test_tf_config_processes_join_without_spawning(tmp_path):
    """Started by an "external launcher" with no TF_CPP_MIN_LOG_LEVEL of its
    own: the processes join, train equal to one device, and their output has
    no TensorFlow C++ or start-up line (the script imports autopar first:
    common/quiet.py), and TensorFlow's deprecation warnings once, from the
    chief."""
    out = tmp_path / "dist"
    # New interpreters: what is checked is what TensorFlow's own import prints.
    logs = _run_tf_config_workers(train_command("mlp_adam_clip_ema", out, "--steps", "4"),
                                  drop=("TF_CPP_MIN_LOG_LEVEL", "AUTOPAR_VERBOSE"), fresh=True)
    assert not any("started worker" in log for log in logs)   # nothing was spawned
    for log in logs:
        noise = [line for line in log.splitlines()
                 if re.match(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ", line)
                 or "absl::InitializeLog" in line or "oneDNN" in line]
        assert not noise, "\n".join(noise)
    assert "WARNING:tensorflow" not in logs[1], logs[1]
    run_single_device("mlp_adam_clip_ema", tmp_path / "single", "--steps", "4")
    expected = load_worker(tmp_path / "single", 0)
    for i in range(2):
        assert_same_parameters(expected, load_worker(out, i), what=f"TF_CONFIG worker {i}")


def test_tf_config_processes_agree_on_an_automatic_threshold_without_a_coordinator(tmp_path):
    """No launcher, so no job coordinator: DropCompute's warm-up latencies and
    the chief's decision travel through collectives, and both workers adopt
    the same tau."""
    logs = _run_tf_config_workers(
        train_command("mlp_sgd", tmp_path / "out", "--steps", "6", "--micro-batches", "2",
                      "--threshold", "auto", "--warmup", "1,4", "--delay", "0.01",
                      "--delay-sigma", "1"))
    held = [re.findall(r"worker \d: DropCompute threshold (\S+)", log) for log in logs]
    assert all(len(h) == 1 for h in held), "\n".join(logs)[-3000:]
    assert held[0] == held[1]
    assert re.search(r"DropCompute: (tau = |no threshold)", logs[0]), logs[0][-3000:]


def test_tf_config_herring_needs_no_ps_task(tmp_path):
    """Herring on a dense model joined through TF_CONFIG: no ps entry, two
    summation servers the "external launcher" started and named in
    AUTOPAR_SUMSERVERS; the plan's servers are those, and training matches
    one device."""
    from tests.integration.test_herring_transport import _start_server
    servers = [_start_server() for _ in range(2)]
    try:
        out = tmp_path / "dist"
        _run_tf_config_workers(train_command("mlp_sgd", out, "--steps", "4", "--run-option", "herring"),
                               extra_env={"AUTOPAR_SUMSERVERS": ",".join(a for _, a in servers)})
        assert all(proc.poll() is None for proc, _ in servers)   # they served the whole job
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()
    run_single_device("mlp_sgd", tmp_path / "single", "--steps", "4")
    expected = load_worker(tmp_path / "single", 0)
    for i in range(2):
        assert_same_parameters(expected, load_worker(out, i), what=f"TF_CONFIG herring worker {i}")
