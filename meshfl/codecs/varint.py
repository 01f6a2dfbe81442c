"""Vectorized unsigned LEB128 varints (numpy, no per-element Python loop).

LEB128 as in DWARF / protobuf: 7 value bits per byte, least significant group first,
high bit set on every byte but the last. Used by :mod:`meshfl.codecs.topk` for
delta-coded indices. Values are limited to ``< 2**35`` (5 bytes), more than any
index gap of a tensor with fewer than 2**32 elements.
"""

from __future__ import annotations

import numpy as np

from meshfl.errors import CodecError

__all__ = ["MAX_VARINT_BYTES", "varint_decode", "varint_encode", "varint_sizes"]

MAX_VARINT_BYTES = 5


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Return the LEB128 byte length of each value.

    Parameters
    ----------
    values : np.ndarray
        int64, shape (m,), each in ``[0, 2**35)``.

    Returns
    -------
    np.ndarray
        int64, shape (m,), each in ``[1, 5]``.

    """
    sizes = np.ones(values.shape, dtype=np.int64)
    for j in range(1, MAX_VARINT_BYTES):
        sizes += values >= (1 << (7 * j))
    return sizes


def varint_encode(values: np.ndarray) -> bytes:
    """Encode non-negative integers as concatenated LEB128 varints.

    Parameters
    ----------
    values : np.ndarray
        int64, shape (m,), each in ``[0, 2**35)``.

    Returns
    -------
    bytes
        ``varint_sizes(values).sum()`` bytes.

    Raises
    ------
    CodecError
        If a value is negative or needs more than 5 bytes.

    """
    vals = np.asarray(values, dtype=np.int64)
    if vals.size == 0:
        return b""
    if int(vals.min()) < 0 or int(vals.max()) >= 1 << (7 * MAX_VARINT_BYTES):
        raise CodecError("varint values must be in [0, 2**35)")
    sizes = varint_sizes(vals)
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    for j in range(int(sizes.max())):
        sel = sizes > j
        group = (vals[sel] >> (7 * j)) & 0x7F
        more = (sizes[sel] - 1 > j).astype(np.int64) << 7
        out[starts[sel] + j] = (group | more).astype(np.uint8)
    return out.tobytes()


def varint_decode(data: np.ndarray, count: int) -> np.ndarray:
    """Decode exactly ``count`` LEB128 varints that fill ``data`` exactly.

    Parameters
    ----------
    data : np.ndarray
        uint8, shape (b,).
    count : int
        Expected number of varints.

    Returns
    -------
    np.ndarray
        int64, shape (count,).

    Raises
    ------
    CodecError
        If ``data`` holds a different number of varints, ends inside one, has a varint
        longer than 5 bytes, or a non-shortest (overlong) encoding.

    """
    if data.size == 0:
        if count != 0:
            raise CodecError(f"varint section is empty, expected {count} varints")
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero((data & 0x80) == 0)
    if ends.size != count:
        raise CodecError(f"varint section holds {ends.size} complete varints, expected {count}")
    if int(ends[-1]) != data.size - 1:
        raise CodecError("varint section ends inside a varint")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = ends - starts + 1
    if int(sizes.max()) > MAX_VARINT_BYTES:
        raise CodecError(f"varint longer than {MAX_VARINT_BYTES} bytes")
    if bool(((sizes > 1) & (data[ends] == 0)).any()):
        raise CodecError("overlong (non-shortest) varint encoding")
    values = np.zeros(count, dtype=np.int64)
    for j in range(int(sizes.max())):
        sel = sizes > j
        values[sel] |= (data[starts[sel] + j].astype(np.int64) & 0x7F) << (7 * j)
    return values
