"""D-PSGD (Lian et al., NeurIPS 2017): each round, every neighbour's whole model, mixed."""

from __future__ import annotations

from edge_agent.round_engine import Params
from edge_agent.versions import TopologyVersion
from meshfl.aggregation import DPSGDGossip, GossipAlgorithm
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import Assignment

__all__ = ["build"]


def build(
    assignment: Assignment, privacy: PrivacyOptions, params: Params, topology: TopologyVersion
) -> GossipAlgorithm:
    """D-PSGD's state for this device, mixing with ``topology``'s row of the first round.

    ``privacy.robust`` names the robust mixing rule (None: plain weighted mean).
    """
    weights, self_weight = topology.row(max(1, assignment["start_round"]))
    dpsgd = DPSGDGossip(params, weights, self_weight, robust=privacy.robust)
    dpsgd.set_neighbours(weights, self_weight, listen=topology.peers())
    return dpsgd
