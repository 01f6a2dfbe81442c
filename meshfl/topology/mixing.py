"""Mixing matrices: Metropolis–Hastings weights, invariant checks, spectral gap.

Metropolis–Hastings weights (Xiao & Boyd, "Fast linear iterations for distributed
averaging", Systems & Control Letters 2004, Eq. 11; Boyd, Diaconis, Xiao, "Fastest
mixing Markov chain on a graph", SIAM Review 2004) give a symmetric, doubly stochastic,
nonnegative W supported on the graph, using only each node's and its neighbours' degrees.
The gossip iteration x ← W x converges at rate ``|λ₂(W)|`` per step; the spectral gap
``1 − |λ₂(W)|`` is the quantity (ρ or δ) in the D-PSGD and CHOCO-SGD rates.
"""

from __future__ import annotations

import numpy as np

from meshfl.errors import TopologyError
from meshfl.topology.graphs import Graph

__all__ = ["check_mixing_matrix", "metropolis_hastings", "spectral_gap"]


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
    n = graph.n
    w = np.zeros((n, n), dtype=np.float64)
    degrees = [graph.degree(i) for i in range(n)]
    for i, j in graph.edges:
        w[i, j] = w[j, i] = 1.0 / (1.0 + max(degrees[i], degrees[j]))
    w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
    return w


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
