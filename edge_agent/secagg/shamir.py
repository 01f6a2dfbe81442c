"""Shamir secret sharing of the 32-byte seeds of secure aggregation (Shamir, CACM 1979).

Bonawitz et al. (CCS 2017) share each device's self-mask seed and masking private key
among its neighbours so that any ``threshold`` of them can rebuild what a dropped or a
surviving member needs. A 32-byte secret is split as two 16-byte halves over GF(2^128)
with the same indices (pycryptodome's :class:`Crypto.Protocol.SecretSharing.Shamir`); a
share is ``(index, half0 ‖ half1)``, 32 bytes. The key material itself is in
:mod:`edge_agent.secagg.crypto`.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_agent.secagg.crypto import KEY_BYTES
from meshfl.errors import ConfigError, WireError

__all__ = ["combine_shares", "split_secret"]


def split_secret(secret: bytes, threshold: int, n: int) -> list[tuple[int, bytes]]:
    """Shamir-split a 32-byte ``secret`` into ``n`` shares, any ``threshold`` of which recover it.

    Shamir (1979) over GF(2^128) (pycryptodome): the two 16-byte halves are split
    separately with the same indices 1..n; share i is ``(i, half0_i ‖ half1_i)``
    (32 bytes). Fewer than ``threshold`` shares reveal nothing about the secret.

    Raises
    ------
    ConfigError
        ``secret`` is not 32 bytes, or not 2 ≤ threshold ≤ n.

    """
    from Crypto.Protocol.SecretSharing import Shamir

    if len(secret) != KEY_BYTES:
        raise ConfigError(f"a Shamir secret must be {KEY_BYTES} bytes, got {len(secret)}")
    if not 2 <= threshold <= n:
        raise ConfigError(
            f"threshold t={threshold} must satisfy 2 <= t <= n={n} (the neighbourhood size);"
            " lower --secure-aggregation or use a topology of higher degree"
        )
    low = Shamir.split(threshold, n, secret[:16])
    high = Shamir.split(threshold, n, secret[16:])
    return [(i, lo + hi) for (i, lo), (_, hi) in zip(low, high, strict=True)]


def combine_shares(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """Recover a 32-byte secret from shares of :func:`split_secret` (Lagrange interpolation).

    With at least the threshold of distinct shares, this is the secret; with fewer it is
    an unrelated value (no error can tell).

    Raises
    ------
    WireError
        Fewer than 2 shares, a repeated index, an index < 1 or a share not of 32 bytes.

    """
    from Crypto.Protocol.SecretSharing import Shamir

    if len(shares) < 2:
        raise WireError(f"at least 2 shares are needed to combine, got {len(shares)}")
    indices = [index for index, _ in shares]
    if len(set(indices)) != len(indices) or min(indices) < 1:
        raise WireError(f"share indices must be distinct and >= 1, got {sorted(indices)}")
    if any(len(share) != KEY_BYTES for _, share in shares):
        raise WireError(f"every share must be {KEY_BYTES} bytes")
    low = Shamir.combine([(i, s[:16]) for i, s in shares])
    high = Shamir.combine([(i, s[16:]) for i, s in shares])
    return low + high
