"""Topologies: communication graphs, Metropolis–Hastings mixing matrices, spectral gap."""

from meshfl.topology.graphs import (
    TOPOLOGIES,
    Graph,
    build_graph,
    complete,
    exponential,
    ring,
    star,
)
from meshfl.topology.mixing import check_mixing_matrix, metropolis_hastings, spectral_gap

__all__ = [
    "TOPOLOGIES",
    "Graph",
    "build_graph",
    "check_mixing_matrix",
    "complete",
    "exponential",
    "metropolis_hastings",
    "ring",
    "spectral_gap",
    "star",
]
