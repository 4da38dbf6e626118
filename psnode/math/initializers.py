"""Weight initializers with MXNet semantics, on numpy arrays.

Contract
--------
* ``init(arr, rng=None)`` fills ``arr`` in place, in its own dtype, and returns it.  ``rng`` is
  a ``np.random.Generator`` (or a seed for ``np.random.default_rng``); None means fresh OS
  entropy.  With the same generator state the result is the same on every machine.
* Random initializers need a floating-point ``arr``; Zero/One/Constant take any dtype.
* Distributions:  ``Zero`` 0, ``One`` 1, ``Constant(value)``, ``Uniform(scale)`` U(-scale, scale)
  (``|x| <= scale`` holds with ``scale`` rounded to the array's dtype), ``Normal(sigma)``
  N(0, sigma), ``Xavier(rnd_type, factor_type, magnitude)``:
  ``hw = prod(shape[2:])`` (1 for 2-D), ``fan_in = shape[1]*hw``, ``fan_out = shape[0]*hw``,
  ``factor`` = ``(fan_in+fan_out)/2`` | ``fan_in`` | ``fan_out`` for ``avg`` | ``in`` | ``out``,
  ``scale = sqrt(magnitude/factor)``; ``uniform`` draws U(-scale, scale), ``gaussian``
  N(0, scale).  Xavier on an array with fewer than 2 dims raises ConfigError.
* ``create(name, **params)`` (case-insensitive; ``zeros``/``ones`` are aliases) and
  ``from_spec(init.to_spec())`` round-trip through JSON; ``to_spec()`` is
  ``{"name": ..., "params": {...}}``.  Unknown names, unknown parameters and bad values raise
  :class:`~psnode.errors.ConfigError` naming the initializer, the parameter, the value and what
  is accepted.

* Computed where the values live (MXNet's ``ps_initializer``): :func:`ps_initializer` wraps an
  initializer for ``kv.init``; each server fills its own part of the key (:class:`FillSpec`,
  JSON on the wire) with a counter-based generator (:class:`CounterRNG`), element ``i`` of
  the key a function of ``(seed, key, i)`` only, so the values do not depend on how many
  servers hold the key; :meth:`OnServers.values` computes the same values locally.

Pure module: numpy only, no I/O.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from psnode.errors import ConfigError

__all__ = [
    "Constant",
    "CounterRNG",
    "FillSpec",
    "Initializer",
    "Normal",
    "OnServers",
    "One",
    "Uniform",
    "Xavier",
    "Zero",
    "create",
    "from_spec",
    "ps_initializer",
    "registered",
    "stream_of",
]

_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class Initializer:
    """Base class: subclasses set ``name`` and implement ``_fill`` and ``params``."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        """No parameters (subclasses with parameters override this)."""

    def __call__(self, arr: np.ndarray, rng: np.random.Generator | int | None = None
                 ) -> np.ndarray:
        """Fill ``arr`` in place and return it."""
        if not isinstance(arr, np.ndarray):
            raise ConfigError(f"initializer {self.name!r} needs a numpy array, got "
                              f"{type(arr).__name__}")
        self._fill(arr, rng)
        return arr

    def _fill(self, arr: np.ndarray, rng: np.random.Generator | int | None) -> None:
        raise NotImplementedError

    def _fill_shaped(self, arr: np.ndarray, rng: Any, shape: tuple[int, ...]) -> None:
        """Fill ``arr``, a piece of an array of ``shape`` (scales that depend on the shape,
        Xavier's fans, use ``shape``, not ``arr.shape``)."""
        self._fill(arr, rng)

    def params(self) -> dict[str, Any]:
        """Constructor arguments by name (JSON-able)."""
        return {}

    def to_spec(self) -> dict[str, Any]:
        """JSON-able ``{"name": ..., "params": {...}}``; inverse of :func:`from_spec`."""
        return {"name": self.name, "params": self.params()}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params() == self.params()  # type: ignore

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({inner})"


_REGISTRY: dict[str, type[Initializer]] = {}
_ALIASES = {"zeros": "zero", "ones": "one"}


def register(cls: type[Initializer]) -> type[Initializer]:
    """Class decorator: make ``cls`` available to :func:`create` under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> list[str]:
    """Canonical names of the known initializers, sorted."""
    return sorted(_REGISTRY)


@register
class Zero(Initializer):
    """All zeros."""

    name = "zero"

    def _fill(self, arr, rng):  # type: ignore[override]
        arr.fill(0)


@register
class One(Initializer):
    """All ones."""

    name = "one"

    def _fill(self, arr, rng):  # type: ignore[override]
        arr.fill(1)


@register
class Constant(Initializer):
    """Every element set to ``value`` (cast to the array's dtype)."""

    name = "constant"

    def __init__(self, value: float) -> None:
        self.value = _number(self.name, "value", value, lambda x: True, "a finite number",
                             keep_int=True)

    def params(self) -> dict[str, Any]:
        return {"value": self.value}

    def _fill(self, arr, rng):  # type: ignore[override]
        arr.fill(self.value)


@register
class Uniform(Initializer):
    """U(-scale, scale)."""

    name = "uniform"

    def __init__(self, scale: float = 0.07) -> None:
        self.scale = _number(self.name, "scale", scale, _positive, "a finite number > 0")

    def params(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def _fill(self, arr, rng):  # type: ignore[override]
        _uniform(arr, self.scale, _rng(rng), self.name)


@register
class Normal(Initializer):
    """N(0, sigma): mean 0, standard deviation ``sigma``."""

    name = "normal"

    def __init__(self, sigma: float = 0.01) -> None:
        self.sigma = _number(self.name, "sigma", sigma, _positive, "a finite number > 0")

    def params(self) -> dict[str, Any]:
        return {"sigma": self.sigma}

    def _fill(self, arr, rng):  # type: ignore[override]
        _normal(arr, self.sigma, _rng(rng), self.name)


@register
class Xavier(Initializer):
    """Xavier/Glorot: scale from the array's fans, see the module docstring."""

    name = "xavier"
    RND_TYPES: ClassVar[tuple[str, ...]] = ("uniform", "gaussian")
    FACTOR_TYPES: ClassVar[tuple[str, ...]] = ("avg", "in", "out")

    def __init__(self, rnd_type: str = "uniform", factor_type: str = "avg",
                 magnitude: float = 3) -> None:
        self.rnd_type = _choice(self.name, "rnd_type", rnd_type, self.RND_TYPES)
        self.factor_type = _choice(self.name, "factor_type", factor_type, self.FACTOR_TYPES)
        self.magnitude = _number(self.name, "magnitude", magnitude, _positive,
                                 "a finite number > 0")

    def params(self) -> dict[str, Any]:
        return {"rnd_type": self.rnd_type, "factor_type": self.factor_type,
                "magnitude": self.magnitude}

    def scale_for(self, shape: tuple[int, ...]) -> float:
        """The uniform bound / gaussian sigma this initializer uses for ``shape``."""
        if len(shape) < 2:
            raise ConfigError(f"Xavier needs an array with at least 2 dims, got shape "
                              f"{tuple(shape)}; use Uniform/Normal/Zero for it")
        hw = math.prod(shape[2:])
        fan_in, fan_out = shape[1] * hw, shape[0] * hw
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[
            self.factor_type]
        if factor <= 0:
            raise ConfigError(f"Xavier: fan {self.factor_type!r} of shape {tuple(shape)} is 0")
        return math.sqrt(self.magnitude / factor)

    def _fill(self, arr, rng):  # type: ignore[override]
        self._fill_shaped(arr, rng, arr.shape)

    def _fill_shaped(self, arr: np.ndarray, rng: Any, shape: tuple[int, ...]) -> None:
        if len(shape) >= 2 and math.prod(shape) == 0:
            return
        scale = self.scale_for(shape)
        if self.rnd_type == "uniform":
            _uniform(arr, scale, _rng(rng), self.name)
        else:
            _normal(arr, scale, _rng(rng), self.name)


# -- construction and specs ------------------------------------------------------------
def create(name: str, **params: Any) -> Initializer:
    """The initializer called ``name`` (case-insensitive) built with ``params``."""
    key = name.lower() if isinstance(name, str) else None
    cls = _REGISTRY.get(_ALIASES.get(key, key)) if key is not None else None  # type: ignore
    if cls is None:
        raise ConfigError(f"unknown initializer {name!r}; accepted: "
                          f"{', '.join(registered())} (aliases: {', '.join(_ALIASES)})")
    sig = inspect.signature(cls.__init__).parameters
    accepted = [p for p in sig if p != "self"]
    for p in params:
        if p not in accepted:
            raise ConfigError(f"initializer {cls.name!r} has no parameter {p!r}; accepted: "
                              f"{', '.join(accepted) or 'none'}")
    for p in accepted:
        if sig[p].default is inspect.Parameter.empty and p not in params:
            raise ConfigError(f"initializer {cls.name!r} needs the parameter {p!r}")
    return cls(**params)


def from_spec(spec: dict[str, Any]) -> Initializer:
    """Inverse of :meth:`Initializer.to_spec`; strict validation, ConfigError on any fault."""
    if not isinstance(spec, dict) or set(spec) != {"name", "params"}:
        shown = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        raise ConfigError(f"initializer spec must be a dict with exactly the keys 'name' and "
                          f"'params', got {shown!r}")
    if not isinstance(spec["params"], dict):
        raise ConfigError(f"initializer spec 'params' must be a dict, got "
                          f"{type(spec['params']).__name__}")
    return create(spec["name"], **spec["params"])


# -- helpers ------------------------------------------------------------------------------
def _positive(x: float) -> bool:
    return x > 0


def _number(owner: str, key: str, value: Any, check: Any, accepted: str,
            keep_int: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))
    if ok:
        value = int(value) if keep_int and isinstance(value, (int, np.integer)) else float(value)
        ok = math.isfinite(value) and check(value)
    if not ok:
        raise ConfigError(f"initializer {owner!r}: bad value {value!r} for parameter "
                          f"{key!r}; accepted: {accepted}")
    return value


def _choice(owner: str, key: str, value: Any, accepted: tuple[str, ...]) -> str:
    if value not in accepted or not isinstance(value, str):
        raise ConfigError(f"initializer {owner!r}: bad value {value!r} for parameter "
                          f"{key!r}; accepted: {', '.join(map(repr, accepted))}")
    return value


def _rng(rng: Any) -> Any:
    """``rng`` itself (a numpy Generator or a :class:`CounterRNG`), else a Generator seeded by it."""
    return rng if isinstance(rng, (np.random.Generator, CounterRNG)) else np.random.default_rng(rng)


def _check_float(arr: np.ndarray, owner: str) -> None:
    if not np.issubdtype(arr.dtype, np.floating):
        raise ConfigError(f"initializer {owner!r} needs a floating-point array, got {arr.dtype}")


def _uniform(arr: np.ndarray, scale: float, rng: np.random.Generator, owner: str) -> None:
    """``arr[...] = U(-scale, scale)`` without a float64 temporary for float32/64 arrays."""
    _check_float(arr, owner)
    if arr.dtype in _FAST_DTYPES and arr.flags.c_contiguous:
        rng.random(out=arr, dtype=arr.dtype)  # [0, 1)
        arr *= 2.0 * scale
        arr -= scale
    else:
        arr[...] = rng.uniform(-scale, scale, size=arr.shape)


def _normal(arr: np.ndarray, sigma: float, rng: np.random.Generator, owner: str) -> None:
    """``arr[...] = N(0, sigma)`` without a float64 temporary for float32/64 arrays."""
    _check_float(arr, owner)
    if arr.dtype in _FAST_DTYPES and arr.flags.c_contiguous:
        rng.standard_normal(out=arr, dtype=arr.dtype)
        arr *= sigma
    else:
        arr[...] = rng.normal(0.0, sigma, size=arr.shape)


# -- values computed where they live (MXNet's ps_initializer) --------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 16        # elements per step of CounterRNG (its scratch stays in cache)
MAX_SEED = (1 << 63) - 1


class CounterRNG:
    """Counter-based random numbers: draw ``i`` of a stream is a function of ``(stream, i)``
    alone (SplitMix64 of ``stream + (i + 1) * golden``), so any piece of a long sequence is
    computed without the rest.  ``start`` is the index of the next draw; each call consumes one
    draw per element it returns.  Normals come from Box-Muller on one draw per element (its
    high bits give the radius, the low bits the angle); float32 results are computed in
    float32, float64 ones in float64.  Implements the parts of ``np.random.Generator`` the
    initializers use (``random``, ``standard_normal``, ``uniform``, ``normal``); works in
    chunks with scratch buffers of its own."""

    _steps: np.ndarray | None = None     # (j + 1) * golden for j < _CHUNK, shared (read-only)

    def __init__(self, stream: int, start: int = 0) -> None:
        self.stream = int(stream) & _MASK64
        self.start = int(start)
        self._z = np.empty(0, np.uint64)
        self._tmp = np.empty(0, np.uint64)
        self._scratch: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {}

    def _bits(self, n: int) -> np.ndarray:
        """The next ``n`` (at most ``_CHUNK``) draws as uint64 (a scratch buffer)."""
        steps = CounterRNG._steps
        if steps is None:
            steps = np.arange(1, _CHUNK + 1, dtype=np.uint64)
            steps *= _GOLDEN
            steps.flags.writeable = False
            CounterRNG._steps = steps
        if self._z.size < n:
            self._z, self._tmp = np.empty(n, np.uint64), np.empty(n, np.uint64)
        z, tmp = self._z[:n], self._tmp[:n]
        np.add(steps[:n], np.uint64((self.stream + self.start * int(_GOLDEN)) & _MASK64), out=z)
        self.start += n
        for shift, mult in ((_S30, _MIX1), (_S27, _MIX2)):
            np.right_shift(z, shift, out=tmp)
            z ^= tmp
            z *= mult
        np.right_shift(z, _S31, out=tmp)
        z ^= tmp
        return z

    def _floats(self, dtype: np.dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
        bufs = self._scratch.get(dtype)
        if bufs is None or bufs[0].size < n:
            bufs = self._scratch[dtype] = (np.empty(n, dtype), np.empty(n, dtype))
        return bufs[0][:n], bufs[1][:n]

    def _each(self, out: np.ndarray, make: Any) -> np.ndarray:
        flat = out.reshape(-1)
        for lo in range(0, flat.size, _CHUNK):
            piece = flat[lo:lo + _CHUNK]
            make(self._bits(piece.size), piece)
        return out

    @staticmethod
    def _out(size: Any, dtype: Any, out: np.ndarray | None) -> np.ndarray:
        if out is not None:
            if not out.flags.c_contiguous or out.dtype not in _FAST_DTYPES:
                raise ConfigError("CounterRNG fills C-contiguous float32 or float64 arrays")
            return out
        dt = np.dtype(dtype)
        if dt not in _FAST_DTYPES:
            raise ConfigError(f"CounterRNG draws float32 or float64, not {dt}")
        return np.empty(() if size is None else size, dt)

    def random(self, size: Any = None, dtype: Any = np.float64, out: np.ndarray | None = None) -> Any:
        """Uniform on [0, 1): 24 bits of the draw for float32, 53 for float64."""
        arr = self._out(size, dtype, out)
        wide = arr.dtype == np.float64
        scale = arr.dtype.type(2.0 ** (-53 if wide else -24))
        shift = np.uint64(11 if wide else 40)

        def make(z: np.ndarray, piece: np.ndarray) -> None:
            np.right_shift(z, shift, out=z)
            np.multiply(z, scale, out=piece, casting="unsafe")
        self._each(arr, make)
        return arr if out is not None or size is not None else arr.item()

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: np.ndarray | None = None) -> Any:
        """N(0, 1) by Box-Muller (see the class docstring)."""
        arr = self._out(size, dtype, out)
        ft = arr.dtype.type
        bits = 32 if arr.dtype == np.float64 else 24
        unit = ft(2.0 ** -bits)
        mask = np.uint64((1 << bits) - 1)
        high = np.uint64(64 - bits)

        def make(z: np.ndarray, piece: np.ndarray) -> None:
            radius, angle = self._floats(arr.dtype, z.size)
            np.bitwise_and(z, mask, out=self._tmp[:z.size])
            np.multiply(self._tmp[:z.size], ft(2 * math.pi) * unit, out=angle, casting="unsafe")
            np.right_shift(z, high, out=z)
            z += np.uint64(1)                     # (0, 1]: the log is finite
            np.multiply(z, unit, out=radius, casting="unsafe")
            np.log(radius, out=radius)
            radius *= ft(-2)
            np.sqrt(radius, out=radius)
            np.cos(angle, out=angle)
            np.multiply(radius, angle, out=piece)
        self._each(arr, make)
        return arr if out is not None or size is not None else arr.item()

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None) -> Any:
        return low + (high - low) * self.random(size)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        return loc + scale * self.standard_normal(size)


def stream_of(seed: int, key: int | str) -> int:
    """The CounterRNG stream of ``key`` under ``seed`` (the same in every process: a hash of
    both as JSON, so the int key 3 and the str key '3' differ)."""
    digest = hashlib.blake2b(json.dumps([int(seed), key]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class FillSpec:
    """How a server computes its part of a key: the initializer, the seed, the key's whole
    ``shape`` and ``start``, the flat index of the part's first element.  Element ``i`` of the
    key (row-major) is a function of ``(seed, key, i)`` and the initializer alone: row ``r`` of
    a table has the same values whichever server holds it and however many there are.
    Travels as JSON (:meth:`to_json`, :meth:`from_json`), never pickled."""

    init: Initializer
    seed: int
    shape: tuple[int, ...]
    start: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"init": self.init.to_spec(), "seed": self.seed, "shape": list(self.shape), "start": self.start}

    @classmethod
    def from_json(cls, spec: Any) -> FillSpec:
        """Strict inverse of :meth:`to_json`; ConfigError naming what is wrong."""
        if not isinstance(spec, dict) or set(spec) != {"init", "seed", "shape", "start"}:
            shown = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
            raise ConfigError(f"a server-side init spec has the keys init, seed, shape and start, got {shown!r}")
        seed, shape, start = spec["seed"], spec["shape"], spec["start"]
        if type(seed) is not int or not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"server-side init: seed must be an integer in 0..2**63-1, not {str(seed)[:40]!r}")
        if type(shape) is not list or len(shape) > 32 or any(type(d) is not int or d < 0 for d in shape):
            raise ConfigError(f"server-side init: bad shape {str(shape)[:60]}")
        if type(start) is not int or not 0 <= start <= math.prod(shape):
            raise ConfigError(f"server-side init: start {str(start)[:40]!r} is outside the key")
        return cls(from_spec(spec["init"]), seed, tuple(shape), start)

    def check(self, dtype: Any) -> None:
        """ConfigError if the initializer cannot fill a key of this shape and ``dtype``
        (random ones need float32/float64; Xavier needs 2 dims)."""
        dt = np.dtype(dtype)
        random = not isinstance(self.init, (Zero, One, Constant))
        if random and dt not in _FAST_DTYPES:
            raise ConfigError(f"initializer {self.init.name!r} computed on the servers fills float32 or "
                              f"float64 keys, not {dt}")
        self.init._fill_shaped(np.empty(min(1, math.prod(self.shape)), dt), CounterRNG(0), self.shape)

    def fill(self, key: int | str, flat: np.ndarray, offset: int = 0) -> np.ndarray:
        """``flat`` (1-d, C-contiguous) = the key's elements ``start + offset`` onwards."""
        rng = CounterRNG(stream_of(self.seed, key), self.start + offset)
        self.init._fill_shaped(flat, rng, self.shape)
        return flat


@dataclass(frozen=True)
class OnServers:
    """An initializer the servers run (MXNet's ``ps_initializer``): ``kv.init(key, template,
    psnode.init.ps_initializer(init))`` creates the key with each server computing its own
    part (:class:`FillSpec`), so no worker ever holds the values."""

    init: Initializer
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.init, Initializer):
            raise ConfigError(f"ps_initializer takes a psnode.init initializer, not {type(self.init).__name__}")
        if type(self.seed) is not int or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"ps_initializer: seed must be an integer in 0..2**63-1, not {self.seed!r}")

    def part(self, shape: tuple[int, ...], start: int = 0) -> FillSpec:
        """The spec of the part of a key of ``shape`` starting at flat element ``start``."""
        return FillSpec(self.init, self.seed, tuple(int(d) for d in shape), int(start))

    def values(self, key: int | str, shape: tuple[int, ...], dtype: Any = np.float32,
               rows: Any = None) -> np.ndarray:
        """The values the servers compute for ``key`` (rows ``rows`` of it only, if given),
        computed here: for checks and references on small keys."""
        shape = tuple(int(d) for d in shape)
        spec = self.part(shape)
        spec.check(dtype)
        if rows is None:
            return spec.fill(key, np.empty(math.prod(shape), dtype)).reshape(shape)
        width = math.prod(shape[1:])
        out = np.empty((len(rows), width), dtype)
        for i, r in enumerate(np.asarray(rows, np.int64).reshape(-1)):
            spec.fill(key, out[i], int(r) * width)
        return out.reshape((len(out), *shape[1:]))


def ps_initializer(init: Initializer, seed: int = 0) -> OnServers:
    """``init`` computed on the servers, element by element from ``(seed, key, index)``
    (MXNet's ``mxnet.contrib.ndarray.ps_initializer``; see :class:`OnServers`)."""
    return OnServers(init, seed)
