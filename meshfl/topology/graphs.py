"""Undirected communication graphs and their builders.

A :class:`Graph` has nodes ``0 .. n−1`` and undirected edges stored as ``(i, j)`` with
``i < j``. Builders:

- :func:`ring`, :func:`complete`, :func:`star` (node 0 is the hub; FedAvg as a special
  case);
- :func:`torus`: the 2-D torus on the most nearly square ``r × c = n`` grid;
- :func:`exponential`: the static exponential graph (Assran et al., ICML 2019
  "Stochastic Gradient Push"; Ying et al., NeurIPS 2021 "Exponential Graph is Provably
  Efficient for Decentralized Deep Training");
- :func:`one_peer_exponential`: its time-varying one-peer version (Ying et al. 2021);
- :func:`random_regular`: a uniformly random ``d``-regular graph by the configuration
  model (Bollobás 1980) with the Steger–Wormald pairing (Steger & Wormald, Combinatorics,
  Probability and Computing 1999);
- :func:`erdos_renyi`: G(n, p) (Erdős & Rényi 1959; Gilbert 1959), resampled until
  connected;
- :func:`small_world`: Watts–Strogatz (Nature 1998), resampled until connected;
- :func:`from_edge_list`: a custom graph from a JSON edge list.

Random builders draw from :class:`random.Random` seeded with ``seed``: the same
``(n, parameters, seed)`` gives the same graph on every machine, so every device of a job
can build the topology itself.
"""

from __future__ import annotations

import os

from meshfl.errors import ConfigError
from meshfl.topology.edge_list import MAX_CUSTOM_NODES, from_edge_list
from meshfl.topology.families import (
    complete,
    exponential,
    one_peer_exponential,
    ring,
    star,
    torus,
)
from meshfl.topology.graph import Graph, _check_n
from meshfl.topology.random_graphs import erdos_renyi, random_regular, small_world

__all__ = [
    "MAX_CUSTOM_NODES",
    "TOPOLOGIES",
    "Graph",
    "build_graph",
    "complete",
    "erdos_renyi",
    "exponential",
    "from_edge_list",
    "one_peer_exponential",
    "random_regular",
    "ring",
    "small_world",
    "star",
    "torus",
]


TOPOLOGIES: tuple[str, ...] = (
    "ring",
    "complete",
    "star",
    "exponential",
    "torus",
    "one-peer-exponential",
    "random-regular",
    "erdos-renyi",
    "small-world",
)
"""Names accepted by :func:`build_graph` (besides a path to a ``.json`` edge list)."""


DEFAULT_DEGREE = 4
"""``build_graph``'s default degree (random-regular d, small-world k); for small-world on a
fleet too small for it, the largest even k < n is used instead."""


def build_graph(
    kind: str | os.PathLike[str],
    n: int,
    *,
    degree: int = DEFAULT_DEGREE,
    probability: float = 0.3,
    seed: int = 0,
    round_: int = 0,
) -> Graph:
    """Build a named topology on ``n`` nodes.

    Parameters
    ----------
    kind : str or os.PathLike
        One of :data:`TOPOLOGIES` or a path to a ``.json`` edge list
        (:func:`from_edge_list`):

        - ``"ring"``, ``"complete"``, ``"star"``, ``"exponential"``, ``"torus"``: no
          parameters;
        - ``"one-peer-exponential"``: ``round_`` (the graph of that round);
        - ``"random-regular"``: ``degree``, ``seed``;
        - ``"erdos-renyi"``: ``probability`` (edge probability), ``seed``;
        - ``"small-world"``: ``degree`` (lattice neighbours ``k``, even), ``probability``
          (rewiring), ``seed``.
    n : int
        Number of nodes, ``>= 1``; for a JSON file it must equal the file's ``n``.
    degree : int
        Node degree of ``random-regular``, lattice degree ``k`` of ``small-world``.
    probability : float
        Edge probability of ``erdos-renyi``, rewiring probability of ``small-world``.
    seed : int
        Seed of the random builders.
    round_ : int
        Round of the time-varying ``one-peer-exponential`` graph.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``kind`` is unknown (the message lists the valid kinds), ``n < 1``, a
        parameter is invalid for ``kind``, or a JSON file is invalid or has another ``n``.

    """
    if not isinstance(kind, (str, os.PathLike)):
        raise ConfigError(f"topology must be a name or a path, got {kind!r}")
    if isinstance(kind, os.PathLike) or kind.lower().endswith(".json"):
        _check_n("custom", n)
        graph = from_edge_list(kind)
        if graph.n != n:
            raise ConfigError(
                f"custom topology file {os.fspath(kind)!r} has {graph.n} nodes but {n} are needed"
            )
        return graph
    if kind not in TOPOLOGIES:
        raise ConfigError(
            f"unknown topology {kind!r}; valid kinds: {', '.join(TOPOLOGIES)}, "
            "or a path to a .json edge list"
        )
    _check_n(kind, n)
    if kind == "torus":
        return torus(n)
    if kind == "one-peer-exponential":
        return one_peer_exponential(n, round_)
    if kind == "random-regular":
        return random_regular(n, degree, seed)
    if kind == "erdos-renyi":
        return erdos_renyi(n, probability, seed)
    if kind == "small-world":
        # A small fleet cannot hold the *default* lattice degree: use the largest even
        # k < n. A degree the caller chose is built as asked (or refused, naming it).
        k = min(degree, (n - 1) // 2 * 2) if degree == DEFAULT_DEGREE else degree
        return small_world(n, k if k >= 2 else degree, probability, seed)
    return {"ring": ring, "complete": complete, "star": star, "exponential": exponential}[kind](n)
