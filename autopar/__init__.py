"""autopar: single-device TensorFlow training, run as synchronous data-parallel
training on many processes and machines.

    ds = autopar.shard(ds)
    runner = autopar.get_runner(graph, "resource_specs/localhost_2workers.yaml")
"""
import os as _os

# setup.py installs the repository's common/, transforms/ and runtime/ folders
# as autopar.common, autopar.transforms and autopar.runtime. Imported from a source checkout (the
# tests, the launcher's children with the checkout on PYTHONPATH), take them
# from that same checkout, not from wherever an editable install points.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_LAYERS = ("common", "transforms", "runtime")
if not _os.path.isdir(_os.path.join(__path__[0], "runtime")) and all(
        _os.path.isfile(_os.path.join(_checkout, layer, "__init__.py")) for layer in _LAYERS):
    __path__.append(_checkout)

# Before any import of grpc (read then): the launcher starts children with
# fork+exec while the coordinator's gRPC threads run. With gRPC's fork support
# on, the child's post-fork handler restarts gRPC's epoll poller, which
# subprocess then closes before exec: the child aborts ("epoll_wait error: Bad
# file descriptor", SIGABRT; grpc/grpc#43055, seen here with grpcio 1.85). No
# child uses the parent's gRPC state, so the handlers are not needed.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

# The command and directory the launcher re-runs this script with, before
# the script can change directory (common/script.py).
from autopar.common import script as _script  # noqa: E402
if _script._started is None:
    _script.note()
from autopar.config import Config, SimulatedDelay  # noqa: E402
from autopar.console import install_excepthook as _install_excepthook  # noqa: E402
from autopar.common.errors import (AutoparError, LaunchError, SpecError,  # noqa: E402
                                   UnsupportedGraphError, WorkerFailedError)

__all__ = ["get_runner", "shard", "num_workers", "analyze", "fit", "Config", "SimulatedDelay", "Report", "AutoparError", "SpecError",
           "UnsupportedGraphError", "LaunchError", "WorkerFailedError"]
__version__ = "0.1.0"

# An AutoparError nobody catches (a bad Config in the script, a checkpoint that
# cannot be saved) ends the script as `autopar: <message>`, exit status 2, as
# errors through get_runner do; AUTOPAR_DEBUG=1 keeps the traceback
# (autopar/console.py).
_install_excepthook()

# TensorFlow's C++ start-up and INFO/WARNING lines, and deprecation warnings
# repeated by every worker, off unless AUTOPAR_VERBOSE=1 (autopar/quiet.py):
# before the script imports TensorFlow, when it imports autopar first.
from autopar import quiet as _quiet  # noqa: E402
_quiet.quiet_tensorflow()


_tensorflow_checked = False


def _check_tensorflow() -> None:
    """Before the API's first import of TensorFlow: none installed is an
    AutoparError saying what to install; a release outside the supported
    ones (common/tensorflow_range.py) is a warning."""
    global _tensorflow_checked
    if _tensorflow_checked:
        return
    import logging
    from autopar.common import tensorflow_range
    try:
        import tensorflow as tf
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow":
            raise
        raise AutoparError(
            f"autopar needs TensorFlow ({tensorflow_range.SPECIFIER}), and none is installed: "
            "pip install 'autopar[cpu]' (tensorflow-cpu) or 'autopar[gpu]' (tensorflow[and-cuda]), "
            "or any TensorFlow distribution of those releases") from None
    problem = tensorflow_range.unsupported(tf.__version__)
    if problem is not None:
        logging.getLogger("autopar").warning("%s", problem)
    _tensorflow_checked = True


def __getattr__(name):
    # The API pulls in TensorFlow (seconds to import); a process that only
    # launches or parses specs (`autopar launch`) should not pay for it.
    if name in ("get_runner", "shard", "num_workers", "analyze"):
        _check_tensorflow()
        from autopar import api
        return getattr(api, name)
    if name == "fit":
        _check_tensorflow()
        from autopar.runtime.keras_fit import fit
        return fit
    if name == "optimizers":
        import importlib
        return importlib.import_module("autopar.optimizers")
    if name == "Report":
        from autopar.transforms.report import Report
        return Report
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")
