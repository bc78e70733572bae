"""How autopar talks to the terminal: its log lines on stdout, its errors on
stderr without a traceback. Shared by `get_runner` and the `autopar` command,
and light (no TensorFlow) so the command stays quick to start."""
from __future__ import annotations

import logging
import os
import sys

from autopar.common.errors import AutoparError

DEBUG = "AUTOPAR_DEBUG"     # "1": autopar errors keep their traceback
ERROR_STATUS = 2            # exit status of an autopar error, as for a command-line usage error


def debug_errors() -> bool:
    """AUTOPAR_DEBUG=1: show autopar errors with their traceback."""
    return os.environ.get(DEBUG) == "1"


def report_error(error: AutoparError) -> int:
    """Print an autopar error as one message on stderr (it says what was wrong
    and what to do; a traceback would add nothing a user can act on) and
    return the exit status for it."""
    sys.stderr.write(f"autopar: {error}\n")
    sys.stderr.flush()
    return ERROR_STATUS


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

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            from autopar.runtime.launcher import discard_stdout
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
