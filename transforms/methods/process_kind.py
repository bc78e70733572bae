"""A kind of helper process a synchronisation method needs besides the
workers (herring's summation servers), declared by the method's package and
listed in transforms/methods/process_registry.py: what the launcher starts
(runtime/commands.py), the ports it reserves for it (runtime/ports.py), the
environment it publishes to the job, how it is heard from (the launcher's
probe, runtime/launcher.py; the coordinator's process states) and its lane
in the job's timeline (runtime/timeline.py) all come from here.

Plain data, no TensorFlow: the launcher of `autopar launch` reads it
without importing TensorFlow. The parameter servers (TensorFlow tasks of
the cluster, runtime/server_main.py) are not declared here: the runtime
starts them as part of the cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

# Where the processes of a kind run: one per server of the spec, on that
# server's host, numbered like the spec's servers (ResourceSpec.server_hosts).
PER_SERVER = "per server"

# How the launcher hears from a process that has no coordinator client: it
# connects to the process's port every second (a connection accepted and
# closed when the launcher closes it is a sign of life).
PROBE_CONNECT = "connect"

# In `command`: the process's host address and port, and a native program of
# runtime/native.py by its name (`{native:autopar_sumserver}`).
HOST, PORT, NATIVE = "{host}", "{port}", "{native:"


@dataclass(frozen=True)
class ProcessKind:
    # Its role (common/roles.py's vocabulary): the process names ("sumserver
    # 0"), AUTOPAR_ROLE, the coordinator's process ids, the timeline's lanes.
    role: str
    # The processes in words, plural, for the launcher's log ("summation servers").
    what: str
    # The argv that starts one on its host: `{native:NAME}` a native program,
    # `{host}` the host's address in the spec, `{port}` its reserved port.
    command: tuple[str, ...]
    # The variable every process of the job gets naming the kind's processes
    # ("host:port,..." in index order): how their clients find them.
    publishes: str
    placement: str = PER_SERVER
    # A regular expression matching the line the process prints when its
    # port is taken (the launcher then starts the job on fresh ports).
    bind_failure: str = ""
    probe: str = PROBE_CONNECT
    # Whether each process has a lane in the job's timeline.
    timeline_lane: bool = True
    # Whether it sets its own process title (a native program does not: the
    # launcher gives it `autopar[job] role N` as its argv[0]).
    sets_title: bool = False
    # The variable giving the bytes each of its flows may have in flight,
    # which the launcher sets from the spec's link speed
    # (runtime/flow_windows.py) unless the environment has it ("": none).
    flow_window: str = ""
    # The variable giving its transport's timeout in seconds, which the
    # launcher sets to max(60, 2 x the peer timeout) unless the environment
    # has it ("": none).
    transport_timeout: str = ""
    # The op library its clients (the workers) load (runtime/native.py's
    # name), which a launcher with TensorFlow imported builds before the job
    # starts rather than have every worker wait on one build ("": none).
    client_library: str = ""

    def __post_init__(self) -> None:
        if self.placement != PER_SERVER:
            raise ValueError(f"process kind {self.role!r}: placement {self.placement!r} is not "
                             f"one the launcher knows ({PER_SERVER!r})")
        if self.probe != PROBE_CONNECT:
            raise ValueError(f"process kind {self.role!r}: probe {self.probe!r} is not one the "
                             f"launcher knows ({PROBE_CONNECT!r})")

    @property
    def native_programs(self) -> list[str]:
        """The names of the native programs its command runs."""
        return [name for name in map(_native_program, self.command) if name]

    def argv(self, host: str, port: str, native) -> list[str]:
        """The command of one process on ``host`` at ``port``; ``native``
        maps a native program's name to its path."""
        return [native(name) if (name := _native_program(part))
                else part.replace(HOST, host).replace(PORT, port) for part in self.command]


def _native_program(part: str) -> str:
    """The native program a command part `{native:NAME}` names ("" for any other part)."""
    return part[len(NATIVE):-1] if part.startswith(NATIVE) and part.endswith("}") else ""
