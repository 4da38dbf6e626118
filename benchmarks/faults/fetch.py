"""How long a replacement server takes to get its state from a holder: ``fetch.py`` times
psnode.server.replicas.fetch of a row_sparse table with an Adagrad-like per-row state (the
values and the state each ``--rows`` x 16 float32) from a real Keeper on loopback, the channel
authenticated as in a job, ``--runs`` times (the first includes the pages the copy touches for
the first time).  The state is given whole (not computed from a fill spec), so the whole of it
crosses.

    python benchmarks/faults/fetch.py                  # 10M rows: 1.28 GB, 3 fetches
    python benchmarks/faults/fetch.py --rows 2e6 --runs 5
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from psnode.config import NodeConfig, Role  # noqa: E402
from psnode.net.security import Mode  # noqa: E402
from psnode.net.transport import Transport, new_security  # noqa: E402
from psnode.protocol.control import ServerAddress  # noqa: E402
from psnode.server.replicas import Keeper, Replicator, fetch  # noqa: E402

JOB = "fetch-bench"


def table(rows: int) -> tuple[dict, dict]:
    """A whole server state of one row_sparse key part ``emb`` (psnode.server.checkpoint.snapshot's form)."""
    rng = np.random.default_rng(0)
    item = {"key": "emb", "part": 0, "sparse": True, "sync": True, "average": False, "round": 1,
            "state": ["t", "h"], "pushed": {"0": 1}}
    arrays = {"v0": rng.random((rows, 16), np.float32), "s0_h": rng.random((rows, 16), np.float32),
              "s0_t": np.array(1, np.int64)}
    return {"index": [item], "optimizer": None}, arrays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=float, default=10e6, help="rows of the table (default 10M: 1.28 GB with its state)")
    ap.add_argument("--runs", type=int, default=3, help="fetches to time (default 3)")
    args = ap.parse_args()
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=2, job_id=JOB)
    keeper = Keeper(cfg, security)
    keeper.start()
    transports: list[Transport] = []
    try:
        book = [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)]
        transports.append(Transport(JOB, "server:1", cfg.max_message_bytes, security))
        primary = Replicator(transports[-1], 1, 2, 2)
        primary.repoint(book)
        state = table(int(args.rows))
        size = sum(a.nbytes for a in state[1].values())
        primary.copy(state, lambda: state, lambda: None, resend_after=60.0)
        for i in range(args.runs):
            transports.append(Transport(JOB, f"server:1/{i}", cfg.max_message_bytes, security))
            t0 = time.perf_counter()
            meta, arrays, _ = fetch(transports[-1], 1, book, 2, 2, lambda: None, timeout=120.0)
            took = time.perf_counter() - t0
            exact = np.array_equal(arrays["v0"], state[1]["v0"]) and np.array_equal(arrays["s0_h"], state[1]["s0_h"])
            print(f"fetch {i + 1}: {size / 1e9:.2f} GB in {took:.2f} s ({size / took / 1e9:.2f} GB/s)"
                  f"{'' if exact else '  NOT EXACT'}", flush=True)
            if not exact:
                return 1
            del meta, arrays
    finally:
        for t in transports:
            t.close()
        keeper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
