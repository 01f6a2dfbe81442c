"""Churn: add a device to a running job's graph, or remove one, keeping it connected.

Both operations are local repairs of the current graph, not a rebuild, so the devices
that stay keep (almost all of) their neighbours and their CHOCO-SGD replicas:

- :func:`add_node` attaches the newcomer to the least-loaded nodes (lowest degree first,
  then highest uplink): the opposite of preferential attachment (Barabási & Albert,
  Science 1999, attach to high-degree nodes), so that no device's download grows much;
- :func:`remove_node` links the former neighbours of the departed node along a chain
  (a rule of our own): every path through the departed node is rerouted, so a connected
  graph stays connected. On a ring it is the repair of ring overlays when a peer leaves,
  its predecessor linking to its successor (Chord, Stoica et al., SIGCOMM 2001), and a
  ring minus a node is the ring on ``n − 1`` nodes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from meshfl.errors import ConfigError
from meshfl.topology.graphs import Graph

__all__ = ["add_node", "remove_node"]


def _edge(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i < j else (j, i)


def add_node(graph: Graph, degree: int, uplink: Sequence[float | None] | None = None) -> Graph:
    """Return ``graph`` with a new node ``graph.n`` attached to ``min(degree, n)`` nodes.

    The new node's neighbours are the existing nodes with the lowest current degree;
    ties go to the higher uplink (``None``, unmeasured, counts as the highest), then to
    the lower index. A connected graph stays connected (the new node has at least one
    neighbour).

    Parameters
    ----------
    graph : Graph
        The current graph on ``n`` nodes.
    degree : int
        Wanted degree of the new node, ``>= 1``; capped at ``n``.
    uplink : sequence of float or None, optional
        Measured uplink per existing node, bytes per second (length ``n``, or ``n + 1``
        with the new node's value last, which is ignored). ``None`` entries and a
        missing sequence mean "unmeasured".

    Returns
    -------
    Graph
        On ``n + 1`` nodes; node ``n`` is the new one, every other edge unchanged.

    Raises
    ------
    ConfigError
        If ``degree < 1`` or ``uplink`` has another length.

    """
    n = graph.n
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ConfigError(f"a joining device needs degree >= 1, got {degree!r}")
    if uplink is None:
        uplink = [None] * n
    if len(uplink) not in (n, n + 1):
        raise ConfigError(f"add_node needs one uplink per node ({n}), got {len(uplink)}")
    speed = [math.inf if u is None else float(u) for u in uplink[:n]]
    chosen = sorted(range(n), key=lambda i: (graph.degree(i), -speed[i], i))[: min(degree, n)]
    return Graph(n + 1, graph.edges | {(i, n) for i in chosen})


def remove_node(graph: Graph, i: int) -> tuple[Graph, list[int]]:
    """Remove node ``i`` and reconnect its former neighbours along a chain.

    Nodes after ``i`` move down by one (``j > i`` becomes ``j − 1``). The former
    neighbours of ``i``, by their new indices ascending ``a0 < a1 < …``, are linked
    ``a0 — a1``, ``a1 — a2``, … where not already adjacent. Every path that went through
    ``i`` still exists, so a connected graph stays connected, and the Metropolis–Hastings
    matrix of the result is a valid mixing matrix. A ring minus a node is exactly the
    ring on ``n − 1`` nodes.

    Parameters
    ----------
    graph : Graph
        The current graph on ``n >= 2`` nodes.
    i : int
        The node that leaves, ``0 <= i < n``.

    Returns
    -------
    tuple of (Graph, list of int)
        The graph on ``n − 1`` nodes, and ``mapping`` of length ``n`` with
        ``mapping[old] = new`` index and ``mapping[i] = -1``.

    Raises
    ------
    ConfigError
        If ``i`` is not a node, or it is the last one (a graph needs a node).

    """
    n = graph.n
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise ConfigError(f"cannot remove device {i!r}: the graph has devices 0 .. {n - 1}")
    if n == 1:
        raise ConfigError("cannot remove the last device; stop the job instead")
    mapping = [j if j < i else j - 1 for j in range(n)]
    mapping[i] = -1
    edges = {_edge(mapping[a], mapping[b]) for a, b in graph.edges if i not in (a, b)}
    former = sorted(mapping[j] for j in graph.neighbours(i))
    edges.update(_edge(a, b) for a, b in itertools.pairwise(former))
    return Graph(n - 1, frozenset(edges)), mapping
