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


# `make test` runs the suite on two pytest-xdist workers (-n 2). A file's
# tests stay together on one worker (its module fixtures, such as the
# one-device reference runs, are made once). The files below share something
# of the machine's beyond their own processes and loopback ports (network
# namespaces named from the test process's pid with addresses derived from
# it, one emulated cluster per prefix, a Slurm allocation, sshd, mpirun, tc
# and nftables): they run one after another on one worker.
_MACHINE_WIDE = frozenset({
    "cluster/test_emulated_cluster.py", "integration/test_coordinator.py",
    "integration/test_ipv6.py", "integration/test_job_isolation.py",
    "integration/test_mpi.py", "integration/test_openssh.py",
    "integration/test_remote_hosts.py", "integration/test_slurm.py",
    "integration/test_tcp_windows.py", "unit/test_job_isolation.py", "unit/test_slurm.py"})


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        relative = os.path.relpath(str(item.path), _TESTS).split(os.sep)
        if relative[0] in _SLOW_FOLDERS:
            item.add_marker(slow)


@pytest.fixture(autouse=True)
def _autopar_logger_as_it_was():
    """The "autopar" logger's handlers, level and propagation put back after
    each test: get_runner gives it a stdout handler in its process, and a
    test calling it in-process would otherwise change what later tests of
    the same worker capture."""
    import logging
    logger = logging.getLogger("autopar")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, a scope being a test's file or, for the
    files above, the machine."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrMachine(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "machine" if path.removeprefix("tests/") in _MACHINE_WIDE else path

        def _assign_work_unit(self, node) -> None:
            # The files that start jobs first, the most tests first; the unit
            # files' many short tests last, filling whichever worker is done
            # first (in xdist's order, by count alone, a job file of a few
            # minute-long tests could start last on one worker).
            if not self.ordered:
                def starts_jobs(scope: str) -> bool:
                    return scope == "machine" or scope.split("/")[1] in _SLOW_FOLDERS
                queue = sorted(self.workqueue.items(),
                               key=lambda item: (not starts_jobs(item[0]), -len(item[1])))
                self.workqueue.clear()
                self.workqueue.update(queue)
                self.ordered = True
            super()._assign_work_unit(node)

    return FileOrMachine(config, log)


def pytest_ignore_collect(collection_path, config):
    """tests/install/ (fresh virtualenvs, minutes: `make test-install`) is
    collected only when named on the command line, not by `pytest tests`."""
    path = str(collection_path)
    if path != _INSTALL_TESTS and not path.startswith(_INSTALL_TESTS + os.sep):
        return None
    asked = [os.path.abspath(str(a).split("::")[0]) for a in config.args]
    return not any(a == _INSTALL_TESTS or a.startswith(_INSTALL_TESTS + os.sep) for a in asked)
