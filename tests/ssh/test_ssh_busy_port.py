"""A port taken on an SSH host never fails a job: the scheduler and the standby scheduler each
find their planned port taken (a real listening socket another process holds, taken just
before they bind) and bind free ones; the launcher tells the standby the scheduler's address
and every server and worker both addresses.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, latest, run_cli
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


def test_taken_ports_move_the_scheduler_and_its_standby_not_the_job(ssh_cluster, home, tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    taker = port_taker(tmp_path / "taker")
    try:
        res = run_cli(["launch", "-H", "node1,node2", "-n", "2", "-s", "2", "--standby-scheduler",
                       "-e", f"PYTHONPATH={taker}", str(train)], ssh_cluster.env(home), timeout=120)
        held = holders(tmp_path / "taker")
        assert res.returncode == 0, res.stdout + res.stderr
        assert sorted(line.split("] ", 1)[-1] for line in res.stdout.splitlines() if "value" in line) == [
            "rank 0 value 1.5", "rank 1 value 1.5"], res.stdout
        assert sorted(a.rpartition(":")[0] for a in held) == ["127.0.0.2", "127.0.0.3"], held
        assert all(taken(a) for a in held)            # the holders kept them all along
        rec = latest(home)
        assert rec["state"] == "succeeded" and rec["scheduler"].startswith("127.0.0.2:")
        assert rec["scheduler"] not in held
        text = " ".join(res.stderr.split())
        for name, host in (("scheduler", "node1"), ("scheduler-1", "node2")):
            planned = next(a for a in held if a.startswith(ssh_cluster.addresses[int(host[-1]) - 1]))
            assert f"{name} on {host}: port {planned.rpartition(':')[2]} was taken, so it listens at " in text, text
    finally:
        release(tmp_path / "taker")
    assert_nothing_left(home)
