"""The worker side's import rules, read from the source (every import statement: top level, in
functions, under TYPE_CHECKING): no import circle inside psnode/worker, and no import of
psnode.server or psnode.scheduler."""
from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "psnode" / "worker"


def _imports(path: Path) -> set[str]:
    """The psnode modules ``path`` imports (``from psnode.worker import x`` names module x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("psnode"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("psnode"):
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in WORKER.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for m in mods:
        deps = {n.split(".")[2] for n in _imports(WORKER / f"{m}.py") if n.startswith("psnode.worker.")}
        graph[m] = (deps & mods) - {m}
    return graph


def test_worker_modules_import_no_circle() -> None:
    graph = _graph()
    assert {"kvstore", "datapath", "engine", "ioloop", "samehost", "state"} <= graph.keys()
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, f"import circle: {' -> '.join([*path[path.index(m):], m])}"
        if m in done:
            return
        for d in sorted(graph[m]):
            visit(d, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_worker_never_imports_server_or_scheduler() -> None:
    bad = {p.name: sorted(n for n in _imports(p) if n.startswith(("psnode.server", "psnode.scheduler")))
           for p in WORKER.glob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}
