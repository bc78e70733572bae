"""The paths a job writes, checked before its first process starts.

A job writes checkpoints and TensorBoard events from its chief
(Config.checkpoint_dir, tensorboard_dir), DropCompute's CSV from every
worker (dropcompute_log_dir) and the merged timeline from the launcher
(timeline, autopar launch --timeline). A path none of them can write was
found only after the workers started (a traceback from each) or, for the
timeline, after the whole job had trained. The launcher checks each path
this machine will write first: a directory is created and a file written in
it and removed, a file's directory must take a new file; a path that cannot
be written is an AutoparError naming the option, before anything starts.
The writers use the same check, so a job joined without the launcher
(TF_CONFIG, srun) refuses such a path the same way.
"""
from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from autopar.common.errors import AutoparError

if TYPE_CHECKING:
    from autopar.runtime.spec import ResourceSpec

_PROBE_PREFIX = ".autopar-probe-"


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def writable_directory(path: str, option: str) -> None:
    """Create directory ``path`` if it is missing and write a file in it;
    AutoparError naming ``option`` (a Config field) if either fails."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise AutoparError(
            f"{option} {path} is not writable ({_why(exc)}): nothing could be written there. "
            f"Make it a directory this user can write, or point Config({option}=...) at one."
        ) from exc


def writable_file(path: str, option: str) -> None:
    """AutoparError naming ``option`` unless a file can be written at
    ``path``: not a directory, in an existing directory that takes a new
    file (the file itself is not created)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        problem = "it is a directory"
    elif not os.path.isdir(directory):
        problem = f"{directory} is not a directory" if os.path.exists(directory) else \
            f"its directory {directory} does not exist"
    else:
        try:
            fd, probe = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=directory)
            os.close(fd)
            os.remove(probe)
            return
        except OSError as exc:
            problem = f"no file can be created in {directory} ({_why(exc)})"
    raise AutoparError(f"{option} {path} cannot be written: {problem}. Give a file path in a "
                       "directory this user can write.")


def check_job_outputs(config, spec: "ResourceSpec") -> None:
    """The directories of ``config`` (an autopar.Config) that processes on
    this machine will write in a job on ``spec``: the chief's when it runs
    here, every worker's when one does. A directory only another machine
    writes is that machine's to check (its writer does, at start).
    DropCompute's CSV is written only with micro-batches."""
    from autopar.runtime.ports import is_local_address
    worker_hosts = [h.address for h in spec.hosts if h.workers]
    if is_local_address(worker_hosts[0]):
        for option in ("checkpoint_dir", "tensorboard_dir"):
            if getattr(config, option) is not None:
                writable_directory(getattr(config, option), option)
    if (config.dropcompute_log_dir is not None and config.micro_batches > 1
            and any(is_local_address(a) for a in worker_hosts)):
        writable_directory(config.dropcompute_log_dir, "dropcompute_log_dir")
