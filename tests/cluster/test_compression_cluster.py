"""Gradient compression end to end: real scheduler, 2 servers and 2 workers on 127.0.0.1.

Exact values over several rounds with each worker's residual carried (tests.support.compression_cases:
a bucket of two small keys and a key split over both servers; average and sum; with and without
a server optimizer; dist_sync and dist_async), on both data paths (the same-host shared-memory
link, the default here, and TCP with ``PSNODE_SHM=0``); bytes on the wire per push from the
workers' and servers' counters; a mismatch of settings between workers.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from psnode.scheduler.client import status as scheduler_status
from tests.support import wait_for
from tests.support.cluster import ok, run_job, start_job, wait_for_file, wait_job
from tests.support.compression_cases import BOUND, KEYS, STEPS, expected

SCRIPT = """
import json, sys, numpy as np, psnode
from tests.support.compression_cases import KEYS, SHAPES, STEPS, INIT, LR, MOMENTUM, gradient
outdir, params, aggregator, optimizer, mode = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:6]
kv = psnode.kv.create(mode, aggregator=aggregator)
kv.init(KEYS, [np.full(SHAPES[k], INIT, np.float32) for k in KEYS])   # before: MXNet's nightly test does
if optimizer == 'sgd':
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=LR,
                                             momentum=MOMENTUM if mode == 'dist_sync' else 0.0))
kv.set_gradient_compression(params)
outs = [np.empty(SHAPES[k], np.float32) for k in KEYS]
got = {}
for step in range(1, STEPS + 1):
    grads = [gradient(k, kv.rank, step) for k in KEYS]
    if step <= 3:                     # every key in one call: a bucket request, two parts of 'big'
        kv.push(KEYS, grads)
        kv.pull(KEYS, out=outs)
    elif step == 4:                   # push and pull fused (PUSHPULL)
        kv.pushpull(KEYS, grads, out=outs)
    else:                             # one key at a time: the bucket's members on their own
        for k, g in zip(KEYS, grads):
            kv.push(k, g)
        for k, o in zip(KEYS, outs):
            kv.pull(k, out=o)
    if mode == 'dist_sync':
        for k, o in zip(KEYS, outs):
            got[f'{k}/{step}'] = o.copy()
kv.barrier()
kv.pull(KEYS, out=outs)
for k, o in zip(KEYS, outs):
    got[f'{k}/final'] = o.copy()
np.savez(f'{outdir}/w{kv.rank}.npz', **got)
kv.close()
print('OK')
"""

TWO_BIT = {"type": "2bit", "threshold": 0.5}


def _run(tmp_path, params: dict, aggregator: str, optimizer: str, mode: str = "dist_sync",
         shm: bool = True) -> dict[str, list[np.ndarray]]:
    env = {"PSNODE_BIG_ARRAY_BOUND": BOUND, **({} if shm else {"PSNODE_SHM": "0"})}
    job = run_job(SCRIPT, 2, 2, env=env, tmp=tmp_path,
                  args=[str(tmp_path), json.dumps(params), aggregator, optimizer, mode])
    ok(job)
    want = expected(params, 2, aggregator, optimizer, mode=mode)
    for w in range(2):
        got = np.load(tmp_path / f"w{w}.npz")
        for k in KEYS:
            if mode == "dist_sync":
                for step in range(1, STEPS + 1):
                    assert np.array_equal(got[f"{k}/{step}"], want[k][step - 1]), (w, k, step)
                assert np.array_equal(got[f"{k}/final"], want[k][-1]), (w, k)
            else:
                assert np.array_equal(got[f"{k}/final"], want[k][0]), (w, k)
    return want


@pytest.mark.parametrize("params,aggregator,optimizer,shm", [
    (TWO_BIT, "average", "sgd", True),
    (TWO_BIT, "sum", "none", False),
    ({"type": "2bit", "threshold": 0.25}, "average", "none", True),
    ({"type": "1bit", "threshold": -0.25}, "average", "sgd", False),
    ({"type": "1bit"}, "sum", "none", True),
    ({"type": "fp16"}, "sum", "sgd", True),
    ({"type": "fp16"}, "average", "none", False),
], ids=["2bit-avg-sgd-shm", "2bit-sum-tcp", "2bit0.25-avg-shm", "1bit-avg-sgd-tcp", "1bit-sum-shm",
        "fp16-sum-sgd-shm", "fp16-avg-tcp"])
def test_sync_rounds_exact_with_residuals(tmp_path, params: dict, aggregator: str, optimizer: str,
                                          shm: bool) -> None:
    want = _run(tmp_path, params, aggregator, optimizer, shm=shm)
    # the compression matters: the uncompressed rounds give other values
    plain = expected({"type": "none"}, 2, aggregator, optimizer)
    assert not np.array_equal(plain["big"][-1], want["big"][-1])


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_async_pushes_exact(tmp_path, shm: bool) -> None:
    _run(tmp_path, TWO_BIT, "sum", "sgd", mode="dist_async", shm=shm)


BYTES = """
import json, pathlib, sys, time, numpy as np, psnode
params, ready, go = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
kv = psnode.kv.create('dist_sync')
n = 1 << 22                                  # 16 MiB of float32, split over both servers
kv.init('g', np.zeros(n, np.float32))
kv.set_gradient_compression(params)
g = np.full(n, 0.75, np.float32)
kv.push('g', g); kv.wait_all()               # warm-up
before = kv._engine.stats.bytes_out
for _ in range(4):
    kv.push('g', g)
kv.wait_all()
print('PUSHBYTES', (kv._engine.stats.bytes_out - before) / 4, flush=True)
pathlib.Path(ready + str(kv.rank)).touch()
deadline = time.monotonic() + 30
while not pathlib.Path(go).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
kv.close()
"""


@pytest.mark.parametrize("params,ratio", [({"type": "none"}, 1.0), (TWO_BIT, 1 / 16), ({"type": "fp16"}, 1 / 2),
                                          ({"type": "1bit"}, 1 / 32)], ids=["none", "2bit", "fp16", "1bit"])
def test_bytes_on_the_wire_per_push(tmp_path, params: dict, ratio: float) -> None:
    """Over TCP (``PSNODE_SHM=0``: on this host the shared-memory link would carry the arrays
    without sockets): a push of 16 MiB of float32 puts ``ratio`` of that on the wire, headers
    aside, by the worker's counter; the servers' counters received that 5 times (the pushes)
    and the float32 initial value once (init values are never compressed)."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    job = start_job(BYTES, 1, 2, env={"PSNODE_SHM": "0"}, tmp=tmp_path,
                    args=[json.dumps(params), str(ready), str(go)])
    try:
        wait_for_file(tmp_path / "ready0")
        full = 4 * (1 << 22)
        payload = full * ratio
        per_push = wait_for(lambda: next((float(line.split()[1]) for line in job.workers[0].out.splitlines()
                                          if line.startswith("PUSHBYTES")), None), 10, "the worker's figure")
        assert payload <= per_push <= payload * 1.01 + 1024, (per_push, payload)

        def servers_in() -> float | None:   # heartbeats (every 0.2 s) carry the servers' counters
            rows = [n for n in scheduler_status(job.scheduler, job.job_id).to_body()["nodes"] if n["role"] == "server"]
            total = sum(n["bytes_in"] for n in rows)
            return total if len(rows) == 2 and total >= full + 5 * payload else None
        total = wait_for(servers_in, 10, "the servers' counters")
        assert total <= full * 1.01 + 5 * (payload * 1.01 + 1024) + 64 * 1024, (total, payload)
    finally:
        go.touch()
        wait_job(job, 30)
    ok(job)


MISMATCH = """
import sys, numpy as np, psnode
kv = psnode.kv.create('dist_sync')
kv.init('w', np.zeros(100, np.float32))
if kv.rank == 1:
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
kv.push('w', np.ones(100, np.float32))
kv.pull('w')
print('NOT REACHED', flush=True)
kv.close()
"""


def test_settings_mismatch_between_workers_is_an_error(tmp_path) -> None:
    job = run_job(MISMATCH, 2, 1, tmp=tmp_path, timeout=60)
    errs = "\n".join(w.err for w in job.workers)
    assert "NOT REACHED" not in "\n".join(w.out for w in job.workers), job.describe()
    assert any(w.code not in (0, None) for w in job.workers), job.describe()
    # whichever push came second is refused, naming its worker and both settings
    first = ("worker 1 pushes with gradient compression {'type': '2bit', 'threshold': 0.5}, but worker 0 "
             "pushes with none (uncompressed float32)")
    second = ("worker 0 pushes with gradient compression none (uncompressed float32), but worker 1 pushes "
              "with {'type': '2bit', 'threshold': 0.5}")
    assert first in errs or second in errs, job.describe()
    assert "ConfigError" in errs and "kv.set_gradient_compression with the same settings" in errs


ASYNC_MISMATCH = """
import sys, time, numpy as np, psnode
from psnode.errors import ConfigError
kv = psnode.kv.create('dist_async')
kv.init('w', np.zeros(100, np.float32))
if kv.rank == 0:
    kv.push('w', np.ones(100, np.float32)); kv.pull('w')     # worker 0's settings are recorded first
kv.barrier()
if kv.rank == 1:
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    try:
        for i in range(50):
            kv.push('w', np.ones(100, np.float32)); time.sleep(0.02)
        print('NOT RAISED', flush=True)
    except ConfigError as e:
        print('RAISED', flush=True)
    try:
        kv.close()
        print('CLOSED', flush=True)
    except ConfigError as e:
        print('CLOSE RAISED', e, flush=True)
else:
    kv.close()
"""


def test_an_async_push_refused_for_its_settings_ends_in_an_error_at_close_not_a_hang(tmp_path) -> None:
    """dist_async: worker 1's pushes, compressed where worker 0's are not, are refused; the refusal
    is raised by a later push, and close() raises it again at once instead of sending the refused
    pushes (which never arrive) again and again."""
    job = run_job(ASYNC_MISMATCH, 2, 1, tmp=tmp_path, timeout=60)
    out = job.workers[1].out
    assert "RAISED" in out and "NOT RAISED" not in out, job.describe()
    assert "CLOSE RAISED server 0: worker 1 pushes with gradient compression" in out, job.describe()
    assert "a push the server refused is never applied" in out, job.describe()
    ok(job)
