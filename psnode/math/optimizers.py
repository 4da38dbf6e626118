"""Server-side optimizers: MXNet 1.x update rules on numpy arrays, in place.

Contract
--------
* ``create(name, **params)`` / ``from_spec(spec)`` build an :class:`Optimizer`; names are
  case-insensitive (``'SGD'`` == ``'sgd'``).  ``opt.to_spec()`` is a JSON-able
  ``{"name": ..., "params": {...}}`` holding only floats and None; ``from_spec`` is strict
  (exactly the keys ``name`` and ``params``, known parameters, right types, finite values
  in range) and ``from_spec(json.loads(json.dumps(opt.to_spec()))) == opt``.  Specs are
  the only way optimizers travel: never pickle.  Every invalid name, parameter or value
  raises :class:`~psnode.errors.ConfigError` naming the optimizer, the parameter, the bad
  value and what is accepted.
* ``state = opt.create_state(weight)`` then ``opt.update(weight, grad, state)`` changes
  ``weight`` and ``state`` in place, in ``weight``'s dtype.  ``grad`` is only read (it may be
  a read-only zmq buffer).  Work is done in cache-sized chunks with small scratch buffers, so
  a 64 MiB weight costs no 64 MiB temporaries.
* ``opt.update_rows(weight, rows, grad_rows, state)`` is MXNet's lazy row_sparse update:
  ``rows`` are sorted unique row indices of ``weight``'s first axis, ``grad_rows`` their
  gradient rows.  Only those rows of ``weight`` and of the state change, and weight decay
  is applied to those rows only.  For SGD without momentum this equals ``update`` with the
  dense gradient that is zero outside ``rows`` *on those rows*; with ``wd > 0`` the dense
  update would also shrink the other rows, the lazy one does not (as in MXNet).
* ``state.t`` counts update calls (dense or rows) for this key; Adam's bias correction uses it.
  A big state's memory is taken page by page as its rows are first written (:func:`lazy_zeros`):
  a row_sparse key's state occupies the pages of the rows updated so far.
* ``state_to_arrays`` / ``state_from_arrays`` convert a state to a flat ``dict`` of arrays
  (``t`` as a 0-d int64 array) for ``np.savez`` checkpoints, bit for bit.

Update rules (g is the gradient after ``rescale_grad`` and clipping to
``[-clip_gradient, clip_gradient]``; ``clip_gradient`` None or negative means no clipping):

* sgd:      ``w = (1 - lr*wd)*w - lr*g``; with momentum ``mom = momentum*mom - lr*wd*w - lr*g;
  w += mom``.
* adam:     ``t += 1; lr_t = lr*sqrt(1-beta2**t)/(1-beta1**t); g = clip(rescale*grad + wd*w);
  mean = beta1*mean + (1-beta1)*g; var = beta2*var + (1-beta2)*g*g;
  w -= lr_t*mean/(sqrt(var) + epsilon)``.
* adagrad:  ``history += g*g; w -= lr*(g/sqrt(history + eps) + wd*w)``.

Pure module: numpy only, no I/O, no threads.
"""
from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from psnode.errors import ConfigError, ShapeMismatch

__all__ = [
    "SGD",
    "AdaGrad",
    "Adam",
    "OptState",
    "Optimizer",
    "create",
    "from_spec",
    "lazy_zeros",
    "registered",
    "state_from_arrays",
    "state_to_arrays",
]

#: elements per chunk of the dense kernels (256 KiB of float32: stays in L2 cache).
CHUNK = 1 << 16


@dataclass(eq=False)
class OptState:
    """Per-key optimizer state: named arrays shaped like the weight, and the update count."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    t: int = 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


#: accepted ranges of parameter values: kind -> (test, description)
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "positive": (lambda x: x > 0, "a finite number > 0"),
    "non_negative": (lambda x: x >= 0, "a finite number >= 0"),
    "unit": (lambda x: 0 <= x < 1, "a number in [0, 1)"),
    "clip": (lambda x: True, "None or a finite number (negative: no clipping)"),
}


@dataclass(frozen=True)
class Param:
    """One optimizer parameter: its default and the kind of value accepted (``_RANGES``)."""

    default: float | None
    kind: str


_COMMON: dict[str, Param] = {
    "wd": Param(0.0, "non_negative"),
    "rescale_grad": Param(1.0, "positive"),
    "clip_gradient": Param(None, "clip"),
}
_ALIASES = {"lr": "learning_rate"}


class Optimizer:
    """Base class.  Subclasses set ``name``, ``PARAMS``, ``STATE`` and ``_kernel``."""

    name: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}
    STATE: ClassVar[tuple[str, ...]] = ()
    learning_rate: float
    wd: float
    rescale_grad: float
    clip_gradient: float | None

    def __init__(self, **params: Any) -> None:
        for key, value in _check_params(self.name, self._all_params(), params).items():
            setattr(self, key, value)

    @classmethod
    def _all_params(cls) -> dict[str, Param]:
        return {**cls.PARAMS, **_COMMON}

    @property
    def lr(self) -> float:
        """Alias of ``learning_rate`` (MXNet spelling)."""
        return self.learning_rate

    def params(self) -> dict[str, float | None]:
        """Every parameter by canonical name."""
        return {key: getattr(self, key) for key in self._all_params()}

    def to_spec(self) -> dict[str, Any]:
        """JSON-able ``{"name": ..., "params": {...}}``; inverse of :func:`from_spec`."""
        return {"name": self.name, "params": self.params()}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params() == self.params()  # type: ignore

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({inner})"

    # -- state --------------------------------------------------------------------------
    def state_names(self) -> tuple[str, ...]:
        """Names of the arrays :meth:`create_state` makes."""
        return self.STATE

    def create_state(self, weight: np.ndarray) -> OptState:
        """Fresh state for ``weight``: zero arrays of its shape and dtype, ``t = 0`` (big ones
        take memory page by page as rows are written: :func:`lazy_zeros`)."""
        _check_weight(weight)
        return OptState({n: lazy_zeros(weight.shape, weight.dtype) for n in self.state_names()})

    # -- updates ------------------------------------------------------------------------
    def update(self, weight: np.ndarray, grad: np.ndarray, state: OptState) -> None:
        """Dense update of ``weight`` and ``state`` in place; ``grad`` is never written."""
        _check_weight(weight)
        if grad.shape != weight.shape:
            raise ShapeMismatch(f"{self.name}: gradient shape {grad.shape} differs from "
                                f"weight shape {weight.shape}")
        self._check_state(weight, state)
        state.t += 1
        coef = self._coefficients(state.t)
        work = {n: state.arrays[n] for n in self.state_names()}
        w = weight if weight.flags.c_contiguous else np.ascontiguousarray(weight)
        self._run(w, grad, work, coef)
        if w is not weight:
            weight[...] = w

    def update_rows(self, weight: np.ndarray, rows: np.ndarray, grad_rows: np.ndarray,
                    state: OptState) -> None:
        """Lazy row_sparse update: only ``weight[rows]`` and the state's rows change."""
        _check_weight(weight)
        rows = _check_rows(weight, rows, grad_rows, self.name)
        self._check_state(weight, state)
        state.t += 1
        if rows.size == 0:
            return
        coef = self._coefficients(state.t)
        w = np.take(weight, rows, axis=0)  # gathered copies; the kernel is elementwise, so
        work = {n: np.take(state.arrays[n], rows, axis=0) for n in self.state_names()}  # results equal dense
        self._run(w, grad_rows, work, coef)
        weight[rows] = w
        for n, part in work.items():
            state.arrays[n][rows] = part

    def _run(self, w: np.ndarray, grad: np.ndarray, work: dict[str, np.ndarray],
             coef: float) -> None:
        """Apply the kernel chunk by chunk on flat views (``w`` and ``work`` C-contiguous)."""
        wf = w.reshape(-1)
        gf = np.ravel(grad)  # a view when contiguous; a read-only view stays read-only
        sf = {n: a.reshape(-1) for n, a in work.items()}
        size = min(wf.size, CHUNK)
        buf, buf2 = np.empty(size, w.dtype), np.empty(size, w.dtype)
        for lo in range(0, wf.size, CHUNK):
            hi = min(lo + CHUNK, wf.size)
            n = hi - lo
            self._kernel(wf[lo:hi], gf[lo:hi], {k: a[lo:hi] for k, a in sf.items()},
                         buf[:n], buf2[:n], coef)

    def _coefficients(self, t: int) -> float:
        """Per-call scalar (effective learning rate) computed once, before the chunks."""
        return self.learning_rate

    def _kernel(self, w: np.ndarray, grad: np.ndarray, s: dict[str, np.ndarray],
                buf: np.ndarray, buf2: np.ndarray, lr: float) -> None:
        raise NotImplementedError

    def _scaled_grad(self, grad: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out = clip(rescale_grad * grad)``."""
        np.multiply(grad, self.rescale_grad, out=out, casting="same_kind")
        return self._clip(out)

    def _clip(self, g: np.ndarray) -> np.ndarray:
        c = self.clip_gradient
        if c is not None and c >= 0:
            np.clip(g, -c, c, out=g)
        return g

    def _check_state(self, weight: np.ndarray, state: OptState) -> None:
        for n in self.state_names():
            a = state.arrays.get(n)
            if a is None or a.shape != weight.shape or a.dtype != weight.dtype:
                got = "missing" if a is None else f"{a.dtype}{list(a.shape)}"
                raise ShapeMismatch(
                    f"{self.name}: state array {n!r} is {got}, expected "
                    f"{weight.dtype}{list(weight.shape)}; use create_state(weight)")
            if not a.flags.c_contiguous or not a.flags.writeable:
                raise ShapeMismatch(f"{self.name}: state array {n!r} must be C-contiguous "
                                    "and writable")


#: state arrays of at least this many bytes are mapped in 4 KiB pages (see lazy_zeros)
LAZY_BYTES = 1 << 24


def lazy_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Zeros whose memory is taken 4 KiB page by 4 KiB page as they are written.  numpy maps big
    arrays in 2 MiB pages, so the state of a row_sparse key updated a few rows at a time (MXNet's
    lazy update) would soon occupy all of it; an anonymous mapping without huge pages occupies
    only the pages of the rows written.  Arrays under :data:`LAZY_BYTES` come from np.zeros."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes < LAZY_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(shape, dt)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mm, dt).reshape(shape)


_REGISTRY: dict[str, type[Optimizer]] = {}


def register(cls: type[Optimizer]) -> type[Optimizer]:
    """Class decorator: make ``cls`` available to :func:`create` under ``cls.name``."""
    _REGISTRY[cls.name.lower()] = cls
    return cls


def registered() -> list[str]:
    """Names of the known optimizers, sorted."""
    return sorted(_REGISTRY)


@register
class SGD(Optimizer):
    """SGD, optionally with momentum (MXNet ``sgd_update`` / ``sgd_mom_update``)."""

    name = "sgd"
    PARAMS: ClassVar[dict[str, Param]] = {
        "learning_rate": Param(0.01, "positive"),
        "momentum": Param(0.0, "unit"),
    }
    momentum: float

    def state_names(self) -> tuple[str, ...]:
        return ("mom",) if self.momentum != 0.0 else ()

    def _kernel(self, w, grad, s, buf, buf2, lr):  # type: ignore[override]
        g = self._scaled_grad(grad, buf)
        g *= -lr                                   # g = -lr * clip(rescale * grad)
        if "mom" not in s:
            if self.wd:
                w *= 1.0 - lr * self.wd
            w += g
            return
        mom = s["mom"]
        mom *= self.momentum
        mom += g
        if self.wd:
            np.multiply(w, -lr * self.wd, out=buf)
            mom += buf
        w += mom


@register
class Adam(Optimizer):
    """Adam (MXNet ``adam_update``; weight decay added to the gradient before clipping)."""

    name = "adam"
    STATE = ("mean", "var")
    PARAMS: ClassVar[dict[str, Param]] = {
        "learning_rate": Param(0.001, "positive"),
        "beta1": Param(0.9, "unit"),
        "beta2": Param(0.999, "unit"),
        "epsilon": Param(1e-8, "positive"),
    }
    beta1: float
    beta2: float
    epsilon: float

    def _coefficients(self, t: int) -> float:
        return self.learning_rate * math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)

    def _kernel(self, w, grad, s, buf, buf2, lr_t):  # type: ignore[override]
        g = buf
        np.multiply(grad, self.rescale_grad, out=g, casting="same_kind")
        if self.wd:
            np.multiply(w, self.wd, out=buf2)
            g += buf2
        self._clip(g)
        mean, var = s["mean"], s["var"]
        mean *= self.beta1
        np.multiply(g, 1.0 - self.beta1, out=buf2)
        mean += buf2
        var *= self.beta2
        np.multiply(g, g, out=g)
        g *= 1.0 - self.beta2
        var += g
        np.sqrt(var, out=g)
        g += self.epsilon
        np.divide(mean, g, out=g)
        g *= lr_t
        w -= g


@register
class AdaGrad(Optimizer):
    """AdaGrad (MXNet 1.x python ``AdaGrad``)."""

    name = "adagrad"
    STATE = ("history",)
    PARAMS: ClassVar[dict[str, Param]] = {
        "learning_rate": Param(0.01, "positive"),
        "eps": Param(1e-7, "positive"),
    }
    eps: float

    def _kernel(self, w, grad, s, buf, buf2, lr):  # type: ignore[override]
        g = self._scaled_grad(grad, buf)
        hist = s["history"]
        np.multiply(g, g, out=buf2)
        hist += buf2
        np.add(hist, self.eps, out=buf2)
        np.sqrt(buf2, out=buf2)
        g /= buf2
        if self.wd:
            np.multiply(w, self.wd, out=buf2)
            g += buf2
        g *= -lr
        w += g


# -- construction and specs -------------------------------------------------------------
def create(name: str, **params: Any) -> Optimizer:
    """The optimizer ``name`` (case-insensitive) with ``params``; ``lr`` means ``learning_rate``."""
    return _lookup(name)(**params)


def from_spec(spec: dict[str, Any]) -> Optimizer:
    """Inverse of :meth:`Optimizer.to_spec`; strict validation, ConfigError on any fault."""
    if not isinstance(spec, dict) or set(spec) != {"name", "params"}:
        shown = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        raise ConfigError(f"optimizer spec must be a dict with exactly the keys 'name' and "
                          f"'params', got {shown!r}")
    if not isinstance(spec["params"], dict):
        raise ConfigError(f"optimizer spec 'params' must be a dict, got "
                          f"{type(spec['params']).__name__}")
    return create(spec["name"], **spec["params"])


def _lookup(name: object) -> type[Optimizer]:
    cls = _REGISTRY.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ConfigError(f"unknown optimizer {name!r}; accepted: {', '.join(registered())}")
    return cls


def _check_params(owner: str, table: dict[str, Param], given: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters by canonical name, defaults filled in."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        canon = _ALIASES.get(key, key)
        if canon not in table:
            names = ", ".join(table) + "".join(
                f", {a} (alias of {c})" for a, c in _ALIASES.items() if c in table)
            raise ConfigError(f"optimizer {owner!r} has no parameter {key!r}; "
                              f"accepted: {names}")
        if canon in out:
            raise ConfigError(f"optimizer {owner!r}: parameter {canon!r} given twice "
                              f"(as {canon!r} and its alias)")
        out[canon] = _check_value(owner, canon, value, table[canon])
    for key, p in table.items():
        out.setdefault(key, p.default)
    if out.get("clip_gradient") is not None and out["clip_gradient"] < 0:
        out["clip_gradient"] = None
    return out


def _check_value(owner: str, key: str, value: Any, p: Param) -> float | None:
    test, accepted = _RANGES[p.kind]
    if value is None and p.kind == "clip":
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))
    if ok:
        value = float(value)
        ok = math.isfinite(value) and test(value)
    if not ok:
        raise ConfigError(f"optimizer {owner!r}: bad value {value!r} for parameter {key!r}; "
                          f"accepted: {accepted}")
    return value


# -- checkpoints --------------------------------------------------------------------------
def state_to_arrays(state: OptState) -> dict[str, np.ndarray]:
    """``{"t": int64 0-d, name: array...}`` for ``np.savez``.  Arrays are shared, not copied."""
    if "t" in state.arrays:
        raise ConfigError("optimizer state array may not be called 't' (reserved for the count)")
    return {"t": np.array(state.t, dtype=np.int64), **state.arrays}


def state_from_arrays(arrays: dict[str, np.ndarray]) -> OptState:
    """Inverse of :func:`state_to_arrays`.  Arrays are used as-is when C-contiguous and
    writable, otherwise copied."""
    t = arrays.get("t")
    if t is None or np.ndim(t) != 0 or not np.issubdtype(np.asarray(t).dtype, np.integer):
        raise ConfigError(f"optimizer state needs 't' as a 0-d integer array, got {t!r}")
    rest = {k: np.require(a, requirements=["C", "W"]) for k, a in arrays.items() if k != "t"}
    return OptState(rest, int(t))


# -- argument checks ---------------------------------------------------------------------
def _check_weight(weight: np.ndarray) -> None:
    if not isinstance(weight, np.ndarray) or not np.issubdtype(weight.dtype, np.floating):
        got = weight.dtype if isinstance(weight, np.ndarray) else type(weight).__name__
        raise ShapeMismatch(f"optimizer weight must be a floating-point ndarray, got {got}")


def _check_rows(weight: np.ndarray, rows: np.ndarray, grad_rows: np.ndarray,
                owner: str) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer) or rows.size == 0):
        raise ShapeMismatch(f"{owner}: rows must be a 1-d integer array, got "
                            f"{rows.dtype}{list(rows.shape)}")
    if weight.ndim == 0:
        raise ShapeMismatch(f"{owner}: update_rows needs a weight with at least 1 dim")
    want = (rows.size, *weight.shape[1:])
    if grad_rows.shape != want:
        raise ShapeMismatch(f"{owner}: grad_rows shape {grad_rows.shape} should be {want} "
                            f"for {rows.size} rows of weight {weight.shape}")
    if rows.size and (rows[0] < 0 or rows[-1] >= weight.shape[0]
                      or (rows.size > 1 and not np.all(rows[1:] > rows[:-1]))):
        raise ShapeMismatch(f"{owner}: rows must be sorted, unique and in [0, "
                            f"{weight.shape[0]}), got {rows[:8].tolist()}...")
    return rows.astype(np.int64, copy=False)
