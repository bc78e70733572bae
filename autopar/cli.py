"""autopar: a single-device TensorFlow training script, run as synchronous
data-parallel training on many processes and machines.

    autopar launch -np 4 -- python train.py [args...]     4 workers on this machine
    autopar launch -H host1:4,host2:4 python train.py     hosts and workers per host
    autopar launch --spec SPEC -- python train.py         a resource spec file
    autopar report -np 4 -- python train.py               print the plan, train nothing
    autopar spec --workers 4 > spec.yaml                  write a resource spec to start from

The hosts as MPI and Horovod take them: -np N alone runs N workers on this
machine; with -H host1:4,host2:4 or --hostfile FILE ('host slots=N' lines),
slots being workers per host, it takes the first N slots. --servers-per-host N
(default 0) adds server processes on each host. Inside a Slurm allocation
(sbatch, salloc), --spec slurm takes the allocation's nodes, workers being its
tasks per node, and starts every process with srun.

The training command follows '--', or directly after the options when its
first word is not an option. --config KEY=VALUE sets any autopar.Config field
for every process of the job, over the Config the script passes to
get_runner (a Python literal, or text: --config run_option=ps
--config partitions="{'embedding': 8}").
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

from autopar import __version__, overrides
from autopar.common import env
from autopar.common.errors import AutoparError
from autopar.common.roles import REPORT_ROLE
from autopar.runtime.console import ERROR_STATUS, StdoutHandler, debug_errors, report_error

# Options that set a Config field: (flag, field, type, help).
_CONFIG_FLAGS = (
    ("--run-option", "run_option", str,
     "how gradients travel: hybrid (default), ps, allreduce or herring"),
    ("--stall-timeout", "stall_timeout_s", float,
     "end the job when workers wait this long in a step for a process that stopped "
     "answering (default 60; 0 disables the timed checks)"),
    ("--busy-timeout", "busy_timeout_s", float,
     "end the job when workers wait this long in a step for a process that is busy "
     "outside one, still reporting (default 3600; 0: never)"),
    ("--max-restarts", "max_restarts", int,
     "start the job again, at most N times, when a process dies, fails or stalls once "
     "training has begun (the chief restores its last checkpoint; default 0)"),
    ("--min-workers", "min_workers", int,
     "with --max-restarts: a host ssh cannot reach on a restart is dropped if the others "
     "run at least M workers (default 0: never)"),
    ("--timeline", "timeline", str, "write the job's merged Chrome trace (timeline) to PATH"),
    ("--timeline-steps", "timeline_steps", int,
     "with --timeline: traced steps kept, the last (default 10)"),
    ("--timeline-every", "timeline_every", int,
     "with --timeline: trace one step in N (default 10)"),
)
_LAUNCH_ONLY = {"--stall-timeout", "--busy-timeout", "--max-restarts", "--min-workers",
                "--timeline", "--timeline-steps", "--timeline-every"}


class UsageError(Exception):
    """A command line autopar cannot run: said as `autopar: ...`, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spec"]:
        return spec_main(argv[1:])
    parser = _parser()
    try:
        if not argv:
            sys.stdout.write(parser.format_help())
            return 0
        args = _parse(parser, argv)
        fields, origins = _config_fields(args)
        config = overrides.checked(fields, origins)   # Config's own checks, before anything starts
        spec = _spec(args)
        _check_against_the_spec(fields, config, spec)
    except (UsageError, AutoparError) as e:
        if debug_errors() and isinstance(e, AutoparError):
            raise
        return _usage_error(e)
    # The job's processes read these from their environment (common/env.py).
    if fields:
        os.environ[env.CONFIG] = overrides.to_env(fields)
    if args.verbose:
        os.environ[env.VERBOSE] = "1"
    # This process is only the launcher: its log lines go to stdout, through a
    # handler that survives a reader closing the pipe (`| head`).
    logging.basicConfig(level=logging.INFO, handlers=[StdoutHandler()])
    try:
        if args.action == "report":
            return _report(spec, args.command)
        return _launch(spec, args.command)
    except AutoparError as e:
        if debug_errors():
            raise
        return report_error(e)
    except KeyboardInterrupt:
        # Outside the job's own handling (setting up, tearing down).
        if debug_errors():
            raise
        sys.stderr.write("autopar: interrupted\n")
        return 130


def _check_against_the_spec(fields: dict, config, spec) -> None:
    """What the command line's Config fields contradict in the spec, and the
    paths they name that cannot be written, refused before anything starts
    (the script's own Config is checked when its plan compiles)."""
    from autopar.runtime import outputs
    from autopar.runtime.launcher import check_restart_options
    if "max_restarts" in fields or "min_workers" in fields:
        check_restart_options(spec, config.max_restarts, config.min_workers)
    if config.timeline is not None and "timeline" in fields:
        outputs.writable_file(config.timeline, "timeline")
    outputs.check_job_outputs(config, spec)


def spec_main(argv: list[str]) -> int:
    """`autopar spec`: a resource spec (YAML, docs/resource-specs.md) on
    stdout, checked as any spec is, for a user to save and edit."""
    import yaml
    from autopar.runtime.spec import load_spec
    parser = argparse.ArgumentParser(
        prog="autopar spec", description="Print a resource spec: hosts, and the workers and "
        "servers on each. Save it (autopar spec --workers 4 > spec.yaml) and edit it "
        "(ports, ssh settings: docs/resource-specs.md).")
    parser.add_argument("--workers", type=int, default=2, metavar="N",
                        help="worker processes per host (default 2)")
    parser.add_argument("--servers", type=int, default=0, metavar="N",
                        help="server processes per host (default 0)")
    parser.add_argument("--hosts", default="127.0.0.1", metavar="HOST,...",
                        help="host names or addresses (default 127.0.0.1: this machine)")
    parser.add_argument("--gpus-per-worker", type=int, default=0, metavar="K",
                        help="GPU ids per worker on each host, in order (default 0: CPU workers)")
    args = parser.parse_args(argv)
    gpus = ({"gpus": list(range(args.workers * args.gpus_per_worker))}
            if args.gpus_per_worker > 0 and args.workers > 0 else {})
    hosts = [{"address": h.strip(), "workers": args.workers, "servers": args.servers, **gpus}
             for h in args.hosts.split(",")]
    try:
        load_spec({"hosts": hosts})
    except AutoparError as e:
        return report_error(e)
    where = "this machine" if args.hosts == "127.0.0.1" else args.hosts
    sys.stdout.write(f"# {args.workers} workers and {args.servers} servers per host on {where} "
                     f"(`autopar spec {' '.join(argv)}`)\n"
                     + yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    return 0


def _usage_error(error: Exception) -> int:
    sys.stderr.write(f"autopar: {error}\n")
    sys.stderr.flush()
    return ERROR_STATUS


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autopar", description=__doc__, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"autopar {__version__}")
    sub = parser.add_subparsers(dest="action", metavar="{launch,report}")
    for action, text in (("launch", "start every server and worker of the job running the "
                                    "command"),
                         ("report", "print the plan for the command's graph, train nothing")):
        p = sub.add_parser(action, help=text, description=f"autopar {action}: {text}.",
                           allow_abbrev=False)
        p.add_argument("-np", "--num-proc", type=int, metavar="N",
                       help="workers: N on this machine, or the first N slots of -H / "
                            "--hostfile (as horovodrun -np)")
        hosts = p.add_mutually_exclusive_group()
        hosts.add_argument("--spec", help="resource spec (YAML or Parallax text), or 'slurm' "
                                          "for the nodes and tasks of this Slurm allocation")
        hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                           help="hosts and workers per host, as horovodrun -H takes them")
        hosts.add_argument("--hostfile", metavar="FILE",
                           help="a hostfile of 'host slots=N' lines (OpenMPI and Horovod)")
        p.add_argument("--servers-per-host", type=int, default=0, metavar="N",
                       help="with -np, -H, --hostfile or --spec slurm: server processes on "
                            "each host (default 0)")
        p.add_argument("--gpus-per-worker", type=int, default=0, metavar="K",
                       help="with -np, -H or --hostfile: slot k of a host owns its GPUs kK .. "
                            "kK+K-1 (default 0: CPU workers; docs/gpus.md)")
        p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="set the autopar.Config field KEY for every process of the job "
                            "(repeatable)")
        for flag, _, kind, text in _CONFIG_FLAGS:
            if action == "launch" or flag not in _LAUNCH_ONLY:
                p.add_argument(flag, type=kind, default=None,
                               metavar="PATH" if kind is str and flag != "--run-option" else None,
                               help=text)
        p.add_argument("-v", "--verbose", action="store_true",
                       help="keep TensorFlow's C++ and start-up lines and its deprecation "
                            "warnings (AUTOPAR_VERBOSE=1)")
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="the training command, e.g. python train.py --steps 100")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The options and the command: after the first '--', or (without one)
    from the first word that is not an option on. A '--' after the command
    has begun is the command's own."""
    before, after = argv, None
    if "--" in argv:
        cut = argv.index("--")
        before, after = argv[:cut], argv[cut + 1:]
    args, unknown = parser.parse_known_args(before)
    if args.action is None:
        raise UsageError("give an action: autopar launch or autopar report (autopar -h)")
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (autopar {args.action} -h "
                         "lists the options; a training command that starts with an option "
                         "goes after '--')")
    if after is not None:
        args.command = args.command + ["--"] + after if args.command else after
    if not args.command:
        raise UsageError(f"give the training command, e.g. autopar {args.action} -np 2 -- "
                         "python train.py")
    return args


def _config_fields(args: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    """{Config field: value} the command line sets, and for each the option
    that set it (for messages)."""
    fields: dict = {}
    origins: dict[str, str] = {}
    for setting in args.config:
        key, value = overrides.parse(setting)
        fields[key], origins[key] = value, f"--config {setting}"
    for flag, name, _, _ in _CONFIG_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is None:
            continue
        if name in fields:
            raise UsageError(f"{flag} and --config {name}=... both set Config.{name}: give one")
        if name == "timeline":
            value = os.path.abspath(value)    # the workers may run elsewhere than here
        fields[name], origins[name] = value, f"{flag} {value}"
    return fields, origins


def _spec(args):
    """The job's ResourceSpec from -np, --spec (a file, or 'slurm'), -H or --hostfile."""
    from autopar.runtime import hostfile, slurm
    from autopar.runtime.spec import load_spec
    if args.servers_per_host < 0:
        raise UsageError(f"--servers-per-host must be >= 0, got {args.servers_per_host}")
    if args.num_proc is not None and args.num_proc < 1:
        raise UsageError(f"-np must be a number of workers >= 1, got {args.num_proc}")
    if args.gpus_per_worker and (args.gpus_per_worker < 0 or args.spec is not None):
        raise UsageError("--gpus-per-worker takes a count >= 0 and goes with -np, -H or "
                         "--hostfile; a spec file gives each host's 'gpus' itself, and --spec "
                         "slurm takes the allocation's")
    if args.spec is None and args.hosts is None and args.hostfile is None:
        if args.num_proc is None:
            raise UsageError("give the workers: -np N (on this machine), -H host:slots,..., "
                             "--hostfile FILE or --spec FILE")
        return hostfile.spec_from_hosts([("127.0.0.1", args.num_proc)], args.servers_per_host,
                                        args.gpus_per_worker)
    if args.spec is not None:
        if args.spec == "slurm":
            spec = slurm.spec_from_allocation(os.environ, args.servers_per_host)
        elif args.servers_per_host:
            raise UsageError("--servers-per-host goes with -np, -H, --hostfile or --spec slurm; "
                             "a spec file gives each host's 'servers' itself")
        else:
            spec = load_spec(args.spec)
        if args.num_proc is not None and args.num_proc != spec.num_workers:
            raise UsageError(f"-np {args.num_proc}, but --spec {args.spec} gives "
                             f"{spec.num_workers} worker(s): leave -np out, or use it with -H, "
                             "--hostfile or alone")
        return spec
    if args.hosts is not None:
        hosts = hostfile.parse_host_list(args.hosts)
    else:
        try:
            with open(args.hostfile, encoding="utf-8") as f:
                text = f.read(1 << 20)
        except (OSError, UnicodeDecodeError) as exc:
            raise AutoparError(f"hostfile {args.hostfile}: cannot be read ({exc})") from exc
        hosts = hostfile.parse_hostfile(text, args.hostfile)
    if args.num_proc is not None:
        hosts = _first_slots(hosts, args.num_proc)
    return hostfile.spec_from_hosts(hosts, args.servers_per_host, args.gpus_per_worker)


def _first_slots(hosts: list[tuple[str, int]], n: int) -> list[tuple[str, int]]:
    """The hosts' first ``n`` slots, in order (horovodrun's -np with -H)."""
    total = sum(slots for _, slots in hosts)
    if n > total:
        raise UsageError(f"-np {n}, but the hosts give {total} slot(s): give more slots "
                         "(host:slots) or a smaller -np")
    taken = []
    for host, slots in hosts:
        if n <= 0:
            break
        taken.append((host, min(slots, n)))
        n -= slots
    return taken


def _report(spec, command: list[str]) -> int:
    child_env = dict(os.environ, **{env.ROLE: REPORT_ROLE, env.SPEC: json.dumps(spec.to_dict())})
    try:
        return subprocess.run(command, env=child_env).returncode
    except OSError as exc:
        raise AutoparError(f"cannot run {command[0]}: {exc.strerror or exc}") from None


def _launch(spec, command: list[str]) -> int:
    from autopar.config import Config
    from autopar.runtime.launcher import run_job
    from autopar.runtime.script_plan import compile_in_script
    from autopar.transforms import serial

    def compile_plan(for_spec, fork_server):
        # The command, run once in the report role, compiles the plan.
        compiled = compile_in_script(command, for_spec, fork_server)
        return (compiled.plan, compiled.processes, compiled.report,
                serial.decode(Config, compiled.config))
    return run_job(spec, command, compile_plan)


if __name__ == "__main__":
    sys.exit(main())
