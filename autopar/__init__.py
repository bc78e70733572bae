"""autopar: single-device TensorFlow training, run as synchronous data-parallel
training on many processes and machines.

    ds = autopar.shard(ds)
    runner = autopar.get_runner(graph, "resource_specs/localhost_2workers.yaml")

Importing autopar (or any of its modules) changes nothing of the process but
TensorFlow's noise (below). The process-wide settings a job needs are made
where the job starts: the hook that ends the script on an autopar error when
the program first uses the API (any public name of this module) or in a
process a launcher started, gRPC's fork support where gRPC is first imported
(runtime/rpc.py).
"""
import importlib.util as _util
import os as _os
import sys as _sys


def _bind_checkout_layers() -> None:
    """setup.py installs the repository's common/, transforms/ and runtime/
    folders as autopar.common, autopar.transforms and autopar.runtime.
    Imported from a source checkout (the tests, the launcher's children with
    the checkout on PYTHONPATH), those three names are bound here to that
    same checkout's folders (not to wherever an editable install points);
    nothing else of the checkout becomes part of the package."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.isdir(_os.path.join(here, "runtime")):
        return      # installed: they are subpackages
    checkout = _os.path.dirname(here)
    for layer in ("common", "transforms", "runtime"):
        name, folder = f"{__name__}.{layer}", _os.path.join(checkout, layer)
        init = _os.path.join(folder, "__init__.py")
        if name in _sys.modules or not _os.path.isfile(init):
            continue
        spec = _util.spec_from_file_location(name, init, submodule_search_locations=[folder])
        module = _util.module_from_spec(spec)
        _sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del _sys.modules[name]
            raise
        globals()[layer] = module


_bind_checkout_layers()

# The command and directory the launcher re-runs this script with, before
# the script can change directory (common/script.py).
from autopar.common import env as _env, script as _script  # noqa: E402
if _script._started is None:
    _script.note()

__all__ = ["get_runner", "shard", "num_workers", "analyze", "fit", "Config", "SimulatedDelay", "Report", "AutoparError", "SpecError",
           "UnsupportedGraphError", "LaunchError", "WorkerFailedError"]
__version__ = "0.1.0"


def _api_used() -> None:
    """An AutoparError nobody catches (a bad Config in the script, a
    checkpoint that cannot be saved) ends the script as `autopar: <message>`,
    exit status 2, as errors through get_runner do; AUTOPAR_DEBUG=1 keeps the
    traceback (runtime/console.py). The hook is installed when the program
    first uses the API, and at once in a process of a launched job (below)."""
    from autopar.runtime.console import install_excepthook
    install_excepthook()


if _env.current_role():
    # A process the launcher started anew (here, over ssh, through srun):
    # the job's process starts here, before the script can fail.
    _api_used()

# TensorFlow's C++ start-up and INFO/WARNING lines, and deprecation warnings
# repeated by every worker, off unless AUTOPAR_VERBOSE=1 (common/quiet.py):
# before the script imports TensorFlow, when it imports autopar first.
from autopar.common import quiet as _quiet  # noqa: E402
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
    from autopar.common.errors import AutoparError
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


# Where each public name is defined (the API's modules pull in TensorFlow,
# seconds to import: a process that only launches or parses specs, `autopar
# launch`, does not pay for it).
_ERRORS = ("AutoparError", "SpecError", "UnsupportedGraphError", "LaunchError",
           "WorkerFailedError")
_WITH_TENSORFLOW = ("get_runner", "shard", "num_workers", "analyze", "fit")


def __getattr__(name):
    import importlib
    if name == "optimizers":
        return importlib.import_module("autopar.optimizers")
    if name in _WITH_TENSORFLOW:
        _api_used()
        _check_tensorflow()
        from autopar import api
        return getattr(api, name)
    if name in ("Config", "SimulatedDelay"):
        module = "autopar.config"
    elif name in _ERRORS:
        module = "autopar.common.errors"
    elif name == "Report":
        module = "autopar.transforms.report"
    else:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    _api_used()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
