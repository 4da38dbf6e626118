"""The worker's push slots (psnode.samehost.staging) with pushes whose size changes from step to
step, as row_sparse pushes of an embedding table do (the rows of each batch differ)."""
from __future__ import annotations

import numpy as np

from psnode.samehost.staging import MAX_SLOTS, Places, Staging


def _staging(released: dict[tuple[str, int], int]) -> Staging:
    return Staging(f"t{np.random.default_rng().integers(1 << 30)}", 0, released)


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
        got = staging.slot(key, (rows, 4), np.dtype(np.float32), seq)
        assert got is not None
        slot, at = got
        assert slot.shape == (rows, 4) and staging.out.locate(slot) == at   # its place is where it lies
        slot[:] = float(seq)
        held[seq] = (slot, float(seq))
        for q, (arr, v) in held.items():
            assert np.all(arr == v), f"push {q}'s slot was overwritten by push {seq}"
        released[("emb", 1)] = seq - 1   # push seq-1 applied and durable: its slot is free again
        held.pop(seq - 1, None)
        assert len(staging._slots[key]) <= MAX_SLOTS
    staging.close()


def test_places_give_shared_memory_with_its_place_to_near_servers_only() -> None:
    """One call's places: a near server's push slot and landing area lie in this worker's
    segments, each with its place (segment, offset); a far server's are plain memory without
    one (their bytes are sent), and a far server's answer brings its own memory."""
    staging = _staging({})
    places = Places(frozenset({1}), staging)
    slot, at = places.slot(1, "w", 0, 0, (8,), np.dtype(np.float32), 1)
    assert at is not None and staging.out.locate(slot) == at
    area, at_area = places.land(1, (3, 2), np.dtype(np.float32))
    assert area is not None and area.shape == (3, 2) and staging.landing.locate(area) == at_area
    staging.release(area)
    again, at_again = places.land(1, (2, 2), np.dtype(np.float32))   # the block comes back, its place with it
    assert again is not None and at_again == at_area
    far, nowhere = places.slot(0, "w", 0, 0, (8,), np.dtype(np.float32), 1)
    assert nowhere is None and staging.out.locate(far) is None
    assert places.land(0, (3,), np.dtype(np.float32)) == (None, None)
    assert Places(frozenset(), staging).slot(1, "w", 0, 0, (8,), np.dtype(np.float32), 1)[1] is None
    staging.close()
