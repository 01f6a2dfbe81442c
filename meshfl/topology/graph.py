"""The undirected :class:`Graph` every topology builder returns, and their shared checks.

Nodes are ``0 .. n−1``; undirected edges are stored as ``(i, j)`` with ``i < j``. The
builders live in :mod:`meshfl.topology.families` (deterministic),
:mod:`meshfl.topology.random_graphs` (seeded) and :mod:`meshfl.topology.edge_list`
(custom); :func:`meshfl.topology.graphs.build_graph` picks one by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meshfl.errors import ConfigError, TopologyError

__all__ = ["Graph"]


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


def _reachable_from_0(graph: Graph) -> set[int]:
    seen = {0}
    stack = [0]
    while stack:
        for j in graph.neighbours(stack.pop()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def _check_n(kind: str, n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"a {kind} topology needs n >= 1 nodes, got {n!r}")


def _check_int(kind: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{kind}: {name} must be an integer, got {value!r}")


def _check_probability(kind: str, p: object) -> None:
    if (
        isinstance(p, bool)
        or not isinstance(p, (int, float))
        or not math.isfinite(p)
        or not 0.0 <= p <= 1.0
    ):
        raise ConfigError(f"{kind}: probability must be in [0, 1], got {p!r}")
