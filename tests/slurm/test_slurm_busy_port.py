"""A port taken on a Slurm node never fails a job: the scheduler, a job step, finds its planned
port taken (a real listening socket another process holds, taken just before it binds) and binds
a free one; the launcher reads its address file on the shared file system and gives that
address to the servers' and workers' steps."""
from __future__ import annotations

import textwrap

from tests.support.cli import latest
from tests.support.ports import holders, port_taker, release, taken
from tests.support.slurm_launch import MXDIST, assert_nothing_left, salloc, write

TRAIN = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros((2, 3), np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, np.float32))
    out = np.empty((2, 3), np.float32); kv.pull(3, out=out)
    print("rank", kv.rank, "value", float(out[0, 0]))
    kv.close()
""")


def test_a_taken_port_moves_the_scheduler_step_not_the_job(slurm3, home, tmp_path):
    train = write(tmp_path, "train.py", TRAIN)
    taker = port_taker(tmp_path / "taker")
    try:
        res = salloc(slurm3, ["-N2", "--ntasks-per-node=2"], home, tmp_path,
                     *MXDIST, "launch", "--launcher", "slurm", "-n", "2", "-s", "2", "--finish-grace", "3",
                     "-e", f"PYTHONPATH={taker}", train)
        held = holders(tmp_path / "taker")
        assert res.returncode == 0, res.stdout + res.stderr
        for rank in (0, 1):
            assert f"rank {rank} value 1.5" in res.stdout, res.stdout
        (planned,) = held
        assert taken(planned)
        rec = latest(home)
        assert rec["state"] == "succeeded" and rec["scheduler"] != planned
        assert rec["scheduler"].rpartition(":")[0] == planned.rpartition(":")[0]
        assert f"port {planned.rpartition(':')[2]} was taken, so it listens at {rec['scheduler']}" in \
            " ".join(res.stderr.split()), res.stderr
    finally:
        release(tmp_path / "taker")
    assert_nothing_left(slurm3, rec["id"])
