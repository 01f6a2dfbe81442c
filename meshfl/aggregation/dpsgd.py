"""D-PSGD: uncompressed gossip averaging of full models.

Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient
Descent", NeurIPS 2017, Algorithm 1: ``x_i ← Σ_j W_ij x_j`` after the local step.
With missing neighbours (a round closed at its deadline)::

    x_i ← w_ii x_i + Σ_{j ∈ answered} w_ij x_j + Σ_{j ∉ answered} w_ij x_i

It is :class:`~meshfl.aggregation.CompressedDPSGD` with the lossless identity codec.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from meshfl.aggregation._model import check_answered, check_model
from meshfl.aggregation.compressed_dpsgd import CompressedDPSGD
from meshfl.aggregation.privacy import RobustRule
from meshfl.aggregation.robust import RobustMixer
from meshfl.codecs import Identity
from meshfl.errors import WireError

__all__ = ["DPSGDGossip"]


class DPSGDGossip(CompressedDPSGD):
    """The D-PSGD state of one device: the latest full model of each neighbour.

    ``outgoing`` sends the full model identity-coded (raw float32); ``incoming`` keeps
    the sender's latest model; ``mix`` is the equation above (float64 sums, fixed order).

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The model layout (ordered names and shapes, float32); values are not read.
    neighbours : Mapping[str, float]
        Neighbour id → mixing weight w_ij.
    self_weight : float
        w_ii; with the neighbour weights it must sum to 1 (±1e-6), all ``>= 0``.
    robust : RobustRule, optional
        Mix with a robust rule (:class:`~meshfl.aggregation.robust.RobustMixer`, γ = 1)
        over the neighbours' latest models instead of the weighted average; ``None``:
        plain D-PSGD.

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, or the weights do not sum to 1.

    """

    __slots__ = ("_mixer",)

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
        robust: RobustRule | None = None,
    ) -> None:
        super().__init__(params, neighbours, self_weight, codec=Identity())
        self._mixer = None if robust is None else RobustMixer(robust)

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Plain D-PSGD mixing, or the robust rule's step with γ = 1 when one is set.

        Raises ConfigError (layout, non-neighbour) or WireError (no model yet) as the
        plain step does.
        """
        if self._mixer is None:
            return super().mix(x, answered)
        tensors = check_model(x, self._layout)
        peers = check_answered(answered, self._weights)
        missing = sorted(peer for peer in peers if peer not in self._latest)
        if missing:
            raise WireError(f"answered neighbours {missing!r} have sent no model yet")
        names = [name for name, _ in self._layout]
        ordered = [peer for peer in self._weights if peer in peers]
        states = {p: dict(zip(names, self._latest[p], strict=True)) for p in ordered}
        x_in = dict(zip(names, tensors, strict=True))
        return self._mixer.mix(x_in, states, self._weights, self._self_weight, 1.0)
