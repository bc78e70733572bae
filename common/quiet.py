"""TensorFlow's noise kept out of a job's output: its C++ start-up lines and
INFO/WARNING lines, and the Python deprecation warnings every worker would
print again after the launcher (or the chief). AUTOPAR_VERBOSE=1 (`autopar
launch --verbose`) keeps everything. Light (no TensorFlow): `import autopar`
applies it, so a script that imports autopar before TensorFlow starts quiet
in every way of running (the launcher, its workers, TF_CONFIG, mpirun,
srun); one that imports TensorFlow first has printed its start-up lines by
then."""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Mapping

from autopar.common import env

# What TensorFlow prints whatever TF_CPP_MIN_LOG_LEVEL says (absl's notice and
# the oneDNN line, logged before the level is read; the CPU-feature notice),
# and its C++ INFO and WARNING lines (absl's format: `I0000 00:00:...
# file.cc:12] ...`); errors (E, F) are kept.
NOISE = re.compile(r"All log messages before absl::InitializeLog|oneDNN custom operations are on"
                   r"|cpu_feature_guard|rebuild TensorFlow with the appropriate compiler flags"
                   r"|^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")

# A child that copies its stdin to its stdout, less the noise: it outlives a
# process that aborts during the import, so a fatal line still comes out.
_FILTER = ("import re, sys\n"
           "noise = re.compile(sys.argv[1].encode())\n"
           "out = sys.stdout.buffer\n"
           "for line in sys.stdin.buffer:\n"
           "    if not noise.search(line):\n"
           "        out.write(line)\n"
           "        out.flush()\n")


def verbose(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(env.VERBOSE) == "1"


def quiet_tensorflow(environ=os.environ) -> None:
    """Unless verbose: TensorFlow's C++ INFO and WARNING lines off
    (TF_CPP_MIN_LOG_LEVEL=2, a value already set is kept), its first import
    with its start-up lines filtered out, and its Python warnings off in a
    process that would repeat the launcher's or the chief's."""
    if verbose(environ):
        return
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietImport)
                                                   for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
    quiet_repeats(environ)


def quiet_repeats(environ: Mapping[str, str] = os.environ) -> None:
    """TensorFlow's Python warnings (deprecations) off in a process that is
    not the one to show them: every worker but the chief, servers, the
    report run (the launcher, or the chief, shows them once)."""
    if not verbose(environ) and _repeats(environ):
        logging.getLogger("tensorflow").setLevel(logging.ERROR)


def _repeats(environ: Mapping[str, str]) -> bool:
    role = environ.get(env.ROLE)
    if role:
        return not (role == "worker" and environ.get(env.TASK_INDEX, "0") == "0")
    if environ.get("TF_CONFIG"):
        try:
            config = json.loads(environ["TF_CONFIG"])
            task = config["task"]
            chief = task["type"] == "chief" or (task["type"] == "worker" and int(task["index"]) == 0
                                                and "chief" not in config.get("cluster", {}))
        except (ValueError, KeyError, TypeError):
            return False
        return not chief
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if environ.get(name, "").isdigit():
            return environ[name] != "0"
    return False


@contextlib.contextmanager
def filtered_stderr():
    """This process's stderr (file descriptor 2, where TensorFlow's C++ code
    writes) through a filter child dropping NOISE, for the block."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    read, write = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER, NOISE.pattern],
                                 stdin=read, stdout=saved, stderr=saved, close_fds=True)
    except OSError:
        for fd in (read, write, saved):
            os.close(fd)
        yield
        return
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(saved, 2)        # the pipe's last writer closes: the filter drains and ends
        os.close(saved)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


class _QuietImport(importlib.abc.MetaPathFinder):
    """Runs the first `import tensorflow` under filtered_stderr, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps its own loader (importlib.resources and the like read it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with filtered_stderr():
            self._loader.exec_module(module)
