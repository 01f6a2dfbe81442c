"""PowerSGD: rank-r approximation by one power iteration, for matrices.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019, Algorithm 1, for one worker. A tensor of shape
``(m, …)`` is viewed as ``M ∈ R^{m×n}`` with ``n = prod(shape[1:])``::

    P  = M Q₀               Q₀ ∈ R^{n×r}, i.i.d. N(0, 1)
    P̂ = orthogonalize(P)   reduced QR (np.linalg.qr)
    Q  = Mᵀ P̂
    C(M) = P̂ Qᵀ            (= P̂ P̂ᵀ M, the projection onto span(P̂))

Stateless form: Q₀ is drawn fresh for every message from the codec's generator (``seed``
makes it reproducible) instead of being warm-started from the previous round, so a
single iteration is the randomized range finder of Halko, Martinsson, Tropp (SIAM Rev.
2011, Alg. 4.1). The decoder needs only P̂ and Q, which travel; Q₀ does not. Exact
(up to float32 rounding) when ``rank(M) <= r``, since then span(P̂) = span(M); otherwise
biased, ``‖M − C(M)‖_F ≤ ‖M‖_F`` (an orthogonal projection never grows the error).

Tensors with ``ndim < 2``, or where ``r (m + n) >= m n`` (no saving), or whose factors
would not fit float32 go dense: the float32 values follow a flag byte.

Payload layout (little-endian)::

    u8   flag       0 = dense, 1 = low rank
    dense:    f32 values[m·n]
    low rank: u16 r, f32 P̂[m×r] (row major), f32 Q[n×r] (row major)
"""

from __future__ import annotations

import math
import struct
from typing import ClassVar

import numpy as np

from meshfl.codecs.base import (
    Codec,
    CodecTag,
    check_finite_float32,
    check_payload,
    check_shape,
    make_rng,
)
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["FLAG_DENSE", "FLAG_LOW_RANK", "PowerSGD"]

FLAG_DENSE = 0
FLAG_LOW_RANK = 1
_RANK = struct.Struct("<H")
_MAX_RANK = 2**16 - 1
_MAX_FACTOR_NORM = 2.0**126  # |P̂_i · Q_j| <= ‖Q_j‖ when rows of P̂ have norm <= 1


def _matrix_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    """Return ``(m, n)`` of the matrix view of ``shape`` (``ndim >= 2``)."""
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


class PowerSGD(Codec):
    """Rank-r PowerSGD compression for tensors with ``ndim >= 2``; spec ``"powersgd:R"``, tag 9.

    Parameters
    ----------
    rank : int
        ``r``, ``1 <= r <= 65535``.
    seed : int or None, default None
        Seed of the generator that draws Q₀; ``None`` draws OS entropy. Not part of the spec.

    Raises
    ------
    CodecSpecError
        If ``rank`` or ``seed`` is out of range.

    """

    tag: ClassVar[int] = CodecTag.POWERSGD
    name: ClassVar[str] = "powersgd"
    __slots__ = ("_rng", "rank")

    def __init__(self, rank: int, seed: int | None = None) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= _MAX_RANK:
            raise CodecSpecError(f"powersgd rank must be an int in [1, {_MAX_RANK}], got {rank!r}")
        self.rank = rank
        self._rng = make_rng(seed)

    def is_low_rank(self, shape: tuple[int, ...]) -> bool:
        """Return whether ``shape`` is sent as factors: ``ndim >= 2`` and ``r(m + n) < mn``."""
        if len(shape) < 2:
            return False
        m, n = _matrix_dims(shape)
        return self.rank * (m + n) < m * n

    def encode(self, x: np.ndarray) -> bytes:
        """Send P̂ and Q, or the dense values; see the module docstring for the layout.

        Raises
        ------
        CodecError
            If ``x`` is not floating or holds NaN/inf.

        """
        arr = check_finite_float32(x)
        if not self.is_low_rank(arr.shape):
            return bytes([FLAG_DENSE]) + arr.tobytes()
        m, n = _matrix_dims(arr.shape)
        matrix = arr.reshape(m, n)
        q0 = self._rng.standard_normal((n, self.rank), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            # float64: when q0 is nearly orthogonal to the row space, M q0 cancels and
            # float32 would lose the direction of P (relative error ~1e-3 seen).
            p = matrix.astype(np.float64) @ q0.astype(np.float64)
            p_hat = np.linalg.qr(p)[0].astype(np.float32)
            q = (matrix.T @ p_hat).astype(np.float64)
            if not bool(np.isfinite(q).all()):
                q = matrix.T.astype(np.float64) @ p_hat.astype(np.float64)
        if float(np.sqrt(np.square(q).sum(axis=1)).max()) > _MAX_FACTOR_NORM:
            return bytes([FLAG_DENSE]) + arr.tobytes()
        return (
            bytes([FLAG_LOW_RANK])
            + _RANK.pack(self.rank)
            + p_hat.astype("<f4").tobytes()
            + q.astype("<f4").tobytes()
        )

    @classmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild ``P̂ Qᵀ`` (or the dense values) as a float32 tensor of ``shape``.

        Raises
        ------
        CodecError
            On an unknown flag, factors for a tensor with ``ndim < 2``, rank 0, a wrong
            length, or non-finite factors or products.

        """
        numel = check_shape(shape)
        buf = check_payload(payload)
        if not buf:
            raise CodecError("powersgd payload is empty")
        flag = buf[0]
        if flag == FLAG_DENSE:
            if len(buf) != 1 + 4 * numel:
                raise CodecError(
                    f"powersgd dense payload is {len(buf)} bytes, expected {1 + 4 * numel}"
                )
            out = np.frombuffer(buf, dtype="<f4", offset=1).astype(np.float32)
        elif flag == FLAG_LOW_RANK:
            out = _decode_factors(buf, shape)
        else:
            raise CodecError(f"unknown powersgd flag {flag}")
        if not bool(np.isfinite(out).all()):
            raise CodecError("powersgd payload decodes to NaN or inf")
        return out.reshape(shape)

    def estimate_ratio(self, numel: int) -> float:
        """Estimate ``4n / payload_bytes`` for a square ``√n × √n`` matrix (0.0 when empty).

        Use :meth:`ratio_for_shape` when the shape is known.
        """
        side = max(1, math.isqrt(numel))
        return self.ratio_for_shape((side, numel // side)) if numel else 0.0

    def ratio_for_shape(self, shape: tuple[int, ...]) -> float:
        """Return the exact ratio ``4·prod(shape) / payload_bytes`` (0.0 when empty)."""
        numel = math.prod(shape)
        if numel == 0:
            return 0.0
        if not self.is_low_rank(shape):
            return 4.0 * numel / (1 + 4 * numel)
        m, n = _matrix_dims(shape)
        return 4.0 * numel / (1 + _RANK.size + 4 * self.rank * (m + n))

    @property
    def spec(self) -> str:
        """``"powersgd:R"``."""
        return f"powersgd:{self.rank}"


def _decode_factors(buf: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Check and multiply the low-rank factors of a payload."""
    if len(shape) < 2:
        raise CodecError(f"powersgd factors sent for a tensor of shape {shape}")
    if len(buf) < 1 + _RANK.size:
        raise CodecError("powersgd payload is truncated inside its rank")
    (rank,) = _RANK.unpack_from(buf, 1)
    m, n = _matrix_dims(shape)
    if rank == 0 or rank * (m + n) >= m * n:
        raise CodecError(f"powersgd rank {rank} is invalid for shape {shape}")
    expected = 1 + _RANK.size + 4 * rank * (m + n)
    if len(buf) != expected:
        raise CodecError(f"powersgd payload is {len(buf)} bytes, expected {expected}")
    factors = np.frombuffer(buf, dtype="<f4", offset=1 + _RANK.size)
    if not bool(np.isfinite(factors).all()):
        raise CodecError("powersgd payload holds NaN or inf factors")
    p_hat = factors[: m * rank].reshape(m, rank).astype(np.float32)
    q = factors[m * rank :].reshape(n, rank).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return p_hat @ q.T
