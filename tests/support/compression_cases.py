"""What the gradient compression cluster tests push, and the values they must pull (closed form).

Shared by the worker scripts (imported as ``tests.support.compression_cases``) and the tests.  Every
gradient element is a multiple of 1/8 in [-2, 2] plus a multiple of 2^-13 (at most 3), so every
value involved -- residuals, decoded payloads (2bit: +-t or 0; 1bit: +-1; fp16: the gradient
rounded to float16, which drops the 2^-13 part above 1/4), sums, averages, SGD updates with
learning rate 1/4 and momentum 1/2 -- is exact in float32 (a few more than 16 significant bits):
the expectation is computed here with plain numpy, element by element, with no rounding to
argue about.

Keys (with ``PSNODE_BIG_ARRAY_BOUND=1000``): ``s1`` and ``s2`` are small (in one bucket of a
dist_sync job, at offsets that are not whole 2bit/1bit words), ``big`` (2501 elements) is split
over both servers into parts whose sizes are not whole words either.
"""
from __future__ import annotations

import numpy as np

from psnode.math.compression import CompressionSpec

SHAPES: dict[str, tuple[int, ...]] = {"s1": (37,), "s2": (3, 7), "big": (2501,)}
KEYS = list(SHAPES)
STEPS = 6
INIT = 0.5
LR, MOMENTUM = 0.25, 0.5
BOUND = "1000"


def gradient(key: str, rank: int, step: int) -> np.ndarray:
    """Worker ``rank``'s gradient of ``key`` at ``step`` (1, 2, ...)."""
    rng = np.random.default_rng([rank, step, KEYS.index(key)])
    coarse = rng.integers(-16, 17, size=SHAPES[key]) / 8
    return (coarse + rng.integers(-3, 4, size=SHAPES[key]) * 2.0**-13).astype(np.float32)


def expected(params: dict, workers: int, aggregator: str, optimizer: str, steps: int = STEPS,
             mode: str = "dist_sync") -> dict[str, list[np.ndarray]]:
    """Per key, the value after each round (dist_sync) or, for dist_async, [the value after
    every push of every worker] (only meaningful with plain SGD: its updates commute)."""
    spec = CompressionSpec.from_params(params)
    out: dict[str, list[np.ndarray]] = {}
    for k, shape in SHAPES.items():
        residuals = [spec.new_residual(int(np.prod(shape))) for _ in range(workers)]
        value = np.full(shape, INIT, np.float32)
        mom = np.zeros(shape, np.float32)
        rounds = []
        for step in range(1, steps + 1):
            decoded = [spec.roundtrip(gradient(k, w, step), residuals[w]) for w in range(workers)]
            if mode == "dist_async":       # each push applied on arrival: w -= lr * g
                for d in decoded:
                    value = value - np.float32(LR) * d
                continue
            agg = np.sum(decoded, axis=0, dtype=np.float32)
            if aggregator == "average":
                agg = agg / np.float32(workers)
            if optimizer == "sgd":
                mom = np.float32(MOMENTUM) * mom - np.float32(LR) * agg
                value = value + mom
            else:
                value = agg
            rounds.append(value.copy())
        out[k] = rounds if mode == "dist_sync" else [value]
    return out
