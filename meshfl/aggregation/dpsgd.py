"""D-PSGD: uncompressed gossip averaging of full models.

Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient
Descent", NeurIPS 2017, Algorithm 1: ``x_i ← Σ_j W_ij x_j`` after the local step.
With missing neighbours (a round closed at its deadline)::

    x_i ← w_ii x_i + Σ_{j ∈ answered} w_ij x_j + Σ_{j ∉ answered} w_ij x_i
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

import numpy as np

from meshfl.aggregation._model import (
    check_answered,
    check_model,
    check_weights,
    decode_entries,
    layout_of,
)
from meshfl.codecs import Identity
from meshfl.errors import WireError
from meshfl.wire import DType, TensorEntry

__all__ = ["DPSGDGossip"]


class DPSGDGossip:
    """The D-PSGD state of one device: the latest full model of each neighbour.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The model layout (ordered names and shapes, float32); values are not read.
    neighbours : Mapping[str, float]
        Neighbour id → mixing weight w_ij.
    self_weight : float
        w_ii; with the neighbour weights it must sum to 1 (±1e-6), all ``>= 0``.

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, or the weights do not sum to 1.

    """

    message_kind: ClassVar[int] = 2  # meshfl.wire.MessageKind.MODEL
    __slots__ = ("_codec", "_latest", "_layout", "_self_weight", "_weights")

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
    ) -> None:
        self._weights = check_weights(neighbours, self_weight)
        self._self_weight = float(self_weight)
        self._layout = layout_of(params)
        self._codec = Identity()
        self._latest: dict[str, list[np.ndarray]] = {}

    def outgoing(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return the full model, identity-coded (raw float32), one entry per tensor.

        Raises
        ------
        ConfigError
            If ``x`` does not match the model layout.
        CodecError
            If a tensor holds NaN/inf.

        """
        tensors = check_model(x, self._layout)
        return tuple(
            TensorEntry(name, shape, DType.FLOAT32, Identity.tag, self._codec.encode(t))
            for (name, shape), t in zip(self._layout, tensors, strict=True)
        )

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Store ``sender``'s latest model (replacing the previous one).

        Raises
        ------
        WireError
            If ``sender`` is not a neighbour or names/shapes/dtypes differ from the model.
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        self._latest[sender] = decode_entries(sender, tensors, self._layout, self._weights)

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Gossip average with the answered neighbours' latest models (float64 accumulation).

        Returns
        -------
        dict of str to np.ndarray
            The new float32 model; ``x`` is not modified.

        Raises
        ------
        ConfigError
            If ``x`` does not match the layout or ``answered`` holds a non-neighbour.
        WireError
            If a neighbour in ``answered`` has never sent a model.

        """
        tensors = check_model(x, self._layout)
        peers = check_answered(answered, self._weights)
        ordered = [peer for peer in self._weights if peer in peers]  # deterministic sum order
        missing = sorted(peer for peer in peers if peer not in self._latest)
        if missing:
            raise WireError(f"answered neighbours {missing!r} have sent no model yet")
        own_weight = self._self_weight + sum(
            w for peer, w in self._weights.items() if peer not in peers
        )
        out: dict[str, np.ndarray] = {}
        for t, (name, _) in enumerate(self._layout):
            acc = own_weight * tensors[t].astype(np.float64)
            for peer in ordered:
                acc += self._weights[peer] * self._latest[peer][t].astype(np.float64)
            out[name] = acc.astype(np.float32)
        return out
