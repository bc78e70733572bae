"""The TensorFlow releases autopar supports, in one place: setup.py's extras
(autopar[cpu], autopar[gpu]) and the check when autopar's API first imports
TensorFlow read it. The suite runs on tensorflow-cpu 2.21 (constraints.txt),
`make test-install` on the `tensorflow` distribution of it. 2.20 is not
among them: it requires tensorboard 2.20, which needs setuptools' removed
pkg_resources to start (docs/install.md).
Standard library only: setup.py loads this file by path."""
from __future__ import annotations

OLDEST = (2, 21)
NEWEST = (2, 21)
# The pip requirement for the range: any TensorFlow distribution (tensorflow,
# tensorflow-cpu, tensorflow[and-cuda]) of these releases.
SPECIFIER = f">={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '2.21.0' or '2.22.0rc1'."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = "".join(c for c in parts[1] if c.isdigit()) if parts[1][:1].isdigit() else ""
    return (int(parts[0]), int(minor)) if minor else None


def unsupported(version: str) -> str | None:
    """Why TensorFlow ``version`` is outside the supported releases, or None."""
    found = release(version)
    if found is not None and OLDEST <= found <= NEWEST:
        return None
    supported = ".".join(map(str, OLDEST)) + ("" if OLDEST == NEWEST
                                               else " to " + ".".join(map(str, NEWEST)))
    return (f"autopar supports TensorFlow {supported} and this is TensorFlow {version}: install a supported release (pip install "
            f"'tensorflow{SPECIFIER}', or tensorflow-cpu, or autopar[cpu] / autopar[gpu])")
