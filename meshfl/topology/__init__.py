"""Topologies: graphs, mixing matrices (Metropolis–Hastings, max-degree), spectral gap, churn."""

from meshfl.topology.churn import add_node, remove_node
from meshfl.topology.graphs import (
    TOPOLOGIES,
    Graph,
    build_graph,
    complete,
    erdos_renyi,
    exponential,
    from_edge_list,
    one_peer_exponential,
    random_regular,
    ring,
    small_world,
    star,
    torus,
)
from meshfl.topology.mixing import (
    MIXING_RULES,
    check_mixing_matrix,
    metropolis_hastings,
    mixing_matrix,
    spectral_gap,
    uniform_weights,
)

__all__ = [
    "MIXING_RULES",
    "TOPOLOGIES",
    "Graph",
    "add_node",
    "build_graph",
    "check_mixing_matrix",
    "complete",
    "erdos_renyi",
    "exponential",
    "from_edge_list",
    "metropolis_hastings",
    "mixing_matrix",
    "one_peer_exponential",
    "random_regular",
    "remove_node",
    "ring",
    "small_world",
    "spectral_gap",
    "star",
    "torus",
    "uniform_weights",
]
