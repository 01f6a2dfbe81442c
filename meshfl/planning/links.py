"""The graph side of planning: which links are slow, and a graph that avoids them.

- :func:`slow_nodes`: nodes whose measured uplink is far below the median;
- :func:`link_aware_graph`: slow links carry fewer edges (a simplification of Sun,
  Nguyen & He 2025, topology/weight co-design for bandwidth-limited edge networks);
- :func:`no_wait`: the neighbours a synchronous round need not wait for.

Pure, deterministic functions; ``docs/planning.md`` gives the rules and their sources.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from meshfl.errors import ConfigError
from meshfl.planning.checks import _check_measurements, _is_number
from meshfl.topology.graphs import Graph

__all__ = ["link_aware_graph", "no_wait", "slow_nodes"]


def link_aware_graph(
    graph: Graph, uplink_bytes_per_s: Sequence[float | None], *, slow_fraction: float = 0.25
) -> Graph:
    """Return ``graph`` with fewer edges on slow links, still connected.

    A simplification of Sun, Nguyen & He (2025), who co-design the topology and the
    mixing weights of decentralized learning for bandwidth-limited edge networks: links
    through a slow device are expensive, so it should carry few edges. Here:

    1. A node is *slow* if its uplink is below ``slow_fraction`` × the median of the
       measured uplinks; an unmeasured uplink counts as fast (and as the highest).
    2. Each slow node keeps the edge to its neighbour with the highest uplink (ties:
       lowest index) and drops its other edges, worst uplink first, except an edge whose
       removal would disconnect its endpoints (a bridge) or that another slow node
       keeps. A slow node whose edges are not bridges ends up a leaf.
    3. Each fast node that lost an edge (in index order) gets new edges to fast nodes it
       is not adjacent to until it is back at its original degree or no candidate is
       left. Candidates that also lost an edge come first (so both regain degree), then
       the highest uplink, then the lowest index.

    The result is connected whenever ``graph`` is (only non-bridges are removed, and
    edges are only added). With no slow node the graph is returned unchanged.

    Parameters
    ----------
    graph : Graph
        The planned topology on ``n`` nodes.
    uplink_bytes_per_s : sequence of float or None
        Measured uplink per node, bytes per second, length ``n``; ``None``: unmeasured.
    slow_fraction : float, default 0.25
        A node below this fraction of the median uplink is slow; in (0, 1].

    Returns
    -------
    Graph
        Same ``n``; connected when ``graph`` is.

    Raises
    ------
    ConfigError
        If the uplinks do not have length ``n``, one is negative or not finite, or
        ``slow_fraction`` is not in (0, 1].

    """
    n = graph.n
    if len(uplink_bytes_per_s) != n:
        raise ConfigError(
            f"link-aware planning needs one uplink per node: {len(uplink_bytes_per_s)} "
            f"uplinks for {n} nodes"
        )
    slow = slow_nodes(uplink_bytes_per_s, slow_fraction=slow_fraction)
    if not any(slow):
        return graph
    speed = [math.inf if u is None else float(u) for u in uplink_bytes_per_s]

    adjacency = [set(graph.neighbours(i)) for i in range(n)]
    kept: set[tuple[int, int]] = set()
    for s in range(n):
        if slow[s] and adjacency[s]:
            best = min(adjacency[s], key=lambda j: (-speed[j], j))
            kept.add(_edge(s, best))
    lost = [0] * n
    for s in range(n):
        if not slow[s]:
            continue
        for j in sorted(adjacency[s], key=lambda j: (speed[j], -j)):  # worst first
            if _edge(s, j) in kept:
                continue
            adjacency[s].discard(j)
            adjacency[j].discard(s)
            if _reachable(adjacency, s, j):
                lost[j] += 1
            else:  # a bridge: keep it
                adjacency[s].add(j)
                adjacency[j].add(s)

    for f in range(n):
        if slow[f]:
            continue
        candidates = sorted(
            (c for c in range(n) if c != f and not slow[c] and c not in adjacency[f]),
            key=lambda c: (lost[c] <= 0, -speed[c], c),
        )
        for c in candidates:
            if lost[f] <= 0:
                break
            adjacency[f].add(c)
            adjacency[c].add(f)
            lost[f] -= 1
            lost[c] -= 1
    return Graph(n, frozenset(_edge(i, j) for i in range(n) for j in adjacency[i] if i < j))


def slow_nodes(
    uplink_bytes_per_s: Sequence[float | None], *, slow_fraction: float = 0.25
) -> list[bool]:
    """Return whether each node's uplink is below ``slow_fraction`` × the median uplink.

    Unmeasured (``None``) uplinks count as fast. Raises ConfigError on a negative or
    non-finite uplink or ``slow_fraction`` outside (0, 1].
    """
    if not _is_number(slow_fraction) or not 0.0 < slow_fraction <= 1.0:
        raise ConfigError(f"slow_fraction must be in (0, 1], got {slow_fraction!r}")
    _check_measurements(uplink_bytes_per_s, "uplink bytes/s")
    measured = [float(u) for u in uplink_bytes_per_s if u is not None]
    if not measured:
        return [False] * len(uplink_bytes_per_s)
    cutoff = slow_fraction * statistics.median(measured)
    return [u is not None and float(u) < cutoff for u in uplink_bytes_per_s]


def no_wait(
    graph: Graph, uplink_bytes_per_s: Sequence[float | None], *, slow_fraction: float = 0.25
) -> dict[int, frozenset[int]]:
    """Return, per fast node, the slow neighbours its synchronous rounds do not wait for.

    A slow link (:func:`slow_nodes`) is the one a synchronous round would wait on every
    time; its fast neighbour mixes the slow node's latest state instead (within the job's
    staleness bound) while the slow node itself still waits for its neighbours. So a
    slow link slows only itself, and the fast part of the graph keeps its pace. Nodes
    with nothing to skip are absent from the result.

    Raises
    ------
    ConfigError
        If the uplinks are not one per node, or as :func:`slow_nodes`.

    """
    if len(uplink_bytes_per_s) != graph.n:
        raise ConfigError(
            f"no_wait needs one uplink per node: {len(uplink_bytes_per_s)} for {graph.n} nodes"
        )
    slow = slow_nodes(uplink_bytes_per_s, slow_fraction=slow_fraction)
    out: dict[int, frozenset[int]] = {}
    for i in range(graph.n):
        skip = frozenset(j for j in graph.neighbours(i) if slow[j]) if not slow[i] else None
        if skip:
            out[i] = skip
    return out


def _edge(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i < j else (j, i)


def _reachable(adjacency: list[set[int]], source: int, target: int) -> bool:
    """Return True when ``target`` can be reached from ``source`` (depth-first search)."""
    seen = {source}
    stack = [source]
    while stack:
        for j in adjacency[stack.pop()]:
            if j == target:
                return True
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return source == target
