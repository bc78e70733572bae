"""Jobs in a real Slurm allocation (Debian's slurm-wlm: slurmctld and two
slurmd's, "nodes" n1 and n2 of this machine, started by the fixture with
their own configuration, ports and state directory, and shut down after):

- `srun -N2 -n3 python train.py`: every task joins from the step's SLURM_*
  variables as a worker (two on n1, one on n2), spawns nothing, and the job
  equals one device;
- `salloc ... autopar launch --spec slurm --servers-per-host 1`: the
  launcher builds the spec from the allocation and starts every worker and
  server as an srun step on its node; the job equals one device;
- nothing of either job is left running afterwards.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.cluster import (REPO, assert_same_parameters, child_env, free_ports,
                                       load_worker, run_single_device, train_command)

STEPS, BATCH = 4, 12
_CONF = """ClusterName=ap{tag}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={n1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SwitchType=switch/none
KillWait=5
MinJobAge=10
SlurmdParameters=config_overrides
MailProg=/bin/true
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1} CPUs=4 RealMemory=1000
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2} CPUs=4 RealMemory=1000
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""


def _binary(name: str) -> str:
    """A Slurm program: installed by `make install` (system-packages) as root."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}")
                                  else None)
    if path is None and os.geteuid() == 0:
        subprocess.run(["make", "-C", str(REPO), "system-packages"], capture_output=True,
                       timeout=900)
        path = shutil.which(name) or (f"/usr/sbin/{name}"
                                      if os.path.exists(f"/usr/sbin/{name}") else None)
    if path is None:
        pytest.skip(f"{name} is not installed and cannot be (needs root and apt-get: "
                    "apt-get install slurm-wlm)")
    return path


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment (SLURM_CONF) of a running two-node Slurm cluster."""
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as any user only as root")
    daemons = [_binary("slurmctld"), _binary("slurmd")]
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool/n1", "spool/n2"):
        (d / sub).mkdir(parents=True)
    ctld, n1, n2 = free_ports(3)
    conf = d / "slurm.conf"
    conf.write_text(_CONF.format(tag=os.getpid(), d=d, ctld=ctld, n1=n1, n2=n2))
    env = {**child_env(), "SLURM_CONF": str(conf)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    procs = [subprocess.Popen([daemons[0], "-D", "-c", "-i", "-f", str(conf)], **quiet)]
    try:
        procs += [subprocess.Popen([daemons[1], "-D", "-N", n, "-f", str(conf)], **quiet)
                  for n in ("n1", "n2")]
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, text=True,
                                   capture_output=True, timeout=30).stdout.split()
            if state.count("idle") == 2:
                break
            assert all(p.poll() is None for p in procs), (d / "slurmctld.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"nodes not idle after 60 s: {state}"
            time.sleep(0.1)
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=30)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _own_processes(marker: str) -> list[str]:
    """Processes whose command line names ``marker`` (the job's output dir)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:]
            if marker in line and str(os.getpid()) != line.split()[0]]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The variables of one device after the same steps on the global batch."""
    out = tmp_path_factory.mktemp("one")
    run_single_device("mlp_adam_clip_ema", out, "--steps", str(STEPS), "--batch", str(BATCH))
    return load_worker(out, 0)


def _check(out, expected, workers: int) -> None:
    for i in range(workers):
        actual = load_worker(out, i)
        assert int(actual["global_step"]) == STEPS
        assert_same_parameters(expected, actual, what=f"Slurm worker {i}")
    deadline = time.monotonic() + 20
    while _own_processes(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _own_processes(str(out))


def test_srun_tasks_join_as_workers_and_train_as_one_device(slurm, one_device, tmp_path):
    out = tmp_path / "srun"
    proc = subprocess.run(["srun", "-N2", "-n3", "--distribution=block",
                           *train_command("mlp_adam_clip_ema", out, "--steps", str(STEPS),
                                          "--batch", str(BATCH))],
                          cwd=REPO, env=slurm, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for task in range(3):
        assert f"Slurm task {task} of 3: worker {task}" in proc.stdout, proc.stdout[-4000:]
    _check(out, one_device, 3)


def test_launch_with_spec_slurm_starts_every_process_as_an_srun_step(slurm, one_device, tmp_path):
    out = tmp_path / "launch"
    command = [sys.executable, "-m", "autopar.cli", "launch", "--spec", "slurm",
               "--servers-per-host", "1", "--",
               *train_command("mlp_adam_clip_ema", out, "--steps", str(STEPS),
                              "--batch", str(BATCH), "--run-option", "ps")]
    proc = subprocess.Popen(["salloc", "-N2", "-n3", *command], cwd=REPO, env=slurm,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    assert proc.returncode == 0, text[-4000:]
    # Two workers and a server on n1, a worker and a server on n2, each an srun step.
    for name in ("server 0", "server 1", "worker 0", "worker 1", "worker 2"):
        assert f"started {name} at" in text and "(via srun)" in text, text[-4000:]
    assert text.count("(via srun)") >= 5, text[-4000:]
    _check(out, one_device, 3)
