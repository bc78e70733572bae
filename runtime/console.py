"""How autopar's processes talk to the terminal: their log lines on stdout,
their errors on stderr without a traceback, the last error line of a failed
process's output. Shared by the API (`get_runner`, the `autopar` command) and
the runtime (the launcher streaming its children, the servers), and light (no
TensorFlow) so the command stays quick to start."""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback

from autopar.common.errors import AutoparError

DEBUG = "AUTOPAR_DEBUG"     # "1": autopar errors keep their traceback
ERROR_STATUS = 2            # exit status of an autopar error, as for a command-line usage error
INTERRUPTED_STATUS = 130    # after Ctrl-C, as a shell reports SIGINT (128 + 2)


def debug_errors() -> bool:
    """AUTOPAR_DEBUG=1: show autopar errors with their traceback."""
    return os.environ.get(DEBUG) == "1"


def report_error(error: AutoparError) -> int:
    """Print an autopar error as one message on stderr (it says what was wrong
    and what to do; a traceback would add nothing a user can act on) and
    return the exit status for it. In a process of a launched job the
    launcher is told first that this process failed."""
    _tell_launcher()
    sys.stderr.write(f"autopar: {error}\n")
    sys.stderr.flush()
    return ERROR_STATUS


# ---------------------------------------------------------------------------
# Uncaught exceptions
# ---------------------------------------------------------------------------

# A traceback longer than this, in a process the launcher started, is
# condensed (TensorFlow's graph-mode errors run to a hundred lines and more:
# the creation stack of the failing op, chained exceptions, hints).
MAX_TRACEBACK_LINES = 20
_ROLE = "AUTOPAR_ROLE"      # common/env.py ROLE: set in processes the launcher started


def install_excepthook() -> None:
    """Make an uncaught exception end the process the way autopar's errors
    end it through get_runner: an AutoparError (a bad Config, a checkpoint
    that cannot be saved...) as ``autopar: <message>`` without a traceback,
    exit status 2; in a process the launcher started, any other traceback
    longer than MAX_TRACEBACK_LINES condensed to the script's own frames and
    the error, and the launcher told at once which process failed. With
    AUTOPAR_DEBUG=1 Python's own hook prints everything. A hook the program
    installed itself (IPython, the user's) is left alone."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook


def _excepthook(kind, value, tb) -> None:
    if debug_errors():
        sys.__excepthook__(kind, value, tb)
        return
    if isinstance(value, AutoparError):
        raise SystemExit(report_error(value))   # Python exits with it (and runs atexit)
    if isinstance(value, KeyboardInterrupt):
        # Ctrl-C before the job's own handling (during `import tensorflow`):
        # nothing to report but that.
        sys.stderr.write("autopar: interrupted\n")
        sys.stderr.flush()
        raise SystemExit(INTERRUPTED_STATUS)
    _tell_launcher()
    if os.environ.get(_ROLE):
        # A process forked by the fork server (runtime/forkserver.py) runs its
        # script under the server's own frames: drop them, as a new process has none.
        while tb is not None and tb.tb_next is not None and _launch_frame(tb.tb_frame):
            tb = tb.tb_next
        value = value.with_traceback(tb)
    text = "".join(traceback.format_exception(kind, value, tb))
    if os.environ.get(_ROLE) and text.count("\n") > MAX_TRACEBACK_LINES:
        text = condensed_traceback(value, text.count("\n"))
    sys.stderr.write(text)
    sys.stderr.flush()


def _launch_frame(frame) -> bool:
    name = frame.f_code.co_filename
    return name.startswith("<frozen runpy>") or name.endswith(
        (os.sep + "runpy.py", os.sep + "forkserver.py"))


def _tell_launcher() -> None:
    """Report this worker's failure to the job coordinator (if it has one), so
    the launcher names this process as the cause, not the peers that fail
    because of it. Light: only if the coordinator client is loaded already."""
    coordinator = sys.modules.get("autopar.runtime.coordinator_client")
    if coordinator is not None:
        coordinator.report_failure()


def condensed_traceback(error: BaseException, total_lines: int) -> str:
    """At most MAX_TRACEBACK_LINES lines: the innermost frames of the script
    itself (not TensorFlow's, autopar's or the standard library's) and the
    error in one line (graph-mode TensorFlow errors: the kernel's message and
    the op, without the op's creation stack)."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if not _library_file(f.filename)] or frames
    lines = [f"Traceback (most recent call last; {total_lines} lines condensed: only the "
             f"script's frames and the error's first line, AUTOPAR_DEBUG=1 prints it all):"]
    for frame in own[-5:]:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()[:200]}")
    lines.append(error_line(error))
    return "\n".join(lines) + "\n"


def error_line(error: BaseException) -> str:
    """``TypeName: first line of its message`` (at most 400 characters); for a
    TensorFlow op error the kernel's own words and the op's name."""
    text = op_error_text(error) if _is_op_error(error) else None
    if text is not None:
        text = text or type(error).__name__
        node = getattr(getattr(error, "node_def", None), "name", "")
        if node:
            text += f" (op '{node}')"
    else:
        text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def op_error_text(error: BaseException) -> str:
    """A TensorFlow op error's own words: the kernel's message without the
    "Graph execution error / Detected at node" framing, the op's creation
    stack and hints; "" when it has none."""
    kept = [line.strip() for line in (getattr(error, "message", None) or "").splitlines()
            if line.strip() and not line[0].isspace()
            and not line.startswith(("Graph execution error", "Detected at node", "Node:",
                                     "Hint:", "\t"))]
    text = kept[0] if kept else ""
    if text.endswith(":") and len(kept) > 1:
        text += " " + kept[1]     # "From /job:worker/replica:0/task:0:" says where, not what
    return text


def _is_op_error(error: BaseException) -> bool:
    return any(c.__name__ == "OpError" and c.__module__.startswith("tensorflow")
               for c in type(error).__mro__)


def _library_file(filename: str) -> bool:
    """A frame of TensorFlow, another installed package, the standard library
    or autopar itself, not of the training script."""
    if filename.startswith("<") or os.sep + "site-packages" + os.sep in filename \
            or os.sep + "dist-packages" + os.sep in filename:
        return True
    return any(filename.startswith(root + os.sep) for root in _library_roots())


def _library_roots() -> tuple[str, ...]:
    import sysconfig
    roots = [sysconfig.get_paths()["stdlib"]]
    # The package's folders (in a source checkout its common/, transforms/
    # and runtime/ are folders of their own: autopar/__init__.py).
    for name in ("autopar", "autopar.common", "autopar.transforms", "autopar.runtime"):
        roots += getattr(sys.modules.get(name), "__path__", ())
    return tuple(roots)


# The line a failed Python process ends its output with: an autopar error
# ("autopar: ..."), or the last line of a traceback ("ValueError: boom",
# "tensorflow.python.framework.errors_impl.InternalError: ...").
_CAUSE_LINE = re.compile(r"^(autopar: .+|(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*"
                         r"(?:Error|Exception|Exit|Interrupt|Stopped|Failure)\b(?::.*)?)$")


def cause_in_output(lines: list[str]) -> str | None:
    """The error a failed process's output ends with (the last such line,
    module path dropped, at most 400 characters), or None."""
    for line in reversed(lines):
        line = line.strip()
        if _CAUSE_LINE.match(line):
            if not line.startswith("autopar: "):
                head, sep, rest = line.partition(":")
                line = head.rsplit(".", 1)[-1] + sep + rest
            return line if len(line) <= 400 else line[:397] + "..."
    return None


# One lock for everything written to stdout by the launcher (its log lines and
# its children's, streamed), and whether the last line written is a progress
# bar, which the next bar replaces in place on a terminal.
OUTPUT_LOCK = threading.Lock()
_bar_shown = False


def write_line(text: str, bar: bool = False) -> None:
    """Write one line (``text`` ends with a newline) to stdout; a progress
    ``bar`` right after another replaces it on a terminal (cursor up, erase)."""
    global _bar_shown
    with OUTPUT_LOCK:
        out = sys.stdout
        if out is None:
            return
        if bar and _bar_shown and _is_terminal(out):
            out.write("\x1b[1A\x1b[2K")
        out.write(text)
        out.flush()
        _bar_shown = bar


def _is_terminal(out) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class StdoutHandler(logging.StreamHandler):
    """A StreamHandler on stdout that survives its reader going away: on a
    closed pipe (`... | head`) it sends stdout to /dev/null and carries on,
    instead of printing "--- Logging error --- ... BrokenPipeError" for
    every later record."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(message)s"))

    # Whatever sys.stdout is when a record is written, not when the handler
    # was made: a script (or a test's capture) may replace it in between.
    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        global _bar_shown
        with OUTPUT_LOCK:
            super().emit(record)
            _bar_shown = False

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            from autopar.runtime.children import discard_stdout
            discard_stdout()
            return
        super().handleError(record)


def setup_logging() -> None:
    """autopar's own lines go to stdout (a worker's reach the launcher, which
    streams them with the worker's prefix); the user's logging configuration
    is left alone."""
    logger = logging.getLogger("autopar")
    if not logger.handlers:
        logger.addHandler(StdoutHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
