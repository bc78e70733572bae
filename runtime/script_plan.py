"""The plan of a job `autopar launch` has only a command for.

The launcher compiles every job's plan before it starts a process, so that
it starts exactly the processes the plan's methods need (a job whose plan
uses no herring gets no summation servers) and every worker runs the same
plan. `autopar launch` has no graph: it runs the command once in the report
role (common/roles.py), forked from the job's fork server where there is
one (TensorFlow is imported there already). The script builds its graph as
usual; get_runner compiles it for the spec, writes the plan, the roles it
needs, its report and the script's Config (whose stall timeouts, restarts
and timeline the launcher then applies) to AUTOPAR_PLAN_OUT, and exits
without training.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.common import env as envvars
from autopar.common.errors import AutoparError, LaunchError
from autopar.runtime.console import ERROR_STATUS, cause_in_output
from autopar.common.roles import REPORT_ROLE
from autopar.runtime.commands import local_env
from autopar.runtime.forkserver import ForkServer, ForkServerError, forkable
from autopar.runtime.spec import ResourceSpec
from autopar.transforms import serial

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ScriptPlan:
    plan: bytes               # transforms.compile.CompiledPlan.to_bytes()
    processes: frozenset[str]  # roles besides the workers (registry.processes)
    report: str               # the plan report's table
    # The autopar.Config the script compiled it with (the launcher's
    # settings), as transforms.serial encoded it: the caller decodes it.
    config: dict


def encode(plan: bytes, processes: Sequence[str], report: str, config) -> str:
    """What the report-role script writes (compile_in_script reads it)."""
    return json.dumps({"plan": base64.b64encode(plan).decode(), "processes": sorted(processes),
                       "report": report, "config": serial.encode(config)})


def compile_in_script(argv: Sequence[str], spec: ResourceSpec,
                      fork_server: ForkServer | None = None) -> ScriptPlan:
    """Run `argv` in the report role for `spec`; its plan. Fails naming the
    command's last output lines if it does not write one."""
    fd, path = tempfile.mkstemp(prefix="autopar-plan-", suffix=".json")
    os.close(fd)
    try:
        child_env = local_env({envvars.ROLE: REPORT_ROLE, envvars.SPEC: json.dumps(spec.to_dict()),
                               envvars.PLAN_OUT: path}, None)
        status, output = _run(argv, child_env, fork_server)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    finally:
        os.unlink(path)
    if status != 0 or not text:
        lines = output.decode(errors="replace").rstrip().splitlines()
        cause = cause_in_output(lines)
        if status == ERROR_STATUS and cause and cause.startswith("autopar: "):
            # The script's own usage error (a bad Config, a graph autopar
            # refuses): said as the script says it, before anything started.
            raise AutoparError(f"{cause[len('autopar: '):]} (in the run of the command that "
                               "compiles the job's plan; no process of the job started)")
        why = (f"exited with status {status}" if status != 0 else
               "ended without calling autopar.get_runner")
        tail = "\n".join(lines[-15:])
        raise LaunchError(f"compiling the job's plan: {' '.join(argv)} {why}; its last lines:\n"
                          f"{tail or '(no output)'}")
    data = json.loads(text)
    return ScriptPlan(base64.b64decode(data["plan"]), frozenset(data["processes"]), data["report"],
                      data["config"])


def _run(argv: Sequence[str], child_env: dict[str, str],
         fork_server: ForkServer | None) -> tuple[int, bytes]:
    """(exit status, merged output) of `argv`, forked when it can be."""
    if fork_server is not None and forkable(argv):
        try:
            child = fork_server.start(list(argv), child_env, os.getcwd())
        except ForkServerError:
            pass
        else:
            with child.stdout:
                output = child.stdout.read()
            return child.wait(TIMEOUT_S), output
    try:
        done = subprocess.run(list(argv), env=child_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"compiling the job's plan: could not run {' '.join(argv)}: {exc}") from exc
    return done.returncode, done.stdout
