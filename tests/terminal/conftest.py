"""The backends of the terminal matrix: this machine, the sshd hosts of tests/ssh and the Slurm
cluster of tests/slurm (the same fixtures, started once for this directory)."""
from __future__ import annotations

from tests.slurm.conftest import slurm3  # noqa: F401 - fixtures used by this directory's tests
from tests.ssh.conftest import ssh_cluster  # noqa: F401
