"""The native parts: the coordinator's gRPC modules (from
``runtime/coordinator.proto``), the bind shim ``cpp_ops/bind_shim.c``, and the
Herring transport: the summation server ``cpp_ops/sum_server.cc`` (plain
C++17) and the TensorFlow op library ``cpp_ops/herring_ops.cc``. Standard
library only, so setup.py can load this file before anything is installed
(TensorFlow is asked for its flags in a subprocess, or by the caller that
has it imported).

When each is built:

- the gRPC modules, the shim and the summation server at install (setup.py's
  build, `make install`), into the package's runtime/ folder; a part that
  could not be built then (no compiler) is built on first use into the
  build cache below, or refused then, naming the package to install;
- the Herring op library on first use, into the build cache, for the
  TensorFlow the process imports: it is compiled against that TensorFlow's
  headers and flags, so the wheel holds no binary tied to one TensorFlow,
  and the user's TensorFlow (any distribution, any supported version)
  gets its own build.

The build cache is ``$AUTOPAR_BUILD_CACHE``, else
``$XDG_CACHE_HOME/autopar/native``, else ``~/.cache/autopar/native``: one
folder per output and what it was built from (the compiler command with
TensorFlow's folder left out, every file of cpp_ops/, TensorFlow's
version), so a rebuild of the same sources copies nothing and compiles
nothing, and processes building the same output at once compile it once
(a lock). A cache that cannot be written is replaced by a folder of the
process's own.

    python -m autopar.runtime.native [--dest DIR]    build all: the modules, shim and
                                                     server into DIR (default runtime/),
                                                     the op library into the cache

The _pb2 modules are generated, not committed: generated code names the
grpcio-tools release that made it and refuses to run on an older grpcio or
protobuf; the build requirement (pyproject.toml) is the oldest release the
package supports, and the .proto stays the one source to edit.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent
# The repository's root in a checkout; the autopar package once installed
# (setup.py installs cpp_ops/ as autopar/cpp_ops, beside autopar/runtime).
REPO_ROOT = RUNTIME_DIR.parent
# The folder holding the autopar package: that checkout's root, or
# site-packages (the first entry of every launched child's PYTHONPATH).
PACKAGE_PARENT = REPO_ROOT.parent if (REPO_ROOT / "__init__.py").is_file() else REPO_ROOT
PROTO = RUNTIME_DIR / "coordinator.proto"
CPP_OPS = REPO_ROOT / "cpp_ops"
SHIM_SOURCE = CPP_OPS / "bind_shim.c"
SHIM_NAME = "libautopar_bind.so"
HERRING_OPS_SOURCE = CPP_OPS / "herring_ops.cc"
HERRING_OPS_NAME = "libautopar_herring.so"
SUMSERVER_SOURCE = CPP_OPS / "sum_server.cc"
SUMSERVER_NAME = "autopar_sumserver"
PROTO_MODULES = ("coordinator_pb2.py", "coordinator_pb2_grpc.py")
# Where the runtime package sits once installed (setup.py's package_dir).
PROTO_PACKAGE = "autopar/runtime"
# The Plan's fusion-buffer table (transforms.methods.herring.bfb), a message only (no service).
LAYOUT_PROTO = REPO_ROOT / "transforms" / "fusion_layout.proto"
LAYOUT_MODULE = "fusion_layout_pb2.py"
LAYOUT_PACKAGE = "autopar/transforms"
# What a job needs that the compiler may be missing for: the shim (every
# job) and, for herring, the summation server and the op library.
CC_PACKAGES = ("Debian/Ubuntu: apt-get install gcc; Fedora/RHEL: dnf install gcc; "
               "Alpine: apk add build-base")
CXX_PACKAGES = ("Debian/Ubuntu: apt-get install g++; Fedora/RHEL: dnf install gcc-c++; "
                "Alpine: apk add build-base")


class BuildError(RuntimeError):
    """A build step could not run; the message says what to install."""


def build_protos(dest: Path = RUNTIME_DIR) -> None:
    """Generate runtime/coordinator_pb2{,_grpc}.py into ``dest`` and
    transforms/fusion_layout_pb2.py into ``dest``/../transforms with grpcio-tools."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise BuildError("generating the coordinator's gRPC code needs grpcio-tools "
                         "(pip install grpcio-tools, or `make install`)") from exc
    import importlib.resources
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    # The package installs as autopar.runtime, so the .proto is compiled from
    # autopar/runtime/ in a scratch tree: the generated modules then import
    # each other as "from autopar.runtime import coordinator_pb2". Written
    # there first so a concurrent import never sees a half-written module.
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        (src / PROTO_PACKAGE).mkdir(parents=True)
        shutil.copy(PROTO, src / PROTO_PACKAGE / PROTO.name)
        out = Path(tmp) / "out"
        out.mkdir()
        code = protoc.main(["grpc_tools.protoc", f"-I{src}", f"-I{well_known}",
                            f"--python_out={out}", f"--grpc_python_out={out}",
                            f"{PROTO_PACKAGE}/{PROTO.name}"])
        if code != 0:
            raise BuildError(f"protoc failed on {PROTO} (status {code})")
        dest.mkdir(parents=True, exist_ok=True)
        for name in PROTO_MODULES:
            os.replace(shutil.copy(out / PROTO_PACKAGE / name, dest / f".{name}.tmp"), dest / name)
        # transforms/ sits next to runtime/ in the source tree and once installed
        (src / LAYOUT_PACKAGE).mkdir(parents=True)
        shutil.copy(LAYOUT_PROTO, src / LAYOUT_PACKAGE / LAYOUT_PROTO.name)
        code = protoc.main(["grpc_tools.protoc", f"-I{src}", f"--python_out={out}",
                            f"{LAYOUT_PACKAGE}/{LAYOUT_PROTO.name}"])
        if code != 0:
            raise BuildError(f"protoc failed on {LAYOUT_PROTO} (status {code})")
        layout_dest = dest.parent / "transforms"
        layout_dest.mkdir(parents=True, exist_ok=True)
        os.replace(shutil.copy(out / LAYOUT_PACKAGE / LAYOUT_MODULE,
                               layout_dest / f".{LAYOUT_MODULE}.tmp"), layout_dest / LAYOUT_MODULE)


def _first_on_path(candidates: tuple[str | None, ...], missing: str) -> str:
    """The first of `candidates` found on PATH; BuildError(`missing`) if none."""
    for name in candidates:
        if name and shutil.which(name):
            return name
    raise BuildError(missing)


def compiler() -> str:
    return _first_on_path(
        (os.environ.get("CC"), "cc", "gcc", "clang"),
        "building autopar's bind shim (cpp_ops/bind_shim.c), which every job's processes "
        f"load, needs a C compiler: install one ({CC_PACKAGES}) or set CC")


def cxx_compiler() -> str:
    return _first_on_path(
        (os.environ.get("CXX"), "c++", "g++", "clang++"),
        "building autopar's Herring transport (cpp_ops/herring_ops.cc, "
        "cpp_ops/sum_server.cc) needs a C++17 compiler: install one "
        f"({CXX_PACKAGES}) or set CXX; every run option but herring works without it")


@dataclass(frozen=True)
class TensorFlowBuild:
    """What an op library is compiled against: the flags and version of
    one TensorFlow (tf.sysconfig)."""
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    version: str

    @classmethod
    def of_imported(cls) -> TensorFlowBuild:
        """The TensorFlow this process has imported."""
        import tensorflow as tf
        return cls(tuple(tf.sysconfig.get_compile_flags()), tuple(tf.sysconfig.get_link_flags()),
                   tf.__version__)

    @classmethod
    def of_python(cls, python: str = sys.executable) -> TensorFlowBuild:
        """The TensorFlow installed for ``python``, asked in a subprocess (this
        module must not import TensorFlow: setup.py loads it, and the import
        is slow)."""
        code = ("import json, tensorflow as tf; print(json.dumps([tf.sysconfig.get_compile_flags(), "
                "tf.sysconfig.get_link_flags(), tf.__version__]))")
        proc = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if proc.returncode != 0:
            raise BuildError("building cpp_ops/herring_ops.cc needs TensorFlow installed for "
                             f"{python} (pip install autopar[cpu] or autopar[gpu]):\n"
                             + proc.stderr[-2000:])
        compile_flags, link_flags, version = json.loads(proc.stdout.strip().splitlines()[-1])
        return cls(tuple(compile_flags), tuple(link_flags), version)

    def folder(self) -> str:
        """TensorFlow's package folder (its headers' parent), left out of the
        cache key: the same TensorFlow in another virtualenv builds the same."""
        for flag in self.compile_flags:
            if flag.startswith("-I") and flag.rstrip("/").endswith("include"):
                return str(Path(flag[2:]).parent)
        return ""


def build_cache_dir() -> Path:
    """The per-user build cache (module docstring)."""
    configured = os.environ.get("AUTOPAR_BUILD_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar" / "native"


_own_cache: Path | None = None


def _writable_cache() -> Path:
    """build_cache_dir(), or a folder of this process's own when that
    cannot be written (each process then compiles for itself)."""
    global _own_cache
    cache = build_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if os.access(cache, os.W_OK | os.X_OK):
            return cache
    except OSError:
        pass
    if _own_cache is None:
        _own_cache = Path(tempfile.mkdtemp(prefix="autopar-native-"))
    return _own_cache


def _cache_key(cmd: list[str], name: str, replaced: dict[str, str], *extra: str) -> str:
    """What an output is built from: the command with ``replaced``'s paths
    named by their role (cpp_ops/ and TensorFlow's folder: the same sources
    and the same TensorFlow elsewhere build the same), every file of
    cpp_ops/ (the sources and the headers they include), and ``extra``."""
    digest = hashlib.sha256()
    parts = [name]
    for arg in cmd:
        for path, role in replaced.items():
            if path:
                arg = arg.replace(path, role)
        parts.append(arg)
    for part in [*parts, *extra]:
        digest.update(part.encode() + b"\0")
    for path in sorted(CPP_OPS.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Held while one process compiles into ``folder``: the others wait,
    then find the output."""
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _compile(command: Callable[[Path], list[str]], source: Path, out: Path) -> Path:
    """Runs ``command(tmp)`` (which writes ``tmp``) and moves the result to
    ``out`` atomically."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = command(tmp)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"compiling {source} failed ({' '.join(cmd)}):\n{proc.stdout}")
    os.replace(tmp, out)
    return out


def _cached(name: str, source: Path, command: Callable[[Path], list[str]],
            replaced: dict[str, str] | None = None, *extra: str) -> Path:
    """``name`` built by ``command`` from ``source``, from the build cache
    (built into it first if this is its first use)."""
    replaced = {str(CPP_OPS): "cpp_ops", **(replaced or {})}
    key = _cache_key(command(Path(name)), name, replaced, *extra)
    folder = _writable_cache() / key
    out = folder / name
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        if not out.is_file():
            _compile(command, source, out)
    return out


def _shim_command(tmp: Path) -> list[str]:
    return [compiler(), "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(tmp),
            str(SHIM_SOURCE), "-ldl"]


def _sumserver_command(tmp: Path) -> list[str]:
    # -O3: the accumulate/average loops are vectorised for the baseline ISA,
    # so the binary runs on any x86-64.
    return [cxx_compiler(), "-std=c++17", "-O3", "-Wall", "-pthread", f"-I{CPP_OPS}", "-o",
            str(tmp), str(SUMSERVER_SOURCE)]


def _herring_ops_command(tensorflow: TensorFlowBuild) -> Callable[[Path], list[str]]:
    # TensorFlow's flags come after ours: its --std=c++17 and ABI define win.
    return lambda tmp: [cxx_compiler(), "-std=c++17", "-shared", "-fPIC", "-O2", "-Wall",
                        f"-I{CPP_OPS}", "-o", str(tmp), str(HERRING_OPS_SOURCE),
                        *tensorflow.compile_flags, *tensorflow.link_flags, "-pthread"]


def build_shim(dest: Path = RUNTIME_DIR) -> Path:
    """The bind shim into ``dest``/libautopar_bind.so (install time), through
    the build cache: `make install` builds it twice (the editable install's
    build, then `make native`), a wheel build once more."""
    return _copy_into(_cached(SHIM_NAME, SHIM_SOURCE, _shim_command), dest)


def build_sumserver(dest: Path = RUNTIME_DIR) -> Path:
    """The summation server into ``dest``/autopar_sumserver (install time),
    through the build cache."""
    return _copy_into(_cached(SUMSERVER_NAME, SUMSERVER_SOURCE, _sumserver_command), dest)


def _copy_into(built: Path, dest: Path) -> Path:
    """``built`` copied into ``dest`` under its name, atomically."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{built.name}.{os.getpid()}.tmp"
    shutil.copy2(built, tmp)
    return Path(os.replace(tmp, dest / built.name) or dest / built.name)


def shim_path() -> Path:
    """The bind shim: the one built at install, else from the build cache."""
    installed = RUNTIME_DIR / SHIM_NAME
    return installed if installed.is_file() else _cached(SHIM_NAME, SHIM_SOURCE, _shim_command)


def sumserver_path() -> Path:
    """The summation server: the one built at install, else from the build cache."""
    installed = RUNTIME_DIR / SUMSERVER_NAME
    return installed if installed.is_file() else _cached(SUMSERVER_NAME, SUMSERVER_SOURCE,
                                                          _sumserver_command)


def herring_ops_path(tensorflow: TensorFlowBuild | None = None) -> Path:
    """The Herring op library built for ``tensorflow`` (default: the one
    this process's interpreter has installed), from the build cache."""
    tensorflow = tensorflow or TensorFlowBuild.of_python()
    return _cached(HERRING_OPS_NAME, HERRING_OPS_SOURCE, _herring_ops_command(tensorflow),
                   {tensorflow.folder(): "<tensorflow>"}, f"tensorflow {tensorflow.version}")


def program_path(name: str) -> Path:
    """A native program a process kind runs, by its name (the
    ``{native:NAME}`` of ProcessKind.command): built at install, else from
    the build cache. KeyError for a name no build rule here makes."""
    return _PROGRAMS[name][0]()


def program_unavailable(name: str) -> str | None:
    """Why the native program ``name`` cannot run here (not built at install
    and no compiler to build it), or None."""
    if (RUNTIME_DIR / name).is_file():
        return None
    try:
        _PROGRAMS[name][1]()
    except BuildError as exc:
        return str(exc)
    return None


def client_library_path(name: str, tensorflow: TensorFlowBuild | None = None) -> Path:
    """The op library a process kind's clients load, by its name
    (ProcessKind.client_library), built for ``tensorflow``. KeyError for a
    name no build rule here makes."""
    return {HERRING_OPS_NAME: herring_ops_path}[name](tensorflow)


# The native programs of helper processes: how each is found or built, and
# the compiler building it needs.
_PROGRAMS: dict[str, tuple[Callable[[], Path], Callable[[], str]]] = {
    SUMSERVER_NAME: (sumserver_path, cxx_compiler),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=RUNTIME_DIR)
    args = parser.parse_args(argv)
    try:
        build_protos(args.dest)
        build_shim(args.dest)
        build_sumserver(args.dest)
        print(f"autopar build: {herring_ops_path()}")
    except BuildError as exc:
        print(f"autopar build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
