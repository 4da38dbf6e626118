"""Workers leaving one after another (the scheduler's MEMBERSHIP, coalesced per turn): every
sync round completes over exactly the workers still pushing, and the job ends cleanly."""
from __future__ import annotations

from tests.support.cluster import PRELUDE, ok, run_job


def test_workers_finishing_one_by_one_rounds_over_the_rest() -> None:
    """Worker r pushes r + 1 for r + 1 rounds, then closes: round s averages workers s..W-1,
    (s + 1 + W) / 2 exactly, on both servers (key 'a' on one, 'b' on the other)."""
    job = run_job(PRELUDE + """
W = kv.num_workers
kv.init(['a', 'b'], [np.zeros(3, np.float32), np.zeros(3, np.float32)])
for s in range(r + 1):
    kv.push(['a', 'b'], [np.full(3, r + 1, np.float32)] * 2)
    for k, got in zip('ab', kv.pull(['a', 'b'])):
        check(got, np.full(3, (s + 1 + W) / 2, np.float32), f"round {s} key {k}")
kv.close()
print("OK")
""", 6, 2)
    ok(job)
