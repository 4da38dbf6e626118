"""Unit tests of psnode.data: shard partition properties, determinism, the torch-free
sampler (world size and rank from arguments, a kv object, or the environment), errors."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from psnode import data as D
from psnode.errors import ConfigError

COMBOS = [(n, p) for n in (1, 2, 3, 5, 7, 10, 16, 17, 100, 101) for p in (1, 2, 3, 4, 8, 11)]


def all_parts(n, p, **kw):
    return [D.shard_indices(n, p, r, **kw) for r in range(p)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("n,p", COMBOS)
def test_padded_parts_equal_complete_and_disjoint_but_padding(n, p, shuffle):
    parts = all_parts(n, p, shuffle=shuffle, epoch=3, seed=1)
    size = math.ceil(n / p)
    assert all(len(x) == size and x.dtype == np.int64 for x in parts)
    flat = np.concatenate(parts)
    assert set(flat.tolist()) == set(range(n))  # complete
    counts = np.bincount(flat, minlength=n)
    assert counts.sum() - n == size * p - n  # the only duplicates are the padding
    # padding wraps around the order, so a sample appears at most ceil(size*p/n) times
    assert counts.max() <= math.ceil(size * p / n)
    if (size * p) == n:
        assert (counts == 1).all()  # exactly disjoint


@pytest.mark.parametrize("n,p", COMBOS)
def test_drop_last_parts_equal_and_disjoint(n, p):
    parts = all_parts(n, p, drop_last=True, seed=4)
    assert all(len(x) == n // p for x in parts)
    flat = np.concatenate(parts)
    assert len(set(flat.tolist())) == len(flat) == (n // p) * p
    assert flat.size == 0 or (flat.min() >= 0 and flat.max() < n)


def test_n_smaller_than_parts():
    parts = all_parts(3, 5, shuffle=False)
    assert [x.tolist() for x in parts] == [[0], [1], [2], [0], [1]]
    assert all(x.size == 0 for x in all_parts(3, 5, drop_last=True))


def test_unshuffled_is_strided_identity():
    assert D.shard_indices(10, 3, 1, shuffle=False).tolist() == [1, 4, 7, 0]
    assert D.shard_indices(10, 3, 1, shuffle=False, drop_last=True).tolist() == [1, 4, 7]
    assert D.shard_indices(10, 1, 0, shuffle=False).tolist() == list(range(10))


def test_deterministic_per_epoch_and_seed_and_different_across():
    a = D.shard_indices(1000, 4, 2, epoch=5, seed=9)
    assert np.array_equal(a, D.shard_indices(1000, 4, 2, epoch=5, seed=9))
    assert not np.array_equal(a, D.shard_indices(1000, 4, 2, epoch=6, seed=9))
    assert not np.array_equal(a, D.shard_indices(1000, 4, 2, epoch=5, seed=10))


def test_every_part_sees_the_same_permutation():
    n, p = 23, 4
    whole = D.shard_indices(n, 1, 0, epoch=2, seed=7)  # the permutation itself
    assert sorted(whole.tolist()) == list(range(n))
    wrapped = np.resize(whole, math.ceil(n / p) * p)
    for r in range(p):
        assert np.array_equal(D.shard_indices(n, p, r, epoch=2, seed=7), wrapped[r::p])


@pytest.mark.parametrize("call,words", [
    (lambda: D.shard_indices(0, 2, 0), ["n", "0"]),
    (lambda: D.shard_indices(-3, 2, 0), ["n", "-3"]),
    (lambda: D.shard_indices(10, 0, 0), ["num_parts", "0"]),
    (lambda: D.shard_indices(10, 2, 2), ["part", "[0, 2)", "2"]),
    (lambda: D.shard_indices(10, 2, -1), ["part", "-1"]),
    (lambda: D.shard_indices(10.0, 2, 0), ["n", "10.0"]),
    (lambda: D.shard_indices(10, 2, True), ["part", "True"]),
    (lambda: D.shard_indices(10, 2, 0, epoch=-1), ["epoch", "-1"]),
    (lambda: D.shard_indices(10, 2, 0, seed=-5), ["seed", "-5"]),
    (lambda: D.shard_indices(10, 2, 0, shuffle="yes"), ["shuffle", "'yes'"]),
    (lambda: D.ShardSampler(0), ["len(dataset)", "0"]),
    (lambda: D.ShardSampler(object()), ["dataset", "object"]),
    (lambda: D.ShardSampler(10, num_replicas=2, rank=3), ["rank", "3"]),
    (lambda: D.shard_arrays(np.zeros(3), np.zeros(4), num_parts=1, part=0), ["[3, 4]"]),
    (lambda: D.shard_arrays(num_parts=1, part=0), ["at least one"]),
    (lambda: D.shard_arrays(np.float32(1), num_parts=1, part=0), ["0-d"]),
    (lambda: list(D.iterate_minibatches(np.zeros(3), batch_size=0)), ["batch_size", "0"]),
])
def test_errors_name_the_value(call, words):
    with pytest.raises(ConfigError) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# -- sampler -----------------------------------------------------------------------------
@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return monkeypatch


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_matches_shard_indices_over_epochs(clean_env, drop_last):
    ds = list(range(37))
    s = D.ShardSampler(ds, num_replicas=4, rank=3, seed=11, drop_last=drop_last)
    for epoch in (0, 1, 2):
        s.set_epoch(epoch)
        got = list(s)
        assert all(type(i) is int for i in got)
        assert got == D.shard_indices(37, 4, 3, epoch, 11, True, drop_last).tolist()
        assert len(s) == len(got) == (9 if drop_last else 10)
    assert s.total_size == len(s) * 4


def test_sampler_without_shuffle_and_int_dataset(clean_env):
    s = D.ShardSampler(10, num_replicas=3, rank=0, shuffle=False)
    assert list(s) == [0, 3, 6, 9] and s.epoch == 0 and "rank=0/3" in repr(s)


def test_sampler_world_from_kv(clean_env):
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("RANK", "7")
    kv = SimpleNamespace(num_workers=3, rank=2)
    s = D.ShardSampler(range(30), kv=kv)
    assert (s.num_replicas, s.rank) == (3, 2)  # kv wins over env
    assert list(s) == D.shard_indices(30, 3, 2).tolist()
    assert (D.ShardSampler(30, kv=kv, rank=0).rank, D.ShardSampler(30, kv=kv).rank) == (0, 2)


def test_sampler_world_from_env_then_default(clean_env):
    assert (D.ShardSampler(5).num_replicas, D.ShardSampler(5).rank) == (1, 0)
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("RANK", "1")
    s = D.ShardSampler(np.zeros((20, 2)))
    assert (s.num_replicas, s.rank, len(s)) == (4, 1, 5)
    assert D.resolve_world(num_replicas=2, rank=None) == (2, 1)
    clean_env.setenv("RANK", "one")
    with pytest.raises(ConfigError, match="RANK='one'"):
        D.ShardSampler(5)
    clean_env.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="rank.*4"):
        D.ShardSampler(5)
    assert D.resolve_world(env={"WORLD_SIZE": "2", "RANK": "1"}) == (2, 1)
    assert D.resolve_world(env={}) == (1, 0)


def test_every_rank_sampler_covers_dataset(clean_env):
    seen = []
    for r in range(3):
        s = D.ShardSampler(10, kv=SimpleNamespace(num_workers=3, rank=r))
        s.set_epoch(4)
        seen += list(s)
    assert len(seen) == 12 and set(seen) == set(range(10))
    with pytest.raises(ConfigError, match="epoch"):
        s.set_epoch(-1)


# -- arrays ------------------------------------------------------------------------------------
def test_shard_arrays_rows_match_indices(clean_env):
    x = np.arange(40).reshape(20, 2)
    y = np.arange(20) * 10
    kv = SimpleNamespace(num_workers=3, rank=1)
    xs, ys = D.shard_arrays(x, y, kv=kv, epoch=2, seed=3)
    idx = D.shard_indices(20, 3, 1, epoch=2, seed=3)
    assert np.array_equal(xs, x[idx]) and np.array_equal(ys, y[idx])
    assert np.array_equal(xs[:, 0] // 2 * 10, ys)  # rows stay paired
    (only,) = D.shard_arrays(list(range(5)), num_parts=2, part=1, shuffle=False)
    assert only.tolist() == [1, 3, 0]


def test_iterate_minibatches():
    x, y = np.arange(10), np.arange(10) * 2
    batches = list(D.iterate_minibatches(x, y, batch_size=4))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(np.array_equal(bx * 2, by) for bx, by in batches)
    assert len(list(D.iterate_minibatches(x, batch_size=4, drop_last=True))) == 2
    shuffled = np.concatenate([b[0] for b in D.iterate_minibatches(x, batch_size=3,
                                                                   shuffle=True, epoch=1)])
    assert sorted(shuffled.tolist()) == list(range(10)) and shuffled.tolist() != list(range(10))


def test_torch_dataloader_accepts_sampler(clean_env):
    torch_data = pytest.importorskip("torch.utils.data")
    s = D.ShardSampler(12, num_replicas=2, rank=1, shuffle=False)
    loader = torch_data.DataLoader(list(range(100, 112)), sampler=s, batch_size=3)
    assert [b.tolist() for b in loader] == [[101, 103, 105], [107, 109, 111]]
