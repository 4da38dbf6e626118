"""A port taken on a host never fails a job: the scheduler finds its planned port taken (by a
real listening socket another process holds, taken just before the scheduler binds) and binds
a free one; the launcher gives that address to every other process and to ``mxdist status``.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli
from tests.support.ports import holders, port_taker, release, taken

TRAIN = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros((2, 3), np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, np.float32))
    out = np.empty((2, 3), np.float32); kv.pull(3, out=out)
    kv.barrier()
    print("rank", kv.rank, "value", float(out[0, 0]))
    kv.close()
""")


def test_a_taken_scheduler_port_moves_the_scheduler_not_the_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    taker = port_taker(tmp_path / "taker")
    try:
        res = run_cli(["launch", "-n", "2", "-s", "2", "-e", f"PYTHONPATH={taker}", str(train)], cli_env(home))
        held = holders(tmp_path / "taker")
        assert res.returncode == 0, res.stdout + res.stderr
        assert sorted(line.split("] ", 1)[-1] for line in res.stdout.splitlines() if "value" in line) == [
            "rank 0 value 1.5", "rank 1 value 1.5"], res.stdout
        (planned,) = held
        assert taken(planned)                       # the holder kept it all along
        rec = latest(home)
        assert rec["state"] == "succeeded"
        assert rec["scheduler"] != planned and rec["scheduler"].rpartition(":")[0] == planned.rpartition(":")[0]
        port = planned.rpartition(":")[2]
        assert f"scheduler on localhost: port {port} was taken, so it listens at {rec['scheduler']}" in \
            " ".join(res.stderr.split()), res.stderr
    finally:
        release(tmp_path / "taker")
    assert_nothing_left(home)
