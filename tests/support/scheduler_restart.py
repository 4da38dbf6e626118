"""The worker script of the scheduler-restart tests (this machine and SSH hosts): :data:`ROUNDS`,
W=3 workers push and pull four keys for ``argv[2]`` rounds (``argv[1]/round5`` marks rank 0's
round 5) and each prints ``RANK r ROUNDS n BAD [...]`` after a final barrier."""
from __future__ import annotations

import textwrap

ROUNDS = textwrap.dedent("""
    import pathlib, sys, time, numpy as np, psnode
    flags, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    kv = psnode.kv.create('dist_sync')
    keys = ['a', 'b', 'c', 'd']
    for k in keys:
        kv.init(k, np.zeros(1000, np.float32))
    bad = []
    for step in range(rounds):
        for k in keys:
            kv.push(k, np.full(1000, (kv.rank + 1) * (step + 1), np.float32))
        for k in keys:
            got = kv.pull(k)
            if not (got == 2.0 * (step + 1)).all():
                bad.append((step, k, float(got[0])))
        if kv.rank == 0 and step == 5:
            (flags / 'round5').touch()
        time.sleep(0.05)
    kv.barrier()
    print('RANK', kv.rank, 'ROUNDS', rounds, 'BAD', bad, flush=True)
    kv.close()
""")
