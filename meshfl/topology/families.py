"""Deterministic topology builders: ring, complete, star, exponential, torus, one-peer.

- :func:`ring`, :func:`complete`, :func:`star` (node 0 is the hub; FedAvg as a special
  case);
- :func:`torus`: the 2-D torus on the most nearly square ``r × c = n`` grid;
- :func:`exponential`: the static exponential graph (Assran et al., ICML 2019
  "Stochastic Gradient Push"; Ying et al., NeurIPS 2021 "Exponential Graph is Provably
  Efficient for Decentralized Deep Training");
- :func:`one_peer_exponential`: its time-varying one-peer version (Ying et al. 2021).
"""

from __future__ import annotations

import math

from meshfl.errors import ConfigError
from meshfl.topology.graph import Graph, _check_n, _edge

__all__ = ["complete", "exponential", "one_peer_exponential", "ring", "star", "torus"]


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
