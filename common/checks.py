"""Checks of option values (autopar.Config's fields, the plan's among them in
transforms/options.py, SimulatedDelay's): each failure an AutoparError naming
the field and showing the value at most briefly (errors.shown)."""
from __future__ import annotations

import math

from autopar.common.errors import AutoparError, shown


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(name: str, value, minimum: int, note: str = "") -> None:
    if not is_int(value) or value < minimum:
        raise AutoparError(f"Config.{name} must be an integer >= {minimum}"
                           f"{' ' + note if note else ''}, got {shown(value)}")


def seconds(name: str, value, *, zero_ok: bool, owner: str = "Config") -> None:
    """A finite number of seconds, > 0 (or >= 0 with ``zero_ok``): NaN and
    infinity are refused (a NaN compares false with everything, so it would
    silently disable every check it takes part in)."""
    if not (is_number(value) and math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        raise AutoparError(f"{owner}.{name} must be a finite number {'>= 0' if zero_ok else '> 0'}"
                           f"{' (0 disables)' if zero_ok and owner == 'Config' else ''}, "
                           f"got {shown(value)}")


def choice(name: str, value, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        names = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise AutoparError(f"Config.{name} must be {names}, got {shown(value)}")


def boolean(name: str, value, none_means: str = "") -> None:
    """True or False (or None, with what None means)."""
    if isinstance(value, bool) or (none_means and value is None):
        return
    allowed = f"True, False or None ({none_means})" if none_means else "True or False"
    raise AutoparError(f"Config.{name} must be {allowed}, got {shown(value)}")
