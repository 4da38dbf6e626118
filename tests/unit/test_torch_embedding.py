"""psnode.torch.Embedding / EmbeddingBag and sparse tables under DistributedTrainer, on the
in-process 'local' kvstore (the W=2 S=2 job: tests/cluster/test_torch_embedding.py).

The references: the same model with torch's dense ``nn.Embedding``/``nn.EmbeddingBag`` holding
the table the servers computed (``OnServers.values``), trained through the same trainer and
store -- equal bit for bit after every step for sgd and adagrad, whose lazy updates leave
untouched rows as dense updates do -- and, for adam (lazy: untouched rows keep their moments),
numpy with psnode's own update rules (``update_rows`` on the batch's rows).

CI installs torch: there a missing torch is an error; elsewhere these tests are skipped.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/unit/test_torch_embedding.py: pip install torch") from None
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

import torch.nn.functional as F
from torch import nn

import psnode
import psnode.torch as pt
from psnode.errors import ConfigError, ShapeMismatch
from psnode.math import optimizers as opt_mod

N, D, STEPS = 60, 4, 12
INIT = psnode.init.Normal(1.0)


class Model(nn.Module):
    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.emb = emb
        torch.manual_seed(0)
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        return self.head(e.sum(1) if e.dim() == 3 else e).squeeze(-1)


def batches(n: int = STEPS + 1, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, N, (16, 3), generator=g)
        out.append((x, (x % 2 == 0).float().mean(1)))
    return out


def table(key: str, pad: int | None = None, seed: int = 0) -> np.ndarray:
    w = psnode.init.ps_initializer(INIT, seed).values(key, (N, D))
    if pad is not None:
        w[pad] = 0
    return w


def pair(kv, kind: str, mode: str | None, pad: int | None, sparse: bool = False) -> tuple[Model, Model]:
    """(a model with a psnode table 'a', the same model with torch's module holding that table)."""
    if kind == "bag":
        a = Model(pt.EmbeddingBag(N, D, mode=mode, kv=kv, key="a", padding_idx=pad, initializer=INIT))
        b = Model(nn.EmbeddingBag(N, D, mode=mode, padding_idx=pad, sparse=sparse))
    else:
        a = Model(pt.Embedding(N, D, pad, kv=kv, key="a", initializer=INIT))
        b = Model(nn.Embedding(N, D, pad, sparse=sparse))
    with torch.no_grad():
        b.emb.weight.copy_(torch.from_numpy(table("a", pad)))
    return a, b


def train(pairs, data) -> None:
    for x, y in data:
        for model, trainer in pairs:
            trainer.zero_grad()
            F.mse_loss(model(x), y).backward()
            trainer.step()


@pytest.mark.parametrize("kind,mode,pad,opt", [
    ("bag", "sum", None, "adagrad"), ("bag", "mean", 3, "sgd"), ("bag", "max", None, "adagrad"),
    ("emb", None, None, "sgd"), ("emb", None, 5, "adagrad"),
])
def test_server_table_trains_exactly_as_the_dense_table(kind, mode, pad, opt) -> None:
    kv = psnode.kv.create("local")
    a, b = pair(kv, kind, mode, pad)
    spec = psnode.optimizer.create(opt, learning_rate=0.1)
    ta = pt.DistributedTrainer(a, kv, spec, prefix="a.")
    tb = pt.DistributedTrainer(b, kv, spec, prefix="b.")
    assert ta.keys == ["a.head.weight", "a.head.bias"] and [t.key for t in ta.tables] == ["a"]
    for i, (x, y) in enumerate(batches(STEPS)):
        train([(a, ta), (b, tb)], [(x, y)])
        got = a.emb.pull_rows(torch.arange(N)).numpy()
        assert np.array_equal(got, kv.pull("b.emb.weight")), f"step {i}"
    assert torch.equal(a.head.weight, b.head.weight) and torch.equal(a.head.bias, b.head.bias)
    assert not np.array_equal(got, table("a", pad))   # (it trained)


def test_adam_updates_only_the_batch_rows() -> None:
    """Adam's lazy update (MXNet's): only the rows a step looked up change, moments included."""
    kv = psnode.kv.create("local")
    a = Model(pt.EmbeddingBag(N, D, mode="sum", kv=kv, key="a", initializer=INIT))
    ta = pt.DistributedTrainer(a, kv, psnode.optimizer.create("adam", learning_rate=0.05))
    ref = Model(nn.EmbeddingBag(N, D, mode="sum"))
    w = table("a")
    rule = opt_mod.create("adam", learning_rate=0.05)
    states = {"w": rule.create_state(w), **{n: rule.create_state(p.detach().numpy().copy())
                                             for n, p in ref.head.named_parameters()}}
    for x, y in batches(STEPS):
        ta.zero_grad()
        F.mse_loss(a(x), y).backward()
        ta.step()
        with torch.no_grad():
            ref.emb.weight.copy_(torch.from_numpy(w))
        ref.zero_grad()
        F.mse_loss(ref(x), y).backward()
        rows = np.unique(x.numpy())
        rule.update_rows(w, rows, ref.emb.weight.grad.numpy()[rows], states["w"])
        for n, p in ref.head.named_parameters():
            arr = p.detach().numpy()
            rule.update(arr, p.grad.numpy(), states[n])
        assert np.array_equal(a.emb.pull_rows(torch.arange(N)).numpy(), w)
    assert torch.equal(a.head.weight, ref.head.weight)


def test_prefetch_is_used_and_changes_nothing() -> None:
    kv = psnode.kv.create("local")
    a, b = pair(kv, "bag", "sum", None)
    spec = psnode.optimizer.create("adagrad", learning_rate=0.1)
    ta, tb = pt.DistributedTrainer(a, kv, spec, prefix="a."), pt.DistributedTrainer(b, kv, spec, prefix="b.")
    fetched: list[np.ndarray] = []
    fetch = kv.row_sparse_fetch

    def counting(key, row_ids, priority=0):
        fetched.append(np.asarray(row_ids))
        return fetch(key, row_ids, priority)
    kv.row_sparse_fetch = counting
    data = batches()
    for i in range(STEPS):
        x, y = data[i]
        for model, trainer in ((a, ta), (b, tb)):
            trainer.zero_grad()
            F.mse_loss(model(x), y).backward()
            if model is a:
                if i % 3 == 0:
                    a.emb.prefetch(data[i + 1][0])   # after backward: sent after this step's push
                elif i % 3 == 1:
                    a.emb.prefetch(torch.tensor([[0, 1, 2]]))   # never used: replaced by the next one
            trainer.step()
        if i % 3 == 2:
            a.emb.prefetch(data[i + 1][0])           # after step: sent at once
        assert np.array_equal(a.emb.pull_rows(torch.arange(N)).numpy(), kv.pull("b.emb.weight"))
    # fetches per step (forward, prefetches, the check's pull_rows): i % 3 == 0: the prefetch
    # of step i - 1 serves the forward (but step 0 fetches), the deferred prefetch leaves at the
    # push: 0 + 1 + 1; i % 3 == 1: served, the unused prefetch leaves at the push: 0 + 1 + 1;
    # i % 3 == 2: the forward fetches, the unused prefetch asks again at the push, the new one
    # leaves at once: 1 + 2 + 1
    assert len(fetched) == 1 + (STEPS // 3) * (2 + 2 + 4)


def test_held_sparse_table_pushes_row_sparse_and_refreshes_its_rows() -> None:
    """nn.Embedding(sparse=True): a row_sparse key; the trainer pushes torch's (coalesced) sparse
    gradient; each forward first pulls its rows.  Against the dense module the sums of repeated
    ids round differently (coalesce vs dense accumulation): equal to float32 rounding."""
    kv = psnode.kv.create("local")
    a, b = pair(kv, "emb", None, 2, sparse=True)
    a = Model(nn.Embedding(N, D, 2, sparse=False))
    with torch.no_grad():
        a.emb.weight.copy_(b.emb.weight)
    spec = psnode.optimizer.create("adagrad", learning_rate=0.1)
    ta, tb = pt.DistributedTrainer(a, kv, spec, prefix="a."), pt.DistributedTrainer(b, kv, spec, prefix="b.")
    assert tb.keys == ["b.head.weight", "b.head.bias"] and [t.key for t in tb.tables] == ["b.emb.weight"]
    train([(a, ta), (b, tb)], batches(STEPS))
    stored = kv.row_sparse_pull("b.emb.weight", row_ids=np.arange(N)).data
    np.testing.assert_allclose(stored, kv.pull("a.emb.weight"), rtol=1e-5, atol=1e-6)
    x = torch.arange(N)
    with torch.no_grad():
        b.emb(x)                                  # the forward pulls every row into the weight
    assert np.array_equal(b.emb.weight.detach().numpy(), stored)
    tb.close()
    b.emb.weight.data.zero_()
    b.emb(x)                                      # closed: no more pulls
    assert not b.emb.weight.detach().numpy().any()


def test_lookups_without_grad_and_zero_grad_push_no_rows() -> None:
    kv = psnode.kv.create("local")
    emb = pt.Embedding(N, D, kv=kv, key="t", initializer=INIT)
    trainer = pt.DistributedTrainer(emb, kv, psnode.optimizer.create("sgd", learning_rate=1.0))
    before = emb.pull_rows(torch.arange(N)).numpy()
    with torch.no_grad():
        emb(torch.tensor([1, 2]))
    emb(torch.tensor([3])).sum().backward()
    trainer.zero_grad()                           # drops the gradient of row 3
    trainer.step()
    assert np.array_equal(emb.pull_rows(torch.arange(N)).numpy(), before)
    emb(torch.tensor([[4, 4], [7, 4]])).sum().backward()
    trainer.step()
    after = emb.pull_rows(torch.arange(N)).numpy()
    want = before.copy()
    want[4] -= 3
    want[7] -= 1
    assert np.array_equal(after, want)
    assert emb.pull_rows(torch.tensor([[4], [7]])).shape == (2, 1, D)


def test_server_side_init_is_the_table_values_and_keys_count_per_store() -> None:
    kv = psnode.kv.create("local")
    e0 = pt.Embedding(N, D, kv=kv)
    e1 = pt.EmbeddingBag(N, D, kv=kv, seed=4, initializer=psnode.init.Uniform(0.5), dtype=torch.float64)
    other = psnode.kv.create("local")
    assert (e0.key, e1.key) == ("psnode.torch.Embedding.0", "psnode.torch.EmbeddingBag.1")
    assert pt.Embedding(N, D, kv=other).key == "psnode.torch.Embedding.0"
    ids = torch.tensor([59, 0, 7])
    assert np.array_equal(e0.pull_rows(ids).numpy(),
                          psnode.init.ps_initializer(psnode.init.Normal(1.0)).values(e0.key, (N, D), rows=[59, 0, 7]))
    got = e1.pull_rows(ids.view(1, 3))
    assert got.dtype == torch.float64 and got.shape == (1, 3, D)   # (rows, not bags)
    assert "on the servers" in repr(e1) and "mode='mean'" in repr(e1)
    assert list(e0.state_dict()) == []


@pytest.mark.parametrize("make,words", [
    (lambda kv: pt.EmbeddingBag(N, D, mode="median", kv=kv), ["mode", "median"]),
    (lambda kv: pt.Embedding(0, D, kv=kv), ["num_embeddings", "positive"]),
    (lambda kv: pt.Embedding(N, D, N, kv=kv), ["padding_idx", "outside"]),
    (lambda kv: pt.Embedding(N, D, kv=kv, dtype=torch.float16), ["float32 or torch.float64"]),
    (lambda kv: pt.Embedding(N, D, kv=kv)(torch.tensor([0.5])), ["int64 or int32"]),
    (lambda kv: pt.DistributedTrainer(pt.Embedding(N, D, kv=psnode.kv.create("local")), kv), ["another KVStore"]),
])
def test_errors_name_the_problem(make, words) -> None:
    kv = psnode.kv.create("local")
    with pytest.raises(ConfigError) as info:
        make(kv)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_ids_out_of_range_and_other_sparse_gradients() -> None:
    kv = psnode.kv.create("local")
    emb = pt.Embedding(N, D, kv=kv)
    with pytest.raises(ShapeMismatch, match=f"row id {N} "):
        emb(torch.tensor([1, N]))
    w = nn.Parameter(torch.zeros(N, D))
    model = nn.Module()
    model.w = w
    trainer = pt.DistributedTrainer(model, kv)
    F.embedding(torch.tensor([1]), w, sparse=True).sum().backward()
    with pytest.raises(ConfigError, match="sparse=True"):
        trainer.step()


def test_template_and_row_sparse_fetch() -> None:
    kv = psnode.kv.create("local")
    t = psnode.kv.template((1000, 8), np.float64)
    assert t.shape == (1000, 8) and t.dtype == np.float64 and t.nbytes == 64_000 and not t.flags.writeable
    assert t.base.nbytes == 8                       # one element of memory
    ps = psnode.init.ps_initializer(psnode.init.Normal(0.1), seed=1)
    kv.init("t", t, ps, stype="row_sparse")
    pending = kv.row_sparse_fetch("t", [[9, 3], [3, 999]])
    rows = pending.wait()
    assert pending.done and rows is pending.wait()
    assert list(rows.indices) == [3, 9, 999] and rows.shape == (1000, 8)
    assert np.array_equal(rows.data, ps.values("t", (1000, 8), np.float64, rows=[3, 9, 999]))
    kv.init("d", np.zeros((4, 3), np.float32), ps)          # a dense template: its contents unused
    assert np.array_equal(kv.pull("d"), ps.values("d", (4, 3)))
    with pytest.raises(ConfigError, match="template"):
        kv.init("x", "a table", ps)


@pytest.mark.parametrize("kind,opt", [("bag", "adagrad"), ("emb", "sgd")])
def test_a_table_without_a_row_count_trains_exactly_as_a_dense_table_of_its_ids(kind, opt) -> None:
    """``EmbeddingBag(None, D)`` fed 64-bit ids trains bit for bit as torch's dense table
    whose row i holds id ``big[i]``'s initial values (psnode.math.dynrows)."""
    from psnode.math import dynrows
    big = np.sort(np.array([(i * 0x9E3779B97F4A7C15 + 12345) % (1 << 64) for i in range(N)],
                           np.uint64).view(np.int64))   # (sorted as x is: torch sums repeats in the same order)
    kv = psnode.kv.create("local")
    if kind == "bag":
        a = Model(pt.EmbeddingBag(None, D, mode="sum", kv=kv, key="a", initializer=INIT))
        b = Model(nn.EmbeddingBag(N, D, mode="sum"))
    else:
        a = Model(pt.Embedding(None, D, kv=kv, key="a", initializer=INIT))
        b = Model(nn.Embedding(N, D))
    with torch.no_grad():
        b.emb.weight.copy_(torch.from_numpy(dynrows.row_values(INIT, 0, "a", dynrows.mix(big), D, np.float32)))
    spec = psnode.optimizer.create(opt, learning_rate=0.1)
    ta = pt.DistributedTrainer(a, kv, spec, prefix="a.")
    tb = pt.DistributedTrainer(b, kv, spec, prefix="b.")
    for x, y in batches(STEPS):
        for model, trainer, ids in ((a, ta, torch.from_numpy(big[x.numpy()])), (b, tb, x)):
            trainer.zero_grad()
            F.mse_loss(model(ids), y).backward()
            trainer.step()
        got, want = a.emb.pull_rows(torch.from_numpy(big)).numpy(), kv.pull("b.emb.weight")
        assert np.array_equal(got, want), (np.flatnonzero((got != want).any(1)), np.abs(got - want).max())
    assert torch.equal(a.head.weight, b.head.weight)
