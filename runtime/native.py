"""Build steps run at install time (``make install`` and setup.py's build):
the coordinator's gRPC modules from ``runtime/coordinator.proto``, the bind
shim ``cpp_ops/bind_shim.c``, and the Herring transport: the TensorFlow op
library ``cpp_ops/herring_ops.cc`` (compiled against the installed
TensorFlow with its own flags) and the summation server
``cpp_ops/sum_server.cc`` (plain C++17). Standard library only, so setup.py
can load this file before anything is installed (TensorFlow is asked for its
flags in a subprocess).

    python -m autopar.runtime.native [--dest DIR]    build all into DIR (default runtime/)

The _pb2 modules are generated, not committed: generated code names the
grpcio-tools release that made it and refuses to run on an older grpcio, so
making it from the pinned grpcio-tools at install keeps it matched to the
pinned grpcio/protobuf, and the .proto stays the one source to edit.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent
REPO_ROOT = RUNTIME_DIR.parent
PROTO = RUNTIME_DIR / "coordinator.proto"
SHIM_SOURCE = REPO_ROOT / "cpp_ops" / "bind_shim.c"
SHIM_NAME = "libautopar_bind.so"
CPP_OPS = REPO_ROOT / "cpp_ops"
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


class BuildError(RuntimeError):
    """A build step could not run; the message says what to install."""


def build_protos(dest: Path = RUNTIME_DIR) -> None:
    """Generate runtime/coordinator_pb2{,_grpc}.py into ``dest`` and
    transforms/fusion_layout_pb2.py into ``dest``/../transforms with grpcio-tools."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise BuildError("generating the coordinator's gRPC code needs grpcio-tools "
                         "(pip install grpcio-tools==1.85.1, or `make install`)") from exc
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
        "building autopar's bind shim (cpp_ops/bind_shim.c) needs a C compiler: "
        "install one (Debian/Ubuntu: apt-get install gcc; Fedora/RHEL: dnf install gcc; "
        "Alpine: apk add build-base) or set CC")


def cxx_compiler() -> str:
    return _first_on_path(
        (os.environ.get("CXX"), "c++", "g++", "clang++"),
        "building autopar's Herring transport (cpp_ops/herring_ops.cc, "
        "cpp_ops/sum_server.cc) needs a C++17 compiler: install one (Debian/Ubuntu: "
        "apt-get install g++; Fedora/RHEL: dnf install gcc-c++; Alpine: apk add "
        "build-base) or set CXX")


def tensorflow_build_info(python: str = sys.executable) -> tuple[list[str], list[str], str]:
    """(compile flags, link flags, version) of the TensorFlow installed for
    ``python``. Asked in a subprocess: this module must not import
    TensorFlow (setup.py loads it before anything is installed, and the
    import is slow)."""
    code = ("import json, tensorflow as tf; print(json.dumps([tf.sysconfig.get_compile_flags(), "
            "tf.sysconfig.get_link_flags(), tf.__version__]))")
    proc = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if proc.returncode != 0:
        raise BuildError("building cpp_ops/herring_ops.cc needs TensorFlow installed for "
                         f"{python} (pip install tensorflow-cpu==2.21.0, or `make install`):\n"
                         + proc.stderr[-2000:])
    import json
    compile_flags, link_flags, version = json.loads(proc.stdout.strip().splitlines()[-1])
    return compile_flags, link_flags, version


def build_cache_dir() -> Path | None:
    """Where compiled outputs are kept by what they were built from
    ($AUTOPAR_BUILD_CACHE, else $XDG_CACHE_HOME/autopar/native, else
    ~/.cache/autopar/native; AUTOPAR_BUILD_CACHE=0: none). `make install`
    builds each output twice (the editable install's build, then `make
    native`) and a wheel build once more: with the cache the compiler runs
    once per change of a source, a flag or TensorFlow's version."""
    configured = os.environ.get("AUTOPAR_BUILD_CACHE")
    if configured == "0":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autopar" / "native"


def _cache_key(cmd: list[str], out: Path, *extra: str) -> str:
    """What an output is built from: the command (its temporary output name
    left out, cpp_ops/ named by its name: a copy of the sources elsewhere
    builds the same), every file of cpp_ops/ (the sources and the headers
    they include), and ``extra`` (TensorFlow's version)."""
    import hashlib
    digest = hashlib.sha256()
    tmp = cmd[cmd.index("-o") + 1]
    for part in [out.name, *(a.replace(str(CPP_OPS), "cpp_ops") for a in cmd if a != tmp),
                 *extra]:
        digest.update(part.encode() + b"\0")
    for path in sorted(CPP_OPS.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _compile(cmd: list[str], source: Path, out: Path, *key_extra: str) -> Path:
    """Runs ``cmd`` (which writes ``out``'s temporary name, its last-but-one
    argument pair) and moves the result into place atomically; or copies the
    output the same command built from the same files before, from the build
    cache (build_cache_dir). A cache that cannot be read or written is only
    not used."""
    tmp = Path(cmd[cmd.index("-o") + 1])
    cache = build_cache_dir()
    cached = cache / _cache_key(cmd, out, *key_extra) / out.name if cache else None
    if cached is not None and cached.is_file():
        try:
            shutil.copy2(cached, tmp)
            os.replace(tmp, out)
            return out
        except OSError:
            tmp.unlink(missing_ok=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"compiling {source} failed ({' '.join(cmd)}):\n{proc.stdout}")
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            staged = cached.with_name(f".{out.name}.{os.getpid()}.tmp")
            shutil.copy2(tmp, staged)
            os.replace(staged, cached)
        except OSError:
            pass
    os.replace(tmp, out)
    return out


def build_herring_ops(dest: Path = RUNTIME_DIR) -> Path:
    """Compile the push/pull kernel into ``dest``/libautopar_herring.so."""
    dest.mkdir(parents=True, exist_ok=True)
    cxx = cxx_compiler()
    compile_flags, link_flags, version = tensorflow_build_info()
    out = dest / HERRING_OPS_NAME
    tmp = dest / f".{HERRING_OPS_NAME}.{os.getpid()}.tmp"
    # TensorFlow's flags come after ours: its --std=c++17 and ABI define win.
    cmd = [cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-Wall", f"-I{CPP_OPS}", "-o", str(tmp),
           str(HERRING_OPS_SOURCE), *compile_flags, *link_flags, "-pthread"]
    return _compile(cmd, HERRING_OPS_SOURCE, out, f"tensorflow {version}")


def build_sumserver(dest: Path = RUNTIME_DIR) -> Path:
    """Compile the summation server into ``dest``/autopar_sumserver."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / SUMSERVER_NAME
    tmp = dest / f".{SUMSERVER_NAME}.{os.getpid()}.tmp"
    # -O3: the accumulate/average loops are vectorised for the baseline ISA,
    # so the binary runs on any x86-64.
    cmd = [cxx_compiler(), "-std=c++17", "-O3", "-Wall", "-pthread", f"-I{CPP_OPS}", "-o", str(tmp),
           str(SUMSERVER_SOURCE)]
    return _compile(cmd, SUMSERVER_SOURCE, out)


def build_shim(dest: Path = RUNTIME_DIR) -> Path:
    """Compile the bind shim into ``dest``/libautopar_bind.so; returns its path."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / SHIM_NAME
    tmp = dest / f".{SHIM_NAME}.{os.getpid()}.tmp"
    cmd = [compiler(), "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(tmp),
           str(SHIM_SOURCE), "-ldl"]
    return _compile(cmd, SHIM_SOURCE, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=RUNTIME_DIR)
    args = parser.parse_args(argv)
    try:
        build_protos(args.dest)
        build_shim(args.dest)
        build_sumserver(args.dest)
        build_herring_ops(args.dest)
    except BuildError as exc:
        print(f"autopar build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
