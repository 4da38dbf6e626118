"""The install: cli/ becomes the package ``mxdist``, and every package directory is listed.

pyproject.toml maps ``mxdist`` to the ``cli/`` folder, which needs an explicit package list; a
package directory missing from that list would be left out of a wheel without any error.
"""
from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")   # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_directory_is_installed() -> None:
    mapping = _setuptools()["package-dir"]
    folders = {name: ROOT / folder for name, folder in mapping.items()}
    folders.setdefault("psnode", ROOT / "psnode")
    on_disk = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            parts = init.parent.relative_to(folder).parts
            on_disk.add(".".join((name, *parts)))
    assert sorted(_setuptools()["packages"]) == sorted(on_disk)


def test_the_launcher_installs_as_mxdist() -> None:
    import mxdist
    import mxdist.main

    assert _setuptools()["package-dir"] == {"mxdist": "cli"}
    assert Path(mxdist.__file__).resolve() == ROOT / "cli" / "__init__.py"   # this tree's, not another
    assert mxdist.main.app.info.name == "mxdist"
