"""benchmarks/kvstore/round_profile.py: a sampled function's category, and the shares of a
``perf report --sort dso,symbol`` text (as perf prints it)."""
from __future__ import annotations

import pytest

from benchmarks.kvstore.round_profile import CATEGORIES, category, shares

REPORT = """\
    51.65%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so  [.] FLOAT_add_X86_V3                 -      -
    13.03%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so  [.] FLOAT_multiply_X86_V3            -      -
     9.27%  libpython3.11.so.1.0                               [.] _PyEval_EvalFrameDefault         -      -
    20.00%  libc.so.6                                          [.] __memmove_avx512_unaligned_erms  -      -
     1.57%  [kernel.kallsyms]                                  [k] finish_task_switch.isra.0        -      -
     0.48%  _struct.cpython-311-x86_64-linux-gnu.so            [.] s_pack_internal                  -      -
# a comment line perf may print
"""


@pytest.mark.parametrize(("dso", "symbol", "want"), [
    ("libc.so.6", "__memmove_avx512_unaligned_erms", "copy"),
    ("libc.so.6", "__memcpy_avx_unaligned", "copy"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", "FLOAT_add_X86_V3", "sum"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", "DOUBLE_multiply_AVX2", "scale"),
    ("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", "python"),
    ("python3.11", "main", "python"),
    ("[kernel.kallsyms]", "do_sys_poll", "kernel"),
    ("libzmq.so.5", "zmq_poll", "other"),
])
def test_category(dso: str, symbol: str, want: str) -> None:
    assert category(dso, symbol) == want


def test_shares_sum_the_categories_and_scale_to_one() -> None:
    got = shares(REPORT)
    assert set(got) == set(CATEGORIES)
    total = 51.65 + 13.03 + 9.27 + 20.00 + 1.57 + 0.48
    assert got["sum"] == pytest.approx(51.65 / total) and got["scale"] == pytest.approx(13.03 / total)
    assert got["copy"] == pytest.approx(20.00 / total) and got["kernel"] == pytest.approx(1.57 / total)
    assert got["other"] == pytest.approx(0.48 / total) and sum(got.values()) == pytest.approx(1.0)


def test_no_samples_gives_zero_shares() -> None:
    assert shares("") == dict.fromkeys(CATEGORIES, 0.0)
