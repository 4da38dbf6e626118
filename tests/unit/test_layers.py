"""Import rules read from the source (every import statement, those under TYPE_CHECKING and
inside functions included): psnode.protocol and psnode.math import nothing of psnode but
psnode.errors, psnode.files (atomic writes, standard library only) and themselves, and the modules of psnode.server (and of psnode.worker) import one
another without a circle.  Which of worker, server and scheduler may import which: the
import-linter contracts in pyproject.toml."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(package: str) -> dict[str, set[str]]:
    """psnode module -> the psnode modules (or packages) it imports, for every module of ``package``."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {m for m in found if m == "psnode" or m.startswith("psnode.")}
    return out


@pytest.mark.parametrize("package", ["psnode.protocol", "psnode.math"])
def test_bottom_layers_import_only_errors(package: str) -> None:
    allowed = ("psnode.errors", "psnode.files", package)
    wrong = {m: sorted(t for t in ts if not any(t == a or t.startswith(a + ".") for a in allowed))
             for m, ts in _imports(package).items()}
    assert {m: ts for m, ts in wrong.items() if ts} == {}


@pytest.mark.parametrize("package,core", [("psnode.server", "psnode.server.store"),
                                          ("psnode.worker", "psnode.worker.kvstore")])
def test_modules_of_a_package_have_no_import_circle(package: str, core: str) -> None:
    graph = {m: {t for t in ts if t.startswith(package + ".")} for m, ts in _imports(package).items()}
    graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(m):], m]))
        if m in done:
            return
        for t in sorted(graph[m]):
            visit(t, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
    assert core in graph and len(graph) >= 8


def test_no_two_classes_of_the_product_share_a_name() -> None:
    """A class name names one thing across psnode and the launcher (a reader who greps for it,
    or meets it in a traceback, finds one definition)."""
    where: dict[str, list[str]] = {}
    for package in ("psnode", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(path.relative_to(ROOT).as_posix())
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
