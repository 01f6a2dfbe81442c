"""QSGD: unbiased stochastic quantization to ``s`` levels per sign.

Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS 2017, Sec. 3.1::

    Q_s(v_i) = ‖v‖₂ · sgn(v_i) · ξ_i(v, s)
    ξ_i = (l + 1)/s  with probability  p = |v_i| s/‖v‖₂ − l,   else  l/s,
    l = ⌊|v_i| s/‖v‖₂⌋ ∈ {0, …, s−1}

so ``E[Q_s(v)] = v`` (Lemma 3.1 (i)) and ``E‖Q_s(v) − v‖² ≤ min(d/s², √d/s) ‖v‖²``
(Lemma 3.1 (ii)) where ``d`` is the length of ``v``. As in the paper's experiments
(Sec. 5, "bucket size"), ``v`` is each bucket of ``d`` consecutive elements (default 512)
with its own norm; one bucket for a whole 10M-element tensor would give a relative error
of √(√n/s) ≈ 14 at s = 16. Each norm is computed in float64 and raised to the bucket's
``max|v_i|`` if float32 rounding left it below, which keeps ``E[Q] = v`` exactly. The
randomness comes from the codec's own ``np.random.Generator`` (``seed`` makes it
reproducible); the decoder needs none. Elias coding of the levels is left out: levels
are bit-packed.

Each element is one code of ``w = ⌈log₂(s + 1)⌉ + 1`` bits, ``code = l | sign << (w − 1)``
(sign 1 for negative), packed LSB first (:mod:`meshfl.codecs.bitpack`).

Payload layout (little-endian)::

    u16  s          levels, 1..65535
    u32  d          bucket size in elements, >= 1
    f32  norms[B]   B = ceil(n/d); bucket b's scale τ_b ≥ max|v_i| over the bucket
    ...  codes      ceil(n·w/8) bytes
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import (
    F32_MAX,
    Codec,
    CodecTag,
    check_finite_float32,
    check_payload,
    check_shape,
    make_rng,
    per_chunk,
    reduce_chunks,
)
from meshfl.codecs.bitpack import pack_codes, packed_size, unpack_codes
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["DEFAULT_BUCKET", "QSGD", "code_width"]

_HEADER = struct.Struct("<HI")
DEFAULT_BUCKET = 512
_MAX_BUCKET = 2**32 - 1
_MAX_LEVELS = 2**16 - 1


def code_width(levels: int) -> int:
    """Return bits per element: ``ceil(log2(levels + 1)) + 1`` (level bits plus a sign)."""
    return int(levels).bit_length() + 1


class QSGD(Codec):
    """Stochastic quantization to ``s`` levels; spec ``"qsgd:S"`` or ``"qsgd:S:BUCKET"``, tag 6.

    Unbiased: ``E[decode(encode(x))] = x``.

    Parameters
    ----------
    levels : int
        ``s``, the number of non-zero levels per sign, ``1 <= s <= 65535``.
    bucket : int, default 512
        Elements per norm, ``1 <= bucket < 2**32``.
    seed : int or None, default None
        Seed of the encoder's generator; ``None`` draws OS entropy. Not part of the spec.

    Raises
    ------
    CodecSpecError
        If ``levels`` or ``seed`` is out of range.

    """

    tag: ClassVar[int] = CodecTag.QSGD
    name: ClassVar[str] = "qsgd"
    __slots__ = ("_rng", "bucket", "levels")

    def __init__(self, levels: int, bucket: int = DEFAULT_BUCKET, seed: int | None = None) -> None:
        if (
            isinstance(levels, bool)
            or not isinstance(levels, int)
            or not 1 <= levels <= _MAX_LEVELS
        ):
            raise CodecSpecError(
                f"qsgd levels must be an int in [1, {_MAX_LEVELS}], got {levels!r}"
            )
        if isinstance(bucket, bool) or not isinstance(bucket, int) or not 0 < bucket <= _MAX_BUCKET:
            raise CodecSpecError(f"qsgd bucket must be an int in [1, 2**32), got {bucket!r}")
        self.levels = levels
        self.bucket = bucket
        self._rng = make_rng(seed)

    def encode(self, x: np.ndarray) -> bytes:
        """Quantize ``x`` stochastically; see the module docstring for the layout.

        Raises
        ------
        CodecError
            If ``x`` is not floating, holds NaN/inf, or ``‖x‖₂ > 1.7e38`` (its
            reconstruction could overflow float32).

        """
        flat = check_finite_float32(x).reshape(-1)
        s, d, width = self.levels, self.bucket, code_width(self.levels)
        if flat.size == 0:
            return _HEADER.pack(s, d)
        mag = np.abs(flat)
        peaks = reduce_chunks(np.maximum, mag, d)
        unit = np.empty_like(mag)
        per_chunk(np.divide, mag, np.where(peaks > 0, peaks, np.float32(1)), d, unit)
        sums = reduce_chunks(np.add, np.square(unit, out=unit), d, dtype=np.float64)
        tau = peaks.astype(np.float64) * np.sqrt(sums)
        if float(tau.max()) > F32_MAX / 2:
            raise CodecError(f"qsgd cannot quantize a bucket of norm {tau.max():.3g} (> 1.7e38)")
        norms = np.maximum(tau.astype(np.float32), peaks)
        ratio = unit  # reuse the buffer: |v_i| / τ_b · s
        per_chunk(np.divide, mag, np.where(norms > 0, norms, np.float32(1)), d, ratio)
        ratio *= np.float32(s)
        level = np.floor(ratio)
        ratio -= level  # now the probability of rounding up
        level += self._rng.random(flat.size, dtype=np.float32) < ratio
        codes = np.minimum(level, s).astype(np.uint32)
        codes |= (flat < 0).astype(np.uint32) << np.uint32(width - 1)
        body: bytes = norms.astype("<f4").tobytes() + pack_codes(codes, width)
        return _HEADER.pack(s, d) + body

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild ``τ · sign · l / s``.

        Raises
        ------
        CodecError
            On a short header, ``s = 0``, a negative, non-finite or too large norm, a
            wrong length, set padding bits, or a level above ``s``.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        if len(buf) < _HEADER.size:
            raise CodecError(f"qsgd payload of {len(buf)} bytes is shorter than its header")
        s, d = _HEADER.unpack_from(buf)
        if s == 0 or d == 0:
            raise CodecError(f"qsgd payload has {s} levels and bucket size {d}")
        buckets = -(-n // d)
        start = _HEADER.size + 4 * buckets
        if len(buf) < start:
            raise CodecError("qsgd payload is truncated inside its norms")
        norms = np.frombuffer(buf, dtype="<f4", count=buckets, offset=_HEADER.size)
        if not bool(((norms >= 0) & (norms <= F32_MAX / 2)).all()):
            raise CodecError("qsgd payload holds a negative, non-finite or too large norm")
        width = code_width(s)
        codes = unpack_codes(buf[start:], n, width)
        sign_bit = np.uint32(1 << (width - 1))
        level = codes & (sign_bit - np.uint32(1))
        if n and int(level.max()) > s:
            raise CodecError(f"qsgd payload holds a level above s = {s}")
        out = level.astype(np.float32)
        out *= np.float32(1.0 / s)
        per_chunk(np.multiply, out, norms, d, out)
        np.negative(out, out=out, where=(codes & sign_bit).astype(np.bool_))
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (6 + 4·ceil(n/d) + ceil(n·w/8))``, ``w = code_width(s)``; 0.0 if empty."""
        if numel == 0:
            return 0.0
        norms = 4 * (-(-numel // self.bucket))
        return 4.0 * numel / (_HEADER.size + norms + packed_size(numel, code_width(self.levels)))

    @property
    def spec(self) -> str:
        """``"qsgd:S"`` for the default bucket, else ``"qsgd:S:BUCKET"``."""
        if self.bucket == DEFAULT_BUCKET:
            return f"qsgd:{self.levels}"
        return f"qsgd:{self.levels}:{self.bucket}"
