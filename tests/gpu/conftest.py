"""CUDA tests of psnode.torch: marked ``cuda``, skipped only when torch sees no CUDA device.

CI machines have no GPU, so there every test here reports as skipped "CUDA is not available";
``tests/gpu/device_check.sh`` runs them on a GPU machine.  They share the cluster harness and
the CPU tests' scripts (``tests.support``).
"""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped when torch.cuda.is_available() is False)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch
        have_cuda = torch.cuda.is_available()
    except ImportError:
        have_cuda = False
    skip = pytest.mark.skip(reason="CUDA is not available (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not have_cuda:
            item.add_marker(skip)
