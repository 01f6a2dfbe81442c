"""Mixing matrices: Metropolis–Hastings and max-degree weights, invariant checks, spectral gap.

Metropolis–Hastings weights (Xiao & Boyd, "Fast linear iterations for distributed
averaging", Systems & Control Letters 2004, Eq. 11; Boyd, Diaconis, Xiao, "Fastest
mixing Markov chain on a graph", SIAM Review 2004) give a symmetric, doubly stochastic,
nonnegative W supported on the graph, using only each node's and its neighbours' degrees.
Max-degree weights (Xiao & Boyd 2004, "maximum-degree weights"; here with ``d_max + 1``)
put the same weight on every edge and need the graph's maximum degree.
The gossip iteration x ← W x converges at rate ``|λ₂(W)|`` per step; the spectral gap
``1 − |λ₂(W)|`` is the quantity (ρ or δ) in the D-PSGD and CHOCO-SGD rates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshfl.errors import ConfigError, TopologyError
from meshfl.topology.graphs import Graph

__all__ = [
    "MIXING_RULES",
    "check_mixing_matrix",
    "metropolis_hastings",
    "mixing_matrix",
    "spectral_gap",
    "uniform_weights",
]

MIXING_RULES: tuple[str, ...] = ("metropolis-hastings", "max-degree")
"""Rules accepted by :func:`mixing_matrix`."""


def metropolis_hastings(graph: Graph) -> np.ndarray:
    """Return the Metropolis–Hastings mixing matrix of ``graph``.

    ``W_ij = 1 / (1 + max(d_i, d_j))`` for each edge ``{i, j}``, ``W_ij = 0`` off the
    graph, ``W_ii = 1 − Σ_{j≠i} W_ij`` (Xiao & Boyd 2004, Eq. 11).

    Parameters
    ----------
    graph : Graph
        Any graph (need not be connected).

    Returns
    -------
    np.ndarray
        float64, shape (n, n): symmetric, doubly stochastic, nonnegative.

    """
    degrees = [graph.degree(i) for i in range(graph.n)]
    return _from_edge_weights(graph, lambda i, j: 1.0 / (1.0 + max(degrees[i], degrees[j])))


def uniform_weights(graph: Graph) -> np.ndarray:
    """Return the max-degree ("uniform") mixing matrix of ``graph``.

    ``W_ij = 1 / (d_max + 1)`` on every edge ``{i, j}``, ``W_ij = 0`` off the graph,
    ``W_ii = 1 − d_i / (d_max + 1)``, with ``d_max`` the largest degree. These are the
    maximum-degree weights of Xiao & Boyd ("Fast linear iterations for distributed
    averaging", Systems & Control Letters 2004) with ``d_max + 1`` in place of
    ``d_max``: every ``W_ii >= 1 / (d_max + 1) > 0`` and, since the Laplacian's
    eigenvalues are at most ``2 d_max``, every eigenvalue of W is at least
    ``(1 − d_max) / (1 + d_max) > −1``, so gossip also converges on bipartite graphs
    (even rings, stars). Unlike Metropolis–Hastings, each node needs the global
    ``d_max``.

    Parameters
    ----------
    graph : Graph
        Any graph (need not be connected).

    Returns
    -------
    np.ndarray
        float64, shape (n, n): symmetric, doubly stochastic, nonnegative.

    """
    d_max = max(graph.degree(i) for i in range(graph.n))
    return _from_edge_weights(graph, lambda i, j: 1.0 / (1.0 + d_max))


def _from_edge_weights(graph: Graph, weight: Callable[[int, int], float]) -> np.ndarray:
    """W with ``weight(i, j)`` on each edge, zero off the graph, and the rest on W_ii."""
    n = graph.n
    w = np.zeros((n, n), dtype=np.float64)
    for i, j in graph.edges:
        w[i, j] = w[j, i] = weight(i, j)
    w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
    return w


def mixing_matrix(graph: Graph, rule: str = "metropolis-hastings") -> np.ndarray:
    """Return the mixing matrix of ``graph`` under ``rule``.

    Parameters
    ----------
    graph : Graph
        Any graph.
    rule : str
        ``"metropolis-hastings"`` (:func:`metropolis_hastings`, the default) or
        ``"max-degree"`` (:func:`uniform_weights`).

    Returns
    -------
    np.ndarray
        float64, shape (n, n): symmetric, doubly stochastic, nonnegative.

    Raises
    ------
    ConfigError
        If ``rule`` is not one of :data:`MIXING_RULES`.

    """
    if rule == "metropolis-hastings":
        return metropolis_hastings(graph)
    if rule == "max-degree":
        return uniform_weights(graph)
    raise ConfigError(f"unknown mixing rule {rule!r}; valid rules: {', '.join(MIXING_RULES)}")


def check_mixing_matrix(w: np.ndarray, graph: Graph | None = None, atol: float = 1e-9) -> None:
    """Check that ``w`` is a valid gossip mixing matrix.

    Parameters
    ----------
    w : np.ndarray
        float, shape (n, n).
    graph : Graph or None
        When given, ``w`` must be zero off its edges and diagonal, and the graph must be
        connected. When None, the graph is the support of ``w`` (entries with
        ``|w_ij| > atol``), which must be connected.
    atol : float
        Absolute tolerance for symmetry, row/column sums, signs and zeros. Default 1e-9.

    Raises
    ------
    TopologyError
        If ``w`` is not square and finite, not symmetric, not doubly stochastic, has a
        negative entry, has a nonzero entry off the graph, or the graph is disconnected.

    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise TopologyError(f"mixing matrix must be square (n, n) with n >= 1, got {w.shape}")
    if not bool(np.isfinite(w).all()):
        raise TopologyError("mixing matrix has NaN or inf entries")
    n = w.shape[0]
    if not np.allclose(w, w.T, rtol=0.0, atol=atol):
        raise TopologyError("mixing matrix is not symmetric")
    if bool((w < -atol).any()):
        raise TopologyError("mixing matrix has negative entries")
    if not np.allclose(w.sum(axis=1), 1.0, rtol=0.0, atol=atol):
        raise TopologyError("mixing matrix rows do not sum to 1 (not stochastic)")
    if not np.allclose(w.sum(axis=0), 1.0, rtol=0.0, atol=atol):
        raise TopologyError("mixing matrix columns do not sum to 1 (not doubly stochastic)")
    if graph is None:
        rows, cols = np.nonzero(np.abs(w) > atol)
        graph = Graph(
            n, frozenset((int(i), int(j)) for i, j in zip(rows, cols, strict=True) if i < j)
        )
    else:
        if graph.n != n:
            raise TopologyError(f"mixing matrix is {n}×{n} but the graph has {graph.n} nodes")
        allowed = np.eye(n, dtype=np.bool_)
        for i, j in graph.edges:
            allowed[i, j] = allowed[j, i] = True
        if bool((np.abs(w[~allowed]) > atol).any()):
            raise TopologyError("mixing matrix has nonzero weights between non-neighbours")
    if not graph.is_connected():
        raise TopologyError("graph is disconnected: gossip cannot reach consensus")


def spectral_gap(w: np.ndarray) -> float:
    """Return the spectral gap ``1 − |λ₂(W)|`` of a symmetric mixing matrix.

    ``|λ₂(W)|`` is the second largest eigenvalue magnitude, ``max(|λ_2|, |λ_n|)`` with
    eigenvalues ``1 = λ_1 ≥ λ_2 ≥ … ≥ λ_n`` (computed with ``np.linalg.eigvalsh``).

    Parameters
    ----------
    w : np.ndarray
        float, shape (n, n), symmetric (only the lower triangle is read).

    Returns
    -------
    float
        In [0, 1] for a valid mixing matrix: 1.0 for the complete graph with uniform
        weights and for n = 1, 0.0 for a disconnected graph.

    """
    w = np.asarray(w, dtype=np.float64)
    if w.shape[0] <= 1:
        return 1.0
    magnitudes = np.sort(np.abs(np.linalg.eigvalsh(w)))
    return float(1.0 - magnitudes[-2])
