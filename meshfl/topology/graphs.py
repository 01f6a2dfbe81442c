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

import json
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshfl.errors import ConfigError, TopologyError

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


def torus(n: int) -> Graph:
    """Build the 2-D torus on the most nearly square ``r × c = n`` grid.

    ``r`` is the largest divisor of ``n`` with ``r <= √n`` and ``c = n / r``; node
    ``a·c + b`` (row ``a``, column ``b``) is linked to ``(a, b ± 1 mod c)`` and
    ``(a ± 1 mod r, b)``. Degrees: 4 when ``r, c >= 3``; 3 when ``r = 2 < c`` (the two
    vertical wrap-around links coincide); 2 for ``n = 4`` (the 2 × 2 torus is a 4-cycle).
    When ``n`` is prime (or 1, 2, 3) the only grid is ``1 × n`` and the torus is
    :func:`ring` ``(n)``. The torus is the standard 2-D grid topology of decentralized SGD
    (e.g. Lian et al., NeurIPS 2017; Koloskova et al., ICML 2019 "CHOCO-SGD"), with
    spectral gap Θ(1/n) against the ring's Θ(1/n²).

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 1``.

    Returns
    -------
    Graph
        Connected; ``r × c`` with ``r <= c``.

    Raises
    ------
    ConfigError
        If ``n < 1``.

    """
    _check_n("torus", n)
    r = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    c = n // r
    if r == 1:
        return ring(n)
    edges = set()
    for a in range(r):
        for b in range(c):
            i = a * c + b
            for j in (a * c + (b + 1) % c, ((a + 1) % r) * c + b):
                if j != i:
                    edges.add(_edge(i, j))
    return Graph(n, frozenset(edges))


def one_peer_exponential(n: int, round_: int) -> Graph:
    """Build round ``round_`` of the one-peer exponential graph (time-varying).

    With ``τ = ⌈log₂ n⌉``, at round ``t`` node ``i`` talks to ``i + 2^(t mod τ) mod n``
    (Ying et al., NeurIPS 2021 "Exponential Graph is Provably Efficient for Decentralized
    Deep Training", one-peer exponential graph). The directed graph of the paper is
    symmetrised here (gossip in meshfl is undirected): each node exchanges with
    ``i ± 2^(t mod τ)``, so it has degree 2, or degree 1 in the round whose offset is
    ``n / 2`` (a perfect matching).

    The graph of one round is connected only when the offset is odd (round 0 is the
    ring); the union over ``τ`` consecutive rounds is exactly :func:`exponential` ``(n)``,
    which is connected, and that is what gossip over the time-varying sequence relies on.

    Parameters
    ----------
    n : int
        Number of nodes, ``>= 1``. ``n = 1`` has no edges.
    round_ : int
        Round number ``t >= 0``.

    Returns
    -------
    Graph
        The graph used at round ``round_`` (simple; possibly disconnected, see above).

    Raises
    ------
    ConfigError
        If ``n < 1`` or ``round_`` is not an integer ``>= 0``.

    """
    _check_n("one-peer-exponential", n)
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise ConfigError(f"one-peer-exponential needs a round >= 0, got {round_!r}")
    if n == 1:
        return Graph(1, frozenset())
    tau = (n - 1).bit_length()  # ⌈log₂ n⌉ for n >= 2
    offset = 1 << (round_ % tau)
    return Graph(n, frozenset(_edge(i, (i + offset) % n) for i in range(n)))


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


_EDGE_LIST_KEYS = ("n", "edges")


MAX_CUSTOM_NODES = 100_000
"""Most nodes of a custom graph: bounds the memory a submitted edge list can claim."""


def from_edge_list(source: str | os.PathLike[str] | Mapping[str, Any]) -> Graph:
    """Build a custom graph from a JSON edge list.

    The document is ``{"n": N, "edges": [[i, j], ...]}``: ``N >= 1`` nodes numbered
    ``0 .. N−1`` and undirected edges given once each, in either orientation.

    Parameters
    ----------
    source : str, os.PathLike or Mapping
        A path to a ``.json`` file; or JSON text (a string starting with ``{``); or the
        already-parsed document.

    Returns
    -------
    Graph
        Simple and connected.

    Raises
    ------
    ConfigError
        If the file cannot be read or is not JSON, keys are missing or unknown, ``n`` is
        not an integer in ``[1, MAX_CUSTOM_NODES]``, an edge is not a pair of node indices
        in ``[0, n)``, is a self loop or a duplicate, or the graph is disconnected. The
        message names the file and the offending entry.

    """
    label, document = _load_edge_list(source)
    if not isinstance(document, Mapping):
        raise ConfigError(f'{label} must be a JSON object {{"n": N, "edges": [[i, j], ...]}}')
    missing = [key for key in _EDGE_LIST_KEYS if key not in document]
    unknown = sorted(str(key) for key in document if key not in _EDGE_LIST_KEYS)
    if missing or unknown:
        raise ConfigError(
            f'{label} must have exactly the keys "n" and "edges"'
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    n = document["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CUSTOM_NODES:
        raise ConfigError(
            f'{label}: "n" must be an integer in [1, {MAX_CUSTOM_NODES}], got {str(n)[:40]}'
        )
    raw_edges = document["edges"]
    if not isinstance(raw_edges, list):
        raise ConfigError(f'{label}: "edges" must be a list of [i, j] pairs')
    first_seen: dict[tuple[int, int], int] = {}
    for index, item in enumerate(raw_edges):
        where = f"{label}: edges[{index}] = {json.dumps(item)}"
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ConfigError(f"{where} is not a pair of node indices [i, j]")
        i, j = item
        if not (0 <= i < n and 0 <= j < n):
            raise ConfigError(f"{where} names a node outside 0 .. {n - 1} (n = {n})")
        if i == j:
            raise ConfigError(f"{where} is a self loop; a node always mixes with itself")
        edge = _edge(i, j)
        if edge in first_seen:
            raise ConfigError(f"{where} repeats edges[{first_seen[edge]}]; list each edge once")
        first_seen[edge] = index
    graph = Graph(n, frozenset(first_seen))
    if not graph.is_connected():
        reached = _reachable_from_0(graph)
        cut = [i for i in range(n) if i not in reached]
        shown = ", ".join(map(str, cut[:10])) + (", …" if len(cut) > 10 else "")
        raise ConfigError(
            f"{label}: the graph is disconnected; node(s) {shown} cannot be reached from "
            "node 0, so gossip cannot reach consensus"
        )
    return graph


def _load_edge_list(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[str, Any]:
    """Return a label for error messages and the parsed JSON document."""
    if isinstance(source, Mapping):
        return "custom topology", source
    if isinstance(source, str) and source.lstrip().startswith("{"):
        label, text = "custom topology JSON", source
    else:
        path = Path(source)
        label = f"custom topology file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{label} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label} cannot be read: {exc}") from exc
    try:
        return label, json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{label} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


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
