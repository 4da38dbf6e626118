"""Torch tensors straight through a distributed KVStore (psnode.torch.values): 2 workers, 2
servers, dist_sync with 'sum', closed-form values."""
from __future__ import annotations

import os

import pytest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    if os.environ.get("CI"):
        raise
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

from tests.support.cluster import PRELUDE, ok, run_job


def test_torch_tensor_lists_in_a_job() -> None:
    """Worker r pushes [r + 1, 2] (two 'devices', one bfloat16) to a small key and a split big
    one: the sum is (1 + 2) + (2 + 2) = 7; every output tensor gets 7 in its own dtype; a
    row_ids pull into a tensor writes only those rows."""
    # torch first, as scripts do: importing it holds the GIL for seconds on a loaded machine,
    # longer than the harness's 1 s heartbeat liveness once the kvstore runs
    job = run_job("import torch\n" + PRELUDE + """
big = 300_000
kv.init(['w', 'big'], [np.zeros(3, np.float32), np.zeros(big, np.float32)])
kv.init('e', np.zeros((4, 2), np.float32), stype='row_sparse')
kv.push(['w', 'big'], [[torch.full((3,), r + 1.0), torch.full((3,), 2.0, dtype=torch.bfloat16)],
                      [torch.full((big,), r + 1.0), torch.full((big,), 2.0)]])
w = [torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16)]
b = torch.zeros(big)
kv.pull(['w', 'big'], out=[w, b])
for t in w + [b]:
    check(t.float().numpy(), np.full(t.shape, 7, np.float32), f"pull {t.dtype}")
kv.push('e', torch.ones(4, 2))
e = torch.full((4, 2), 9.0)
kv.pull('e', out=e, row_ids=[1])
check(e[:, 0].numpy(), np.array([9, 2, 9, 9], np.float32), "row_ids pull")
kv.close()
print("OK")
""", 2, 2, args=["dist_sync", "sum"], env={"PSNODE_BIG_ARRAY_BOUND": "100000"})
    ok(job)
    assert all("OK" in w.out for w in job.workers), job.describe()
