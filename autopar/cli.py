"""`autopar` command line.

    autopar launch --spec SPEC -- python train.py [args...]   train on the cluster
    autopar report --spec SPEC -- python train.py [args...]   print the plan, train nothing
    autopar spec --workers 4 > spec.yaml                      write a resource spec to start from

Instead of --spec, the hosts as MPI and Horovod take them: -H host1:4,host2:4
or --hostfile FILE ('host slots=N' lines), slots being workers per host, with
--servers-per-host N (default 0). Inside a Slurm allocation (sbatch, salloc),
--spec slurm takes the allocation's nodes, workers being its tasks per node,
and starts every process with srun.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys

from autopar.config import Config
from autopar.console import StdoutHandler, debug_errors, report_error
from autopar.common.errors import AutoparError
from autopar.common import env
from autopar.common.roles import REPORT_ROLE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spec"]:
        return spec_main(argv[1:])
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="autopar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("spec", help="print a resource spec to start from (autopar spec --help)")
    for action, text in (("launch", "start every server and worker of SPEC running the command"),
                         ("report", "print the plan for the command's graph on SPEC, train nothing")):
        p = sub.add_parser(action, help=text)
        hosts = p.add_mutually_exclusive_group(required=True)
        hosts.add_argument("--spec", help="resource spec (YAML or Parallax text), or 'slurm' "
                                          "for the nodes and tasks of this Slurm allocation")
        hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                           help="hosts and workers per host, as horovodrun -H takes them")
        hosts.add_argument("--hostfile", metavar="FILE",
                           help="a hostfile of 'host slots=N' lines (OpenMPI and Horovod)")
        p.add_argument("--servers-per-host", type=int, default=0, metavar="N",
                       help="with -H, --hostfile or --spec slurm: server processes on each "
                            "host (default 0)")
        p.add_argument("--gpus-per-worker", type=int, default=0, metavar="K",
                       help="with -H or --hostfile: slot k of a host owns its GPUs kK .. kK+K-1 "
                            "(default 0: CPU workers; docs/gpus.md)")
        if action == "launch":
            p.add_argument("--stall-timeout", type=float, default=60.0, metavar="SECONDS",
                           help="end the job when workers wait this long in a step for others "
                                "(default 60; 0 disables)")
            p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                           help="start the job again, at most N times, when a process dies, "
                                "fails or stalls once training has begun (the chief restores "
                                "its last checkpoint; default 0)")
            p.add_argument("--timeline", metavar="PATH",
                           help="write the job's merged Chrome trace (timeline) to PATH")
            p.add_argument("--timeline-steps", type=int, default=Config.timeline_steps,
                           metavar="K", help="with --timeline: traced steps kept, the last "
                                             f"(default {Config.timeline_steps})")
            p.add_argument("--timeline-every", type=int, default=Config.timeline_every,
                           metavar="N", help="with --timeline: trace one step in N "
                                             f"(default {Config.timeline_every})")
            p.add_argument("--min-workers", type=int, default=0, metavar="M",
                           help="with --max-restarts: a host ssh cannot reach on a restart is "
                                "dropped if the others run at least M workers (default 0: never)")
    args = parser.parse_args(argv)
    if not command:
        parser.error("give the training command after '--', e.g. -- python train.py")
    if not 0 <= getattr(args, "stall_timeout", 0) < math.inf:
        parser.error("--stall-timeout must be a finite number >= 0 (0 disables the stall check)")
    if getattr(args, "max_restarts", 0) < 0:
        parser.error("--max-restarts must be an integer >= 0")
    if getattr(args, "min_workers", 0) < 0:
        parser.error("--min-workers must be an integer >= 0")
    if min(getattr(args, "timeline_steps", 1), getattr(args, "timeline_every", 1)) < 1:
        parser.error("--timeline-steps and --timeline-every must be integers >= 1")
    # This process is only the launcher: its log lines go to stdout, through a
    # handler that survives a reader closing the pipe (`| head`).
    logging.basicConfig(level=logging.INFO, handlers=[StdoutHandler()])
    try:
        spec = _spec(args)
    except AutoparError as e:
        if debug_errors():
            raise
        return report_error(e)
    if args.action == "report":
        child_env = dict(os.environ, **{env.ROLE: REPORT_ROLE, env.SPEC: json.dumps(spec.to_dict())})
        return subprocess.run(command, env=child_env).returncode
    from autopar.runtime.launcher import run_job
    from autopar.runtime.script_plan import compile_in_script
    from autopar.runtime.timeline import TimelineOptions

    def compile_plan(for_spec, fork_server):
        # The command, run once in the report role, compiles the plan.
        compiled = compile_in_script(command, for_spec, fork_server)
        return compiled.plan, compiled.processes, compiled.report
    try:
        return run_job(spec, command, compile_plan, stall_timeout_s=args.stall_timeout,
                       max_restarts=args.max_restarts, min_workers=args.min_workers,
                       timeline=TimelineOptions(os.path.abspath(args.timeline),
                                                args.timeline_steps, args.timeline_every)
                       if args.timeline else None)
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


def _spec(args):
    """The job's ResourceSpec from --spec (a file, or 'slurm'), -H or --hostfile."""
    from autopar.runtime import hostfile, slurm
    from autopar.runtime.spec import load_spec
    if args.servers_per_host < 0:
        raise AutoparError(f"--servers-per-host must be >= 0, got {args.servers_per_host}")
    if args.gpus_per_worker and (args.gpus_per_worker < 0 or args.spec is not None):
        raise AutoparError("--gpus-per-worker takes a count >= 0 and goes with -H or --hostfile; "
                           "a spec file gives each host's 'gpus' itself, and --spec slurm takes "
                           "the allocation's")
    if args.spec == "slurm":
        return slurm.spec_from_allocation(os.environ, args.servers_per_host)
    if args.spec is not None:
        if args.servers_per_host:
            raise AutoparError("--servers-per-host goes with -H, --hostfile or --spec slurm; a "
                               "spec file gives each host's 'servers' itself")
        return load_spec(args.spec)
    if args.hosts is not None:
        hosts = hostfile.parse_host_list(args.hosts)
    else:
        try:
            with open(args.hostfile, encoding="utf-8") as f:
                text = f.read(1 << 20)
        except (OSError, UnicodeDecodeError) as exc:
            raise AutoparError(f"hostfile {args.hostfile}: cannot be read ({exc})") from exc
        hosts = hostfile.parse_hostfile(text, args.hostfile)
    return hostfile.spec_from_hosts(hosts, args.servers_per_host, args.gpus_per_worker)


if __name__ == "__main__":
    sys.exit(main())
