"""The interface shared by the gossip algorithms."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar, Protocol

import numpy as np

from meshfl.wire import TensorEntry

__all__ = ["GossipAlgorithm"]


class GossipAlgorithm(Protocol):
    """One device's gossip state: publish, absorb neighbours' messages, mix.

    ``message_kind`` is the :class:`meshfl.wire.MessageKind` value of the envelopes
    this algorithm publishes (1 = DELTA for CHOCO-SGD, 2 = MODEL for D-PSGD).
    """

    message_kind: ClassVar[int]

    def outgoing(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return this round's message: one FLOAT32 entry per tensor, in model order."""
        ...

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Apply a neighbour's message (exactly once); state unchanged on error."""
        ...

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Return the model after this round's consensus step with the answered neighbours."""
        ...

    def set_neighbours(
        self, neighbours: Mapping[str, float], self_weight: float, listen: Collection[str] = ()
    ) -> None:
        """Use another row of W; keep state of peers in ``neighbours`` or ``listen``."""
        ...

    def has_state(self, peer: str) -> bool:
        """Whether ``peer`` can be mixed (its replica or model is known)."""
        ...

    def keyframe(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return a lossless, absolute message of ``x`` (wire kind KEYFRAME)."""
        ...

    def incoming_keyframe(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Take a neighbour's keyframe: its replica or model becomes the keyframe."""
        ...

    def forget(self, peer: str) -> None:
        """Drop what is held of ``peer``; it must send a keyframe before it is mixed again."""
        ...

    def mean_of(self, peers: Collection[str]) -> dict[str, np.ndarray]:
        """Return the mean of the held states of ``peers``."""
        ...
