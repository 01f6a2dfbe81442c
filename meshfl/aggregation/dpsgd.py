"""D-PSGD: uncompressed gossip averaging of full models.

Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient
Descent", NeurIPS 2017, Algorithm 1: ``x_i ← Σ_j W_ij x_j`` after the local step.
With missing neighbours (a round closed at its deadline)::

    x_i ← w_ii x_i + Σ_{j ∈ answered} w_ij x_j + Σ_{j ∉ answered} w_ij x_i

It is :class:`~meshfl.aggregation.CompressedDPSGD` with the lossless identity codec.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from meshfl.aggregation.compressed_dpsgd import CompressedDPSGD
from meshfl.codecs import Identity

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

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, or the weights do not sum to 1.

    """

    __slots__ = ()

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
    ) -> None:
        super().__init__(params, neighbours, self_weight, codec=Identity())
