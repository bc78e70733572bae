"""Puts the repository root on sys.path so tests import the in-tree packages
(autopar, transforms, runtime, tests.models) whether or not it is installed.

TF_USE_LEGACY_KERAS=1, for this process and every process a test starts:
`import tensorflow` otherwise imports Keras 3 eagerly (and, through Keras,
scikit-learn when it is installed), about 2.5 s of CPU per process, and the
suite starts a few hundred TensorFlow processes on two cores. Nothing under
test uses Keras; with the legacy switch on and tf_keras not installed,
TensorFlow skips the import. Only when tf_keras is absent, since otherwise the
switch would load tf_keras instead."""
import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if importlib.util.find_spec("tf_keras") is None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# Before any test module imports grpc: gRPC's fork support off, which grpc
# reads at its first import (runtime/rpc.py; the tests fork job processes).
import autopar.runtime.rpc  # noqa: E402,F401


_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests")
_INSTALL_TESTS = os.path.join(_TESTS, "install")
# Folders whose every test starts jobs (or a virtualenv): pytest.ini's `slow`.
_SLOW_FOLDERS = ("integration", "cluster", "install")


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        relative = os.path.relpath(str(item.path), _TESTS).split(os.sep)
        if relative[0] in _SLOW_FOLDERS:
            item.add_marker(slow)


def pytest_ignore_collect(collection_path, config):
    """tests/install/ (fresh virtualenvs, minutes: `make test-install`) is
    collected only when named on the command line, not by `pytest tests`."""
    path = str(collection_path)
    if path != _INSTALL_TESTS and not path.startswith(_INSTALL_TESTS + os.sep):
        return None
    asked = [os.path.abspath(str(a).split("::")[0]) for a in config.args]
    return not any(a == _INSTALL_TESTS or a.startswith(_INSTALL_TESTS + os.sep) for a in asked)
