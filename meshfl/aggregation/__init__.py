"""Gossip algorithms as explicit state objects (numpy only, no I/O).

Per round, a device calls ``outgoing(x)`` and publishes the entries, feeds each
neighbour's message to ``incoming(sender, tensors)`` (exactly once), and then calls
``mix(x, answered)`` with the neighbours whose messages arrived by the deadline.
"""

from meshfl.aggregation.choco import ChocoGossip
from meshfl.aggregation.compressed_dpsgd import CompressedDPSGD
from meshfl.aggregation.dp import GaussianPrivatizer, Privatizer, clip_l2
from meshfl.aggregation.dpsgd import DPSGDGossip
from meshfl.aggregation.error_feedback import ErrorFeedback
from meshfl.aggregation.protocol import GossipAlgorithm
from meshfl.aggregation.robust import (
    RobustMixer,
    adaptive_tau,
    clipped_gossip,
    coordinate_median,
    trimmed_mean,
)
from meshfl.aggregation.secure import (
    FixedPoint,
    add_mod,
    mask,
    pack_words,
    prg_words,
    shared_indices,
    skellam_noise,
    unmask,
    unpack_words,
)
from meshfl.aggregation.secure_choco import Contribution, SecureChoco
from meshfl.aggregation.sketch import consensus_distance, consensus_sketch

__all__ = [
    "ChocoGossip",
    "CompressedDPSGD",
    "Contribution",
    "DPSGDGossip",
    "ErrorFeedback",
    "FixedPoint",
    "GaussianPrivatizer",
    "GossipAlgorithm",
    "Privatizer",
    "RobustMixer",
    "SecureChoco",
    "adaptive_tau",
    "add_mod",
    "clip_l2",
    "clipped_gossip",
    "consensus_distance",
    "consensus_sketch",
    "coordinate_median",
    "mask",
    "pack_words",
    "prg_words",
    "shared_indices",
    "skellam_noise",
    "trimmed_mean",
    "unmask",
    "unpack_words",
]
