"""A user's environment, made fresh once per session: a virtualenv that has
TensorFlow already, from the distribution `make` does not use (`tensorflow`
where constraints.txt pins `tensorflow-cpu`, the same release), into which
autopar is then pip-installed from a copy of the sources, as a user would
(`pip install <checkout>[examples]`, build isolation and all). Nothing of the
checkout is on its path: scripts run from a folder outside it.

Minutes (the TensorFlow wheel alone is 570 MB, from pip's cache after the
first run), so these tests run in `make test-install`, not in `make test`
(conftest.py at the root leaves this folder out unless it is named)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The user's TensorFlow: the other distribution of the release make pins.
TENSORFLOW_CPU_PIN = re.search(r"^tensorflow-cpu==(\S+)$", (REPO / "constraints.txt").read_text(),
                               re.M).group(1)
USER_TENSORFLOW = f"tensorflow=={TENSORFLOW_CPU_PIN}"
PIP_TIMEOUT_S = 1200


@dataclass
class UserEnv:
    root: Path
    python: str
    bin: Path
    before: dict[str, str]    # pip list before autopar: name -> version
    after: dict[str, str]     # and after
    work: Path                # a folder outside the checkout
    env: dict[str, str]       # the environment scripts run with

    def run(self, *argv: str, timeout: float = 600, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), cwd=cwd or self.work, env=self.env, text=True,
                              capture_output=True, timeout=timeout)
        assert proc.returncode == 0, (f"{' '.join(argv)} exited {proc.returncode}\n"
                                      f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
        return proc


def _pip_list(python: str, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "list", "--format=json"], env=env, text=True,
                         capture_output=True, check=True, timeout=120).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


@pytest.fixture(scope="session")
def user_env(tmp_path_factory) -> UserEnv:
    root = tmp_path_factory.mktemp("user")
    venv.create(root / "venv", with_pip=True)
    python = str(root / "venv" / "bin" / "python")
    # Only what a user's shell would have: no PYTHONPATH into the checkout,
    # and a build cache of its own, so the op library is built for this
    # TensorFlow here (runtime/native.py).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{root / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               AUTOPAR_BUILD_CACHE=str(root / "build-cache"), TF_CPP_MIN_LOG_LEVEL="2")
    pip = [python, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, USER_TENSORFLOW], env=env, check=True, timeout=PIP_TIMEOUT_S)
    before = _pip_list(python, env)
    # A copy without the checkout's build products: what `pip install .` of a
    # fresh clone builds.
    src = root / "autopar-src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", "results", "*.so", "*_pb2*.py",
        "autopar_sumserver"))
    subprocess.run([*pip, f"{src}[examples]"], env=env, check=True, timeout=PIP_TIMEOUT_S)
    after = _pip_list(python, env)
    work = root / "work"
    work.mkdir()
    return UserEnv(root, python, root / "venv" / "bin", before, after, work, env)
