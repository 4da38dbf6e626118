import sys, textwrap
from pathlib import Path
from tests.ssh.mxdist_testing import ROOT
from tests.terminal.emulator import Terminal, terminal_env

TRAIN = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros(2, np.float32))
    kv.push(3, np.full(2, kv.rank + 1, np.float32))
    print("rank", kv.rank, "of", kv.num_workers, "ok", kv.pull(3).tolist())
    kv.close()
""")

def test_ssh_launch_in_a_terminal_ends(ssh_cluster, tmp_path):
    (tmp_path / "home").mkdir()
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    env = terminal_env(ssh_cluster.env(tmp_path / "home"))
    with Terminal([sys.executable, "-m", "cli.main", "launch", "-H", "node1,node2", "-n", "2", "-s", "2", str(train)],
                  env, cwd=ROOT) as term:
        assert term.wait(40) == 0, term.screen().text()
        screen = term.screen().flat()
        assert "rank 1 of 2 ok [1.5, 1.5]" in screen and "succeeded in" in screen, screen
