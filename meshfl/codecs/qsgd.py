"""QSGD: unbiased stochastic quantization to ``s`` levels per sign.

Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS 2017, Sec. 3.1::

    Q_s(v_i) = ‖v‖₂ · sgn(v_i) · ξ_i(v, s)
    ξ_i = (l + 1)/s  with probability  p = |v_i| s/‖v‖₂ − l,   else  l/s,
    l = ⌊|v_i| s/‖v‖₂⌋ ∈ {0, …, s−1}

so ``E[Q_s(v)] = v`` (Lemma 3.1 (i)) and ``E‖Q_s(v) − v‖² ≤ min(n/s², √n/s) ‖v‖²``
(Lemma 3.1 (ii)). The norm is computed in float32 and raised to ``max|v_i|`` if rounding
left it below, which keeps ``E[Q] = v`` exactly for any such scale. The randomness comes
from the codec's own ``np.random.Generator`` (``seed`` makes it reproducible); the decoder
needs none. Only Elias coding of the levels is left out: levels are bit-packed.

Each element is one code of ``w = ⌈log₂(s + 1)⌉ + 1`` bits, ``code = l | sign << (w − 1)``
(sign 1 for negative), packed LSB first (:mod:`meshfl.codecs.bitpack`).

Payload layout (little-endian)::

    u16  s          levels, 1..65535
    f32  norm       the scale τ ≥ max|v_i| (0 for a zero tensor)
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
)
from meshfl.codecs.bitpack import pack_codes, packed_size, unpack_codes
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["QSGD", "code_width"]

_HEADER = struct.Struct("<Hf")
_MAX_LEVELS = 2**16 - 1


def code_width(levels: int) -> int:
    """Return bits per element: ``ceil(log2(levels + 1)) + 1`` (level bits plus a sign)."""
    return int(levels).bit_length() + 1


class QSGD(Codec):
    """Stochastic quantization to ``s`` levels; spec ``"qsgd:S"``, tag 6. Unbiased.

    Parameters
    ----------
    levels : int
        ``s``, the number of non-zero levels per sign, ``1 <= s <= 65535``.
    seed : int or None, default None
        Seed of the encoder's generator; ``None`` draws OS entropy. Not part of the spec.

    Raises
    ------
    CodecSpecError
        If ``levels`` or ``seed`` is out of range.

    """

    tag: ClassVar[int] = CodecTag.QSGD
    name: ClassVar[str] = "qsgd"
    __slots__ = ("_rng", "levels")

    def __init__(self, levels: int, seed: int | None = None) -> None:
        if (
            isinstance(levels, bool)
            or not isinstance(levels, int)
            or not 1 <= levels <= _MAX_LEVELS
        ):
            raise CodecSpecError(
                f"qsgd levels must be an int in [1, {_MAX_LEVELS}], got {levels!r}"
            )
        self.levels = levels
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
        s, width = self.levels, code_width(self.levels)
        mag = np.abs(flat)
        peak = float(mag.max()) if flat.size else 0.0
        if peak == 0.0:
            return _HEADER.pack(s, 0.0) + bytes(packed_size(flat.size, width))
        unit = mag / np.float32(peak)
        tau = peak * float(np.sqrt(np.add.reduce(np.square(unit), dtype=np.float64)))
        if tau > F32_MAX / 2:
            raise CodecError(f"qsgd cannot quantize a tensor of norm {tau:.3g} (> 1.7e38)")
        norm = max(np.float32(tau), np.float32(peak))
        factor = s / float(norm)
        if factor <= F32_MAX:
            ratio = mag * np.float32(factor)
        else:  # a subnormal norm: scale in float64
            ratio = (mag.astype(np.float64) * factor).astype(np.float32)
        level = np.floor(ratio)
        ratio -= level  # now the probability of rounding up
        level += self._rng.random(flat.size, dtype=np.float32) < ratio
        codes = np.minimum(level, s).astype(np.uint32)
        codes |= (flat < 0).astype(np.uint32) << np.uint32(width - 1)
        return _HEADER.pack(s, float(norm)) + pack_codes(codes, width)

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
        s, norm = _HEADER.unpack_from(buf)
        if s == 0:
            raise CodecError("qsgd payload has 0 levels")
        if not (0.0 <= norm <= F32_MAX / 2):
            raise CodecError(f"qsgd payload has an invalid norm {norm!r}")
        width = code_width(s)
        codes = unpack_codes(buf[_HEADER.size :], n, width)
        sign_bit = np.uint32(1 << (width - 1))
        level = codes & (sign_bit - np.uint32(1))
        if n and int(level.max()) > s:
            raise CodecError(f"qsgd payload holds a level above s = {s}")
        step = norm / s
        if step >= 2.0**-126:
            out = level.astype(np.float32) * np.float32(step)
        else:  # keep subnormal steps exact
            out = (level.astype(np.float64) * step).astype(np.float32)
        np.negative(out, out=out, where=(codes & sign_bit).astype(np.bool_))
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (6 + ceil(n·w/8))`` with ``w = code_width(s)`` (0.0 when empty)."""
        if numel == 0:
            return 0.0
        return 4.0 * numel / (_HEADER.size + packed_size(numel, code_width(self.levels)))

    @property
    def spec(self) -> str:
        """``"qsgd:S"``."""
        return f"qsgd:{self.levels}"
