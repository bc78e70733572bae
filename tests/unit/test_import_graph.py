"""transforms/ imports form no cycle: every module's autopar imports are at
its top level (none inside a function, where a cycle could hide), and the
graph of those imports, package __init__s included, is acyclic. Imports
under `if TYPE_CHECKING:` are annotations only and never run."""
import ast
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[2]
TRANSFORMS = REPO / "transforms"


def _module(path: Path) -> str:
    parts = list(path.relative_to(TRANSFORMS).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["autopar", "transforms", *parts])


def _is_module(dotted: str) -> bool:
    """Whether autopar.transforms.x.y names a module file (a generated one too)."""
    parts = dotted.split(".")
    if parts[:2] != ["autopar", "transforms"]:
        return False
    base = TRANSFORMS.joinpath(*parts[2:])
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(tree: ast.Module):
    """(top-level autopar imports, autopar imports anywhere else but under TYPE_CHECKING)."""
    top, nested = [], []

    def names(node):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autopar"):
            # `from package import module` imports that module (and the
            # package's __init__ on the way); `from module import name` the module
            return [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}")
                    else node.module for a in node.names]
        if isinstance(node, ast.Import):
            return [a.name for a in node.names if a.name.startswith("autopar")]
        return []

    def walk(node, at_top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            found = names(child)
            (top if at_top else nested).extend(found)
            walk(child, at_top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try)))
    walk(tree, True)
    return top, nested


def test_transforms_import_graph_has_no_cycle_and_no_lazy_import():
    modules = {_module(p): p for p in TRANSFORMS.rglob("*.py") if "_pb2" not in p.name}
    graph = nx.DiGraph()
    lazy = {}
    for name, path in modules.items():
        top, nested = _imports(ast.parse(path.read_text()))
        graph.add_node(name)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        for target in top:
            parts = target.split(".")
            for i in range(3, len(parts) + 1):
                candidate = ".".join(parts[:i])
                if candidate in modules and candidate != name:
                    graph.add_edge(name, candidate)
        # a generated module (fusion_layout_pb2) is imported where it is
        # needed, with an error saying how to build it: not part of the graph
        inner = [t for t in nested if t in modules]
        if inner:
            lazy[path.relative_to(REPO).as_posix()] = inner
    assert graph.number_of_edges() > 30   # the scan sees the imports that exist
    assert not lazy, f"autopar imports inside functions: {lazy}"
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles[:5]
