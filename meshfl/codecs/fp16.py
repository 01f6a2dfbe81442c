"""IEEE half precision with a per-tensor power-of-two scale.

A plain float32 → float16 cast overflows above 65 504 and loses relative precision below
2⁻¹⁴ ≈ 6.1e-5, where model deltas often live. The encoder therefore first multiplies by
``2^−e``, an exact operation, chosen so that ``max|x| · 2^−e ∈ [2¹⁴, 2¹⁵)``; this is the
loss-scaling trick of mixed-precision training (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, Sec. 3.2) applied per tensor. Rounding is IEEE round-to-nearest-even
(IEEE 754-2008, binary16: 11 significant bits).

    x̂_i = fp16(x_i · 2^−e) · 2^e,   |x̂_i − x_i| ≤ 2⁻¹¹ |x_i| + 2^(e−25)

and ``2^e ≤ 2⁻¹⁴ max|x|``, so the absolute term is at most ``2⁻³⁹ max|x|`` (elements
below that become zero; float32 subnormal rounding can add up to 2⁻¹⁴⁹). Values within
2⁻¹¹ of the float32 maximum saturate at ``32752 · 2¹¹³`` instead of rounding to infinity.

Payload layout (little-endian)::

    i16  e          power-of-two exponent (0 for an all-zero or empty tensor)
    f16  values[n]  x · 2^−e, C order
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import Codec, CodecTag, check_finite_float32, check_payload, check_shape
from meshfl.errors import CodecError

__all__ = ["Float16", "scale_pow2"]

_HEADER = struct.Struct("<h")
_TOP_EXPONENT = 15  # max|x| · 2^−e lands in [2^14, 2^15)
_MAX_E = 128 - 15
_MIN_E = -149 - 15
_SATURATE = np.float16(32752.0)  # largest float16 below 2^15


def scale_pow2(x: np.ndarray, e: int) -> np.ndarray:
    """Return ``x · 2^e`` for float32 ``x``, exact unless the result is subnormal.

    Multiplies by float32 powers of two in steps of at most 2^±126 (each a normal
    float32), so no intermediate overflows when the final result does not. Returns
    ``x`` itself when ``e == 0``.
    """
    out = x
    while e:
        step = max(-126, min(126, e))
        out = out * np.float32(2.0**step)
        e -= step
    return out


class Float16(Codec):
    """Half-precision codec with a per-tensor power-of-two scale; spec ``"fp16"``, tag 3.

    Ratio ``4n / (2 + 2n)``, about 2. Deterministic and stateless.
    """

    tag: ClassVar[int] = CodecTag.FP16
    name: ClassVar[str] = "fp16"

    def encode(self, x: np.ndarray) -> bytes:
        """Scale ``x`` by ``2^−e`` and round to float16; see the module docstring.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        flat = check_finite_float32(x).reshape(-1)
        peak = float(np.max(np.abs(flat))) if flat.size else 0.0
        e = 0 if peak == 0.0 else int(np.frexp(peak)[1]) - _TOP_EXPONENT
        with np.errstate(under="ignore"):
            half = scale_pow2(flat, -e).astype("<f2")
        if e == _MAX_E:  # 2^15 · 2^113 would overflow float32: saturate below it
            np.clip(half, -_SATURATE, _SATURATE, out=half)
        return _HEADER.pack(e) + half.tobytes()

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild the float32 tensor ``fp16 · 2^e``.

        Raises
        ------
        CodecError
            On a wrong length, an exponent outside what the encoder writes, or a value
            that is (or scales to) NaN/inf.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        if len(buf) != _HEADER.size + 2 * n:
            raise CodecError(
                f"fp16 payload is {len(buf)} bytes, expected {_HEADER.size + 2 * n} for {shape}"
            )
        (e,) = _HEADER.unpack_from(buf)
        if not _MIN_E <= e <= _MAX_E:
            raise CodecError(f"fp16 exponent {e} is outside [{_MIN_E}, {_MAX_E}]")
        half = np.frombuffer(buf, dtype="<f2", offset=_HEADER.size)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            out = scale_pow2(half.astype(np.float32), e)
        if not bool(np.isfinite(out).all()):
            raise CodecError("fp16 payload decodes to NaN or inf")
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (2 + 2n)`` (0.0 for an empty tensor)."""
        return 4.0 * numel / (_HEADER.size + 2 * numel) if numel else 0.0

    @property
    def spec(self) -> str:
        """``"fp16"``."""
        return "fp16"
