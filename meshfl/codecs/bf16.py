"""bfloat16: the upper 16 bits of float32, rounded to nearest even.

bfloat16 keeps float32's 8-bit exponent and 8 significant bits (Kalamkar et al., "A Study
of BFLOAT16 for Deep Learning Training", 2019). Rounding works on the float32 bit pattern
``b`` (IEEE 754 round-to-nearest, ties to even)::

    h = (b + 0x7FFF + ((b >> 16) & 1)) >> 16

Finite inputs that would round up to infinity (|x| > 3.3895e38) saturate to the largest
finite bfloat16, ``±0x7F7F``. Error bound: ``|x̂ − x| ≤ 2⁻⁸ |x|`` for normal ``x`` (the
unit roundoff of an 8-bit significand; saturation stays within it) and ``≤ 2⁻¹³⁴`` for
float32 subnormals.

Payload layout: ``u16 bits[n]``, little-endian, C order (``2n`` bytes, no header).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from meshfl.codecs.base import Codec, CodecTag, check_finite_float32, check_payload, check_shape
from meshfl.errors import CodecError

__all__ = ["BFloat16", "bf16_bits"]

_EXPONENT_MASK = 0x7F80
_MAX_FINITE = 0x7F7F


def bf16_bits(flat: np.ndarray) -> np.ndarray:
    """Round finite float32 values to bfloat16 bit patterns (uint16), saturating.

    Parameters
    ----------
    flat : np.ndarray
        float32, shape (n,), finite.

    Returns
    -------
    np.ndarray
        uint16, shape (n,).

    """
    bits = flat.view(np.uint32)
    rounded = bits + np.uint32(0x7FFF)
    rounded += (bits >> np.uint32(16)) & np.uint32(1)
    high = (rounded >> np.uint32(16)).astype(np.uint16)
    overflow = (high & np.uint16(_EXPONENT_MASK)) == _EXPONENT_MASK
    if bool(overflow.any()):
        high[overflow] = (high[overflow] & np.uint16(0x8000)) | np.uint16(_MAX_FINITE)
    return high


class BFloat16(Codec):
    """bfloat16 codec, spec ``"bf16"``, tag 4; ratio exactly 2. Deterministic, stateless."""

    tag: ClassVar[int] = CodecTag.BF16
    name: ClassVar[str] = "bf16"

    def encode(self, x: np.ndarray) -> bytes:
        """Round ``x`` to bfloat16 (nearest even, saturating) and return its ``2n`` bytes.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        flat = check_finite_float32(x).reshape(-1)
        return bf16_bits(flat).astype("<u2").tobytes()

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Widen the bfloat16 bits to float32 (exact).

        Raises
        ------
        CodecError
            If the payload is not ``2 · prod(shape)`` bytes or holds a NaN/inf pattern.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        if len(buf) != 2 * n:
            raise CodecError(f"bf16 payload is {len(buf)} bytes, expected {2 * n} for {shape}")
        high = np.frombuffer(buf, dtype="<u2")
        if bool(((high & np.uint16(_EXPONENT_MASK)) == _EXPONENT_MASK).any()):
            raise CodecError("bf16 payload holds NaN or inf")
        return (high.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return 2.0: two bytes per element, no header."""
        return 2.0

    @property
    def spec(self) -> str:
        """``"bf16"``."""
        return "bf16"
