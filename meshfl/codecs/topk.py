"""Top-k sparsification with compact index packing.

Keeps the ``k`` largest-magnitude entries (Aji & Heafield, EMNLP 2017; Stich, Cordonnier,
Jaggi, NeurIPS 2018 "Sparsified SGD with memory"). Top-k is a δ-contraction with
δ = k/n: ``‖x − C(x)‖² ≤ (1 − k/n)‖x‖²`` (Stich et al. 2018, Def. 2.1), which is the
compression assumption of CHOCO-SGD (Koloskova et al., ICML 2019, Eq. 4).

Payload layout (all little-endian)::

    u8   format     0 = bitmap, 1 = delta-coded LEB128 varints
    u32  k          number of kept entries
    f32  values[k]  kept values, in ascending index order
    ...  indices    bitmap: ceil(n/8) bytes, bit i (LSB first) set iff index i is kept;
                    varint: k unsigned LEB128 varints of gap_t = idx_t − idx_{t−1} − 1
                    (idx_{−1} = −1), shortest encoding only

The encoder picks whichever index section is smaller (the bitmap on a tie).
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import Codec, CodecTag, as_float32, check_finite_float32, check_shape
from meshfl.codecs.density import check_density, k_for
from meshfl.codecs.varint import MAX_VARINT_BYTES, varint_decode, varint_encode, varint_sizes
from meshfl.errors import CodecError

__all__ = ["FORMAT_BITMAP", "FORMAT_VARINT", "TopK"]

FORMAT_BITMAP = 0
FORMAT_VARINT = 1
_HEADER = struct.Struct("<BI")
_MAX_NUMEL = 2**32 - 1
_SAMPLED_MIN_NUMEL = 1 << 16
"""Smallest tensor for the sampled selection; below it a plain partition is as fast."""
_SAMPLE = 1 << 14
"""Target size of the strided magnitude sample that guesses the candidate threshold."""
_BLOCK = 65536
"""Elements per block of the candidate pass (256 KiB of scratch stays in L2)."""
_ABS_MASK = np.uint32(0x7FFF_FFFF)
_NONFINITE = 0x7F80_0000
"""Magnitude bits at or above this are inf (equal) or NaN (above)."""


class TopK(Codec):
    """Keep the ``k = max(1, ceil(density · n))`` largest-magnitude entries, zero the rest.

    Parameters
    ----------
    density : float
        Fraction of entries kept, ``0 < density <= 1``. ``k`` is computed from the
        decimal value of ``density`` (``0.1 · 30`` gives 3, not 4); ``k = 0`` for an
        empty tensor. Ties in magnitude go to the lower flat index (deterministic).

    Raises
    ------
    CodecSpecError
        If ``density`` is not a finite number in ``(0, 1]``.

    """

    tag: ClassVar[int] = CodecTag.TOPK
    name: ClassVar[str] = "topk"
    __slots__ = ("_density_exact", "density")

    def __init__(self, density: float) -> None:
        self.density, self._density_exact = check_density(density)

    def k_for(self, numel: int) -> int:
        """Return ``k`` for a tensor of ``numel`` elements (0 when empty, else in [1, numel])."""
        return k_for(self._density_exact, numel)

    def encode(self, x: np.ndarray) -> bytes:
        """Sparsify ``x`` and pack values and indices; see the module docstring for layout.

        Runs in O(n) time, no sort: on tensors of at least 65 536 elements with
        ``k <= n/4``, a threshold guessed from a strided sample of ``|x|`` selects
        candidates in one blocked pass and the exact selection runs on those
        (:func:`_top_indices_sampled`); otherwise a partial partition of ``|x|``.

        Raises
        ------
        CodecError
            If ``x`` is not floating, holds NaN/inf, or has more than 2**32 − 1 elements.

        """
        flat = as_float32(x).reshape(-1)
        n = flat.size
        if n > _MAX_NUMEL:
            raise CodecError(f"top-k supports up to {_MAX_NUMEL} elements, got {n}")
        k = self.k_for(n)
        if n >= _SAMPLED_MIN_NUMEL and k <= n // 4:
            idx = _top_indices_sampled(flat, k)  # checks finiteness itself
        else:
            idx = _top_indices(check_finite_float32(flat), k)
        values: bytes = flat[idx].astype("<f4").tobytes()
        gaps = np.diff(idx, prepend=-1) - 1
        bitmap_size = (n + 7) // 8
        if _varint_total(gaps) < bitmap_size:
            return _HEADER.pack(FORMAT_VARINT, k) + values + varint_encode(gaps)
        mask = np.zeros(n, dtype=np.bool_)
        mask[idx] = True
        bitmap = np.packbits(mask, bitorder="little").tobytes()
        return _HEADER.pack(FORMAT_BITMAP, k) + values + bitmap

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Scatter the kept values into a zero float32 tensor of ``shape``.

        Raises
        ------
        CodecError
            On a short header, an unknown format flag, ``k > n``, a truncated value
            block, an index section that is malformed, out of range, not strictly
            increasing, of the wrong length or count, or NaN/inf values.

        """
        n = check_shape(shape)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise CodecError(f"payload must be bytes, got {type(payload).__name__}")
        buf = bytes(payload)
        if len(buf) < _HEADER.size:
            raise CodecError(f"top-k payload of {len(buf)} bytes is shorter than its header")
        fmt, k = _HEADER.unpack_from(buf)
        if k > n:
            raise CodecError(f"top-k payload keeps {k} entries of a {n}-element tensor")
        end_values = _HEADER.size + 4 * k
        if len(buf) < end_values:
            raise CodecError("top-k payload is truncated inside its value block")
        values = np.frombuffer(buf, dtype="<f4", count=k, offset=_HEADER.size)
        if not bool(np.isfinite(values).all()):
            raise CodecError("top-k payload holds NaN or inf values")
        section = np.frombuffer(buf, dtype=np.uint8, offset=end_values)
        if fmt == FORMAT_BITMAP:
            idx = _bitmap_indices(section, n, k)
        elif fmt == FORMAT_VARINT:
            gaps = varint_decode(section, k)
            if gaps.size and int(gaps.max()) >= n:
                raise CodecError("top-k varint index gap is out of range")
            idx = np.cumsum(gaps + 1) - 1
            if idx.size and int(idx[-1]) >= n:
                raise CodecError("top-k varint index is out of range")
        else:
            raise CodecError(f"unknown top-k index format {fmt}")
        out = np.zeros(n, dtype=np.float32)
        out[idx] = values
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Estimate ``4n / payload_bytes`` assuming evenly spread kept indices.

        Returns 0.0 for ``numel == 0`` (the 5-byte header carries no tensor bytes).
        """
        k = self.k_for(numel)
        if k == 0:
            return 0.0
        gap = np.array([numel // k - 1], dtype=np.int64)
        index_bytes = min((numel + 7) // 8, k * int(varint_sizes(gap)[0]))
        return 4.0 * numel / (_HEADER.size + 4 * k + index_bytes)

    @property
    def spec(self) -> str:
        """``"topk:DENSITY"``, e.g. ``"topk:0.1"`` (``repr`` of the float, so it round-trips)."""
        return f"topk:{self.density!r}"


def _top_indices(flat: np.ndarray, k: int) -> np.ndarray:
    """Return the sorted flat indices of the ``k`` largest ``|flat|``, ties to the lower index."""
    n = flat.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    mag = np.abs(flat)
    threshold = np.partition(mag, n - k)[n - k]  # the k-th largest magnitude
    keep = mag > threshold
    need = k - int(np.count_nonzero(keep))
    ties = np.flatnonzero(mag == threshold)[:need]
    keep[ties] = True
    return np.flatnonzero(keep).astype(np.int64)


def _varint_total(gaps: np.ndarray) -> int:
    """Return ``varint_sizes(gaps).sum()`` from one count per extra byte (no size array)."""
    if gaps.size == 0:
        return 0
    total = gaps.size
    top = int(gaps.max())
    for j in range(1, MAX_VARINT_BYTES):
        if top < 1 << (7 * j):
            break
        total += int(np.count_nonzero(gaps >= 1 << (7 * j)))
    return total


def _top_indices_sampled(flat: np.ndarray, k: int) -> np.ndarray:
    """Exact :func:`_top_indices` (same set, same tie-break) from a sampled threshold.

    Magnitudes are compared as the uint32 bits of ``|x|`` (``bits & 0x7fffffff``), whose
    integer order is the float order for finite values; NaN and inf sort above every
    finite value, so they always become candidates and are refused there. A strided
    sample of about 16 384 magnitudes gives a threshold ``t`` whose expected candidate
    count is ``k`` plus four binomial standard deviations plus 8 sample ranks. Every
    element with ``|x| >= t`` is gathered in one pass over blocks that stay in cache.
    If at least ``k`` are gathered, the k-th largest magnitude is ``>= t``, so all
    elements at or above it (ties included) are candidates and selecting among the
    candidates (in index order) is exact; otherwise the full partition runs.

    Raises
    ------
    CodecError
        If ``flat`` holds NaN or inf.

    """
    n = flat.size
    bits = flat.view(np.uint32)
    step = max(1, n // _SAMPLE)
    sample = bits[::step] & _ABS_MASK
    size = sample.size
    expected = size * k / n
    rank = min(size, int(expected + 4.0 * expected**0.5) + 8)  # from the top, >= 1
    threshold = np.partition(sample, size - rank)[size - rank]
    scratch = np.empty(min(n, _BLOCK), dtype=np.uint32)
    hits = np.empty(min(n, _BLOCK), dtype=np.bool_)
    parts: list[np.ndarray] = []
    for lo in range(0, n, _BLOCK):
        part = bits[lo : lo + _BLOCK]
        mags = scratch[: part.size]
        found = hits[: part.size]
        np.bitwise_and(part, _ABS_MASK, out=mags)
        np.greater_equal(mags, threshold, out=found)
        where = np.flatnonzero(found)
        where += lo
        parts.append(where)
    candidates = np.concatenate(parts)
    mags = bits[candidates] & _ABS_MASK
    if candidates.size and int(mags.max()) >= _NONFINITE:
        raise CodecError("tensor contains NaN or inf; refusing to encode it")
    c = candidates.size
    if c < k:  # the guess was too high: exact fallback on the whole tensor
        return _top_indices(check_finite_float32(flat), k)
    kth = np.partition(mags, c - k)[c - k]
    keep = mags > kth
    need = k - int(np.count_nonzero(keep))
    keep[np.flatnonzero(mags == kth)[:need]] = True
    chosen: np.ndarray = candidates[keep].astype(np.int64, copy=False)
    return chosen


def _bitmap_indices(section: np.ndarray, n: int, k: int) -> np.ndarray:
    """Decode and check a bitmap index section (length, zero padding, popcount)."""
    if section.size != (n + 7) // 8:
        raise CodecError(f"top-k bitmap is {section.size} bytes, expected {(n + 7) // 8}")
    bits = np.unpackbits(section, bitorder="little")
    if bits[n:].any():
        raise CodecError("top-k bitmap has bits set past the end of the tensor")
    idx = np.flatnonzero(bits[:n])
    if idx.size != k:
        raise CodecError(f"top-k bitmap marks {idx.size} entries, header says {k}")
    return idx
