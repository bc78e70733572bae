"""The installed package: only `autopar` lands at the top of site-packages,
with the repository's transforms/ and runtime/ folders inside it."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# The build compiles the Herring op library against TensorFlow's headers:
# minutes on a loaded machine.
@pytest.mark.timeout(900)
def test_wheel_installs_only_the_autopar_namespace(tmp_path):
    # The same build `pip install .` runs (setup.py, including the generated
    # coordinator modules), without fetching build requirements again; from a
    # copy of the sources, so no build/ directory is left in the repository.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", "results", "*.so", "*_pb2*.py",
        "autopar_sumserver"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, text=True, timeout=800, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("autopar-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "site")
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"autopar"}
    for module in ("autopar/transforms/rewrite.py", "autopar/runtime/launcher.py",
                   "autopar/runtime/coordinator_pb2_grpc.py", "autopar/runtime/libautopar_bind.so",
                   "autopar/runtime/libautopar_herring.so", "autopar/runtime/autopar_sumserver"):
        assert module in names

    # Imported from the unpacked wheel, outside the repository: the autopar
    # subpackages resolve, the old top-level names do not exist.
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), TF_CPP_MIN_LOG_LEVEL="3")
    probe = ("import autopar, autopar.runtime.launcher, autopar.runtime.coordinator\n"
             "assert autopar.__file__.startswith(%r), autopar.__file__\n"
             "autopar.runtime.coordinator._grpc_modules()\n"
             "import importlib.util\n"
             "print(importlib.util.find_spec('runtime'), importlib.util.find_spec('transforms'))\n"
             % str(tmp_path / "site"))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None None"
