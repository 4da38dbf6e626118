"""Real Slurm clusters for the slurm tests (see tests/support/slurm.py).

Two session fixtures, each started once (about 1-2 s) and stopped at the end (the temp dir
under /tmp removed):

* ``slurm3``: three emulated nodes 127.0.0.2, .3, .4 (2 CPUs each);
* ``slurm1``: one node ``localhost`` with NodeAddr 127.0.0.1 (its address comes from
  ``scontrol show node``, not from its name).

Without the Slurm or munge binaries the tests skip, except under CI (env CI set) where they
fail: CI installs slurm-wlm and munge (.ci/run does).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.support.slurm import SlurmCluster, missing_binaries


def _cluster(tmp_path_factory: pytest.TempPathFactory, name: str, nodes: tuple[str, ...]):
    missing = missing_binaries()
    if missing:
        message = f"Slurm is not installed ({', '.join(missing)} missing)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must install slurm-wlm and munge (.ci/run does)")
        pytest.skip(f"{message}: apt-get install slurm-wlm munge")
    # not under pytest's tmp dir: that is mode 0700 and munged runs as the munge user
    root = Path(tempfile.mkdtemp(prefix=f"mxdist-{name}-"))
    cluster = SlurmCluster(root, nodes)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm3(tmp_path_factory: pytest.TempPathFactory):
    cluster = _cluster(tmp_path_factory, "slurm3", ("127.0.0.2", "127.0.0.3", "127.0.0.4"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm1(tmp_path_factory: pytest.TempPathFactory):
    cluster = _cluster(tmp_path_factory, "slurm1", ("localhost",))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private MXDIST_HOME for one test."""
    path = tmp_path / "mxdist-home"
    path.mkdir()
    return path
