"""Fixtures of the unit tests that drive the mxdist CLI."""
from __future__ import annotations

import pytest

from mxdist.job import records


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private MXDIST_HOME (``tmp_path/home``) for the CLI and for the tests' own ``records.*``
    calls, a wide terminal, no SSH config of the user's."""
    path = tmp_path / "home"
    monkeypatch.setenv("MXDIST_HOME", str(path))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("MXDIST_SSH_CONFIG", raising=False)
    records.use_home(path)               # for the tests' own records.* calls (the CLI sets it per command)
    yield path
    records.use_home(None)
