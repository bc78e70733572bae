"""How this process's script was started, which the launcher re-runs once
per worker: the command and the directory it started in, noted when autopar
is first imported (or when the fork server turns into the process), before
the script can change directory. The command comes from sys.orig_argv, the
interpreter's own: runpy.run_path makes sys.argv[0] the file it runs, so a
wrapper running the training script through it would be re-run as the
inner file."""
from __future__ import annotations

import os
import sys

_started: tuple[list[str], str] | None = None

# Interpreter options that take the next argument as their value.
_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def note(argv: list[str] | None = None, cwd: str | None = None) -> None:
    """Note the command this process was started with (sys.orig_argv: the
    interpreter, its options, the script and its arguments) and its
    directory (now)."""
    global _started
    _started = (list(sys.orig_argv if argv is None else argv),
                os.getcwd() if cwd is None else cwd)


def command() -> tuple[list[str], str]:
    """(the command, the directory to run it in) that starts this script
    again as it was started: this interpreter with its options, the script
    as an absolute path (or `-m module`, `-c code`) and its arguments."""
    argv, cwd = _started if _started is not None else (list(sys.orig_argv), os.getcwd())
    out = [sys.executable]
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("-c", "-m", "-") or arg.startswith(("-c", "-m")):
            out += rest[i:]
            break
        if arg in _WITH_VALUE:
            out += rest[i:i + 2]
            i += 2
            continue
        if arg.startswith("-"):
            out.append(arg)
            i += 1
            continue
        out += [os.path.join(cwd, arg), *rest[i + 1:]]
        break
    return out, cwd
