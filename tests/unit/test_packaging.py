"""The installed package: only `autopar` lands at the top of site-packages,
with the repository's transforms/, runtime/ and cpp_ops/ folders inside it;
the wheel's tags say what it holds; the native parts built on first use are
kept in the build cache by what they were built from."""
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from autopar.runtime import native

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
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
                   check=True, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("autopar-*.whl")
    # Compiled programs for this platform, no Python extension module and
    # nothing built against one TensorFlow: any Python 3, no ABI, this platform.
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name == f"autopar-0.1.0-py3-none-{platform}.whl", wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "site")
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"autopar"}
    for module in ("autopar/transforms/rewrite.py", "autopar/runtime/launcher.py",
                   "autopar/runtime/coordinator_pb2_grpc.py", "autopar/runtime/libautopar_bind.so",
                   "autopar/runtime/autopar_sumserver", "autopar/cpp_ops/herring_ops.cc",
                   "autopar/cpp_ops/herring_wire.h", "autopar/common/tensorflow_range.py"):
        assert module in names
    assert not [n for n in names if "libautopar_herring" in n]   # built on first use

    # Imported from the unpacked wheel, outside the repository: the autopar
    # subpackages resolve, the old top-level names do not exist, and the
    # sources of the parts built on first use are where native.py looks.
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), TF_CPP_MIN_LOG_LEVEL="3")
    probe = ("import autopar, autopar.runtime.launcher, autopar.runtime.coordinator\n"
             "from autopar.runtime import native\n"
             "assert autopar.__file__.startswith(%r), autopar.__file__\n"
             "assert native.HERRING_OPS_SOURCE.is_file(), native.HERRING_OPS_SOURCE\n"
             "autopar.runtime.coordinator._grpc_modules()\n"
             "import importlib.util\n"
             "print(importlib.util.find_spec('runtime'), importlib.util.find_spec('transforms'))\n"
             % str(tmp_path / "site"))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None None"


@pytest.mark.slow
def test_the_build_cache_compiles_once_per_source_and_flags(monkeypatch, tmp_path):
    """runtime/native.py builds a part on first use into the build cache,
    under what it was built from: a second use of the same sources and
    command compiles nothing, a changed source file or flag compiles again."""
    monkeypatch.setenv("AUTOPAR_BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "RUNTIME_DIR", tmp_path / "installed")   # nothing installed
    runs = []
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        runs.append(cmd[0])
        return real_run(cmd, *args, **kwargs)
    monkeypatch.setattr(native.subprocess, "run", counting_run)
    first = native.shim_path()
    again = native.shim_path()
    assert len(runs) == 1 and again == first and first.is_file()
    assert first.parent.parent == tmp_path / "cache"
    # An install's build copies it from there (a wheel, `make install`).
    installed = native.build_shim(tmp_path / "install")
    assert len(runs) == 1 and installed.read_bytes() == first.read_bytes()
    assert [p.name for p in (tmp_path / "install").iterdir()] == [native.SHIM_NAME]

    # a copy of cpp_ops/ with one header changed: compiled again, then cached
    sources = tmp_path / "cpp_ops"
    shutil.copytree(native.CPP_OPS, sources)
    (sources / "herring_wire.h").write_text((sources / "herring_wire.h").read_text() + "\n")
    monkeypatch.setattr(native, "CPP_OPS", sources)
    monkeypatch.setattr(native, "SHIM_SOURCE", sources / native.SHIM_SOURCE.name)
    assert native.shim_path() != first
    native.shim_path()
    assert len(runs) == 2
    monkeypatch.setenv("CC", "gcc")   # another command line
    native.shim_path()
    assert len(runs) == 3


def test_the_op_library_is_keyed_by_tensorflows_version_and_flags_not_its_folder():
    """The same TensorFlow release with the same flags in another virtualenv
    (another folder) reuses the build; another version or flag does not."""
    def build(folder, version="2.21.0", define="-D_GLIBCXX_USE_CXX11_ABI=1"):
        return native.TensorFlowBuild((f"-I{folder}/include", define, "-DEIGEN_MAX_ALIGN_BYTES=64"),
                                      (f"-L{folder}", "-l:libtensorflow_framework.so.2"), version)

    def key(tensorflow):
        cmd = native._herring_ops_command(tensorflow)(Path("out"))
        return native._cache_key(cmd, "lib.so", {str(native.CPP_OPS): "cpp_ops",
                                                 tensorflow.folder(): "<tensorflow>"},
                                 tensorflow.version)
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to name in the command")
    here = key(build("/a/lib/python3.11/site-packages/tensorflow"))
    assert key(build("/b/venv/lib/python3.11/site-packages/tensorflow")) == here
    assert key(build("/a/lib/python3.11/site-packages/tensorflow", version="2.21.1")) != here
    assert key(build("/a/lib/python3.11/site-packages/tensorflow",
                     define="-D_GLIBCXX_USE_CXX11_ABI=0")) != here


def test_supported_tensorflow_releases():
    from autopar.common import tensorflow_range as r
    assert r.unsupported("2.21.0") is None
    for version in ("2.20.0", "2.22.0rc1", "3.0.0", "nightly"):
        assert "autopar supports TensorFlow 2.21 and this is TensorFlow " + version \
            in r.unsupported(version)


def test_the_api_without_tensorflow_says_what_to_install(monkeypatch, caplog):
    """`pip install autopar` brings no TensorFlow: the API's first use says
    which extras do; a release outside the supported ones is a warning."""
    import autopar
    from autopar.common.errors import AutoparError
    monkeypatch.setattr(autopar, "_tensorflow_checked", False)
    monkeypatch.setitem(sys.modules, "tensorflow", None)     # import tensorflow fails
    with pytest.raises(AutoparError, match=r"autopar needs TensorFlow \(>=2.21,<2.22\), and none "
                                           r"is installed: pip install 'autopar\[cpu\]'"):
        autopar.get_runner
    monkeypatch.undo()
    import logging

    import tensorflow as tf
    monkeypatch.setattr(logging.getLogger("autopar"), "propagate", True)   # to caplog
    monkeypatch.setattr(autopar, "_tensorflow_checked", False)
    monkeypatch.setattr(tf, "__version__", "2.22.0")
    autopar._check_tensorflow()
    assert "this is TensorFlow 2.22.0" in caplog.text


def _in_checkout(code: str, **env) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter importing this checkout, outside a job."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("AUTOPAR_ROLE", "GRPC_ENABLE_FORK_SUPPORT")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**clean, "PYTHONPATH": str(REPO), **env}, timeout=120)


@pytest.mark.slow
def test_the_package_is_autopar_and_its_three_layers_only():
    """From a checkout, autopar.common, autopar.transforms and
    autopar.runtime are the checkout's folders; its other folders (bench,
    tests, setup.py) are no part of the package."""
    done = _in_checkout(
        "import importlib, autopar.common.roles, autopar.transforms.serial, autopar.runtime.spec\n"
        "for layer in ('common', 'transforms', 'runtime'):\n"
        "    print(importlib.import_module('autopar.' + layer).__path__[0])\n"
        "for name in ('bench', 'tests', 'setup', 'docs', 'examples'):\n"
        "    try:\n"
        "        importlib.import_module('autopar.' + name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    print('imports', name)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(REPO / layer) for layer in ("common", "transforms", "runtime")]


@pytest.mark.slow
def test_importing_autopar_leaves_the_process_alone_until_a_job_starts():
    """Importing any of autopar's modules installs no excepthook and sets no
    gRPC setting (bench/ and tools import common/ alone); the program's
    first use of the API installs the hook, gRPC's first import in autopar
    its fork setting; in a process a launcher started the hook is there at
    `import autopar`."""
    probe = ("import os, sys\n"
             "import autopar, autopar.common.roles, autopar.common.procs, autopar.transforms.options\n"
             "print(sys.excepthook is sys.__excepthook__, os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
             "autopar.Config\n"
             "import autopar.runtime.coordinator_client\n"
             "print(sys.excepthook is sys.__excepthook__, os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n")
    done = _in_checkout(probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None", "False", "0"]
    launched = _in_checkout("import sys, autopar.common.roles\nprint(sys.excepthook is sys.__excepthook__)",
                            AUTOPAR_ROLE="worker")
    assert launched.returncode == 0 and launched.stdout.split() == ["False"], launched.stderr
