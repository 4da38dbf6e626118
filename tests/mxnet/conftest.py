"""The MXNet tier: ports of MXNet's KVStore tests to psnode's numpy API (``test_port_*``, any
interpreter), and tests with MXNet 1.9 itself (``test_mx_*``: psnode.mxnet, Gluon, and
``mxdist launch --engine mxnet`` locally, over SSH and in Slurm).

MXNet 1.9.1 needs numpy < 1.24, so ``test_mx_*`` run in a venv of their own
(``pip install -e '.[mxnet,examples]' pytest``; ``.ci/run`` makes ``.venv-mxnet`` and runs
them there with ``PSNODE_TEST_MXNET=1``).  Where MXNet cannot be imported they are not
collected, unless ``PSNODE_TEST_MXNET`` is set: then the import error fails the run.
"""
from __future__ import annotations

import importlib.util
import os

# The SSH hosts and the Slurm cluster of tests/ssh and tests/slurm, for test_mx_engine_ssh.py and
# test_mx_engine_slurm.py (session fixtures: started only when a test asks for them).
from tests.slurm.conftest import slurm3  # noqa: F401
from tests.ssh.conftest import ssh_cluster  # noqa: F401

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("mxnet") is None and not os.environ.get("PSNODE_TEST_MXNET"):
    collect_ignore_glob.append("test_mx_*.py")
