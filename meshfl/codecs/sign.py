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
from functools import lru_cache
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import F32_MAX, Codec, CodecTag, as_float32, check_payload, check_shape
from meshfl.errors import CodecError

__all__ = ["Sign", "abs_sum_and_sign_bits"]

_HEADER = struct.Struct("<f")
_BLOCK = 65536
"""Leaf size of the blocked pass: 256 KiB of float32 stays in L2 with its scratch."""
_PW_UNROLL = 8
"""numpy's pairwise summation splits at multiples of 8 (``pairwise_sum`` in numpy's umath)."""


class Sign(Codec):
    """1-bit sign codec with a mean-magnitude scale; spec ``"sign"``, tag 8.

    Ratio ``4n / (4 + ⌈n/8⌉)``, about 32. Deterministic and stateless.
    """

    tag: ClassVar[int] = CodecTag.SIGN
    name: ClassVar[str] = "sign"

    def encode(self, x: np.ndarray) -> bytes:
        """Return the mean magnitude and the packed sign bits of ``x``.

        One pass over memory, block by block in cache (:func:`abs_sum_and_sign_bits`):
        the float32 sum of ``|x|`` (finite iff every element is, so it doubles as the
        NaN/inf check; recomputed in float64 when the float32 sum overflows) and the bits.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        flat = as_float32(x).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            total, bits = abs_sum_and_sign_bits(flat)
        if not np.isfinite(total):  # overflow of the float32 sum, or NaN/inf in x
            total = float(np.add.reduce(np.abs(flat), dtype=np.float64))
            if not np.isfinite(total):
                raise CodecError("tensor contains NaN or inf; refusing to encode it")
        scale = total / flat.size if flat.size else 0.0
        return _HEADER.pack(scale) + bits

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
        out = np.empty(n, dtype=np.float32)
        exact = scale <= F32_MAX / 2  # s − 2s·b is exact, and 2s does not overflow
        # Blocks of _DECODE_BLOCK elements keep the bits and the output block in cache.
        for start in range(0, n, _DECODE_BLOCK):
            stop = min(n, start + _DECODE_BLOCK)
            bits = np.unpackbits(
                packed[start // 8 : (stop + 7) // 8], count=stop - start, bitorder="little"
            )
            block = out[start:stop]
            if exact:
                np.multiply(bits, np.float32(-2.0 * scale), out=block)
                block += np.float32(scale)
            else:
                block[...] = np.where(bits.view(np.bool_), np.float32(-scale), np.float32(scale))
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (4 + ceil(n/8))`` (0.0 for an empty tensor)."""
        return 4.0 * numel / (_HEADER.size + (numel + 7) // 8) if numel else 0.0

    @property
    def spec(self) -> str:
        """``"sign"``."""
        return "sign"


_DECODE_BLOCK = 1 << 16
"""Elements decoded per block (a multiple of 8): bits and output stay in L2 cache."""


@lru_cache(maxsize=64)
def _leaves(n: int, block: int) -> tuple[tuple[int, int], ...]:
    """Return the ``[lo, hi)`` leaves of numpy's pairwise split of ``n`` down to ``block``."""
    out: list[tuple[int, int]] = []
    stack = [(0, n)]
    while stack:
        lo, hi = stack.pop()
        m = hi - lo
        if m <= block:
            out.append((lo, hi))
            continue
        half = m // 2
        half -= half % _PW_UNROLL
        stack.append((lo + half, hi))  # popped after the left half: leaves in order
        stack.append((lo, lo + half))
    return tuple(out)


def _combine(sums: list[np.float32], lo: int, hi: int, block: int, at: list[int]) -> np.float32:
    """Add the leaf sums in numpy's pairwise order (float32 adds), consuming ``sums``."""
    m = hi - lo
    if m <= block:
        value = sums[at[0]]
        at[0] += 1
        return value
    half = m // 2
    half -= half % _PW_UNROLL
    left = _combine(sums, lo, lo + half, block, at)
    return np.float32(left + _combine(sums, lo + half, hi, block, at))


def abs_sum_and_sign_bits(flat: np.ndarray, block: int = _BLOCK) -> tuple[float, bytes]:
    """Return ``np.add.reduce(np.abs(flat))`` and ``np.packbits(flat < 0, "little")`` in one pass.

    The tensor is cut at the split points of numpy's pairwise summation (halves rounded
    down to a multiple of 8, down to leaves of at most ``block`` elements); each leaf's
    ``|x|`` goes to a scratch buffer that stays in cache, is summed by numpy (the same
    pairwise code on the same elements) and the leaf sums are added in the same tree
    order, so the float32 result is bit-identical to the two-pass form. Every leaf but
    the last starts and ends on a multiple of 8, so the packed bits concatenate.

    Parameters
    ----------
    flat : np.ndarray
        float32, shape (n,), C-contiguous.
    block : int, default 65536
        Largest leaf, elements (>= 8).

    Returns
    -------
    tuple of (float, bytes)
        The float32 sum of ``|x|`` as a Python float (inf/NaN when ``x`` holds them or the
        sum overflows float32), and ``ceil(n/8)`` bytes of sign bits, LSB first.

    """
    n = flat.size
    if n == 0:
        return 0.0, b""
    leaves = _leaves(n, block)
    scratch = np.empty(min(n, block), dtype=np.float32)
    negative = np.empty(min(n, block), dtype=np.bool_)
    packed = np.empty((n + 7) // 8, dtype=np.uint8)
    sums: list[np.float32] = []
    for lo, hi in leaves:
        part = flat[lo:hi]
        mags = scratch[: hi - lo]
        signs = negative[: hi - lo]
        np.less(part, 0, out=signs)
        np.abs(part, out=mags)
        sums.append(np.add.reduce(mags))
        packed[lo >> 3 : (hi + 7) >> 3] = np.packbits(signs, bitorder="little")
    return float(_combine(sums, 0, n, block, [0])), packed.tobytes()
