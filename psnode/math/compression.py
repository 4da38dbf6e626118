"""Gradient compression: MXNet's ``set_gradient_compression`` rules, pure numpy, no I/O.

A :class:`CompressionSpec` is validated from the user's dict (:meth:`CompressionSpec.from_params`,
MXNet's argument) and travels as a short exact string with each push (:attr:`CompressionSpec.tag`,
in the grammar psnode.protocol.comptag defines and checks; :meth:`CompressionSpec.from_tag` is the
spec of a tag it parsed), never pickled.  A worker keeps one :class:`Residual` per key
(``spec.new_residual(n)``; None for the stateless types) and calls
``spec.compress(grad, residual)`` for every push; a server calls ``spec.decompress(packed, n)``
or ``spec.accumulate(acc, packed)`` and aggregates float32 as for any gradient.  ``'local'``
calls ``spec.roundtrip(grad, residual)``: the same arithmetic in one process.

Types (the rules are MXNet's ``src/kvstore/gradient_compression-inl.h``, element by element in
float32, bit for bit):

``2bit`` (threshold ``t`` > 0, default 0.5)
    ``r += g``; ``r >= t``: send ``+t``, ``r -= t``; else ``r <= -t``: send ``-t``, ``r += t``;
    else send 0.  Element ``i`` is 2 bits of byte ``i // 4`` of the payload, the first element in
    the two most significant bits: ``11`` is ``+t``, ``10`` is ``-t``, ``00`` (and ``01``) is 0.
    16 elements per 32-bit word; the payload is ``uint8[4 * ceil(n / 16)]``, padding bits 0.
``1bit`` (threshold ``t``, any finite value, default 0.5; MXNet 2.0's rule: MXNet 1.x has only 2bit)
    ``r += g``; ``r > t``: send ``+1``, ``r -= 1``; else send ``-1``, ``r += 1``.  The values
    sent are +-1 whatever ``t`` is (``t`` only decides the sign).  Element ``i`` is bit
    ``7 - i % 8`` of byte ``i // 8`` (set: +1); 32 elements per word; ``uint8[4 * ceil(n / 32)]``.
``fp16`` (no parameter; what BytePS and Horovod call fp16 compression; not in MXNet)
    The float32 gradient rounded to float16 (nearest even; beyond +-65504 it becomes +-inf, as a
    hardware conversion does); no residual.  The payload is ``float16[n]``; servers add it into
    a float32 sum.
``none``
    The float32 gradient itself.

A key split over servers is compressed part by part: part ``[lo, hi)`` of the gradient with
``residual.part(lo, hi)`` (a view of the same residual), each part padded to whole words on its
own.  Every rule is element-wise, so the values a server decodes are those of compressing the
whole array; only the padding differs (at most one word per part).

Bytes on the wire per push of an ``n``-element part: :meth:`CompressionSpec.nbytes` (``4n``
none, ``2n`` fp16, ``4 ceil(n/16)`` 2bit, ``4 ceil(n/32)`` 1bit); a split key:
:meth:`CompressionSpec.push_nbytes`.  Pulls are never compressed (MXNet's behaviour).

Errors: a bad user dict raises :class:`ConfigError` naming the field and the accepted values;
a payload of the wrong size :class:`ProtocolError`; a gradient that is not
float32, or a residual of another size, :class:`ShapeMismatch`.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from psnode.errors import ConfigError, ProtocolError, ShapeMismatch

DEFAULT_THRESHOLD = 0.5
CHUNK = 1 << 16  # elements per pass: the temporaries stay in the CPU cache (a multiple of 32)

_F32 = np.dtype(np.float32)
_EXAMPLE = "{'type': '2bit', 'threshold': 0.5}"


class CompressionType(str, Enum):
    NONE = "none"
    ONEBIT = "1bit"
    TWOBIT = "2bit"
    FP16 = "fp16"


_ACCEPTED = ", ".join(repr(t.value) for t in CompressionType)
_THRESHOLDED = (CompressionType.ONEBIT, CompressionType.TWOBIT)
#: elements per 32-bit payload word (1bit, 2bit); the payload dtype of the others (none, fp16)
_PER_WORD = {CompressionType.ONEBIT: 32, CompressionType.TWOBIT: 16}
_ITEM: dict[CompressionType, np.dtype] = {CompressionType.NONE: np.dtype(np.float32),
                                          CompressionType.FP16: np.dtype(np.float16)}


class ParsedTag(Protocol):
    """A push's compression tag as psnode.protocol.comptag parses it (its CompressionTag)."""

    @property
    def type(self) -> str: ...

    @property
    def threshold(self) -> float: ...


@dataclass
class Residual:
    """A worker's per-key compression state: float32, one element per gradient element."""

    data: np.ndarray

    @property
    def size(self) -> int:
        return int(self.data.size)

    def part(self, lo: int, hi: int) -> Residual:
        """Elements ``[lo, hi)``: a view, so compressing a part updates this residual."""
        return Residual(self.data[lo:hi])


def _threshold(value: Any, kind: CompressionType) -> float:
    """The float32 value of a user threshold (MXNet parses it as a C float)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.number)):
        raise ConfigError(f"gradient compression: 'threshold' must be a number; got {value!r}")
    try:
        t = float(np.float32(float(value)))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"gradient compression: 'threshold' must be a number; got {value!r}") from None
    if not math.isfinite(t):
        raise ConfigError(f"gradient compression: 'threshold' must be finite in float32; got {value!r}")
    if kind is CompressionType.TWOBIT and t <= 0:
        raise ConfigError(f"gradient compression: 'threshold' must be greater than 0 for 2bit; got {value!r}")
    return t


@dataclass(frozen=True)
class CompressionSpec:
    """A validated compression setting; ``threshold`` is a float32 value (0.0 when unused)."""

    type: CompressionType = CompressionType.NONE
    threshold: float = 0.0

    # ------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, params: Any) -> CompressionSpec:
        """MXNet's ``compression_params``: ``{'type': '2bit', 'threshold': 0.5}``,
        ``{'type': '1bit'}``, ``{'type': 'fp16'}`` (``'none'`` turns compression off).

        ``type`` is required; ``threshold`` (1bit, 2bit only) defaults to 0.5 and may be a
        number or a numeric string, as MXNet passes strings.  Unknown fields are refused
        (MXNet ignores them, so a misspelt ``threshold`` silently meant 0.5).
        """
        if not isinstance(params, Mapping):
            raise ConfigError(f"gradient compression expects a dict like {_EXAMPLE}; "
                              f"got {type(params).__name__} {params!r}"[:300])
        if "type" not in params:
            raise ConfigError(f"gradient compression: the dict has no 'type' field (accepted: {_ACCEPTED}); "
                              f"example: {_EXAMPLE}")
        raw = params["type"]
        kind = next((t for t in CompressionType if t.value == raw), None) if isinstance(raw, str) else None
        if kind is None:
            raise ConfigError(f"gradient compression: 'type' is {raw!r}; accepted: {_ACCEPTED}")
        allowed = ("type", "threshold") if kind in _THRESHOLDED else ("type",)
        for field in params:
            if field not in allowed:
                fields = ", ".join(repr(f) for f in allowed)
                raise ConfigError(f"gradient compression: unknown field {field!r} for type {kind.value!r}; "
                                  f"accepted fields: {fields}")
        if kind not in _THRESHOLDED:
            return cls(kind)
        return cls(kind, _threshold(params.get("threshold", DEFAULT_THRESHOLD), kind))

    def to_params(self) -> dict[str, Any]:
        """The user-level dict that :meth:`from_params` maps to this spec."""
        return {"type": self.type.value, "threshold": self.threshold} if self.thresholded else {"type": self.type.value}

    @property
    def tag(self) -> str:
        """The tag of each compressed push, in its exact form (psnode.protocol.comptag's grammar):
        ``"2bit:0.5"``, ``"1bit:-1.0"``, ``"fp16"``."""
        return f"{self.type.value}:{self.threshold!r}" if self.thresholded else self.type.value

    @classmethod
    def from_tag(cls, tag: ParsedTag) -> CompressionSpec:
        """The spec of a tag psnode.protocol.comptag parsed (and so checked): the inverse of :attr:`tag`."""
        kind = CompressionType(tag.type)
        return cls(kind, float(tag.threshold)) if kind in _THRESHOLDED else cls(kind)

    # ------------------------------------------------------------ properties and sizes
    @property
    def active(self) -> bool:
        return self.type is not CompressionType.NONE

    @property
    def thresholded(self) -> bool:
        return self.type in _THRESHOLDED

    @property
    def wire_dtype(self) -> np.dtype:
        """The dtype of the payload array."""
        return _ITEM.get(self.type, np.dtype(np.uint8))

    def packed_size(self, n: int) -> int:
        """Elements of the payload for an ``n``-element gradient (part)."""
        per_word = _PER_WORD.get(self.type)
        return n if per_word is None else 4 * (-(-n // per_word))

    def nbytes(self, n: int) -> int:
        """Bytes of the payload pushed for an ``n``-element gradient (part)."""
        return self.packed_size(n) * self.wire_dtype.itemsize

    def push_nbytes(self, part_sizes: Sequence[int]) -> int:
        """Bytes of the payloads of one push of a key cut into parts of these sizes."""
        return sum(self.nbytes(n) for n in part_sizes)

    def ratio(self, n: int) -> float:
        """float32 bytes / payload bytes for an ``n``-element gradient (16 for big 2bit ones)."""
        return 4 * n / self.nbytes(n) if n else 1.0

    def new_residual(self, n: int) -> Residual | None:
        """The zero state of a key of ``n`` elements (None: this type keeps no state)."""
        return Residual(np.zeros(n, np.float32)) if self.thresholded else None

    def check_key(self, key: Any, dtype: Any, sparse: bool) -> None:
        """Raise ConfigError when compression is on and ``key`` cannot be compressed."""
        if not self.active:
            return
        if sparse:
            raise ConfigError(f"key {key!r} is row_sparse: gradient compression ({self.type.value}) applies "
                              f"to dense float32 keys only (MXNet does not compress row_sparse keys either)")
        if np.dtype(dtype) != _F32:
            raise ConfigError(f"key {key!r} holds {np.dtype(dtype)}: gradient compression ({self.type.value}) "
                              f"applies to float32 keys only")

    def check_packed(self, packed: np.ndarray, n: int) -> None:
        """Raise ProtocolError unless ``packed`` is a payload of an ``n``-element part."""
        want = self.packed_size(n)
        if packed.dtype != self.wire_dtype or packed.ndim != 1 or packed.size != want:
            raise ProtocolError(f"{self.type.value} payload for {n} elements must be {self.wire_dtype}[{want}]; "
                                f"got {packed.dtype}{list(packed.shape)}")

    # ------------------------------------------------------------ the work
    def compress(self, grad: np.ndarray, residual: Residual | None, out: np.ndarray | None = None) -> np.ndarray:
        """The payload of ``grad`` (float32, any shape, read in C order; not modified), written
        into ``out`` when given (a contiguous ``wire_dtype[packed_size(n)]``, e.g. a push slot
        in shared memory); the residual (1bit, 2bit) is updated in place."""
        g = _flat(grad)
        n = g.size
        want = self.packed_size(n)
        if out is None:
            out = np.empty(want, self.wire_dtype)
        elif out.dtype != self.wire_dtype or out.shape != (want,) or not out.flags.c_contiguous:
            raise ShapeMismatch(f"{self.type.value} payload of {n} elements goes into a contiguous "
                                f"{self.wire_dtype}[{want}]; got {out.dtype}{list(out.shape)}")
        if self.thresholded:
            if residual is None or residual.data.dtype != _F32 or residual.size != n:
                got = "none" if residual is None else f"{residual.data.dtype}[{residual.size}]"
                raise ShapeMismatch(f"{self.type.value} compression of {n} elements needs a float32[{n}] "
                                    f"residual; got {got}")
            fill = _quantize_2bit if self.type is CompressionType.TWOBIT else _quantize_1bit
            with np.errstate(over="ignore", invalid="ignore"):   # inf and NaN go through as in MXNet
                fill(g, residual.data.reshape(-1), np.float32(self.threshold), out)
            return out
        with np.errstate(over="ignore"):
            for lo, hi in _chunks(n):
                np.copyto(out[lo:hi], g[lo:hi], casting="same_kind")
        return out

    def decompress(self, packed: np.ndarray, n: int, out: np.ndarray | None = None) -> np.ndarray:
        """The float32 values (``n`` of them) a payload stands for, into ``out`` if given."""
        self.check_packed(packed, n)
        if out is None:
            out = np.empty(n, np.float32)
        elif out.dtype != _F32 or out.size != n or not out.flags.c_contiguous:
            raise ShapeMismatch(f"decompress into float32[{n}] (contiguous); got {out.dtype}{list(out.shape)}")
        flat = out.reshape(-1)
        if self.thresholded:
            _dequantize(packed, self._table(), flat)
        else:
            np.copyto(flat, packed)
        return out

    def accumulate(self, acc: np.ndarray, packed: np.ndarray, scale: float = 1.0) -> None:
        """``acc += decompress(packed, acc.size)`` in place, in float32, then (``scale`` != 1)
        ``acc *= scale``, chunk by chunk without a full temporary: bit-identical to the whole
        array passes (psnode.math.aggregation's fold_scaled rule)."""
        n = acc.size
        self.check_packed(packed, n)
        if acc.dtype != _F32 or not acc.flags.c_contiguous:
            raise ShapeMismatch(f"accumulate into a contiguous float32 array; got {acc.dtype}")
        flat = acc.reshape(-1)
        table = self._table() if self.thresholded else None
        per_byte = 1 if table is None else table.shape[1]
        scratch = np.empty(min(n, CHUNK), np.float32)
        for lo, hi in _chunks(n):
            tmp = scratch[:hi - lo]
            if table is None:
                np.copyto(tmp, packed[lo:hi])
            else:
                _dequantize(packed[lo // per_byte:], table, tmp)
            part = flat[lo:hi]
            np.add(part, tmp, out=part)
            if scale != 1.0:
                np.multiply(part, scale, out=part, casting="unsafe")

    def roundtrip(self, grad: np.ndarray, residual: Residual | None) -> np.ndarray:
        """What a server decodes from this push: ``decompress(compress(grad, residual))``,
        shaped like ``grad`` (the ``'local'`` store's arithmetic)."""
        g = np.asarray(grad)
        return self.decompress(self.compress(g, residual), g.size).reshape(g.shape)

    def _table(self) -> np.ndarray:
        if self.type is CompressionType.TWOBIT:
            return _table_2bit(self.threshold)
        return _table_1bit()


# ---------------------------------------------------------------- kernels

def _flat(grad: Any) -> np.ndarray:
    g = np.asarray(grad)
    if g.dtype != _F32:
        raise ShapeMismatch(f"gradient compression applies to float32 gradients; got {g.dtype}")
    return g.reshape(-1)  # a view when contiguous, else a C-order copy


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, CHUNK):
        yield lo, min(n, lo + CHUNK)


def _quantize_2bit(g: np.ndarray, res: np.ndarray, t: np.float32, out: np.ndarray) -> None:
    """MXNet's quantize_2bit over every element; ``out`` (uint8, whole words) is fully written."""
    n = g.size
    m = min(n, CHUNK)
    pos, neg, sent = np.empty(m, np.bool_), np.empty(m, np.bool_), np.empty(m, np.bool_)
    sign = np.empty(m, np.int8)
    step = np.empty(m, np.float32)
    words = out.view(">u2")  # 8 elements per big-endian 16-bit word: bytes in element order
    spread = _spread()
    nt = -t
    for lo, hi in _chunks(n):
        k = hi - lo
        r, p, q, z, i, s = res[lo:hi], pos[:k], neg[:k], sent[:k], sign[:k], step[:k]
        np.add(r, g[lo:hi], out=r)
        np.greater_equal(r, t, out=p)
        np.less_equal(r, nt, out=q)
        np.subtract(p.view(np.int8), q.view(np.int8), out=i)  # +1, -1, 0
        np.copyto(s, i)
        np.multiply(s, t, out=s)                                # +t, -t, 0: exactly what is sent
        np.subtract(r, s, out=r)                                # r - t, r - (-t) == r + t, r - 0 == r
        np.logical_or(p, q, out=z)
        # element j of a byte: bits (7-2j, 6-2j) = (sent nonzero, sent positive); packbits puts
        # 8 elements in a byte MSB first, spread moves bit b of that byte to bit 2b+1 of 16
        hi_bits = np.take(spread, np.packbits(z), mode="clip")
        lo_bits = np.take(spread, np.packbits(p), mode="clip")
        np.bitwise_or(hi_bits, lo_bits >> 1, out=hi_bits)
        words[lo // 8:lo // 8 + hi_bits.size] = hi_bits
    out[-(-n // 4):] = 0  # the padding of the last word


def _quantize_1bit(g: np.ndarray, res: np.ndarray, t: np.float32, out: np.ndarray) -> None:
    """MXNet's quantize_1bit over every element; ``out`` (uint8, whole words) is fully written."""
    n = g.size
    m = min(n, CHUNK)
    bit = np.empty(m, np.bool_)
    sign = np.empty(m, np.int8)
    step = np.empty(m, np.float32)
    for lo, hi in _chunks(n):
        k = hi - lo
        r, b, i, s = res[lo:hi], bit[:k], sign[:k], step[:k]
        np.add(r, g[lo:hi], out=r)
        np.greater(r, t, out=b)
        np.left_shift(b.view(np.int8), 1, out=i)
        np.subtract(i, np.int8(1), out=i)                       # +1 or -1: what is sent
        np.copyto(s, i)
        np.subtract(r, s, out=r)                                # r - 1 or r - (-1) == r + 1
        packed = np.packbits(b)                                 # MSB first: element 0 -> 0x80
        out[lo // 8:lo // 8 + packed.size] = packed
    out[-(-n // 8):] = 0


@functools.lru_cache(maxsize=1)
def _spread() -> np.ndarray:
    """uint16[256]: bit ``b`` of the index moved to bit ``2b + 1``."""
    x = np.arange(256)
    table = np.zeros(256, np.uint16)
    for b in range(8):
        table |= (((x >> b) & 1) << (2 * b + 1)).astype(np.uint16)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=64)
def _table_2bit(t: float) -> np.ndarray:
    """byte -> its 4 values: code ``11`` +t, ``10`` -t, ``00`` and ``01`` 0 (MXNet's dequantize)."""
    codes = (np.arange(256)[:, None] >> np.array([6, 4, 2, 0])) & 3
    table = np.where(codes == 3, np.float32(t), np.where(codes == 2, np.float32(-t), np.float32(0)))
    table = table.astype(np.float32)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=1)
def _table_1bit() -> np.ndarray:
    """byte -> its 8 values: bit set +1, clear -1."""
    bits = (np.arange(256)[:, None] >> np.arange(7, -1, -1)) & 1
    table = np.where(bits == 1, np.float32(1), np.float32(-1)).astype(np.float32)
    table.flags.writeable = False
    return table


def _dequantize(packed: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` = value of element ``i`` of ``packed`` (elements from the start of ``packed``)."""
    n = out.size
    per = table.shape[1]
    whole = n // per
    if whole:
        np.take(table, packed[:whole], axis=0, out=out[:whole * per].reshape(whole, per), mode="clip")
    rest = n - whole * per
    if rest:
        out[whole * per:] = table[packed[whole], :rest]
