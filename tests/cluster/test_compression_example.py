"""The README's compression line runs: ``mxdist launch -n 2 -s 2 examples/mlp_numpy.py
--compression 2bit`` trains the digits MLP with 2-bit gradient pushes (MXNet's default threshold
0.5) to within 2 accuracy points of the same job uncompressed (0.9666 vs 0.9833 here:
both runs are deterministic, dist_sync rounds over the same batches)."""
from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, run_cli
from tests.support.examples import require_module


def _accuracy(out: str) -> float:
    found = re.findall(r"^\[worker 0 @ \S+\] accuracy=([0-9.]+)$", out, re.M)
    assert found, out
    return float(found[-1])


def test_mlp_example_with_2bit_compression_within_2_points(tmp_path: Path) -> None:
    require_module("sklearn")
    env = cli_env(tmp_path / "home")
    base = ["launch", "-n", "2", "-s", "2", "examples/mlp_numpy.py"]
    try:
        plain = run_cli(base, env, timeout=120)
        packed = run_cli([*base, "--compression", "2bit"], env, timeout=120)
    finally:
        assert_nothing_left(tmp_path / "home")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert "gradient compression: {'type': '2bit', 'threshold': 0.5}" in packed.stdout
    assert "gradient compression" not in plain.stdout
    acc_plain, acc_packed = _accuracy(plain.stdout), _accuracy(packed.stdout)
    assert acc_plain > 0.95
    assert abs(acc_plain - acc_packed) <= 0.02, (acc_plain, acc_packed)
