"""Linear int8 quantization with one symmetric max-abs scale per chunk.

Chunk ``c`` (elements ``[c·B, (c+1)·B)`` of the flattened tensor, ``B`` the chunk size)
gets the scale ``s_c = max_{i∈c} |x_i| / 127`` (rounded to float32, never above it) and

    q_i = round(x_i / s_c) ∈ [−127, 127],   x̂_i = q_i · s_c,   |x̂_i − x_i| ≤ s_c / 2

(plus float32 rounding of the product). This is the symmetric per-block scheme of
Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022, Sec. 2; a
smaller chunk follows outliers more closely at 4/B bytes per element.

Payload layout (little-endian)::

    u32  B              chunk size in elements
    f32  scales[C]      C = ceil(n / B), each finite and >= 0
    i8   q[n]           each in [−127, 127], C order
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
    per_chunk,
)
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["DEFAULT_CHUNK", "Int8"]

DEFAULT_CHUNK = 1024
_HEADER = struct.Struct("<I")
_MAX_CHUNK = 2**32 - 1


class Int8(Codec):
    """int8 quantization with a per-chunk scale; spec ``"int8"`` or ``"int8:CHUNK"``, tag 5.

    Parameters
    ----------
    chunk : int, default 1024
        Elements per scale, ``1 <= chunk < 2**32``.

    Raises
    ------
    CodecSpecError
        If ``chunk`` is not an int in range.

    """

    tag: ClassVar[int] = CodecTag.INT8
    name: ClassVar[str] = "int8"
    __slots__ = ("chunk",)

    def __init__(self, chunk: int = DEFAULT_CHUNK) -> None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= _MAX_CHUNK:
            raise CodecSpecError(f"int8 chunk must be an int in [1, {_MAX_CHUNK}], got {chunk!r}")
        self.chunk = chunk

    def encode(self, x: np.ndarray) -> bytes:
        """Quantize ``x`` chunk by chunk; see the module docstring for the layout.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        flat = check_finite_float32(x).reshape(-1)
        n, b = flat.size, self.chunk
        full = (n // b) * b
        mag = np.abs(flat)
        peaks = np.empty(-(-n // b), dtype=np.float32)
        if full:
            peaks[: n // b] = mag[:full].reshape(-1, b).max(axis=1)
        if full < n:
            peaks[-1] = mag[full:].max()
        scales = (peaks.astype(np.float64) / 127.0).astype(np.float32)
        # Never let 127 · s exceed the float32 range (decode multiplies in float32).
        high = scales.astype(np.float64) * 127.0 > F32_MAX
        scales[high] = np.nextafter(scales[high], np.float32(0))
        divisor = np.where(scales > 0, scales, np.float32(1))
        ratio = mag  # reuse the buffer
        with np.errstate(under="ignore"):
            per_chunk(np.divide, flat, divisor, b, ratio)
        np.rint(ratio, out=ratio)
        np.clip(ratio, -127, 127, out=ratio)
        body: bytes = scales.astype("<f4").tobytes() + ratio.astype(np.int8).tobytes()
        return _HEADER.pack(b) + body

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild ``q · s`` per chunk.

        Raises
        ------
        CodecError
            On a short header, chunk size 0, a wrong length, a negative or non-finite
            scale, a code of −128, or a product that overflows.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        if len(buf) < _HEADER.size:
            raise CodecError(f"int8 payload of {len(buf)} bytes is shorter than its header")
        (b,) = _HEADER.unpack_from(buf)
        if b == 0:
            raise CodecError("int8 payload has chunk size 0")
        chunks = -(-n // b)
        expected = _HEADER.size + 4 * chunks + n
        if len(buf) != expected:
            raise CodecError(f"int8 payload is {len(buf)} bytes, expected {expected} for {shape}")
        scales = np.frombuffer(buf, dtype="<f4", count=chunks, offset=_HEADER.size)
        if not bool(np.isfinite(scales).all()) or bool((scales < 0).any()):
            raise CodecError("int8 payload holds a negative or non-finite scale")
        q = np.frombuffer(buf, dtype=np.int8, offset=_HEADER.size + 4 * chunks)
        if bool((q == -128).any()):
            raise CodecError("int8 payload holds the code -128, which the encoder never writes")
        if bool(scales.size) and float(scales.max()) * 127.0 > F32_MAX:
            raise CodecError("int8 payload holds a scale whose products overflow float32")
        out = np.empty(n, dtype=np.float32)
        per_chunk(np.multiply, q, scales, b, out)
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (4 + 4·ceil(n/B) + n)`` (0.0 for an empty tensor)."""
        if numel == 0:
            return 0.0
        return 4.0 * numel / (_HEADER.size + 4 * (-(-numel // self.chunk)) + numel)

    @property
    def spec(self) -> str:
        """``"int8"`` for the default chunk, else ``"int8:CHUNK"``."""
        return "int8" if self.chunk == DEFAULT_CHUNK else f"int8:{self.chunk}"
