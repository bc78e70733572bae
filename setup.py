import importlib.util
import sys
from pathlib import Path

from setuptools import Distribution, find_packages, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load(relative: str):
    """A standard-library module of the source tree, loaded by path: nothing
    is installed yet."""
    spec = importlib.util.spec_from_file_location(f"_autopar_{Path(relative).stem}", HERE / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


native = _load("runtime/native.py")
TENSORFLOW = _load("common/tensorflow_range.py").SPECIFIER


class BuildWithNative(build_py):
    """Also generate the coordinator's gRPC modules (grpcio-tools, a build
    requirement in pyproject.toml) and compile the bind shim (C) and the
    summation server (C++17) with the system's compilers: neither depends on
    TensorFlow. The Herring op library is compiled on first use against the
    TensorFlow the process imports (runtime/native.py). A missing compiler
    does not stop the install: the part is built on first use, or refused
    then naming the package to install. An editable install builds them in
    the source tree."""

    def run(self):
        super().run()
        dest = HERE / "runtime" if getattr(self, "editable_mode", False) \
            else Path(self.build_lib) / "autopar" / "runtime"
        try:
            native.build_protos(dest)
        except native.BuildError as exc:
            raise SystemExit(f"autopar build: {exc}") from exc
        for build in (native.build_shim, native.build_sumserver):
            try:
                build(dest)
            except native.BuildError as exc:
                print(f"autopar build: warning: {exc}", file=sys.stderr)


class NativeDistribution(Distribution):
    """Installed as platform-specific (the shim and the summation server are
    compiled programs), so every file lands in one tree, as a package with
    extension modules does."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """The wheel holds the shim and the summation server, compiled for this
    platform but for no Python ABI: tagged py3-none-<platform>."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    name="autopar",
    version="0.1.0",
    description="Single-device TensorFlow training as synchronous data-parallel training",
    python_requires=">=3.11",
    # The repository keeps common/, transforms/, runtime/ and cpp_ops/ at its
    # top level; they are installed inside autopar, so only `autopar` lands in
    # site-packages (cpp_ops/'s sources: the native parts built on first use).
    packages=["autopar", "autopar.cpp_ops"] + [f"autopar.{p}" for p in find_packages(include=[
        "common", "common.*", "transforms", "transforms.*", "runtime", "runtime.*"])],
    package_dir={"autopar.common": "common", "autopar.transforms": "transforms",
                 "autopar.runtime": "runtime", "autopar.cpp_ops": "cpp_ops"},
    package_data={"autopar.runtime": ["coordinator.proto"], "autopar.transforms": ["fusion_layout.proto"],
                  "autopar.cpp_ops": ["*.c", "*.cc", "*.h"]},
    # Ranges, not pins: autopar lives in the user's environment. TensorFlow
    # comes from the user (any distribution providing the `tensorflow`
    # module, in TENSORFLOW's releases) or from an extra below. protobuf and
    # grpcio start at what the generated modules need (pyproject.toml's
    # grpcio-tools) and stay within what those TensorFlow releases accept.
    # The exact versions `make` and CI use: constraints.txt.
    install_requires=[
        "networkx>=3.0,<4",
        "PyYAML>=6.0,<7",
        "protobuf>=6.31.1,<8",
        "grpcio>=1.74.0,<2",
        "numpy>=1.26,<3",
        # Process titles (`autopar[job] worker 1/3 train.py` in ps and top).
        "setproctitle>=1.3,<2",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu{TENSORFLOW}"],
        "gpu": [f"tensorflow[and-cuda]{TENSORFLOW}"],
        # 2.21: the first release that starts without pkg_resources
        # (setuptools >= 81 has none).
        "tensorboard": ["tensorboard>=2.21,<3"],
        # examples/: scikit-learn's bundled data sets, docs/draw_timeline.py's plot.
        "examples": ["scikit-learn>=1.3", "matplotlib>=3.7", "tensorboard>=2.21,<3"],
        "test": ["pytest>=8", "pytest-timeout>=2.3",
                 # `make test` runs on two workers (conftest.py groups the files)
                 "pytest-xdist>=3.5", "scikit-learn>=1.3", "matplotlib>=3.7",
                 # tests read the chief's event files with TensorBoard's own reader
                 "tensorboard>=2.21,<3",
                 # `make native` regenerates the coordinator's modules
                 "grpcio-tools>=1.74.0",
                 # `make check` lints with it (pyproject.toml)
                 "ruff>=0.17,<0.18"],
    },
    entry_points={"console_scripts": ["autopar=autopar.cli:main"]},
    cmdclass={"build_py": BuildWithNative, "bdist_wheel": PlatformWheel},
    distclass=NativeDistribution,
)
