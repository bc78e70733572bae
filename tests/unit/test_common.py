"""common/: the leaf every layer (and the benchmark harness) shares."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.common import procs
from tests.integration.cluster import survivors

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_common_imports_no_other_layer():
    """A leaf: importing every common module pulls in neither TensorFlow nor
    a module of the transforms, runtime or API layers (so bench and
    launch-only processes can use it cheaply; in a checkout the layers'
    packages are bound, empty, when autopar is imported)."""
    probe = ("import sys\n"
             "import autopar.common.env, autopar.common.errors, autopar.common.procs, "
             "autopar.common.roles, autopar.common.quiet\n"
             "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow' or "
             "m.startswith(('autopar.runtime.', 'autopar.transforms.', 'autopar.api')))\n"
             "print(bad)\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_transforms_take_only_errors_and_roles_from_common():
    """transforms/ (method packages included) are pure graph functions: of
    common/ they use the errors, the job names, the address predicates and
    the option checks (transforms/options.py),
    never the environment contract or process handling. Only a method's
    declaration of a helper-process kind (transforms/methods/process_kind.py)
    names variables of the environment contract (common/env.py): those its
    processes publish, which the launcher sets; none reads the environment."""
    imported = {}
    declarations = set()
    for path in sorted((REPO / "transforms").rglob("*.py")):
        text = path.read_text()
        for module in re.findall(r"autopar\.common\.(\w+)", text) + re.findall(
                r"from autopar\.common import ([\w, ]+)", text):
            imported.setdefault(path.name, set()).update(m.strip() for m in module.split(","))
        if "ProcessKind(" in text and "class ProcessKind" not in text:
            declarations.add(path.name)
        assert not re.search(r"\bos\.environ\b|\bgetenv\b|\bsubprocess\b", text), path.name
    assert imported   # the scan sees the imports that exist
    assert "sumserver.py" in declarations   # the scan sees the declarations
    assert set().union(*imported.values()) - {"env"} <= {"errors", "roles", "addresses", "text",
                                                         "checks"}, imported
    assert {name for name, modules in imported.items() if "env" in modules} <= declarations


class _Polled:
    """A process known only by pid and poll(), like the benchmark harness's
    processes started by a fork server (no wait())."""

    def __init__(self, popen: subprocess.Popen):
        self.pid = popen.pid
        self.poll = popen.poll


@pytest.mark.slow
def test_stop_processes_kills_a_group_that_ignores_sigterm():
    # The shell and the sleep it starts both ignore SIGTERM (an ignored signal
    # stays ignored across exec): only the escalation to SIGKILL, sent to the
    # whole group, ends both.
    popen = procs.start_process(["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"], os.environ)
    try:
        grandchild = int(popen.stdout.readline())
        procs.stop_processes([_Polled(popen)], grace_seconds=0.5)
        assert popen.poll() == -9
        # The group's SIGKILL reached the grandchild too; on a loaded machine
        # it may take a moment to finish dying after the shell was reaped.
        assert survivors([grandchild], timeout=10) == []
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        popen.stdout.close()


@pytest.mark.slow
def test_stop_processes_without_grace_kills_without_a_warning(caplog):
    # A job refused at its start stops its still-importing fork server this
    # way: the kill is intended, and a warning about it came before the
    # refusal's reason in the user's terminal.
    popen = procs.start_process(["sh", "-c", "trap '' TERM; echo up; sleep 60"], os.environ)
    try:
        assert popen.stdout.readline().strip() == b"up"
        with caplog.at_level("DEBUG", logger=procs.logger.name):
            procs.stop_processes([_Polled(popen)], grace_seconds=0.0)
        assert popen.poll() == -9
        assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        popen.stdout.close()


@pytest.mark.parametrize("argv,expected", [
    (["python3", "train.py", "--spec", "s.yaml"], ["/start/train.py", "--spec", "s.yaml"]),
    (["python3", "-u", "-X", "dev", "sub/train.py", "-u"], ["-u", "-X", "dev",
                                                           "/start/sub/train.py", "-u"]),
    (["python3", "/abs/train.py"], ["/abs/train.py"]),
    (["python3", "-m", "pkg.train", "x.py"], ["-m", "pkg.train", "x.py"]),
    (["python3", "-c", "import train"], ["-c", "import train"]),
])
def test_the_script_is_rerun_as_it_was_started(argv, expected, monkeypatch):
    """The launcher's command for the workers: this interpreter, its
    options, the script's path resolved where it started (a script that
    changes directory before get_runner is re-run all the same)."""
    from autopar.common import script
    monkeypatch.setattr(script, "_started", None)
    script.note(argv, "/start")
    assert script.command() == ([sys.executable, *expected], "/start")


def test_no_layer_below_the_api_imports_it():
    """Layers import downwards only: no module of common/, transforms/ or
    runtime/ imports autopar's API modules (autopar/*.py), only
    autopar.common, autopar.transforms and autopar.runtime."""
    upward = re.compile(r"^\s*(?:import autopar(?!\.(?:common|transforms|runtime)\b)"
                        r"|from autopar(?!\.(?:common|transforms|runtime)\b)[\w.]* import)",
                        re.MULTILINE)
    found = {str(path.relative_to(REPO)): upward.findall(path.read_text())
             for layer in ("common", "transforms", "runtime")
             for path in sorted((REPO / layer).rglob("*.py"))}
    assert len(found) > 90   # the scan reads the layers' modules
    assert {path: lines for path, lines in found.items() if lines} == {}
