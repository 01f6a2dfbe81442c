"""Gradient tracking with compressed messages (BEER), one round = one local epoch.

Zhao, Li, Li, Richtárik, Chi, "BEER: Fast O(1/T) Rate for Decentralized Nonconvex
Optimization with Communication Compression", NeurIPS 2022, Algorithm 1. Node i holds its
model x_i, a tracker v_i of the network's average gradient, and CHOCO-style public
replicas h_j (of the models) and g_j (of the trackers) of itself and its neighbours::

    x_i ← x_i + γ Σ_j w_ij (h_j − h_i) − η v_i                          (BEER, line 3)
    h_i ← h_i + C(x_i − h_i)            (sent; every replica of h_i adds the same)
    v_i ← v_i + γ Σ_j w_ij (g_j − g_i) + p_i^new − p_i^old               (BEER, line 5)
    g_i ← g_i + C(v_i − g_i)            (sent)

Both model and tracker travel as compressed *differences* against replicas, which is
their error feedback (nothing dropped is lost: the next difference carries it). The
tracker keeps Σ_i v_i = Σ_i p_i, so the data-heterogeneity term of D-SGD's bound
disappears (their Theorem 1).

meshfl's round runs a local epoch, so the "gradient" is the epoch's pseudo-gradient
``p_i = (x_start − x_local) / η`` (a sum of τ minibatch gradients along the way). One
round sends one envelope holding both differences (tensors named ``h/<name>`` and
``g/<name>``: twice a CHOCO message's payload); the tracker update uses the replicas of
the previous round (BEER's two messages of an iteration merged into one, the tracker
one round behind). Replicas start at x⁰ (h, shared start) and at 0 (g); v starts at the
first pseudo-gradient.

Combines with every codec (δ-contractions; BEER's γ must shrink with δ), not with
secure aggregation (the replica differences are per-sender, not sums) nor asynchronous
rounds (the tracker's invariant needs every g-difference applied before it is mixed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from meshfl.aggregation._model import check_model, check_weights, decode_entries, layout_of
from meshfl.codecs import Codec
from meshfl.errors import ConfigError
from meshfl.wire import DType, TensorEntry

__all__ = ["GradientTracking"]


class GradientTracking:
    """One device's BEER state: model/tracker replicas of itself and its neighbours.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        Shared start x⁰ (float32) and the layout.
    neighbours : Mapping[str, float]
        Neighbour id → w_ij.
    self_weight : float
        w_ii; with the neighbour weights it must sum to 1 (±1e-6), all ``>= 0``.
    consensus_step : float
        γ in (0, 1].
    codec : Codec
        Compressor of both differences.

    Raises
    ------
    ConfigError
        On invalid weights, γ or codec.

    """

    message_kind: ClassVar[int] = 1  # meshfl.wire.MessageKind.DELTA
    __slots__ = (
        "_codec",
        "_g",
        "_gamma",
        "_h",
        "_layout",
        "_next",
        "_p_old",
        "_v",
        "_weights",
        "_wire",
    )

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
        consensus_step: float,
        codec: Codec,
    ) -> None:
        if not isinstance(codec, Codec):
            raise ConfigError(f"codec must be a meshfl Codec, got {type(codec).__name__}")
        ok = not isinstance(consensus_step, bool) and isinstance(consensus_step, (int, float))
        if not (ok and 0.0 < consensus_step <= 1.0):
            raise ConfigError(f"consensus step γ must be in (0, 1], got {consensus_step!r}")
        self._weights = check_weights(neighbours, self_weight)
        self._gamma = float(consensus_step)
        self._codec = codec
        self._layout = layout_of(params)
        self._wire = tuple((f"{p}/{n}", s) for p in ("h", "g") for n, s in self._layout)
        x0 = [np.array(params[n], dtype=np.float32) for n, _ in self._layout]
        peers = ["<self>", *self._weights]
        self._h = {p: [a.copy() for a in x0] for p in peers}
        self._g = {p: [np.zeros_like(a) for a in x0] for p in peers}
        self._v: list[np.ndarray] | None = None
        self._p_old: list[np.ndarray] = []
        self._next: list[np.ndarray] = []

    @property
    def neighbours(self) -> list[str]:
        """The neighbour ids."""
        return list(self._weights)

    def _gossip(self, table: Mapping[str, list[np.ndarray]], t: int) -> np.ndarray:
        own = table["<self>"][t].astype(np.float64)
        acc = np.zeros_like(own)
        for peer, w in self._weights.items():
            acc += w * (table[peer][t].astype(np.float64) - own)
        return self._gamma * acc

    def outgoing(
        self, x_start: Mapping[str, np.ndarray], x_local: Mapping[str, np.ndarray], lr: float
    ) -> tuple[TensorEntry, ...]:
        """Do BEER's tracker and model updates and return the round's message.

        ``x_start`` is the model before the local epoch, ``x_local`` after; ``lr`` is η.

        Raises
        ------
        ConfigError
            If a model mismatches the layout or η is not > 0.
        CodecError
            If a difference holds NaN/inf; the state is then unchanged.

        """
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ConfigError(f"learning rate must be > 0, got {lr!r}")
        start, local = check_model(x_start, self._layout), check_model(x_local, self._layout)
        p = [(s - loc) / np.float32(lr) for s, loc in zip(start, local, strict=True)]
        if self._v is None:
            v = [a.copy() for a in p]
        else:
            v = [
                (old + self._gossip(self._g, t) + (p[t] - self._p_old[t])).astype(np.float32)
                for t, old in enumerate(self._v)
            ]
        nxt = [
            (s + self._gossip(self._h, t) - lr * v[t]).astype(np.float32)
            for t, s in enumerate(start)
        ]
        staged = []  # encode both differences before any state moves: all or nothing
        for table, values in ((self._h, nxt), (self._g, v)):
            for val, rep in zip(values, table["<self>"], strict=True):
                staged.append((rep, self._codec.encode(val - rep)))
        self._v, self._p_old, self._next = v, p, nxt
        entries = []
        for (rep, payload), (name, shape) in zip(staged, self._wire, strict=True):
            rep += self._codec.decode(payload, shape)
            entries.append(TensorEntry(name, shape, DType.FLOAT32, self._codec.tag, payload))
        return tuple(entries)

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Apply a neighbour's differences to h_j and g_j (state unchanged on error)."""
        decoded = decode_entries(sender, tensors, self._wire, self._weights)
        k = len(self._layout)
        for t in range(k):
            self._h[sender][t] += decoded[t]
            self._g[sender][t] += decoded[k + t]

    def mix(self, x_start: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return the model computed by :meth:`outgoing` (``x_start`` checks the layout)."""
        check_model(x_start, self._layout)
        if not self._next:
            raise ConfigError("mix before outgoing")
        return {n: a.copy() for (n, _), a in zip(self._layout, self._next, strict=True)}

    def tracker(self) -> dict[str, np.ndarray]:
        """A copy of v_i (zeros before the first round)."""
        v = self._v if self._v is not None else [np.zeros(s, np.float32) for _, s in self._layout]
        return {n: a.copy() for (n, _), a in zip(self._layout, v, strict=True)}
