import importlib.util
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _native():
    """runtime/native.py, loaded by path: nothing is installed yet."""
    spec = importlib.util.spec_from_file_location("_autopar_native", HERE / "runtime" / "native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithNative(build_py):
    """Also generate the coordinator's gRPC modules (grpcio-tools, a build
    requirement in pyproject.toml), compile the bind shim (the system C
    compiler) and the Herring transport (C++: the op library against the
    installed TensorFlow, and the summation server). An editable install builds them in the source tree."""

    def run(self):
        super().run()
        native = _native()
        dest = HERE / "runtime" if getattr(self, "editable_mode", False) \
            else Path(self.build_lib) / "autopar" / "runtime"
        try:
            native.build_protos(dest)
            native.build_shim(dest)
            native.build_sumserver(dest)
            native.build_herring_ops(dest)
        except native.BuildError as exc:
            raise SystemExit(f"autopar build: {exc}") from exc


setup(
    name="autopar",
    version="0.1.0",
    description="Single-device TensorFlow training as synchronous data-parallel training",
    python_requires=">=3.11",
    # The repository keeps common/, transforms/ and runtime/ at its top level;
    # they are installed inside autopar, so only `autopar` lands in site-packages.
    packages=["autopar"] + [f"autopar.{p}" for p in find_packages(include=[
        "common", "common.*", "transforms", "transforms.*", "runtime", "runtime.*"])],
    package_dir={"autopar.common": "common", "autopar.transforms": "transforms",
                 "autopar.runtime": "runtime"},
    package_data={"autopar.runtime": ["coordinator.proto"], "autopar.transforms": ["fusion_layout.proto"]},
    install_requires=[
        "tensorflow-cpu==2.21.0",
        "networkx==3.6.1",
        "PyYAML==6.0.3",
        "protobuf==7.36.2",
        "grpcio==1.85.1",
        # The release of grpcio's own version; its generated code requires
        # grpcio >= its version and runs on protobuf 7.36.
        "grpcio-tools==1.85.1",
        "numpy==2.4.6",
        # Process titles (`autopar[job] worker 1/3 train.py` in ps and top).
        "setproctitle==1.3.7",
    ],
    extras_require={
        "test": ["pytest==9.2.0", "pytest-timeout==2.4.0", "scikit-learn==1.9.1", "matplotlib==3.11.2",
                 # tests read the chief's event files with TensorBoard's own reader
                 "tensorboard==2.20.0"],
    },
    entry_points={"console_scripts": ["autopar=autopar.cli:main"]},
    cmdclass={"build_py": BuildWithNative},
)
