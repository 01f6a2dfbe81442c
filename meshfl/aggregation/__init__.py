"""Gossip algorithms as explicit state objects (numpy only, no I/O).

Per round, a device calls ``outgoing(x)`` and publishes the entries, feeds each
neighbour's message to ``incoming(sender, tensors)`` (exactly once), and then calls
``mix(x, answered)`` with the neighbours whose messages arrived by the deadline.
"""

from meshfl.aggregation.choco import ChocoGossip
from meshfl.aggregation.compressed_dpsgd import CompressedDPSGD
from meshfl.aggregation.dpsgd import DPSGDGossip
from meshfl.aggregation.error_feedback import ErrorFeedback
from meshfl.aggregation.protocol import GossipAlgorithm
from meshfl.aggregation.sketch import consensus_distance, consensus_sketch

__all__ = [
    "ChocoGossip",
    "CompressedDPSGD",
    "DPSGDGossip",
    "ErrorFeedback",
    "GossipAlgorithm",
    "consensus_distance",
    "consensus_sketch",
]
