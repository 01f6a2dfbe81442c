"""A lossless zstd layer over any other codec.

``Zstd(inner, level)`` compresses the inner codec's payload with Zstandard (Collet &
Kucherawy, RFC 8878) and prefixes the inner wire tag, so the receiver dispatches the
inner decode through :data:`meshfl.codecs.plain.PLAIN_CODECS` without knowing the inner codec in
advance. Lossless: ``decode(encode(x)) == inner.decode(inner.encode(x))``. Worth it on
payloads with redundancy (top-k index gaps, int8 codes, sparse or quantized values);
close to useless on raw float32 mantissas.

The ``zstandard`` package is imported on first use, here and nowhere else in the kernel.

Payload layout::

    u8   inner tag  a registered tag other than 10 (no nesting)
    ...  frame      one zstd frame with its content size recorded, nothing after it

The decoder refuses frames without a content size, or declaring more than
``8 n + 1024`` bytes for an ``n``-element tensor (a bound on every codec's payload), so a
hostile frame cannot make it allocate more.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from meshfl.codecs.base import Codec, CodecTag, check_payload, check_shape
from meshfl.codecs.plain import PLAIN_CODECS
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["DEFAULT_LEVEL", "Zstd"]

DEFAULT_LEVEL = 3
MIN_LEVEL, MAX_LEVEL = 1, 22


def _zstandard() -> ModuleType:
    """Import ``zstandard`` lazily, translating its absence into a CodecError."""
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is installed with meshfl
        raise CodecError("the +zstd layer needs the 'zstandard' package") from exc
    return zstandard


def max_inner_bytes(numel: int) -> int:
    """Return the largest inner payload accepted for ``numel`` elements: ``8 n + 1024``."""
    return 8 * numel + 1024


class Zstd(Codec):
    """Lossless zstd wrapper; spec ``"INNER+zstd"`` or ``"INNER+zstd:LEVEL"``, tag 10.

    Parameters
    ----------
    inner : Codec
        Any codec but another :class:`Zstd`.
    level : int, default 3
        zstd compression level, 1..22.

    Raises
    ------
    CodecSpecError
        If ``inner`` is not a codec or is a Zstd, or ``level`` is out of range.

    """

    tag: ClassVar[int] = CodecTag.ZSTD
    name: ClassVar[str] = "zstd"
    __slots__ = ("inner", "level")

    def __init__(self, inner: Codec, level: int = DEFAULT_LEVEL) -> None:
        if not isinstance(inner, Codec) or isinstance(inner, Zstd):
            raise CodecSpecError(f"+zstd wraps one codec that is not itself +zstd, got {inner!r}")
        if (
            isinstance(level, bool)
            or not isinstance(level, int)
            or not MIN_LEVEL <= level <= MAX_LEVEL
        ):
            raise CodecSpecError(
                f"zstd level must be an int in [{MIN_LEVEL}, {MAX_LEVEL}], got {level!r}"
            )
        self.inner = inner
        self.level = level

    def encode(self, x: np.ndarray) -> bytes:
        """Encode with the inner codec, then zstd-compress; see the module docstring.

        Raises
        ------
        CodecError
            Whatever the inner codec raises (NaN/inf input, …).

        """
        inner_payload = self.inner.encode(x)
        compressor: Any = _zstandard().ZstdCompressor(level=self.level, write_content_size=True)
        frame: bytes = compressor.compress(inner_payload)
        return bytes([self.inner.tag]) + frame

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Decompress, then decode with the codec named by the inner tag.

        Raises
        ------
        CodecError
            On an empty payload, an unknown or nested inner tag, a malformed or
            truncated frame, trailing bytes, an oversized or unsized frame, or any
            error of the inner decode.

        """
        numel = check_shape(shape)
        buf = check_payload(payload)
        if not buf:
            raise CodecError("zstd payload is empty")
        inner = PLAIN_CODECS.get(buf[0])
        if inner is None:
            raise CodecError(f"zstd payload wraps an invalid inner tag {buf[0]}")
        frame = buf[1:]
        zstandard = _zstandard()
        try:
            size = zstandard.frame_content_size(frame)
            if not 0 <= size <= max_inner_bytes(numel):
                raise CodecError(
                    f"zstd frame declares {size} bytes; limit {max_inner_bytes(numel)}"
                )
            reader: Any = zstandard.ZstdDecompressor().decompressobj()
            data: bytes = reader.decompress(frame)
            complete = bool(reader.eof) and not reader.unused_data
        except zstandard.ZstdError as exc:
            raise CodecError(f"malformed zstd frame: {exc}") from exc
        if not complete or len(data) != size:
            raise CodecError("zstd frame is truncated, has trailing bytes, or lies about its size")
        return inner.decode(data, shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return the inner codec's estimate: zstd's gain depends on the data; none is assumed."""
        return self.inner.estimate_ratio(numel)

    @property
    def spec(self) -> str:
        """``"INNER+zstd"`` at the default level, else ``"INNER+zstd:LEVEL"``."""
        suffix = "+zstd" if self.level == DEFAULT_LEVEL else f"+zstd:{self.level}"
        return self.inner.spec + suffix
