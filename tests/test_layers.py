"""The layers of pyproject.toml's [tool.importlinter] hold (the core imports no plugin, Spark job,
driver or app module; connectors are rooms of their own), the checker does catch a breach, and
the product's import graph has no cycle — counting imports inside functions, which
import-linter does not see (``TYPE_CHECKING`` imports excepted: they never run)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"
#: the product's packages (pyproject.toml's [tool.importlinter] root_packages)
PACKAGES = ("cdc", "cdc_app", "connectors", "sinks", "spark_apply", "views")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_every_layer_contract_is_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


def test_a_core_module_importing_a_connector_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, copy / name,
                        ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    status = copy / "cdc" / "status.py"
    status.write_text(status.read_text() + "\nfrom connectors.postgres import catalog  # noqa\n")
    result = subprocess.run([str(LINT), "--no-cache"], cwd=copy, capture_output=True, text=True,
                            timeout=300, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "cdc.status -> connectors.postgres.catalog" in result.stdout, result.stdout


# ---------------------------------------------------------------------------- import cycles

def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module ``module`` imports anywhere (functions included), but not under
    ``if TYPE_CHECKING:``; ``from a import b`` counts as ``a.b`` when that is a module."""
    found: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the product modules it imports (and the packages those run on the way)."""
    files = {_module_name(path, root): path for package in PACKAGES
             for path in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for name in _imported(tree, module, path.name == "__init__.py"):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):  # a.b.c runs a, a.b, then a.b.c
                prefix = ".".join(parts[:end])
                if prefix in files and prefix != module:
                    targets.add(prefix)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_import_graph_has_no_cycle_even_inside_functions() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    for name in PACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "cdc" / "a.py").write_text("from cdc import b\n")
    (tmp_path / "cdc" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cdc import a\n")
    assert cycles(import_graph(tmp_path)) == []  # a type-only import never runs
    (tmp_path / "cdc" / "b.py").write_text("def f():\n    from . import a\n")
    assert cycles(import_graph(tmp_path)) == [["cdc.a", "cdc.b"]]
