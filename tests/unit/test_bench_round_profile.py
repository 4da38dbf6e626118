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


def test_the_gap_to_the_bound_adds_up_and_names_its_largest_part_first() -> None:
    from benchmarks.kvstore.round_profile import gap

    def proc(copy: float = 0.0, sum_: float = 0.0, scale: float = 0.0, python: float = 0.0,
             kernel: float = 0.0, other: float = 0.0) -> dict:
        return {"ms_per_round": {"copy": copy, "sum": sum_, "scale": scale, "python": python,
                                 "kernel": kernel, "other": other}}
    per_proc = {"worker 0": proc(copy=2.25, python=0.45, kernel=0.08, other=0.05),
                "worker 1": proc(copy=2.25, python=0.45, kernel=0.08, other=0.05),
                "server 0": proc(sum_=0.76, scale=0.15, python=0.31, kernel=0.07, other=0.10),
                "server 1": proc(sum_=0.76, scale=0.15, python=0.31, kernel=0.07, other=0.10)}
    used = sum(sum(v["ms_per_round"].values()) for v in per_proc.values())
    round_ms, bound_ms, cores = 5.0, 2.9, 2
    idle = cores * round_ms - used
    got = gap(per_proc, idle, round_ms, bound_ms, cores)
    assert sum(ms for _, ms in got) == pytest.approx(cores * (round_ms - bound_ms))
    named = dict(got)
    assert named["the workers' Python"] == pytest.approx(0.9)
    assert named["the servers' Python"] == pytest.approx(0.62)
    assert named["kernel and other"] == pytest.approx(0.6)
    assert named["copies, sum and scale beyond the bound's"] == pytest.approx(4.5 + 1.52 + 0.3 - 5.8)
    assert got[0] == ("idle: no process of the job on a core (waiting, or work not the job's)", pytest.approx(idle))
    assert [ms for _, ms in got] == sorted((ms for _, ms in got), reverse=True)
