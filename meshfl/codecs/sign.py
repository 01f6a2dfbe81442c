"""Scaled sign (1-bit) compression.

One bit per element plus one scale, the mean magnitude::

    C(x) = (‖x‖₁ / n) · sign(x),   sign(0) = +1

Seide, Fu, Droppo, Li, Yu, "1-Bit Stochastic Gradient Descent and its Application to
Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014; Bernstein, Wang,
Azizzadenesheli, Anandkumar, "signSGD: Compressed Optimisation for Non-Convex
Problems", ICML 2018; the ``‖x‖₁/n`` scale is Karimireddy, Rebjock, Stich, Jaggi, "Error
Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019, Alg. 1.
Biased; a δ-contraction with ``‖x − C(x)‖² = ‖x‖² − ‖x‖₁²/n`` (δ = ‖x‖₁² / (n‖x‖²),
Karimireddy et al. 2019, Lemma 8). Mapping zeros to ``+scale`` leaves that identity
intact. Use it with error feedback, or inside CHOCO-SGD's difference compression.

Payload layout (little-endian)::

    f32  scale      mean |x| (0 for an all-zero or empty tensor)
    u8   bits[⌈n/8⌉] bit i (LSB first) set iff x_i < 0; padding bits zero
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import F32_MAX, Codec, CodecTag, as_float32, check_payload, check_shape
from meshfl.errors import CodecError

__all__ = ["Sign"]

_HEADER = struct.Struct("<f")


class Sign(Codec):
    """1-bit sign codec with a mean-magnitude scale; spec ``"sign"``, tag 8.

    Ratio ``4n / (4 + ⌈n/8⌉)``, about 32. Deterministic and stateless.
    """

    tag: ClassVar[int] = CodecTag.SIGN
    name: ClassVar[str] = "sign"

    def encode(self, x: np.ndarray) -> bytes:
        """Return the mean magnitude and the packed sign bits of ``x``.

        One pass for the scale (the sum of ``|x|`` in float64 is finite iff every element
        is, which doubles as the NaN/inf check) and one for the bits.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        flat = as_float32(x).reshape(-1)
        mag = np.abs(flat)
        with np.errstate(over="ignore", invalid="ignore"):
            total = float(np.add.reduce(mag))  # float32, pairwise
        if not np.isfinite(total):  # overflow of the float32 sum, or NaN/inf in x
            total = float(np.add.reduce(mag, dtype=np.float64))
            if not np.isfinite(total):
                raise CodecError("tensor contains NaN or inf; refusing to encode it")
        scale = total / flat.size if flat.size else 0.0
        bits = np.packbits(flat < 0, bitorder="little")
        return _HEADER.pack(scale) + bits.tobytes()

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild ``scale · (±1)``.

        Raises
        ------
        CodecError
            On a wrong length, a negative or non-finite scale, or set padding bits.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        expected = _HEADER.size + (n + 7) // 8
        if len(buf) != expected:
            raise CodecError(f"sign payload is {len(buf)} bytes, expected {expected} for {shape}")
        (scale,) = _HEADER.unpack_from(buf)
        if not (np.isfinite(scale) and scale >= 0.0):
            raise CodecError(f"sign payload has an invalid scale {scale!r}")
        if n % 8 and buf[-1] >> (n % 8):
            raise CodecError("sign payload has padding bits set")
        packed = np.frombuffer(buf, dtype=np.uint8, offset=_HEADER.size)
        bits = np.unpackbits(packed, count=n, bitorder="little")
        out = bits.astype(np.float32)
        if scale <= F32_MAX / 2:  # s − 2s·b is exact, and 2s does not overflow
            out *= np.float32(-2.0 * scale)
            out += np.float32(scale)
        else:
            out = np.where(bits.view(np.bool_), np.float32(-scale), np.float32(scale))
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (4 + ceil(n/8))`` (0.0 for an empty tensor)."""
        return 4.0 * numel / (_HEADER.size + (numel + 7) // 8) if numel else 0.0

    @property
    def spec(self) -> str:
        """``"sign"``."""
        return "sign"
