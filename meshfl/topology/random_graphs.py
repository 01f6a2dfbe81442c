"""Seeded random topology builders: random-regular, Erdős–Rényi, small-world.

- :func:`random_regular`: a uniformly random ``d``-regular graph by the configuration
  model (Bollobás 1980) with the Steger–Wormald pairing (Steger & Wormald, Combinatorics,
  Probability and Computing 1999);
- :func:`erdos_renyi`: G(n, p) (Erdős & Rényi 1959; Gilbert 1959), resampled until
  connected;
- :func:`small_world`: Watts–Strogatz (Nature 1998), resampled until connected.

Each draws from :class:`random.Random` seeded with ``seed``: the same
``(n, parameters, seed)`` gives the same graph on every machine, so every device of a job
can build the topology itself.
"""

from __future__ import annotations

import math
import random

from meshfl.errors import ConfigError
from meshfl.topology.families import complete
from meshfl.topology.graph import Graph, _check_int, _check_n, _check_probability, _edge

__all__ = ["erdos_renyi", "random_regular", "small_world"]


_MAX_TRIES = 1000
"""Samples a random builder draws before it gives up with a ConfigError."""


def random_regular(n: int, degree: int, seed: int) -> Graph:
    """Build a random connected ``degree``-regular graph.

    Configuration model (Bollobás, European J. Combinatorics 1980): ``degree`` stubs per
    node are paired at random; a pairing with a self loop or a repeated edge is not
    simple. The pairing follows Steger & Wormald (Combinatorics, Probability and Computing
    1999): unsuitable pairs go back to the pool and are re-paired, and the attempt starts
    over only when no suitable pair is left. Attempts are repeated (up to 1000) until the
    graph is simple and connected. For ``degree > (n − 1) / 2`` the complement of a random
    ``(n − 1 − degree)``-regular graph is drawn instead (same distribution, fewer
    rejections); ``degree = 2`` is drawn directly as a ring on a random permutation (the
    connected 2-regular graphs are exactly the Hamiltonian cycles).

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 1``.
    degree : int
        Degree of every node, ``0 <= degree < n``; ``n · degree`` must be even. A
        connected graph needs ``degree >= 1`` (for ``n >= 2``) and ``degree >= 2`` (for
        ``n >= 3``).
    seed : int
        Seed of :class:`random.Random`; the same arguments give the same graph.

    Returns
    -------
    Graph
        Simple, connected, every node of degree ``degree``.

    Raises
    ------
    ConfigError
        If the parameters admit no connected simple ``degree``-regular graph, or no
        attempt succeeded.

    """
    _check_n("random-regular", n)
    _check_int("random-regular", "degree", degree)
    _check_int("random-regular", "seed", seed)
    if not 0 <= degree < n:
        raise ConfigError(f"random-regular needs 0 <= degree < n, got degree={degree} with n={n}")
    if (n * degree) % 2:
        raise ConfigError(
            f"random-regular needs n·degree even (each edge has two ends), got n={n}, "
            f"degree={degree}; change the degree or the number of nodes by one"
        )
    if (degree == 0 and n > 1) or (degree == 1 and n > 2):
        raise ConfigError(f"a {degree}-regular graph on {n} nodes is disconnected; use degree >= 2")
    rng = random.Random(seed)
    if degree == n - 1:
        return complete(n)
    if degree == 2:
        order = list(range(n))
        rng.shuffle(order)
        return Graph(n, frozenset(_edge(order[k], order[(k + 1) % n]) for k in range(n)))
    complement = degree > (n - 1) / 2
    d = n - 1 - degree if complement else degree
    for _ in range(_MAX_TRIES):
        edges = _pair_stubs(n, d, rng)
        if edges is None:
            continue
        if complement:
            edges = {(i, j) for i in range(n) for j in range(i + 1, n)} - edges
        graph = Graph(n, frozenset(edges))
        if graph.is_connected():
            return graph
    raise ConfigError(  # pragma: no cover - needs ~1e-300 luck for degree >= 3
        f"random-regular found no connected simple {degree}-regular graph on {n} nodes "
        f"in {_MAX_TRIES} attempts (seed {seed}); try another seed or degree"
    )


def _pair_stubs(n: int, d: int, rng: random.Random) -> set[tuple[int, int]] | None:
    """Pair ``d`` stubs per node into a simple graph (Steger–Wormald); None when stuck."""
    edges: set[tuple[int, int]] = set()
    stubs = [i for i in range(n) for _ in range(d)]
    while stubs:
        leftover: dict[int, int] = {}
        rng.shuffle(stubs)
        for k in range(0, len(stubs), 2):
            a, b = stubs[k], stubs[k + 1]
            if a != b and _edge(a, b) not in edges:
                edges.add(_edge(a, b))
            else:
                leftover[a] = leftover.get(a, 0) + 1
                leftover[b] = leftover.get(b, 0) + 1
        nodes = list(leftover)
        if leftover and not any(
            _edge(u, v) not in edges for k, u in enumerate(nodes) for v in nodes[k + 1 :]
        ):
            return None
        stubs = [i for i in nodes for _ in range(leftover[i])]
    return edges


def erdos_renyi(n: int, p: float, seed: int) -> Graph:
    """Build a connected Erdős–Rényi graph G(n, p).

    Each of the ``n(n − 1)/2`` pairs is an edge independently with probability ``p``
    (Gilbert, Ann. Math. Stat. 1959; Erdős & Rényi, Publ. Math. Debrecen 1959). A
    disconnected sample is discarded and redrawn, up to 1000 times; G(n, p) is connected
    with high probability once ``p`` exceeds ``ln(n) / n`` (Erdős & Rényi 1960).

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 1``.
    p : float
        Edge probability, ``0 <= p <= 1``. Expected degree ``p (n − 1)``.
    seed : int
        Seed of :class:`random.Random`; the same arguments give the same graph.

    Returns
    -------
    Graph
        Simple and connected.

    Raises
    ------
    ConfigError
        If ``p`` is outside [0, 1], or every sample was disconnected (the message names a
        larger ``p``).

    """
    _check_n("erdos-renyi", n)
    _check_probability("erdos-renyi", p)
    _check_int("erdos-renyi", "seed", seed)
    rng = random.Random(seed)
    tries = 1 if p == 0.0 else _MAX_TRIES
    for _ in range(tries):
        edges = frozenset((i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p)
        graph = Graph(n, edges)
        if graph.is_connected():
            return graph
    threshold = math.log(n) / n
    larger = min(1.0, math.ceil(100 * max(2 * p, 2 * threshold)) / 100)
    raise ConfigError(
        f"erdos-renyi with n={n}, probability={p} was disconnected in all {tries} samples "
        f"(seed {seed}); use a larger probability, e.g. {larger:g} "
        f"(connectivity threshold ln(n)/n = {threshold:.3f})"
    )


def small_world(n: int, k: int, p: float, seed: int) -> Graph:
    """Build a connected Watts–Strogatz small-world graph.

    Start from the ring lattice where each node is linked to its ``k / 2`` nearest
    neighbours on either side; then, for ``j = 1 .. k/2`` and each node ``i`` in turn, the
    edge ``(i, i + j mod n)`` is rewired with probability ``p`` to ``(i, u)``, ``u`` drawn
    uniformly among the nodes that are neither ``i`` nor already its neighbours (Watts &
    Strogatz, "Collective dynamics of 'small-world' networks", Nature 1998). Rewiring keeps
    the number of edges, so the average degree is exactly ``k``. A disconnected sample is
    discarded and redrawn, up to 1000 times.

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 3``.
    k : int
        Even number of lattice neighbours, ``2 <= k < n``.
    p : float
        Rewiring probability, ``0 <= p <= 1``; ``p = 0`` is the ring lattice.
    seed : int
        Seed of :class:`random.Random`; the same arguments give the same graph.

    Returns
    -------
    Graph
        Simple and connected, ``n k / 2`` edges.

    Raises
    ------
    ConfigError
        If ``k`` is odd or outside ``[2, n)``, ``p`` is outside [0, 1], or every sample
        was disconnected.

    """
    _check_n("small-world", n)
    _check_int("small-world", "degree", k)
    _check_probability("small-world", p)
    _check_int("small-world", "seed", seed)
    if k % 2 or not 2 <= k < n:
        raise ConfigError(
            f"small-world needs an even degree k with 2 <= k < n, got k={k} with n={n}"
        )
    rng = random.Random(seed)
    for _ in range(_MAX_TRIES):
        adjacency = [{(i + j) % n for j in range(-k // 2, k // 2 + 1) if j != 0} for i in range(n)]
        for j in range(1, k // 2 + 1):
            for i in range(n):
                v = (i + j) % n
                if v not in adjacency[i] or rng.random() >= p:
                    continue
                candidates = [u for u in range(n) if u != i and u not in adjacency[i]]
                if not candidates:
                    continue
                u = rng.choice(candidates)
                adjacency[i].discard(v)
                adjacency[v].discard(i)
                adjacency[i].add(u)
                adjacency[u].add(i)
        graph = Graph(n, frozenset((i, j) for i in range(n) for j in adjacency[i] if i < j))
        if graph.is_connected():
            return graph
    raise ConfigError(  # pragma: no cover - a ring lattice with rewiring rarely splits
        f"small-world with n={n}, k={k}, probability={p} was disconnected in all "
        f"{_MAX_TRIES} samples (seed {seed}); use a larger k or a smaller probability"
    )
