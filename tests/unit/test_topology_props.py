"""Topology properties over many sizes: specified degrees and closed-form spectral gaps.

Complements test_topology_builders.py, whose hypothesis test already checks, for every
builder in TOPOLOGIES over n <= 40 and random seeds, that the graph is simple and
connected, that W (Metropolis–Hastings and max-degree) is symmetric, doubly stochastic
and non-negative, and the degrees of torus, random-regular and small-world. Here: the
degrees of the other builders, the one-peer exponential union for every n (not only
powers of two), and spectral gaps against closed forms.

Closed forms. A vertex-transitive graph of degree d has MH weights equal to the
max-degree weights, W = (I + A) / (d + 1). For a circulant graph (ring, complete,
exponential) with symmetric connection set S ⊂ Z_n, A's eigenvalues are
Σ_{s∈S} cos(2π m s / n), m = 0 … n−1; for the r × c torus (a product of two cycles)
they are 2cos(2πa/r) + 2cos(2πb/c). The gap is 1 − max over the non-principal
eigenvalues of |λ|, where the most negative eigenvalue may dominate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.topology import (
    MIXING_RULES,
    Graph,
    build_graph,
    complete,
    exponential,
    mixing_matrix,
    one_peer_exponential,
    ring,
    spectral_gap,
    star,
    torus,
)

SIZES = st.integers(1, 96)
FEW = settings(max_examples=40, deadline=None)


def _gap_from_eigenvalues(eigenvalues: list[float]) -> float:
    """1 − |λ₂| from all eigenvalues of W, exactly one of which is the principal 1."""
    ordered = sorted(eigenvalues, key=abs, reverse=True)
    assert ordered[0] == pytest.approx(1.0, abs=1e-12)
    return 1.0 - abs(ordered[1]) if len(ordered) > 1 else 1.0


def _offsets(n: int) -> set[int]:
    """The exponential graph's connection set {±2^k mod n : 2^k < n} (0 excluded)."""
    powers = [1 << k for k in range(n.bit_length()) if (1 << k) < n]
    return {(sign * p) % n for p in powers for sign in (1, -1)} - {0}


def _circulant_gap(n: int, connection: set[int]) -> float:
    d = len(connection)
    return _gap_from_eigenvalues(
        [
            (1 + sum(math.cos(2 * math.pi * m * s / n) for s in connection)) / (d + 1)
            for m in range(n)
        ]
    )


# ---------------------------------------------------------------- degrees as specified


@FEW
@given(SIZES)
def test_degrees_of_the_parameter_free_builders(n: int) -> None:
    on_ring, on_complete, on_star = ring(n), complete(n), star(n)
    assert {on_ring.degree(i) for i in range(n)} == {min(2, n - 1)}
    assert {on_complete.degree(i) for i in range(n)} == {n - 1}
    assert on_star.degree(0) == n - 1
    assert {on_star.degree(i) for i in range(1, n)} <= {1}
    graph = exponential(n)
    offsets = _offsets(n)
    for i in range(n):
        assert set(graph.neighbours(i)) == {(i + o) % n for o in offsets}


@FEW
@given(SIZES, st.integers(0, 1000))
def test_one_peer_exponential_union_over_log2_n_rounds_is_connected(n: int, start: int) -> None:
    tau = max(1, (n - 1).bit_length())
    union: set[tuple[int, int]] = set()
    for t in range(start, start + tau):
        one_round = one_peer_exponential(n, t)
        assert {one_round.degree(i) for i in range(n)} <= {0, 1, 2}
        union |= one_round.edges

    assert Graph(n, frozenset(union)) == exponential(n)
    assert Graph(n, frozenset(union)).is_connected()


# ---------------------------------------------------------------- closed-form spectral gaps


@FEW
@given(st.integers(3, 200), st.sampled_from(MIXING_RULES))
def test_ring_gap_closed_form(n: int, rule: str) -> None:
    gap = spectral_gap(mixing_matrix(ring(n), rule))

    # λ_m = (1 + 2cos(2πm/n)) / 3; the largest |λ| besides 1 is at m = 1 for n >= 3
    # (the most negative, ≥ −1/3, never exceeds it since cos(2π/n) >= 0 for n >= 4,
    # and for n = 3 both are 0)
    assert gap == pytest.approx(1 - (1 + 2 * math.cos(2 * math.pi / n)) / 3, abs=1e-10)
    assert gap == pytest.approx(_circulant_gap(n, {1, n - 1}), abs=1e-10)


def test_small_ring_gaps() -> None:
    assert spectral_gap(mixing_matrix(ring(1))) == 1.0
    assert spectral_gap(mixing_matrix(ring(2))) == pytest.approx(1.0)  # W = J / 2
    assert spectral_gap(mixing_matrix(ring(3))) == pytest.approx(1.0)  # the triangle: J / 3
    assert spectral_gap(mixing_matrix(ring(4))) == pytest.approx(2 / 3)  # λ = 1/3, 1/3, −1/3
    assert spectral_gap(mixing_matrix(ring(8))) == pytest.approx(0.19526, abs=1e-5)


@FEW
@given(st.integers(1, 80), st.sampled_from(MIXING_RULES))
def test_complete_graph_is_exact_averaging(n: int, rule: str) -> None:
    w = mixing_matrix(complete(n), rule)

    np.testing.assert_allclose(w, np.full((n, n), 1 / n), atol=1e-15)
    assert spectral_gap(w) == pytest.approx(1.0, abs=1e-12)


@FEW
@given(st.integers(3, 120), st.sampled_from(MIXING_RULES))
def test_star_gap_is_one_over_n(n: int, rule: str) -> None:
    # W_hub,leaf = 1/n: eigenvalues 1, 1 − 1/n (×(n−2), leaf differences) and 0 (trace)
    w = mixing_matrix(star(n), rule)

    assert spectral_gap(w) == pytest.approx(1 / n, abs=1e-10)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(w))[[0, 1, -2, -1]],
                               [0.0, 1 - 1 / n, 1 - 1 / n, 1.0], atol=1e-10)  # fmt: skip


@FEW
@given(st.integers(2, 128), st.sampled_from(MIXING_RULES))
def test_exponential_gap_matches_the_circulant_spectrum(n: int, rule: str) -> None:
    graph = exponential(n)
    connection = set(graph.neighbours(0))
    assert connection == _offsets(n)

    gap = spectral_gap(mixing_matrix(graph, rule))

    assert gap == pytest.approx(_circulant_gap(n, connection), abs=1e-10)
    assert gap > 0


@pytest.mark.parametrize("k", range(1, 10))
def test_exponential_gap_for_powers_of_two(k: int) -> None:
    # n = 2^k: degree 2k − 1 (2^(k−1) ≡ −2^(k−1)), W = (I + A) / 2k. At m = n/2 the
    # offsets ±1 give cos π = −1 and all the others +1: λ = (1 − 2 + 2k − 3) / 2k =
    # (k − 2) / k, the largest |λ| besides 1, so the gap is 2 / k = 2 / log₂ n.
    n = 2**k
    graph = exponential(n)

    gap = spectral_gap(mixing_matrix(graph))

    assert graph.degree(0) == 2 * k - 1
    assert gap == pytest.approx(min(1.0, 2 / k), abs=1e-10)


@FEW
@given(st.integers(3, 12), st.integers(3, 12), st.sampled_from(MIXING_RULES))
def test_torus_gap_matches_the_product_of_cycles(r: int, c: int, rule: str) -> None:
    n = r * c
    graph = torus(n)
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)  # torus's own grid
    cols = n // rows
    assert 3 <= min(r, c) <= rows <= cols

    expected = _gap_from_eigenvalues(
        [
            (1 + 2 * math.cos(2 * math.pi * a / rows) + 2 * math.cos(2 * math.pi * b / cols)) / 5
            for a in range(rows)
            for b in range(cols)
        ]
    )

    assert spectral_gap(mixing_matrix(graph, rule)) == pytest.approx(expected, abs=1e-10)


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 40), st.integers(0, 2**16))
def test_random_regular_gap_is_positive_and_below_the_complete_graph(n: int, seed: int) -> None:
    degrees = [d for d in range(2, n - 1) if n * d % 2 == 0]
    d = degrees[seed % len(degrees)]
    graph = build_graph("random-regular", n, degree=d, seed=seed)

    w = mixing_matrix(graph)

    np.testing.assert_array_equal(w, mixing_matrix(graph, "max-degree"))  # regular: same W
    # connected and not complete: 0 < gap < 1
    assert 0.0 < spectral_gap(w) < 1.0
