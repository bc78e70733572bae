"""Synchronisation methods are self-contained (docs/adding-a-sync-method.md):
no method package (transforms/methods/<name>/) imports another, and no
library module outside a method's package imports it, except the registries
(transforms/methods/registry.py, which lists the methods, and
transforms/methods/process_registry.py, which lists the helper-process kinds
they declare). What several methods
share lives in a module of their own beside base.py, policy.py and the
registry. Every import counts: at the top, inside a function, or under
TYPE_CHECKING. Tests and benchmarks may import a method's modules to test
them."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
METHODS = REPO / "transforms" / "methods"
LIBRARY = ("autopar", "common", "transforms", "runtime")
PREFIX = "autopar.transforms.methods"
REGISTRY = METHODS / "registry.py"
REGISTRIES = (REGISTRY, METHODS / "process_registry.py")


def _method_packages() -> set[str]:
    return {p.name for p in METHODS.iterdir() if (p / "__init__.py").exists()}


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, dotted name) of every autopar import, `from package import
    module` naming the module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(line, name) for line, name in out if name.startswith("autopar.")]


def _package_of(dotted: str, packages: set[str]) -> str | None:
    """The method package a dotted import reaches into, if any."""
    parts = dotted.split(".")
    if parts[:3] != PREFIX.split(".") or len(parts) < 4:
        return None
    return parts[3] if parts[3] in packages else None


def violations() -> list[str]:
    packages = _method_packages()
    found = []
    for folder in LIBRARY:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "_pb2" in path.name or path in REGISTRIES:
                continue
            rel = path.relative_to(REPO)
            own = rel.parts[2] if rel.parts[:2] == ("transforms", "methods") and \
                len(rel.parts) > 3 else None
            for line, dotted in _imported(ast.parse(path.read_text())):
                target = _package_of(dotted, packages)
                if target is not None and target != own:
                    found.append(f"{rel.as_posix()}:{line} imports {dotted}")
    return found


def test_the_scan_sees_the_method_packages_and_the_registry_imports():
    packages = _method_packages()
    assert {"allreduce", "allgather", "ps", "herring"} <= packages
    registry = {_package_of(d, packages) for _, d in _imported(ast.parse(REGISTRY.read_text()))}
    assert {"allreduce", "allgather", "ps", "herring"} <= registry


def test_no_module_reaches_into_a_method_package_but_its_own_and_the_registry():
    found = violations()
    assert not found, "method internals imported from outside their package:\n" + "\n".join(found)
