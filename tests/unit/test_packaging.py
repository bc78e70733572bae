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


def test_the_build_cache_compiles_once_per_source_and_flags(monkeypatch, tmp_path):
    """runtime/native.py keeps each compiled output under what it was built
    from: a second build of the same sources with the same command copies
    it (no compiler run), the same bytes; a changed source file or flag is
    compiled again."""
    from autopar.runtime import native
    monkeypatch.setenv("AUTOPAR_BUILD_CACHE", str(tmp_path / "cache"))
    runs = []
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        runs.append(cmd[0])
        return real_run(cmd, *args, **kwargs)
    monkeypatch.setattr(native.subprocess, "run", counting_run)
    first = native.build_shim(tmp_path / "a")
    again = native.build_shim(tmp_path / "b")
    assert len(runs) == 1 and again.read_bytes() == first.read_bytes()
    assert [p.name for p in (tmp_path / "a").iterdir()] == [native.SHIM_NAME]

    # a copy of cpp_ops/ with one header changed: compiled again, then cached
    sources = tmp_path / "cpp_ops"
    shutil.copytree(native.CPP_OPS, sources)
    (sources / "herring_wire.h").write_text((sources / "herring_wire.h").read_text() + "\n")
    monkeypatch.setattr(native, "CPP_OPS", sources)
    monkeypatch.setattr(native, "SHIM_SOURCE", sources / native.SHIM_SOURCE.name)
    native.build_shim(tmp_path / "c")
    native.build_shim(tmp_path / "d")
    assert len(runs) == 2
    monkeypatch.setenv("CC", "gcc")   # another command line
    native.build_shim(tmp_path / "e")
    assert len(runs) == 3
    monkeypatch.setenv("AUTOPAR_BUILD_CACHE", "0")   # no cache
    native.build_shim(tmp_path / "f")
    native.build_shim(tmp_path / "g")
    assert len(runs) == 5
