"""Robust neighbour mixing: coordinate-wise median, trimmed mean, ClippedGossip.

A faulty or malicious (Byzantine) neighbour can send any state; plain weighted mixing
moves a device by w_ij times whatever it sent. The rules here bound that influence:

- **Coordinate-wise median** and **trimmed mean** (Yin, Chen, Ramchandran, Bartlett,
  "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates", ICML 2018):
  per coordinate, over the device's own state and its neighbours' states.
- **ClippedGossip** (He, Karimireddy, Jaggi, "Byzantine-Robust Decentralized Learning via
  ClippedGossip", arXiv:2202.01545, 2022; "self-centered clipping" in its later
  version): ``x_i ← x_i + Σ_j w_ij CLIP(x_j − x_i, τ_i)`` with
  ``CLIP(z, τ) = min(1, τ/‖z‖)·z``, so one neighbour moves x_i by at most w_ij·τ_i.

Every function works on flat float64 vectors; :class:`RobustMixer` flattens a model's
tensors jointly (one vector per state), so norms are over the whole model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from meshfl.aggregation.privacy import RobustRule
from meshfl.errors import ConfigError

__all__ = [
    "RobustMixer",
    "adaptive_tau",
    "clipped_gossip",
    "coordinate_median",
    "trimmed_mean",
]

_WEIGHT_SLACK = 1e-12  # float slack when comparing sums of mixing weights


def _stack(stack: np.ndarray) -> np.ndarray:
    arr = np.asarray(stack, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ConfigError(f"expected a (m, n) stack with m >= 1 states, got shape {arr.shape}")
    return arr


def coordinate_median(stack: np.ndarray) -> np.ndarray:
    """Coordinate-wise median of m states (Yin et al., ICML 2018, Option II).

    Parameters
    ----------
    stack : np.ndarray
        Shape (m, n): one state per row, m >= 1.

    Returns
    -------
    np.ndarray
        Shape (n,), float64; with m even, the mean of the two middle values.

    Raises
    ------
    ConfigError
        If ``stack`` is not 2-D with at least one row.

    """
    median: np.ndarray = np.median(_stack(stack), axis=0)
    return median


def trimmed_mean(stack: np.ndarray, beta: float) -> np.ndarray:
    """Coordinate-wise β-trimmed mean (Yin et al., ICML 2018, Option I).

    Per coordinate, the ⌊β·m⌋ largest and ⌊β·m⌋ smallest of the m values are dropped and
    the rest averaged. β = 0 is the plain mean.

    Parameters
    ----------
    stack : np.ndarray
        Shape (m, n): one state per row, m >= 1.
    beta : float
        Fraction trimmed from each end, in [0, 0.5).

    Returns
    -------
    np.ndarray
        Shape (n,), float64.

    Raises
    ------
    ConfigError
        If ``beta`` is outside [0, 0.5) or ``stack`` is not (m, n) with m >= 1.

    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 0.5:
        raise ConfigError(f"trimmed-mean β must be in [0, 0.5), got {beta!r}")
    arr = _stack(stack)
    m = arr.shape[0]
    k = math.floor(beta * m + 1e-9)  # 0.2 · 5 must trim 1 whatever the float rounding
    kept = np.sort(arr, axis=0)[k : m - k]
    mean: np.ndarray = np.mean(kept, axis=0)
    return mean


def _weights(weights: np.ndarray, m: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (m,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(f"expected {m} finite weights >= 0, got {weights!r}")
    return w


def _neighbours(x_i: np.ndarray, neighbours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x_i, dtype=np.float64)
    nb = np.asarray(neighbours, dtype=np.float64)
    if x.ndim != 1 or nb.ndim != 2 or nb.shape[1] != x.shape[0]:
        raise ConfigError(
            f"expected x_i of shape (n,) and neighbours of shape (m, n), got {x.shape}, {nb.shape}"
        )
    return x, nb


def clipped_gossip(
    x_i: np.ndarray, neighbours: np.ndarray, weights: np.ndarray, tau: float
) -> np.ndarray:
    """ClippedGossip's step: x_i + Σ_j w_ij CLIP(x_j − x_i, τ).

    He, Karimireddy & Jaggi (2022), Eq. (ClippedGossip), with
    ``CLIP(z, τ) = min(1, τ/‖z‖₂)·z``: a neighbour closer than τ is mixed as in plain
    gossip, a farther one only pulls x_i by w_ij·τ towards itself.

    Parameters
    ----------
    x_i : np.ndarray
        This device's state, shape (n,).
    neighbours : np.ndarray
        The neighbours' states, shape (m, n) (m may be 0).
    weights : np.ndarray
        w_ij of each neighbour, shape (m,), finite and >= 0.
    tau : float
        Clipping radius τ >= 0 (``math.inf``: plain gossip).

    Returns
    -------
    np.ndarray
        Shape (n,), float64.

    Raises
    ------
    ConfigError
        On mismatched shapes, negative or non-finite weights, or τ < 0 or NaN.

    """
    x, nb = _neighbours(x_i, neighbours)
    w = _weights(weights, nb.shape[0])
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau >= 0:
        raise ConfigError(f"clipping radius τ must be >= 0, got {tau!r}")
    z = nb - x
    norms = np.linalg.norm(z, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > tau, tau / norms, 1.0)
    out: np.ndarray = x + (w * scale) @ z
    return out


def adaptive_tau(
    x_i: np.ndarray,
    neighbours: np.ndarray,
    weights: np.ndarray,
    byzantine_fraction: float | None = None,
) -> float:
    """Choose ClippedGossip's radius τ_i from the distances ‖x_j − x_i‖ of this round.

    The paper's analysis sets τ_i from the spread of the *good* neighbours, which a
    device cannot observe; in practice a radius that leaves out the farthest neighbours
    is used. Rule implemented here (stated honestly, not quoted from the paper):

    - ``byzantine_fraction`` δ given: τ_i is the smallest distance d_k such that the
      neighbours strictly farther than d_k hold at most δ of the neighbour weight
      Σ_j w_ij. The closest (1 − δ) of the weighted mass is mixed unclipped; the rest is
      clipped to the radius of the farthest of those. δ = 0: τ_i = the largest distance
      (nothing clipped).
    - ``None`` (default): τ_i is the second-largest distance (the largest with a single
      neighbour), i.e. at most one Byzantine neighbour is assumed. This is the rule of
      the authors' reference code (epfml/byzantine-robust-decentralized-optimizer,
      ``SelfCenteredClipping`` with ``tau=None``).

    Parameters
    ----------
    x_i : np.ndarray
        This device's state, shape (n,).
    neighbours : np.ndarray
        The neighbours' states, shape (m, n), m >= 1.
    weights : np.ndarray
        w_ij, shape (m,), finite and >= 0.
    byzantine_fraction : float, optional
        δ in [0, 1): the share of the neighbour weight that may be Byzantine.

    Returns
    -------
    float
        τ_i >= 0.

    Raises
    ------
    ConfigError
        On mismatched shapes, no neighbours, bad weights, or δ outside [0, 1).

    """
    x, nb = _neighbours(x_i, neighbours)
    m = nb.shape[0]
    if m == 0:
        raise ConfigError("adaptive τ needs at least one neighbour state")
    w = _weights(weights, m)
    distances = np.linalg.norm(nb - x, axis=1)
    order = np.argsort(distances, kind="stable")
    if byzantine_fraction is None:
        return float(distances[order[-2]] if m >= 2 else distances[order[-1]])
    delta = byzantine_fraction
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ConfigError(f"byzantine fraction δ must be in [0, 1), got {delta!r}")
    allowed = delta * float(np.sum(w)) + _WEIGHT_SLACK
    beyond = np.concatenate([np.cumsum(w[order][::-1])[::-1][1:], [0.0]])  # weight past k
    for k in range(m):
        if beyond[k] <= allowed:
            return float(distances[order[k]])
    return float(distances[order[-1]])  # pragma: no cover - beyond[m-1] is 0


class RobustMixer:
    """Mix a model with its neighbours' states under a :class:`RobustRule`.

    - ``median`` / ``trimmed:β``: x ← x + γ (R({x} ∪ {x_j}) − x), R coordinate-wise
      over the device's state and the answered neighbours' states (weights unused: each
      state counts once).
    - ``clipped-gossip``: x ← x + γ Σ_j w_ij CLIP(x_j − x, τ) with τ fixed (``tau``) or
      chosen each round by :func:`adaptive_tau` (``byzantine_fraction``).

    All tensors of a model are flattened jointly (one vector per state; ClippedGossip's
    norm is over the whole model); sums in float64, results float32.

    Parameters
    ----------
    rule : RobustRule
        From :func:`meshfl.aggregation.privacy.parse_robust`.
    byzantine_fraction : float, optional
        δ for :func:`adaptive_tau` (clipped-gossip only); None: one Byzantine neighbour.
    tau : float, optional
        A fixed clipping radius τ >= 0 (clipped-gossip only); None: adaptive.

    Raises
    ------
    ConfigError
        An unknown rule, or ``tau``/``byzantine_fraction`` out of range.

    """

    __slots__ = ("byzantine_fraction", "last_tau", "rule", "tau")

    def __init__(
        self, rule: RobustRule, byzantine_fraction: float | None = None, tau: float | None = None
    ) -> None:
        if not isinstance(rule, RobustRule) or rule.name not in (
            "median",
            "trimmed",
            "clipped-gossip",
        ):
            raise ConfigError(f"unknown robust rule {rule!r}; use parse_robust(text)")
        if tau is not None and not (isinstance(tau, (int, float)) and tau >= 0):
            raise ConfigError(f"clipping radius τ must be >= 0, got {tau!r}")
        if byzantine_fraction is not None and not (
            isinstance(byzantine_fraction, (int, float)) and 0 <= byzantine_fraction < 1
        ):
            raise ConfigError(f"byzantine fraction δ must be in [0, 1), got {byzantine_fraction!r}")
        self.rule = rule
        self.tau = tau
        self.byzantine_fraction = byzantine_fraction
        self.last_tau: float | None = None  # the radius of the latest clipped-gossip step

    def mix(
        self,
        x: Mapping[str, np.ndarray],
        peers: Mapping[str, Mapping[str, np.ndarray]],
        weights: Mapping[str, float],
        self_weight: float,
        gamma: float,
    ) -> dict[str, np.ndarray]:
        """Return the mixed model (float32, names and shapes of ``x``; inputs untouched).

        Parameters
        ----------
        x : Mapping[str, np.ndarray]
            This device's model.
        peers : Mapping[str, Mapping[str, np.ndarray]]
            The answered neighbours' states (same names and shapes as ``x``).
        weights : Mapping[str, float]
            w_ij of every peer in ``peers``.
        self_weight : float
            w_ii; implicit in all three rules (kept for the interface of plain mixing).
        gamma : float
            Consensus step γ in (0, 1].

        Raises
        ------
        ConfigError
            A peer without weight, or names/shapes that differ from ``x``.

        """
        del self_weight  # ClippedGossip keeps x_i itself; median/trim count it once
        names = list(x)
        shapes = [np.shape(x[n]) for n in names]
        flat_x = self._flatten(x, names, shapes)
        order = list(peers)
        missing = [p for p in order if p not in weights]
        if missing:
            raise ConfigError(f"no mixing weight for peers {missing!r}")
        if order:
            stack = np.stack([self._flatten(peers[p], names, shapes) for p in order])
            w = np.array([float(weights[p]) for p in order], dtype=np.float64)
            if self.rule.name == "clipped-gossip":
                tau = self.tau
                if tau is None:
                    tau = adaptive_tau(flat_x, stack, w, self.byzantine_fraction)
                self.last_tau = float(tau)
                target = clipped_gossip(flat_x, stack, w, tau)
            else:
                states = np.concatenate([flat_x[None, :], stack])
                if self.rule.name == "median":
                    target = coordinate_median(states)
                else:
                    target = trimmed_mean(states, self.rule.beta)
            flat_x = flat_x + gamma * (target - flat_x)
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, shape in zip(names, shapes, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = flat_x[offset : offset + size].reshape(shape).astype(np.float32)
            offset += size
        return out

    @staticmethod
    def _flatten(
        state: Mapping[str, np.ndarray], names: list[str], shapes: list[tuple[int, ...]]
    ) -> np.ndarray:
        if list(state) != names:
            raise ConfigError(f"state tensors {list(state)} do not match the model {names}")
        parts = []
        for name, shape in zip(names, shapes, strict=True):
            arr = np.asarray(state[name], dtype=np.float64)
            if arr.shape != shape:
                raise ConfigError(f"tensor {name!r} has shape {arr.shape}, expected {shape}")
            parts.append(arr.ravel())
        return np.concatenate(parts) if parts else np.zeros(0)
