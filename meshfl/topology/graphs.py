"""Undirected communication graphs and their builders.

A :class:`Graph` has nodes ``0 .. n−1`` and undirected edges stored as ``(i, j)`` with
``i < j``. Builders: ring, complete, star (node 0 is the hub; FedAvg as a special case)
and the static exponential graph (Assran et al., ICML 2019 "Stochastic Gradient Push";
Ying et al., NeurIPS 2021 "Exponential Graph is Provably Efficient").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from meshfl.errors import ConfigError, TopologyError

__all__ = ["TOPOLOGIES", "Graph", "build_graph", "complete", "exponential", "ring", "star"]


@dataclass(frozen=True)
class Graph:
    """An undirected simple graph on nodes ``0 .. n−1``.

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 1``.
    edges : frozenset of (int, int)
        Undirected edges as ``(i, j)`` with ``0 <= i < j < n`` (no self loops, no
        duplicates by construction).

    Raises
    ------
    TopologyError
        If ``n < 1`` or an edge is not of the form ``(i, j)``, ``0 <= i < j < n``.

    """

    n: int
    edges: frozenset[tuple[int, int]]
    _adjacency: tuple[tuple[int, ...], ...] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise TopologyError(f"a graph needs n >= 1 nodes, got {self.n!r}")
        adjacency: list[list[int]] = [[] for _ in range(self.n)]
        for edge in self.edges:
            if not (isinstance(edge, tuple) and len(edge) == 2):
                raise TopologyError(f"edge {edge!r} is not a pair (i, j)")
            i, j = edge
            if not (isinstance(i, int) and isinstance(j, int) and 0 <= i < j < self.n):
                raise TopologyError(f"edge {edge!r} must satisfy 0 <= i < j < n={self.n}")
            adjacency[i].append(j)
            adjacency[j].append(i)
        object.__setattr__(self, "_adjacency", tuple(tuple(sorted(a)) for a in adjacency))

    def neighbours(self, i: int) -> tuple[int, ...]:
        """Return the neighbours of node ``i``, sorted ascending.

        Raises
        ------
        TopologyError
            If ``i`` is not a node.

        """
        if not 0 <= i < self.n:
            raise TopologyError(f"node {i} is not in a graph of {self.n} nodes")
        return self._adjacency[i]

    def degree(self, i: int) -> int:
        """Return the number of neighbours of node ``i`` (raises TopologyError if absent)."""
        return len(self.neighbours(i))

    def is_connected(self) -> bool:
        """Return True when every node is reachable from node 0 (breadth-first search)."""
        seen = {0}
        frontier = [0]
        while frontier:
            nxt = []
            for i in frontier:
                for j in self._adjacency[i]:
                    if j not in seen:
                        seen.add(j)
                        nxt.append(j)
            frontier = nxt
        return len(seen) == self.n


def _edge(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i < j else (j, i)


def ring(n: int) -> Graph:
    """Cycle ``i — i+1 mod n``: degree 2 for n >= 3, one edge for n = 2, none for n = 1."""
    return Graph(n, frozenset(_edge(i, (i + 1) % n) for i in range(n) if n > 1))


def complete(n: int) -> Graph:
    """Every pair of nodes connected: degree ``n − 1``."""
    return Graph(n, frozenset((i, j) for i in range(n) for j in range(i + 1, n)))


def star(n: int) -> Graph:
    """Node 0 is the hub, connected to every other node; leaves have degree 1."""
    return Graph(n, frozenset((0, j) for j in range(1, n)))


def exponential(n: int) -> Graph:
    """Build the static exponential graph: ``i`` linked to ``i ± 2**k mod n``, ``2**k < n``.

    Undirected version of the graph of Assran et al. (ICML 2019) and Ying et al.
    (NeurIPS 2021); for n = 8 each node has degree 5 (offsets ±1, ±2, 4).
    """
    edges = set()
    step = 1
    while step < n:
        for i in range(n):
            j = (i + step) % n
            if j != i:
                edges.add(_edge(i, j))
        step *= 2
    return Graph(n, frozenset(edges))


_BUILDERS: dict[str, Callable[[int], Graph]] = {
    "ring": ring,
    "complete": complete,
    "star": star,
    "exponential": exponential,
}

TOPOLOGIES: tuple[str, ...] = tuple(_BUILDERS)
"""Names accepted by :func:`build_graph`."""


def build_graph(kind: str, n: int) -> Graph:
    """Build a named topology on ``n`` nodes.

    Parameters
    ----------
    kind : str
        One of :data:`TOPOLOGIES`: ``"ring"``, ``"complete"``, ``"star"``, ``"exponential"``.
    n : int
        Number of nodes, ``>= 1``.

    Raises
    ------
    ConfigError
        If ``kind`` is unknown (the message lists the valid kinds) or ``n < 1``.

    """
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ConfigError(f"unknown topology {kind!r}; valid kinds: {', '.join(TOPOLOGIES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"a {kind} topology needs n >= 1 nodes, got {n!r}")
    return builder(n)
