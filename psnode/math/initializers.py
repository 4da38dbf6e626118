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

Pure module: numpy only, no I/O.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import numpy as np

from psnode.errors import ConfigError

__all__ = [
    "Constant",
    "Initializer",
    "Normal",
    "One",
    "Uniform",
    "Xavier",
    "Zero",
    "create",
    "from_spec",
    "registered",
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
        if arr.ndim >= 2 and arr.size == 0:
            return
        scale = self.scale_for(arr.shape)
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


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


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
