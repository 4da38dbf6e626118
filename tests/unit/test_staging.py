"""The worker's push slots (psnode.samehost.staging) with pushes whose size changes from step to
step, as row_sparse pushes of an embedding table do (the rows of each batch differ)."""
from __future__ import annotations

import numpy as np

from psnode.samehost.staging import MAX_SLOTS, Staging


def _staging(released: dict[tuple[str, int], int]) -> Staging:
    return Staging(f"t{np.random.default_rng().integers(1 << 30)}", 0, lambda kp: released.get(kp, 0))


def test_slots_follow_row_counts_that_change_every_step() -> None:
    """Pushes of 1..4000 rows in a random order, two in flight at a time: every slot handed
    out has the push's shape, holds what was written into it until released, and a key part
    never keeps more than MAX_SLOTS slots."""
    rng = np.random.default_rng(7)
    released: dict[tuple[str, int], int] = {}
    staging = _staging(released)
    key = ("emb", 1, 0)
    held: dict[int, tuple[np.ndarray, float]] = {}
    for seq in range(1, 301):
        rows = int(rng.integers(1, 4001))
        slot = staging.slot(key, (rows, 4), np.dtype(np.float32), seq)
        assert slot is not None and slot.shape == (rows, 4)
        slot[:] = float(seq)
        held[seq] = (slot, float(seq))
        for q, (arr, v) in held.items():
            assert np.all(arr == v), f"push {q}'s slot was overwritten by push {seq}"
        released[("emb", 1)] = seq - 1   # push seq-1 applied and durable: its slot is free again
        held.pop(seq - 1, None)
        assert len(staging._slots[key]) <= MAX_SLOTS
    staging.close()
