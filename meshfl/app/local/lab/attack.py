"""A Byzantine device for tests and demos: sign-flipped, scaled messages.

Not a defence and not for production: :class:`SignFlip` plays the attacker of the
robust-aggregation tests (issue 5: "one neighbour sends sign-flipped, 20× scaled
deltas"), so the robust rules of :mod:`meshfl.aggregation.robust` can be measured.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from meshfl.aggregation.protocol import GossipAlgorithm
from meshfl.codecs import Identity, decode_tensor
from meshfl.errors import ConfigError
from meshfl.wire import TensorEntry

__all__ = ["SignFlip"]


def _flip(entries: Sequence[TensorEntry], factor: float) -> tuple[TensorEntry, ...]:
    codec = Identity()
    out = []
    for entry in entries:
        shape = tuple(entry.shape)
        value = decode_tensor(entry.codec, entry.payload, shape).astype(np.float64) * factor
        payload = codec.encode(value.astype(np.float32))
        out.append(TensorEntry(entry.name, shape, entry.dtype, codec.tag, payload))
    return tuple(out)


class SignFlip:
    """Wrap a gossip algorithm so every message it publishes is multiplied by −scale.

    The wrapped algorithm runs honestly (its own replica x̂_i advances by the true
    message); only what leaves the device is replaced: each entry is decoded with its
    codec, multiplied by −``scale`` and re-encoded losslessly (identity codec, which
    every receiver accepts). With CHOCO-SGD a receiver's replica of the attacker becomes
    x̂⁰ − scale·Σ_t q_t (the attacker's true progress, flipped and scaled); with D-PSGD
    it is −scale·x. Keyframes are flipped too.

    Why not the privatizer hook of :class:`~meshfl.aggregation.ChocoGossip`: there the
    sender's own replica follows the altered message, so x − x̂_i grows by a factor
    ~(1 + scale) each round and overflows float32 within a few dozen rounds; an
    attacker that keeps its honest state sends a steady, stronger attack.

    ``message_kind`` is the wrapped algorithm's, held per instance (not a class
    variable), so static type checkers do not take a SignFlip for a
    :class:`GossipAlgorithm`; at run time it quacks like one.

    Parameters
    ----------
    inner : GossipAlgorithm
        The attacker's honest algorithm state.
    scale : float
        The factor (> 0, finite); 20 is the issue's attack.

    Raises
    ------
    ConfigError
        If ``scale`` is not a finite number > 0.

    """

    __slots__ = ("inner", "message_kind", "scale")

    def __init__(self, inner: GossipAlgorithm, scale: float) -> None:
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not (math.isfinite(scale) and scale > 0)
        ):
            raise ConfigError(f"sign-flip scale must be a finite number > 0, got {scale!r}")
        self.inner = inner
        self.scale = float(scale)
        self.message_kind = inner.message_kind

    def outgoing(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return the honest message multiplied by −scale (identity-coded)."""
        return _flip(self.inner.outgoing(x), -self.scale)

    def keyframe(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return the honest keyframe multiplied by −scale."""
        return _flip(self.inner.keyframe(x), -self.scale)

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Absorb a neighbour's message honestly (delegated)."""
        self.inner.incoming(sender, tensors)

    def incoming_keyframe(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Absorb a neighbour's keyframe honestly (delegated)."""
        self.inner.incoming_keyframe(sender, tensors)

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Mix honestly (delegated): the attacker's own model stays plausible."""
        return self.inner.mix(x, answered)

    def set_neighbours(
        self, neighbours: Mapping[str, float], self_weight: float, listen: Collection[str] = ()
    ) -> None:
        """Delegated."""
        self.inner.set_neighbours(neighbours, self_weight, listen)

    def has_state(self, peer: str) -> bool:
        """Delegated."""
        return self.inner.has_state(peer)

    def forget(self, peer: str) -> None:
        """Delegated."""
        self.inner.forget(peer)

    def mean_of(self, peers: Collection[str]) -> dict[str, np.ndarray]:
        """Delegated."""
        return self.inner.mean_of(peers)
