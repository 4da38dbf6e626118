"""How much of the gradient traffic psnode.torch hides behind backward (run under a launcher).

    mxdist launch -n 1 -s 1 tests/gpu/overlap_bench.py --device cuda
    python tests/gpu/overlap_bench.py --device cpu          # 'local' kvstore, for a smoke run

Model: ``--layers`` Linear(H, H) + ReLU blocks.  Times (median of ``--iters`` after warm-up, each
ending with the device synchronized), all on this worker:

* ``compute``: zero_grad + forward + backward, no push (the hooks idle under ``no_sync``);
* ``comm``: ``trainer.step()`` alone after a backward (device-to-host copies, pushes, pulls,
  copies back), with the step-time path;
* ``serial``: the full step (compute, then step) with ``overlap=False``;
* ``overlapped``: the full step with ``overlap=True`` (gradients leave while backward runs).

``hidden = (serial_t - overlapped_t) / min(compute, comm)``: the share of the shorter phase that the
pipeline hid (0: none; 1: all of it).  The batch is calibrated so compute is about comm (within
``--batch-min``..``--batch-max``).  Rank 0 prints one ``overlap:`` line with every figure.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

import psnode
import psnode.torch


def timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--batch-min", type=int, default=256)
    p.add_argument("--batch-max", type=int, default=131072)
    p.add_argument("--batch", type=int, default=0,
                   help="fixed batch (no calibration; needed with several workers, which must step alike)")
    args = p.parse_args()
    torch.manual_seed(0)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)

        def sync() -> None:
            torch.cuda.synchronize(device)
    else:
        device = torch.device(args.device)
        torch.set_num_threads(1)

        def sync() -> None:
            pass
    kind = "dist_sync" if os.environ.get("PSNODE_ROLE") else "local"
    kv = psnode.kv.create(kind)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    batch = args.batch or args.batch_min
    opt = psnode.optimizer.create("sgd", learning_rate=1e-6)
    serial_tr = psnode.torch.DistributedTrainer(model, kv, opt, prefix="serial.", overlap=False)
    overlap_tr = psnode.torch.DistributedTrainer(model, kv, opt, prefix="overlap.", overlap=True)
    x = torch.randn(batch, args.hidden, device=device)

    def backward() -> None:
        with overlap_tr.no_sync():                 # its hooks stay idle
            model.zero_grad(set_to_none=False)
            model(x).sum().backward()

    def step_alone() -> None:
        backward()
        sync()
        times["comm"].append(timed(serial_tr.step, sync))

    def serial() -> None:
        with overlap_tr.no_sync():
            serial_tr.zero_grad()
            model(x).sum().backward()
            serial_tr.step()

    def overlapped() -> None:
        overlap_tr.zero_grad()
        model(x).sum().backward()
        overlap_tr.step()

    def rounds(n: int) -> dict[str, float]:
        """``n`` interleaved rounds of the four measures (after one untimed round); medians."""
        for fn in (backward, serial, overlapped):
            fn()
        times.clear()
        times.update(compute=[], comm=[], serial=[], overlapped=[])
        for _ in range(n):
            times["compute"].append(timed(backward, sync))
            step_alone()
            times["serial"].append(timed(serial, sync))
            times["overlapped"].append(timed(overlapped, sync))
        return {k: statistics.median(v) for k, v in times.items()}

    times: dict[str, list[float]] = {}
    med = rounds(3)
    while not args.batch and med["compute"] < med["comm"] and batch < args.batch_max:     # calibrate: compute ~ comm
        batch = min(args.batch_max, max(batch * 2, int(batch * med["comm"] / med["compute"])))
        x = torch.randn(batch, args.hidden, device=device)
        med = rounds(3)
    med = rounds(args.iters)
    compute, comm, serial_t, overlapped_t = med["compute"], med["comm"], med["serial"], med["overlapped"]
    serial_tr.close()
    overlap_tr.close()
    hidden = (serial_t - overlapped_t) / min(compute, comm)
    mib = sum(q.numel() * q.element_size() for q in model.parameters()) / 2**20
    if kv.rank == 0:
        print(f"overlap: device={device} kvstore={kind} workers={kv.num_workers} servers={kv.num_servers} "
              f"params={mib:.0f}MiB batch={batch} compute_ms={compute * 1e3:.1f} comm_ms={comm * 1e3:.1f} "
              f"serial_ms={serial_t * 1e3:.1f} overlapped_ms={overlapped_t * 1e3:.1f} hidden={hidden:.2f}",
              flush=True)
    kv.close()


if __name__ == "__main__":
    main()
