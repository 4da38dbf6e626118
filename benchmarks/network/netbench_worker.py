"""A worker of the rate-limited testbed (started by netbench.py inside a host's namespace).

argv: cases <cases-json> <quick 0|1>   the dense workload cases, one BENCHRESULT line per case
      mlp [example args...]            examples/mlp_numpy.py unchanged, its epochs timed

Environment: the ``PSNODE_*`` variables of the job, ``NETBENCH_COMPRESSION`` (a JSON object for
``kv.set_gradient_compression``, or ``{"type": "none"}``), ``NETBENCH_IFACE`` (the host's link,
whose byte counters each result reports), ``NETBENCH_PUSHPULL=1`` (timed rounds call
``kv.pushpull`` instead of ``push`` then ``pull``) and ``NETBENCH_TRACE`` (benchmarks/network/nbtrace.py).

A ``cases`` round on each worker: push the K gradients, pull the K aggregated values.  The
first round pushes ``rank + 1`` and checks the pulled value exactly: the mean over the workers of
what a server decodes from that push (``CompressionSpec.roundtrip``: ``rank + 1`` itself when
uncompressed).  Then warm-up and timed rounds; the link's tx/rx byte counters are read around the
timed rounds (the host's link carries this worker's traffic and its co-located server's).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psnode  # noqa: E402
from benchmarks.cases import Case, decode_cases, fail, report, summarize  # noqa: E402
from psnode.math.compression import CompressionSpec  # noqa: E402


def spec_from_env() -> CompressionSpec:
    return CompressionSpec.from_params(json.loads(os.environ.get("NETBENCH_COMPRESSION", '{"type": "none"}')))


def link_bytes() -> tuple[int, int]:
    """(tx, rx) bytes of this host's link so far."""
    base = Path("/sys/class/net") / os.environ.get("NETBENCH_IFACE", "eth0") / "statistics"
    return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def create_kv(spec: CompressionSpec) -> Any:
    kv = psnode.kv.create("dist_sync")
    if spec.active:
        if not hasattr(kv, "set_gradient_compression"):
            fail(f"compression {spec.type.value!r}: this psnode has no kv.set_gradient_compression yet "
                 f"(kv.set_gradient_compression missing); run with --compression none")
        kv.set_gradient_compression(spec.to_params())
    return kv


def dense_case(kv: Any, spec: CompressionSpec, c: Case, quick: bool) -> None:
    W, rank = kv.num_workers, kv.rank
    keys = [f"{c.name}/{i}" for i in range(c.keys)]
    kv.init(keys, [np.zeros(c.elems, np.float32) for _ in keys])
    grads = [np.full(c.elems, rank + 1, np.float32) for _ in keys]
    outs = [np.empty(c.elems, np.float32) for _ in keys]
    kv.barrier()
    kv.push(keys, grads)                        # check round
    kv.pull(keys, out=outs)
    decoded = [spec.roundtrip(np.full(1, r + 1, np.float32), spec.new_residual(1))[0] for r in range(W)]
    expect = np.float32(np.sum(np.array(decoded, np.float32), dtype=np.float32) / np.float32(W))
    for k, o in zip(keys, outs, strict=True):
        if not (o == expect).all():
            fail(f"{c.name} key {k}: pulled {o[:4]}..., expected {expect} ({spec.type.value})")
    warm, timed = c.warm(quick), c.timed(quick)
    pushpull = os.environ.get("NETBENCH_PUSHPULL") == "1"   # kv.pushpull instead of push then pull
    times = []
    tx0 = rx0 = 0
    for i in range(warm + timed):
        if i == warm:
            kv.barrier()
            tx0, rx0 = link_bytes()
        t0 = time.perf_counter()
        if pushpull:
            kv.pushpull(keys, grads, out=outs)
        else:
            kv.push(keys, grads)
            kv.pull(keys, out=outs)
        t1 = time.perf_counter()
        if i >= warm:
            times.append(t1 - t0)
    tx1, rx1 = link_bytes()
    kv.barrier()
    report(system="psnode", case=c.name, rank=rank, compression=spec.to_params(), bytes=2 * c.keys * c.nbytes,
           pushpull=pushpull, link_tx=(tx1 - tx0) / timed, link_rx=(rx1 - rx0) / timed, **summarize(times))


def cases(cases_json: str, quick: bool) -> None:
    spec = spec_from_env()
    kv = create_kv(spec)
    for c in decode_cases(cases_json):
        if c.kind != "dense":
            fail(f"netbench runs dense cases only; got {c.name}")
        dense_case(kv, spec, c, quick)
    kv.close()


def mlp(args: list[str]) -> None:
    """examples/mlp_numpy.py with ``args``; rank 0 reports every epoch's wall time."""
    sys.path.insert(0, str(ROOT / "examples"))
    import common
    import mlp_numpy

    base = common.Progress

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.marks = [time.perf_counter()]

        def epoch(self, epoch: int, loss: float, accuracy: float) -> None:
            self.marks.append(time.perf_counter())
            super().epoch(epoch, loss, accuracy)

        def done(self, accuracy: float) -> None:
            super().done(accuracy)
            if self.kv.rank == 0:
                report(system="mlp", case="mlp", rank=0, epochs=np.diff(self.marks).tolist(),
                       accuracy=accuracy, samples=self.samples)

    common.Progress = Timed
    spec = spec_from_env()
    sys.argv = ["mlp_numpy.py", *args]
    if spec.active:   # the example's own flag
        sys.argv += ["--compression", spec.type.value]
        if spec.thresholded:
            sys.argv += ["--compression-threshold", str(spec.threshold)]
    mlp_numpy.main()


if __name__ == "__main__":
    from benchmarks.network import nbtrace
    nbtrace.install("worker", int(os.environ.get("PSNODE_RANK", "0")))
    if sys.argv[1] == "cases":
        cases(sys.argv[2], sys.argv[3] == "1")
    elif sys.argv[1] == "mlp":
        mlp(sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} cases CASES-JSON QUICK | mlp [ARGS...]")
