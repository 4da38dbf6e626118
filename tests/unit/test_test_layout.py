"""The test tree's own layout: shared helpers live in ``tests.support``, which every tier imports.

Read from the source with ``ast`` (nothing is imported): no module under tests/ imports a test
module (``test_*``) or another tier's helper; a conftest may re-export another tier's fixtures
(``from tests.ssh.conftest import ssh_cluster``); and nothing under tests/ imports ``benchmarks``
but the tests whose subject is benchmark code itself (:data:`BENCHMARK_TESTS`).
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: Tests of the benchmarks themselves: the smoke runs of benchmark scripts (by path) and the unit
#: tests of the benchmarks' pure functions.  They may import ``benchmarks``; nothing else may.
BENCHMARK_TESTS = {
    "cluster/test_benchmark_smoke.py",
    "cluster/test_control_simulation.py",
    "faults/test_netbench.py",
    "faults/test_slow_links.py",
    "unit/test_bench_chart.py",
    "unit/test_bench_report.py",
    "unit/test_bench_sim_chart.py",
    "unit/test_bench_round_profile.py",
    "unit/test_bench_stragglers.py",
    "unit/test_bench_stream.py",
}


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> list[str]:
    parts = ["tests", *path.relative_to(TESTS).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path)[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            # ``from tests.support import cli`` imports the module tests.support.cli
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _where(path: Path, line: int, name: str) -> str:
    return f"{path.relative_to(TESTS.parent)}:{line}: {name}"


def test_the_layout_check_sees_imports() -> None:
    """The check reads this repository's tests (not an empty tree) and resolves their imports."""
    seen = {name for path in _modules() for _, name in _imports(path)}
    assert "tests.support.cluster.run_job" in seen and "tests.support.cli.run_cli" in seen
    assert (TESTS / "support" / "__init__.py").exists()


def test_no_module_imports_a_test_module_or_another_tiers_helper() -> None:
    bad = []
    for path in _modules():
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "tests":
                continue
            if parts[:2] == ["tests", "support"] and not any(p.startswith("test_") for p in parts):
                continue
            if path.name == "conftest.py" and len(parts) >= 3 and parts[2] == "conftest":
                continue   # a conftest re-exporting another tier's fixtures
            bad.append(_where(path, line, name))
    assert not bad, "import shared helpers from tests.support (move them there): " + "; ".join(bad)


def test_nothing_under_tests_imports_benchmarks_but_the_benchmarks_own_tests() -> None:
    bad = [_where(path, line, name) for path in _modules() for line, name in _imports(path)
           if name.split(".")[0] == "benchmarks" and path.relative_to(TESTS).as_posix() not in BENCHMARK_TESTS]
    assert not bad, "tests import benchmarks (move what they need into tests.support): " + "; ".join(bad)
    listed = [name for name in BENCHMARK_TESTS if not (TESTS / name).exists()]
    assert not listed, f"BENCHMARK_TESTS names files that are gone: {listed}"
