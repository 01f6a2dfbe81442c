"""Fixed-width bit packing of small unsigned codes (numpy, no per-element Python loop).

Element ``i`` of width ``w`` occupies bits ``[i·w, (i+1)·w)`` of the stream, least
significant bit first, and the stream is cut into bytes LSB first (``np.packbits`` with
``bitorder="little"``). The last byte is zero-padded; the decoder checks the padding.
"""

from __future__ import annotations

import numpy as np

from meshfl.errors import CodecError

__all__ = ["MAX_WIDTH", "pack_codes", "packed_size", "unpack_codes"]

MAX_WIDTH = 32


def packed_size(count: int, width: int) -> int:
    """Return the packed length in bytes, ``ceil(count · width / 8)``."""
    return (count * width + 7) // 8


def pack_codes(codes: np.ndarray, width: int) -> bytes:
    """Pack unsigned codes of ``width`` bits each.

    Parameters
    ----------
    codes : np.ndarray
        Unsigned integers, shape (n,), each ``< 2**width``.
    width : int
        Bits per code, 1..32.

    Returns
    -------
    bytes
        ``packed_size(n, width)`` bytes.

    """
    n = codes.size
    if width <= 8:
        # Eight codes of w bits fill exactly w bytes: build them in one uint64 per group.
        groups = -(-n // 8)
        padded = np.zeros(groups * 8, dtype=np.uint64)
        padded[:n] = codes
        lanes = padded.reshape(groups, 8)
        word = lanes[:, 0].copy()
        for i in range(1, 8):
            word |= lanes[:, i] << np.uint64(width * i)
        raw = word.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :width]
        return raw.tobytes()[: packed_size(n, width)]
    bits = np.empty((n, width), dtype=np.uint8)
    wide = codes.astype(np.uint32)
    for j in range(width):
        bits[:, j] = (wide >> np.uint32(j)) & np.uint32(1)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def unpack_codes(data: bytes, count: int, width: int) -> np.ndarray:
    """Unpack ``count`` codes of ``width`` bits from exactly ``packed_size(count, width)`` bytes.

    Returns
    -------
    np.ndarray
        uint32, shape (count,).

    Raises
    ------
    CodecError
        If ``data`` has the wrong length or a padding bit is set.

    """
    expected = packed_size(count, width)
    if len(data) != expected:
        raise CodecError(f"packed section is {len(data)} bytes, expected {expected}")
    tail_bits = (count * width) % 8
    if tail_bits and data[-1] >> tail_bits:
        raise CodecError("packed section has padding bits set")
    raw = np.frombuffer(data, dtype=np.uint8)
    if width <= 8:
        groups = -(-count // 8)
        block = np.zeros(groups * width, dtype=np.uint8)
        block[: raw.size] = raw
        lanes = np.zeros((groups, 8), dtype=np.uint8)
        lanes[:, :width] = block.reshape(groups, width)
        word = lanes.view("<u8").reshape(groups)
        mask = np.uint64((1 << width) - 1)
        out = np.empty((groups, 8), dtype=np.uint32)
        for i in range(8):
            out[:, i] = (word >> np.uint64(width * i)) & mask
        return out.reshape(-1)[:count]
    bits = np.unpackbits(raw, count=count * width, bitorder="little").reshape(count, width)
    out32 = np.zeros(count, dtype=np.uint32)
    for j in range(width):
        out32 |= bits[:, j].astype(np.uint32) << np.uint32(j)
    return out32
