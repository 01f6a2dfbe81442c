"""Graph builders, Metropolis–Hastings mixing matrices, spectral gap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import meshfl.topology as topology
from meshfl.errors import ConfigError, TopologyError
from meshfl.topology import (
    TOPOLOGIES,
    Graph,
    build_graph,
    check_mixing_matrix,
    complete,
    exponential,
    metropolis_hastings,
    ring,
    spectral_gap,
    star,
)


def test_exported_members() -> None:
    assert sorted(topology.__all__) == sorted(
        [
            "MIXING_RULES",
            "TOPOLOGIES",
            "Graph",
            "add_node",
            "build_graph",
            "check_mixing_matrix",
            "complete",
            "erdos_renyi",
            "exponential",
            "from_edge_list",
            "metropolis_hastings",
            "mixing_matrix",
            "one_peer_exponential",
            "random_regular",
            "remove_node",
            "ring",
            "small_world",
            "spectral_gap",
            "star",
            "torus",
            "uniform_weights",
        ]
    )
    assert TOPOLOGIES == (
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


@given(st.sampled_from(("ring", "complete", "star", "exponential")), st.integers(1, 64))
def test_mh_weights_are_a_valid_mixing_matrix(kind: str, n: int) -> None:
    graph = build_graph(kind, n)

    w = metropolis_hastings(graph)

    assert w.shape == (n, n) and w.dtype == np.float64
    np.testing.assert_allclose(w, w.T, atol=0)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert (w >= 0).all()
    on_graph = np.eye(n, dtype=bool)
    for i, j in graph.edges:
        on_graph[i, j] = on_graph[j, i] = True
        assert w[i, j] == pytest.approx(1 / (1 + max(graph.degree(i), graph.degree(j))))
    assert (w[~on_graph] == 0).all()
    assert graph.is_connected()
    check_mixing_matrix(w, graph)
    check_mixing_matrix(w)
    assert 0.0 <= spectral_gap(w) <= 1.0 + 1e-12
    assert all(i < j for i, j in graph.edges)


@pytest.mark.parametrize(
    ("graph", "edges"),
    [
        (ring(1), set()),
        (ring(2), {(0, 1)}),
        (ring(4), {(0, 1), (1, 2), (2, 3), (0, 3)}),
        (star(4), {(0, 1), (0, 2), (0, 3)}),
        (complete(3), {(0, 1), (0, 2), (1, 2)}),
        (exponential(2), {(0, 1)}),
        (
            exponential(5),
            {(0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (0, 2), (1, 3), (2, 4), (0, 3), (1, 4)},
        ),
    ],
)
def test_builders_edges(graph: Graph, edges: set[tuple[int, int]]) -> None:
    assert graph.edges == frozenset(edges)


def test_degrees_and_neighbours() -> None:
    g = exponential(8)

    assert [g.degree(i) for i in range(8)] == [5] * 8
    assert g.neighbours(0) == (1, 2, 4, 6, 7)
    assert star(8).degree(0) == 7 and star(8).degree(5) == 1
    assert ring(8).neighbours(0) == (1, 7)
    with pytest.raises(TopologyError):
        g.neighbours(8)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("complete", 1.0),
        ("ring", 1 - (1 + math.sqrt(2)) / 3),  # ≈ 0.1953: λ₂ = (1 + 2cos(2π/8)) / 3
        ("exponential", 2 / 3),  # W = (I + A)/6, |λ₂| = 1/3
        ("star", 1 / 8),  # leaves keep 7/8 on themselves
    ],
)
def test_spectral_gap_of_8_nodes(kind: str, expected: float) -> None:
    w = metropolis_hastings(build_graph(kind, 8))

    gap = spectral_gap(w)

    assert gap == pytest.approx(expected, abs=1e-12)


def test_spectral_gap_reference_values() -> None:
    assert spectral_gap(metropolis_hastings(ring(8))) == pytest.approx(0.195, abs=5e-4)
    assert spectral_gap(metropolis_hastings(exponential(8))) == pytest.approx(0.667, abs=5e-4)
    assert spectral_gap(np.ones((1, 1))) == 1.0


def test_disconnected_graph_rejected() -> None:
    g = Graph(4, frozenset({(0, 1), (2, 3)}))
    w = metropolis_hastings(g)

    assert not g.is_connected()
    with pytest.raises(TopologyError, match="disconnected"):
        check_mixing_matrix(w, g)
    with pytest.raises(TopologyError, match="disconnected"):
        check_mixing_matrix(w)
    assert spectral_gap(w) == pytest.approx(0.0, abs=1e-12)


def test_invalid_matrices_rejected() -> None:
    g = ring(4)
    w = metropolis_hastings(g)
    asym = w.copy()
    asym[0, 1] += 0.1
    asym[0, 0] -= 0.1
    negative = np.array([[1.5, -0.5], [-0.5, 1.5]])
    substochastic = w * 0.9
    off_graph = w.copy()
    off_graph[0, 2] = off_graph[2, 0] = 0.1
    off_graph[0, 0] -= 0.1
    off_graph[2, 2] -= 0.1

    with pytest.raises(TopologyError, match="not symmetric"):
        check_mixing_matrix(asym, g)
    with pytest.raises(TopologyError, match="negative"):
        check_mixing_matrix(negative)
    with pytest.raises(TopologyError, match="sum to 1"):
        check_mixing_matrix(substochastic, g)
    with pytest.raises(TopologyError, match="non-neighbours"):
        check_mixing_matrix(off_graph, g)
    with pytest.raises(TopologyError, match="square"):
        check_mixing_matrix(np.ones((2, 3)))
    with pytest.raises(TopologyError, match="NaN"):
        check_mixing_matrix(np.full((2, 2), np.nan))
    with pytest.raises(TopologyError, match="graph has 5 nodes"):
        check_mixing_matrix(w, ring(5))


@pytest.mark.parametrize(("kind", "n"), [("hypercube", 4), ("ring", 0), ("star", -1)])
def test_build_graph_rejects_bad_input(kind: str, n: int) -> None:
    with pytest.raises(ConfigError, match=r"ring, complete, star, exponential|n >= 1"):
        build_graph(kind, n)


def test_build_graph_unknown_kind_lists_valid_kinds() -> None:
    with pytest.raises(ConfigError) as info:
        build_graph("hypercube", 4)

    assert "valid kinds: ring, complete, star, exponential" in str(info.value)


@pytest.mark.parametrize(
    "edges",
    [{(1, 0)}, {(0, 0)}, {(0, 5)}, {(0, 1, 2)}, {(-1, 2)}],
)
def test_graph_rejects_invalid_edges(edges: set[tuple[int, ...]]) -> None:
    with pytest.raises(TopologyError):
        Graph(4, frozenset(edges))  # type: ignore[arg-type]


def test_graph_rejects_empty() -> None:
    with pytest.raises(TopologyError):
        Graph(0, frozenset())
