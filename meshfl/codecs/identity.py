"""The identity codec: raw little-endian float32, lossless."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from meshfl.codecs.base import Codec, CodecTag, check_finite_float32, check_shape
from meshfl.errors import CodecError

__all__ = ["Identity"]


class Identity(Codec):
    """Lossless codec: the payload is the tensor's float32 bytes, little-endian, C order.

    Payload layout: ``4 * numel`` bytes, nothing else. Spec ``"identity"`` (alias
    ``"fp32"``), wire tag 1, compression ratio 1.
    """

    tag: ClassVar[int] = CodecTag.IDENTITY
    name: ClassVar[str] = "identity"

    def encode(self, x: np.ndarray) -> bytes:
        """Return the raw ``'<f4'`` bytes of ``x`` (``4 * x.size`` bytes).

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        return check_finite_float32(x).tobytes()

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild the exact float32 tensor of ``shape`` from ``4 * prod(shape)`` bytes.

        Raises
        ------
        CodecError
            If the payload length is not ``4 * prod(shape)``, or a value is NaN/inf.

        """
        numel = check_shape(shape)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise CodecError(f"payload must be bytes, got {type(payload).__name__}")
        if len(payload) != 4 * numel:
            raise CodecError(
                f"identity payload is {len(payload)} bytes, expected {4 * numel} for shape {shape}"
            )
        out = np.frombuffer(payload, dtype="<f4").astype(np.float32).reshape(shape)
        if not bool(np.isfinite(out).all()):
            raise CodecError("identity payload decodes to NaN or inf")
        return out

    def estimate_ratio(self, numel: int) -> float:
        """Return 1.0: the payload is exactly as large as the float32 tensor."""
        return 1.0

    @property
    def spec(self) -> str:
        """``"identity"``."""
        return "identity"
