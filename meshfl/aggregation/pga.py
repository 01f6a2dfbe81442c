"""Periodic global averaging (Gossip-PGA) as a schedule of mixing matrices.

Chen, Yuan, Zhang, Pan, Xu, Yin, "Accelerating Gossip SGD with Periodic Global
Averaging", ICML 2021, Algorithm 1. Gossip SGD with mixing matrix W, except that every
H-th round is an exact global average::

    W_t = 11ᵀ / n     if t ≡ 0 (mod H)
    W_t = W           otherwise                                       (PGA, Eq. 4)

The global average removes the consensus error accumulated over the last H rounds, so
the transient phase no longer grows with 1/(1 − λ) alone (their Table 1).

No server sees a model in meshfl's form of it:

- With broadcast deltas (CHOCO-SGD, D-PSGD) every device publishes one message a round on
  its own topic whatever the graph, so upload bytes do not change. A global round needs
  every device to hold every other device's replica x̂_j: devices *listen* to all peers
  every round (their replicas stay exact; download grows to n − 1 messages a round) and
  *mix* with the row of W_t. With the identity codec and γ = 1 the global round is the
  exact average; with a compressed codec it is the average of the public replicas, each
  device keeping its own residual x_i − x̂_i (CHOCO's step with W_t = 11ᵀ/n).
- With secure aggregation the global round is one masked sum over all devices (the sum
  reveals only the average), instead of a neighbourhood sum.

Pure functions only: the gossip state objects take the row through their
``set_neighbours`` each round.
"""

from __future__ import annotations

import numpy as np

from meshfl.errors import ConfigError

__all__ = ["is_global_round", "pga_row"]


def is_global_round(round_: int, period: int) -> bool:
    """Whether round ``round_`` (1-based) is a global-averaging round: ``round_ % period == 0``.

    Raises
    ------
    ConfigError
        If ``period`` is not an int ≥ 1 or ``round_`` is negative.

    """
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigError(f"global averaging period H must be an int >= 1, got {period!r}")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise ConfigError(f"round must be an int >= 0, got {round_!r}")
    return round_ % period == 0


def pga_row(matrix: np.ndarray, round_: int, period: int) -> np.ndarray:
    """The mixing matrix W_t of round ``round_`` (PGA above), float64, shape (n, n).

    Parameters
    ----------
    matrix : np.ndarray
        W, square (n, n), used in the other rounds; returned as a float64 copy.
    round_ : int
        Round number, 1-based (round 0 counts as global: 0 % H = 0).
    period : int
        H ≥ 1; H = 1 is exact averaging every round (FedAvg without a server).

    Raises
    ------
    ConfigError
        If ``matrix`` is not square or ``period`` / ``round_`` is invalid.

    """
    w = np.asarray(matrix, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
        raise ConfigError(f"mixing matrix must be square and non-empty, got shape {w.shape}")
    if is_global_round(round_, period):
        n = w.shape[0]
        return np.full((n, n), 1.0 / n)
    return w.copy()
