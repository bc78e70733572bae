"""Exceptions for errors a user can cause.

Every message says what was wrong and what to do about it, so a user reading a
launcher's output never has to open a traceback to act.
"""


class AutoparError(Exception):
    """Base class of every error autopar raises on purpose."""


class SpecError(AutoparError):
    """The resource spec (YAML, Parallax text, TF_CONFIG) is invalid."""


class UnsupportedGraphError(AutoparError):
    """The training graph has a shape autopar cannot parallelise."""


class LaunchError(AutoparError):
    """Processes could not be started (port taken, ssh failed, ...)."""


class WorkerFailedError(AutoparError):
    """A worker or server process died; the job was stopped."""
