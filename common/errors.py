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


def shown(value: object, limit: int = 300) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters,
    computed without ever building the whole repr: a value from a spec or a
    Config can be huge (a YAML alias bomb expands a 512-byte file into 9**9
    elements by reference), and a message must never format unbounded input."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel = 3
    r.maxdict = r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = 4
    r.maxarray = 4
    r.maxstring = r.maxother = max(8, limit)
    r.maxlong = 40
    try:
        text = r.repr(value)
    except Exception:   # noqa: BLE001 - a repr that fails (an int too long to print...)
        text = (f"<an integer of {value.bit_length()} bits>" if isinstance(value, int)
                else f"<{type(value).__name__}>")
    return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."
