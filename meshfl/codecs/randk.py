"""Random-k sparsification with indices drawn from a seed carried in the payload.

Keeps ``k = max(1, ⌈density · n⌉)`` entries chosen uniformly at random without
replacement (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018,
Sec. 2 "rand_k"; Wangni, Wang, Liu, Zhang, "Gradient Sparsification for
Communication-Efficient Distributed Optimization", NeurIPS 2018). Only the seed travels,
never the indices: sender and receivers regenerate the same index set.

- default (``randk:D``): ``C(x) = x ⊙ m`` with the random mask ``m``; biased,
  ``E[C(x)] = (k/n) x``, and a δ-contraction with δ = k/n in expectation,
  ``E‖x − C(x)‖² = (1 − k/n)‖x‖²`` — the form CHOCO-SGD needs;
- unbiased (``randk:D:unbiased``): ``C(x) = (n/k) x ⊙ m``, so ``E[C(x)] = x`` with
  variance ``E‖C(x) − x‖² = (n/k − 1)‖x‖²`` (Wangni et al. 2018, Eq. 3 with uniform p).
  The scaling is applied by the encoder, so the decoder is the same for both.

Index generation uses only the PCG64 bit stream (``np.random.PCG64(seed).random_raw``),
which NumPy keeps stable across releases, and this module's own code: draw indices
``⌊(r >> 32) · n / 2³²⌋`` (uniform up to ``n/2³²``) until ``k`` are distinct, then drop a
random subset of the excess, drawn the same way (:func:`random_indices`) — a uniform
``k``-subset. When ``k > n/2`` the ``n − k`` dropped indices are drawn instead. Indices
are applied in ascending order.

Payload layout (little-endian)::

    u64  seed       index seed, fresh per message from the encoder's generator
    u32  k          number of kept entries
    f32  values[k]  kept (and for the unbiased form, scaled) values, ascending index order
"""

from __future__ import annotations

import math
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
    make_rng,
)
from meshfl.codecs.density import check_density, k_for
from meshfl.errors import CodecError

__all__ = ["RandK", "random_indices"]

_HEADER = struct.Struct("<QI")
_MAX_NUMEL = 2**32 - 1


def random_indices(seed: int, n: int, k: int) -> np.ndarray:
    """Return ``k`` distinct indices in ``[0, n)``, sorted, determined by ``seed`` alone.

    This function is part of the wire format of tag 7: sender and receivers must agree
    on it bit for bit. It reads ``np.random.PCG64(seed).random_raw`` only.

    Parameters
    ----------
    seed : int
        u64 seed of ``np.random.PCG64``.
    n, k : int
        Population size (``< 2**32``) and sample size, ``0 <= k <= n``.

    Returns
    -------
    np.ndarray
        int64, shape (k,), strictly increasing.

    """
    return _subset(np.random.PCG64(seed), n, k)


def _subset(bits: np.random.PCG64, n: int, k: int) -> np.ndarray:
    """Uniform random ``k``-subset of ``[0, n)``, sorted (see the module docstring).

    Draw batches of ``⌈n ln((n − c)/(n − k))⌉`` indices (the expected number to reach
    ``k`` distinct from ``c``) until at least ``k`` are distinct, then drop a uniform
    random subset of the excess, chosen by this same procedure. The distinct set of
    i.i.d. uniform draws is exchangeable, so the result is a uniform ``k``-subset; the
    set (not the order of discovery) is what the method fixes, so sort-based and
    mask-based unions give identical results.
    """
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k > n // 2:
        mask = np.ones(n, dtype=np.bool_)
        mask[_subset(bits, n, n - k)] = False
        return np.flatnonzero(mask).astype(np.int64)
    dense = 64 * k >= n  # a bitmap of n is cheaper than sorting the draws
    seen = np.zeros(n if dense else 0, dtype=np.bool_)
    found = np.zeros(0, dtype=np.int64)
    count = 0
    while count < k:
        batch = max(1, math.ceil(n * (math.log(n - count) - math.log(n - k))))
        raw = bits.random_raw(batch)
        draws = (((raw >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)).astype(np.int64)
        if dense:
            seen[draws] = True
            count = int(np.count_nonzero(seen))
        else:
            found = np.sort(np.concatenate([found, draws]))
            found = found[np.concatenate(([True], found[1:] != found[:-1]))]
            count = found.size
    if dense:
        found = np.flatnonzero(seen).astype(np.int64)
    if count > k:
        found = np.delete(found, _subset(bits, count, count - k))
    return found


class RandK(Codec):
    """Random-k sparsifier; spec ``"randk:DENSITY"`` or ``"randk:DENSITY:unbiased"``, tag 7.

    Parameters
    ----------
    density : float
        Fraction kept, ``0 < density <= 1`` (``k`` as for :class:`~meshfl.codecs.TopK`).
    unbiased : bool, default False
        Scale kept values by ``n/k`` so that ``E[C(x)] = x``; see the module docstring.
    seed : int or None, default None
        Seed of the generator that draws each message's index seed; ``None`` draws OS
        entropy. Not part of the spec.

    Raises
    ------
    CodecSpecError
        If ``density`` is not in ``(0, 1]`` or ``seed`` is invalid.

    """

    tag: ClassVar[int] = CodecTag.RANDK
    name: ClassVar[str] = "randk"
    __slots__ = ("_density_exact", "_rng", "density", "unbiased")

    def __init__(self, density: float, unbiased: bool = False, seed: int | None = None) -> None:
        self.density, self._density_exact = check_density(density)
        self.unbiased = bool(unbiased)
        self._rng = make_rng(seed)

    def k_for(self, numel: int) -> int:
        """Return ``k`` for a tensor of ``numel`` elements (0 when empty, else in [1, numel])."""
        return k_for(self._density_exact, numel)

    def encode(self, x: np.ndarray) -> bytes:
        """Draw a seed, keep the entries it selects; see the module docstring for the layout.

        Raises
        ------
        CodecError
            If ``x`` is not floating, holds NaN/inf, has 2**32 elements or more, or (when
            unbiased) a scaled value overflows float32.

        """
        flat = check_finite_float32(x).reshape(-1)
        n = flat.size
        if n > _MAX_NUMEL:
            raise CodecError(f"random-k supports up to {_MAX_NUMEL} elements, got {n}")
        k = self.k_for(n)
        seed = int(self._rng.bit_generator.random_raw())
        values = flat[random_indices(seed, n, k)]
        if self.unbiased and k:
            scale = n / k
            if float(np.max(np.abs(values))) * scale > F32_MAX:
                raise CodecError("random-k scaled values overflow float32")
            values = (values.astype(np.float64) * scale).astype(np.float32)
        body: bytes = values.astype("<f4").tobytes()
        return _HEADER.pack(seed, k) + body

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Regenerate the indices from the seed and scatter the values.

        Raises
        ------
        CodecError
            On a short header, ``k > n``, a wrong length, or NaN/inf values.

        """
        n = check_shape(shape)
        buf = check_payload(payload)
        if len(buf) < _HEADER.size:
            raise CodecError(f"random-k payload of {len(buf)} bytes is shorter than its header")
        seed, k = _HEADER.unpack_from(buf)
        if k > n:
            raise CodecError(f"random-k payload keeps {k} entries of a {n}-element tensor")
        if len(buf) != _HEADER.size + 4 * k:
            raise CodecError(
                f"random-k payload is {len(buf)} bytes, expected {_HEADER.size + 4 * k}"
            )
        values = np.frombuffer(buf, dtype="<f4", offset=_HEADER.size)
        if not bool(np.isfinite(values).all()):
            raise CodecError("random-k payload holds NaN or inf values")
        out = np.zeros(n, dtype=np.float32)
        out[random_indices(seed, n, k)] = values
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Return ``4n / (12 + 4k)`` (0.0 for an empty tensor)."""
        k = self.k_for(numel)
        return 4.0 * numel / (_HEADER.size + 4 * k) if k else 0.0

    @property
    def spec(self) -> str:
        """``"randk:DENSITY"``, with ``":unbiased"`` appended for the unbiased form."""
        return f"randk:{self.density!r}" + (":unbiased" if self.unbiased else "")
