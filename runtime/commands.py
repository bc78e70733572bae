"""What the launcher starts, before anything starts (pure: unit-testable):
one ChildPlan per server, helper process (a method's process kind:
transforms/methods/process_registry.py) and worker, with its command (ssh
for a remote host, srun for a Slurm node), environment and working
directory; the variables every child gets; the native binaries a child needs
(the bind shim, a helper kind's program), built on first use in a checkout
without `make install`.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from autopar.common import env as envvars
from autopar.common import procs
from autopar.common.addresses import host_address
from autopar.common.errors import LaunchError
from autopar.common.roles import SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE, process_name
from autopar.runtime.coordinator import Coordinator
from autopar.runtime.coordinator_client import DEFAULT_LINK_TIMEOUT_S, LINK_TIMEOUT
from autopar.runtime.flow_windows import SETTABLE_BYTES, job_window_setting, tcp_window_bytes
from autopar.common import quiet
from autopar.runtime.gpus import launched_worker_env, spec_worker_gpus
from autopar.runtime.native import PACKAGE_PARENT
from autopar.runtime.ports import is_local_address
from autopar.runtime.slurm import srun_command
from autopar.runtime.spec import HostSpec, ResourceSpec
from autopar.transforms.methods.process_kind import ProcessKind
from autopar.transforms.methods.process_registry import process_kinds

logger = logging.getLogger("autopar.launcher")


# The directory holding the autopar package (a source checkout's root, or
# site-packages): put first on every child's PYTHONPATH.
REPO_ROOT = str(PACKAGE_PARENT)

# How a child starts: this machine's process, over ssh, or as a Slurm step.
LOCAL, SSH, SRUN = "local", "ssh", "srun"


@dataclass(frozen=True)
class ChildPlan:
    """Everything needed to start one server or worker process."""
    role: str                 # WORKER_ROLE, SERVER_ROLE or a helper kind's (ProcessKind.role)
    index: int                # task index within the role's job
    address: str              # "host:port" from the cluster
    host: HostSpec
    via: str                  # how it starts: LOCAL, SSH or SRUN
    command: list[str]        # final argv run locally (ssh ... or srun ... for those)
    env: dict[str, str]       # environment of the local process
    cwd: str | None
    # Written to a remote child's ssh stdin once it asks for it (see
    # build_ssh_command): the coordinator token. Never printed.
    stdin_secret: str | None = field(default=None, repr=False)
    # Whether the process sets its own title (ProcessKind.sets_title); the
    # launcher gives a local one that does not its name as argv[0].
    titled: bool = True

    @property
    def name(self) -> str:
        return process_name(self.role, self.index)

    @property
    def remote(self) -> bool:
        """The process runs elsewhere: its pid is not ours to signal."""
        return self.via != LOCAL

def autopar_env(role: str, index: int, cluster: Mapping[str, list[str]],
                spec: ResourceSpec, *, tty: bool) -> dict[str, str]:
    """The variables telling a child which role it plays (common/env.py)."""
    return {
        envvars.ROLE: role,
        envvars.TASK_INDEX: str(index),
        envvars.CLUSTER: json.dumps(dict(cluster), sort_keys=True),
        envvars.SPEC: json.dumps(spec.to_dict(), sort_keys=True),
        envvars.TTY: "1" if tty else "0",
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ INFO/WARNING chatter, unless the user asked for it.
        **tf_log_level(),
        # The command line's Config fields and --verbose, on other hosts too.
        **{name: os.environ[name] for name in envvars.FORWARDED if os.environ.get(name)},
    }

def tf_log_level() -> dict[str, str]:
    """TF_CPP_MIN_LOG_LEVEL for a child: the user's, else 2 (C++ INFO and
    WARNING lines off), none with AUTOPAR_VERBOSE=1 (common/quiet.py)."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return {"TF_CPP_MIN_LOG_LEVEL": os.environ["TF_CPP_MIN_LOG_LEVEL"]}
    return {} if quiet.verbose() else {"TF_CPP_MIN_LOG_LEVEL": "2"}


def new_job() -> dict[str, str]:
    """A new job's id, as the variable every child gets (AUTOPAR_JOB_ID): six
    hex digits in the title of each of its processes (``autopar[id] ...``),
    this launcher's included."""
    job = {envvars.JOB_ID: secrets.token_hex(3)}
    procs.set_title(f"launcher {os.path.basename(sys.argv[0]) if sys.argv else ''}", job)
    logger.info("job %s: its processes show as autopar[%s] in ps", job[envvars.JOB_ID],
                job[envvars.JOB_ID])
    return job

def _prepend_path(entry: str, existing: str | None) -> str:
    parts = [p for p in (existing or "").split(os.pathsep) if p]
    return os.pathsep.join([entry] + [p for p in parts if p != entry])

def local_env(role_env: Mapping[str, str], extra_env: Mapping[str, str] | None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a local child: the launcher's own, then ``extra_env``,
    then the role variables, with the repo root first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env.update(extra_env or {})
    env.update(role_env)
    env["PYTHONPATH"] = _prepend_path(REPO_ROOT, env.get("PYTHONPATH"))
    return env

def remote_env(role_env: Mapping[str, str], extra_env: Mapping[str, str] | None) -> dict[str, str]:
    """Environment set on a remote host's command line.

    Unlike a local child, a remote one does not inherit the launcher's whole
    environment (PATH, HOME, DISPLAY... describe this machine, not that one):
    only ``extra_env``, the role variables and PYTHONPATH, which assumes the
    repository sits at the same path on every host (as Parallax does).
    """
    env = dict(extra_env or {})
    env.update(role_env)
    env["PYTHONPATH"] = _prepend_path(REPO_ROOT, env.get("PYTHONPATH"))
    # Cut off from the launcher, it stops itself (runtime/coordinator_client.py LINK_TIMEOUT).
    env[LINK_TIMEOUT] = os.environ.get(LINK_TIMEOUT, f"{DEFAULT_LINK_TIMEOUT_S:g}")
    return env

# A remote child prints this line when it is ready to read the coordinator
# token from its stdin (terminal echo off); the launcher then writes it.
TOKEN_PROMPT = "autopar: ready for the job token"

def build_ssh_command(host: HostSpec, command: Sequence[str], env: Mapping[str, str], *,
                      default_workdir: str) -> list[str]:
    """The local argv that runs ``command`` with ``env`` on ``host`` over ssh.

    ``-tt`` gives the remote command a terminal, so that when the local ssh
    process is stopped (or killed with the launcher) the remote side gets
    SIGHUP instead of running on orphaned. BatchMode makes a missing key fail
    at once instead of prompting; the keep-alive options turn a dead host into
    an ssh exit (255) within half a minute. If ``ssh.python`` is set it
    replaces a leading ``sys.executable``.

    The coordinator token is secret, so it is not in ``env`` (that is on the
    command line, visible in ``ps`` on both hosts): a POSIX ``sh`` on the
    remote host turns terminal echo off (the token must not come back through
    the terminal into the log), prints TOKEN_PROMPT, reads one line from its
    stdin into AUTOPAR_COORD_TOKEN and then runs ``command`` with stdin from
    /dev/null, as a local child has. The launcher answers the prompt on ssh's
    stdin and closes it. Without a token line (stdin closed) nothing runs.
    """
    ssh = host.ssh
    user = getattr(ssh, "user", None)
    port = getattr(ssh, "port", 22) or 22
    key_file = getattr(ssh, "key_file", None)
    known_hosts = getattr(ssh, "known_hosts", None)
    python = getattr(ssh, "python", None)
    workdir = getattr(ssh, "workdir", None) or default_workdir

    remote_argv = list(command)
    if python and remote_argv and remote_argv[0] == sys.executable:
        remote_argv[0] = python
    assignments = [f"{key}={value}" for key, value in env.items()]
    token = envvars.COORD_TOKEN
    script = "; ".join([
        f"cd {shlex.quote(workdir)} || exit 1",
        "stty -echo 2>/dev/null",
        f"echo {shlex.quote(TOKEN_PROMPT)}",
        f"IFS= read -r {token} || exit 1",
        f"export {token}",
        # `exec` so the shell is replaced and signals reach the process.
        f"exec env {shlex.join(assignments)} {shlex.join(remote_argv)} </dev/null",
    ])
    # `sh` whatever the user's login shell is (read/export are POSIX sh).
    remote_cmd = f"exec sh -c {shlex.quote(script)}"

    argv = ["ssh", "-tt",
            "-o", "BatchMode=yes",
            "-o", "ServerAliveInterval=10",
            "-o", "ServerAliveCountMax=3",
            "-p", str(port)]
    if key_file:
        # Passed as written: OpenSSH expands "~" in identity files itself.
        argv += ["-i", key_file]
    if known_hosts:
        # The host's key must be the one pinned there: no other file, and no
        # first-use acceptance (BatchMode refuses an unknown key anyway).
        argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=none",
                 "-o", "StrictHostKeyChecking=yes"]
    destination = f"{user}@{host.address}" if user else host.address
    # "--" ends ssh's options: even a destination that slipped past spec
    # validation cannot be read as one ("-oProxyCommand=...").
    argv += ["--", destination, remote_cmd]
    return argv

def plan_children(spec: ResourceSpec, cluster: Mapping[str, list[str]], argv: Sequence[str],
                  *, extra_env: Mapping[str, str] | None = None, tty: bool = False,
                  cwd: str | None = None,
                  helpers: Mapping[str, Sequence[str]] | None = None) -> list[ChildPlan]:
    """One ChildPlan per server, then per helper process (``helpers``: the
    "host:port" of each helper kind's processes, by role, one per server;
    transforms/methods/process_registry.py), then per worker, in task-index
    order. Every child gets each helper kind's addresses in the variable it
    publishes (ProcessKind.publishes), and its flows' window
    (ProcessKind.flow_window) when the link speed or the environment gives one."""
    cwd = cwd or os.getcwd()
    helpers = {role: list(addresses) for role, addresses in (helpers or {}).items() if addresses}
    kinds = process_kinds(helpers)
    server_cmd = [sys.executable, "-m", "autopar.runtime.server_main"]
    jobs: list[tuple[str, list[str], list[HostSpec], list[str], ProcessKind | None]] = [
        (SERVER_ROLE, list(cluster.get(SERVER_JOB, [])),
         spec.server_hosts() if cluster.get(SERVER_JOB) else [], server_cmd, None),
        *[(kind.role, helpers[kind.role], spec.server_hosts(), [], kind) for kind in kinds],
        (WORKER_ROLE, list(cluster[WORKER_JOB]), spec.worker_hosts(), list(argv), None),
    ]
    if kinds:
        extra_env = {**(extra_env or {}), **helper_env(kinds, helpers, spec,
                                                       len(cluster[WORKER_JOB]))}
    plans: list[ChildPlan] = []
    worker_gpus = spec_worker_gpus(spec)
    for role, addresses, hosts, command, kind in jobs:
        if len(addresses) != len(hosts):
            raise LaunchError(
                f"the cluster has {len(addresses)} {role} addresses but the spec places "
                f"{len(hosts)} {role}s; this is a bug in port allocation, please report it")
        for index, (address, host) in enumerate(zip(addresses, hosts)):
            if kind is not None:
                command = kind.argv(host_address(host.address), address.rpartition(":")[2],
                                    native_program)
            role_env = {**autopar_env(role, index, cluster, spec, tty=tty),
                        **tcp_window_env(role, cluster, spec.bandwidth_gbps)}
            if role == WORKER_ROLE:   # its GPUs, if the spec gives it some (docs/gpus.md)
                role_env.update(launched_worker_env(worker_gpus[index]))
            titled = kind is None or kind.sets_title
            if host.slurm_node is not None:
                # srun exports this environment to the step (a shared file
                # system gives the node the same paths).
                plans.append(ChildPlan(role, index, address, host, SRUN,
                                       srun_command(host.slurm_node, command),
                                       local_env(role_env, extra_env), cwd, titled=titled))
            elif is_local_address(host.address):
                plans.append(ChildPlan(role, index, address, host, LOCAL, list(command),
                                       local_env(role_env, extra_env), cwd, titled=titled))
            else:
                ssh_cmd = build_ssh_command(host, command, remote_env(role_env, extra_env),
                                            default_workdir=cwd)
                plans.append(ChildPlan(role, index, address, host, SSH, ssh_cmd,
                                       dict(os.environ), cwd, titled=titled))
    return plans

def helper_env(kinds: Sequence[ProcessKind], helpers: Mapping[str, Sequence[str]],
               spec: ResourceSpec, workers: int) -> dict[str, str]:
    """What every child of a job with these helper processes gets: each
    kind's addresses in the variable it publishes, and its flows' window
    (the user's own setting, given explicitly so it reaches remote children
    too, else one from the spec's link speed: runtime/flow_windows.py)."""
    env = {}
    for kind in kinds:
        addresses = helpers[kind.role]
        env[kind.publishes] = ",".join(addresses)
        if kind.flow_window:
            window = job_window_setting(user_window(kind.flow_window), spec.bandwidth_gbps,
                                        workers, len(addresses))
            if window is not None:
                env[kind.flow_window] = window
    return env

def bind_env_value(cluster: Mapping[str, list[str]]) -> str:
    """AUTOPAR_BIND for the shim: "ADDR/PORT" for every endpoint of the job."""
    return _shim_endpoints([e for addresses in cluster.values() for e in addresses])

def _shim_endpoints(endpoints: Sequence[str]) -> str:
    """"ADDR/PORT,..." (the bind shim's format) of "host:port" endpoints."""
    entries = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        entries.append(f"{host_address(host)}/{port}")
    return ",".join(dict.fromkeys(entries))

def tcp_window_env(role: str, cluster: Mapping[str, list[str]],
                   bandwidth_gbps: float | None) -> dict[str, str]:
    """AUTOPAR_TCP_WINDOW_{BYTES,PEERS} for a worker (its connections to the
    other workers and to the parameter servers) or a parameter server (to
    the workers): the receive window of each (flow_windows.tcp_window_bytes);
    nothing when that leaves the kernel's autotuning (no link speed, a fast
    link) unless the environment gives the bytes, nor when it gives 0."""
    workers, servers = list(cluster.get(WORKER_JOB, [])), list(cluster.get(SERVER_JOB, []))
    peers = {WORKER_ROLE: workers + servers, SERVER_ROLE: workers}.get(role)
    if not peers:
        return {}
    window = user_window(envvars.TCP_WINDOW, off_ok=True)
    if window == "0":     # the user turned it off
        return {}
    window = window or tcp_window_bytes(bandwidth_gbps, len(workers), len(servers))
    if window is None:
        return {}
    return {envvars.TCP_WINDOW: str(window), envvars.TCP_WINDOW_PEERS: _shim_endpoints(peers)}

def user_window(name: str, off_ok: bool = False) -> str | None:
    """The window the environment variable ``name`` gives (None: unset or
    empty), refused by name unless it is a whole number of bytes the
    transports take (flow_windows.SETTABLE_BYTES; or "0", turning it off, when
    ``off_ok``): they would ignore it silently."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    low, high = SETTABLE_BYTES
    if value.isdigit() and (low <= int(value) <= high or (off_ok and int(value) == 0)):
        return str(int(value))
    raise LaunchError(f"{name}={value!r}: must be a whole number of bytes from {low} to {high}"
                      + (" (or 0: no bound)" if off_ok else ""))

def bind_shim_path() -> str:
    """runtime/libautopar_bind.so, built at install time (else on first use)."""
    from autopar.runtime import native
    return _built(native.shim_path)

def native_program(name: str) -> str:
    """A helper process's native program by its name (ProcessKind.command),
    built at install time (else on first use)."""
    from autopar.runtime import native
    return _built(lambda: native.program_path(name))

def _built(path_of) -> str:
    """The native part ``path_of`` finds or builds (runtime/native.py); a
    build failure (no compiler) is a LaunchError naming what to install."""
    from autopar.runtime import native
    try:
        return str(path_of())
    except native.BuildError as exc:
        raise LaunchError(str(exc)) from exc

def job_env(coordinator: Coordinator, cluster: Mapping[str, list[str]]) -> dict[str, str]:
    """Variables every child gets, the token excepted (see give_token): where
    the coordinator is, and the bind shim that keeps TensorFlow's servers off
    the wildcard address."""
    return {envvars.COORDINATOR: coordinator.address, envvars.BIND: bind_env_value(cluster),
            "LD_PRELOAD": preload_value()}

def preload_value() -> str:
    """LD_PRELOAD of every local child (and the fork server): the bind shim,
    then whatever the launcher's environment preloads."""
    return " ".join(p for p in (bind_shim_path(), os.environ.get("LD_PRELOAD", "")) if p)

def give_token(plans: list[ChildPlan], coordinator: Coordinator) -> list[ChildPlan]:
    """The plans with the coordinator token: in the environment of a local
    child or an srun step, on an ssh child's stdin (its environment is part
    of the ssh command line, see build_ssh_command)."""
    given = []
    for plan in plans:
        if plan.via == SSH:
            plan = replace(plan, stdin_secret=coordinator.token)
        else:
            plan.env[envvars.COORD_TOKEN] = coordinator.token
        given.append(plan)
    return given
