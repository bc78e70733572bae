"""`autopar` command line.

    autopar launch --spec SPEC -- python train.py [args...]   train on the cluster
    autopar report --spec SPEC -- python train.py [args...]   print the plan, train nothing
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys

from autopar.console import StdoutHandler, debug_errors, report_error
from autopar.common.errors import AutoparError
from autopar.common import env
from autopar.common.roles import REPORT_ROLE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="autopar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    for action, text in (("launch", "start every server and worker of SPEC running the command"),
                         ("report", "print the plan for the command's graph on SPEC, train nothing")):
        p = sub.add_parser(action, help=text)
        p.add_argument("--spec", required=True, help="resource spec (YAML or Parallax text)")
        if action == "launch":
            p.add_argument("--stall-timeout", type=float, default=60.0, metavar="SECONDS",
                           help="end the job when workers wait this long in a step for others "
                                "(default 60; 0 disables)")
            p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                           help="start the job again, at most N times, when a process dies, "
                                "fails or stalls once training has begun (the chief restores "
                                "its last checkpoint; default 0)")
    args = parser.parse_args(argv)
    if not command:
        parser.error("give the training command after '--', e.g. -- python train.py")
    if not 0 <= getattr(args, "stall_timeout", 0) < math.inf:
        parser.error("--stall-timeout must be a finite number >= 0 (0 disables the stall check)")
    if getattr(args, "max_restarts", 0) < 0:
        parser.error("--max-restarts must be an integer >= 0")
    # This process is only the launcher: its log lines go to stdout, through a
    # handler that survives a reader closing the pipe (`| head`).
    logging.basicConfig(level=logging.INFO, handlers=[StdoutHandler()])
    from autopar.runtime.spec import load_spec
    try:
        spec = load_spec(args.spec)
    except AutoparError as e:
        if debug_errors():
            raise
        return report_error(e)
    if args.action == "report":
        child_env = dict(os.environ, **{env.ROLE: REPORT_ROLE, env.SPEC: json.dumps(spec.to_dict())})
        return subprocess.run(command, env=child_env).returncode
    from autopar.runtime.launcher import launch
    try:
        # The plan is compiled in the job (by the chief): whether it uses
        # herring is not known here, so a spec with servers gets summation
        # servers too.
        return launch(spec, command, stall_timeout_s=args.stall_timeout,
                      sumservers=spec.num_servers > 0, max_restarts=args.max_restarts)
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


if __name__ == "__main__":
    sys.exit(main())
