"""Torus, one-peer exponential, random graphs, custom JSON graphs, max-degree weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.errors import ConfigError
from meshfl.topology import (
    MIXING_RULES,
    TOPOLOGIES,
    Graph,
    build_graph,
    check_mixing_matrix,
    complete,
    erdos_renyi,
    exponential,
    from_edge_list,
    mixing_matrix,
    one_peer_exponential,
    random_regular,
    ring,
    small_world,
    spectral_gap,
    torus,
    uniform_weights,
)


def _degrees(graph: Graph) -> list[int]:
    return [graph.degree(i) for i in range(graph.n)]


def _assert_valid_mixing(graph: Graph, rule: str) -> None:
    w = mixing_matrix(graph, rule)
    n = graph.n
    assert w.shape == (n, n) and w.dtype == np.float64
    np.testing.assert_array_equal(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert (w >= 0).all()
    assert (np.diag(w) > 0).all()
    if graph.is_connected():
        check_mixing_matrix(w, graph)
        assert 0.0 < spectral_gap(w) <= 1.0 + 1e-12 or n == 1


# ---------------------------------------------------------------- invariants (hypothesis)


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[str, Graph, dict[str, int | float]]:
    kind = draw(st.sampled_from(TOPOLOGIES))
    n = draw(st.integers(3 if kind == "small-world" else 1, 40))
    seed = draw(st.integers(0, 2**32))
    params: dict[str, int | float] = {"seed": seed}
    if kind == "random-regular":
        choices = [d for d in range(2, n) if n * d % 2 == 0] or [n - 1]
        params["degree"] = draw(st.sampled_from(choices))
    elif kind == "small-world":
        params["degree"] = draw(st.sampled_from([k for k in range(2, n, 2)]))
        params["probability"] = draw(st.floats(0.0, 1.0))
    elif kind == "erdos-renyi":
        params["probability"] = draw(st.floats(0.5, 1.0))
    elif kind == "one-peer-exponential":
        params["round_"] = draw(st.integers(0, 100))
    graph = build_graph(kind, n, **params)  # type: ignore[arg-type]
    return kind, graph, params


@settings(max_examples=300, deadline=None)
@given(_graphs())
def test_every_builder_yields_a_simple_graph_with_the_documented_degrees(
    drawn: tuple[str, Graph, dict[str, int | float]],
) -> None:
    kind, graph, params = drawn
    n = graph.n
    assert all(0 <= i < j < n for i, j in graph.edges)  # simple: no loops, no duplicates
    degrees = _degrees(graph)
    if kind == "one-peer-exponential":
        # one round may be disconnected; the union over ⌈log₂ n⌉ rounds is not
        assert set(degrees) <= ({0} if n == 1 else {1, 2})
    else:
        assert graph.is_connected()
    if kind == "random-regular":
        assert degrees == [params["degree"]] * n
    if kind == "small-world":
        assert sum(degrees) == n * params["degree"]  # average degree exactly k
    if kind == "torus":
        r = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
        c = n // r
        if r >= 3:
            assert degrees == [4] * n
        elif r == 2:
            assert degrees == [3 if c >= 3 else 2] * n
        else:
            assert graph == ring(n)
    for rule in MIXING_RULES:
        _assert_valid_mixing(graph, rule)


@settings(deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.integers(8, 24), st.integers(0, 1000))
def test_builders_are_deterministic_by_seed(kind: str, n: int, seed: int) -> None:
    first = build_graph(kind, n, seed=seed, round_=seed)
    again = build_graph(kind, n, seed=seed, round_=seed)

    assert first == again


@pytest.mark.parametrize("kind", ["random-regular", "erdos-renyi", "small-world"])
def test_different_seeds_give_different_graphs(kind: str) -> None:
    graphs = {build_graph(kind, 16, seed=seed).edges for seed in range(10)}

    assert len(graphs) > 1


@given(st.integers(0, 7).map(lambda k: 2**k))
def test_one_peer_union_over_log2_n_rounds_is_the_exponential_graph(n: int) -> None:
    tau = max(1, n.bit_length() - 1)
    union: set[tuple[int, int]] = set()
    for t in range(tau):
        union |= one_peer_exponential(n, t).edges

    assert Graph(n, frozenset(union)) == exponential(n)
    assert one_peer_exponential(n, tau) == one_peer_exponential(n, 0)


def test_one_peer_rounds_of_8_nodes() -> None:
    assert one_peer_exponential(8, 0) == ring(8)
    assert one_peer_exponential(8, 1).neighbours(0) == (2, 6)
    assert _degrees(one_peer_exponential(8, 2)) == [1] * 8  # i ~ i + 4: a matching
    assert one_peer_exponential(8, 5) == one_peer_exponential(8, 2)
    with pytest.raises(ConfigError, match="round >= 0"):
        one_peer_exponential(8, -1)


# ---------------------------------------------------------------- builders' shapes


@pytest.mark.parametrize(("n", "r", "c"), [(9, 3, 3), (12, 3, 4), (16, 4, 4), (20, 4, 5)])
def test_torus_grid(n: int, r: int, c: int) -> None:
    g = torus(n)

    assert _degrees(g) == [4] * n
    assert len(g.edges) == 2 * n
    assert g.neighbours(0) == tuple(sorted({1, c - 1, c, (r - 1) * c}))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 13])
def test_torus_on_a_prime_is_the_ring(n: int) -> None:
    assert torus(n) == ring(n)


def test_torus_small_grids() -> None:
    assert torus(4) == Graph(4, frozenset({(0, 1), (2, 3), (0, 2), (1, 3)}))
    assert _degrees(torus(8)) == [3] * 8  # 2 × 4


def test_random_regular_full_and_complement_degrees() -> None:
    assert random_regular(6, 5, 0) == complete(6)
    assert _degrees(random_regular(10, 8, 3)) == [8] * 10  # drawn as a complement
    assert _degrees(random_regular(30, 2, 3)) == [2] * 30
    assert random_regular(1, 0, 0) == Graph(1, frozenset())
    assert random_regular(2, 1, 0) == complete(2)


@pytest.mark.parametrize(
    ("n", "degree", "match"),
    [
        (5, 3, "even"),
        (4, 4, "degree < n"),
        (4, -1, "degree < n"),
        (6, 1, "disconnected"),
        (3, 0, "disconnected"),
    ],
)
def test_random_regular_rejects(n: int, degree: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        random_regular(n, degree, 0)


def test_erdos_renyi_extremes_and_errors() -> None:
    assert erdos_renyi(6, 1.0, 0) == complete(6)
    assert erdos_renyi(1, 0.0, 0) == Graph(1, frozenset())
    with pytest.raises(ConfigError, match=r"larger probability, e\.g\. 0\.13"):
        erdos_renyi(64, 0.005, 0)
    with pytest.raises(ConfigError, match="larger probability"):
        erdos_renyi(4, 0.0, 0)
    with pytest.raises(ConfigError, match=r"probability must be in \[0, 1\]"):
        erdos_renyi(4, 1.5, 0)


def test_small_world_lattice_and_errors() -> None:
    lattice = small_world(10, 4, 0.0, 0)

    assert _degrees(lattice) == [4] * 10
    assert lattice.neighbours(0) == (1, 2, 8, 9)
    assert small_world(7, 6, 0.5, 1) == complete(7)
    for n, k in [(10, 3), (10, 0), (4, 4), (2, 2)]:
        with pytest.raises(ConfigError, match="even degree k"):
            small_world(n, k, 0.1, 0)
    with pytest.raises(ConfigError, match="probability"):
        small_world(10, 4, -0.1, 0)


def test_build_graph_passes_parameters_and_keeps_positional_use() -> None:
    assert build_graph("ring", 4) == ring(4)
    assert build_graph("torus", 9) == torus(9)
    assert build_graph("random-regular", 10, degree=3, seed=7) == random_regular(10, 3, 7)
    assert build_graph("erdos-renyi", 10, probability=0.5, seed=2) == erdos_renyi(10, 0.5, 2)
    assert build_graph("small-world", 10, degree=4, probability=0.2, seed=2) == small_world(
        10, 4, 0.2, 2
    )
    assert build_graph("one-peer-exponential", 8, round_=1) == one_peer_exponential(8, 1)
    with pytest.raises(ConfigError, match=r"or a path to a \.json edge list"):
        build_graph("hypercube", 4)
    with pytest.raises(ConfigError, match="name or a path"):
        build_graph(None, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["ring", "complete", "star", "exponential"])
def test_validation_call_keeps_working_for_the_old_names(kind: str) -> None:
    graph = build_graph(kind, 4)  # coordinator/validation.py's call

    assert graph.n == 4 and graph.is_connected()


# ---------------------------------------------------------------- custom JSON graphs


def _write(tmp_path: Path, document: object, name: str = "g.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def test_custom_graph_from_file_text_and_mapping(tmp_path: Path) -> None:
    document = {"n": 4, "edges": [[0, 1], [2, 1], [2, 3]]}
    path = _write(tmp_path, document)
    expected = Graph(4, frozenset({(0, 1), (1, 2), (2, 3)}))

    assert from_edge_list(path) == expected
    assert from_edge_list(str(path)) == expected
    assert from_edge_list(json.dumps(document)) == expected
    assert from_edge_list(document) == expected
    assert build_graph(str(path), 4) == expected
    assert build_graph(path, 4) == expected
    with pytest.raises(ConfigError, match="has 4 nodes but 5 are needed"):
        build_graph(str(path), 5)


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ("{not json", r"g\.json' is not valid JSON: .* line 1 column 2"),
        ([[0, 1]], "must be a JSON object"),
        ({"n": 2}, "missing: edges"),
        ({"n": 2, "edges": [[0, 1]], "edge": []}, "unknown: edge"),
        ({"n": 0, "edges": []}, r'"n" must be an integer in \[1, 100000\]'),
        ({"n": True, "edges": []}, r'"n" must be an integer in \[1, 100000\]'),
        ({"n": 10**12, "edges": []}, r'"n" must be an integer in \[1, 100000\], got 1000000000000'),
        ({"n": 2, "edges": {"0": 1}}, r'"edges" must be a list'),
        ({"n": 3, "edges": [[0, 1], [1, 2, 0]]}, r"edges\[1\] = \[1, 2, 0\] is not a pair"),
        ({"n": 3, "edges": [[0, 1], [1, "2"]]}, r"edges\[1\] .* is not a pair"),
        ({"n": 3, "edges": [[0, 1], [1, 3]]}, r"edges\[1\] = \[1, 3\] names a node outside 0 .. 2"),
        ({"n": 3, "edges": [[0, 1], [-1, 2]]}, "names a node outside"),
        ({"n": 3, "edges": [[0, 1], [2, 2]]}, r"edges\[1\] = \[2, 2\] is a self loop"),
        ({"n": 3, "edges": [[0, 1], [1, 2], [1, 0]]}, r"edges\[2\] = \[1, 0\] repeats edges\[0\]"),
        ({"n": 4, "edges": [[0, 1], [2, 3]]}, r"disconnected; node\(s\) 2, 3 cannot be reached"),
    ],
)
def test_custom_graph_errors_name_the_file(tmp_path: Path, document: object, match: str) -> None:
    path = _write(tmp_path, document)

    with pytest.raises(ConfigError, match=match) as info:
        from_edge_list(path)

    assert f"custom topology file {str(path)!r}" in str(info.value)


def test_custom_graph_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.json' does not exist"):
        build_graph(str(tmp_path / "nope.json"), 4)


# ---------------------------------------------------------------- mixing rules


def test_max_degree_weights() -> None:
    w = uniform_weights(build_graph("star", 4))

    np.testing.assert_allclose(w[0], [0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(w[1], [0.25, 0.75, 0.0, 0.0])
    np.testing.assert_array_equal(mixing_matrix(ring(5), "max-degree"), uniform_weights(ring(5)))
    np.testing.assert_allclose(uniform_weights(Graph(1, frozenset())), [[1.0]])
    with pytest.raises(ConfigError, match="valid rules: metropolis-hastings, max-degree"):
        mixing_matrix(ring(4), "laplacian")


SPECTRAL_GAPS_8 = {
    # kind: (Metropolis–Hastings, max-degree); defaults degree=4, probability=0.3, seed=0
    "ring": (0.1953, 0.1953),
    "complete": (1.0000, 1.0000),
    "star": (0.1250, 0.1250),
    "exponential": (0.6667, 0.6667),
    "torus": (0.5000, 0.5000),
    "one-peer-exponential": (0.1953, 0.1953),
    "random-regular": (0.5172, 0.5172),
    "erdos-renyi": (0.0507, 0.0507),
    "small-world": (0.2731, 0.2397),
}


@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_spectral_gaps_of_8_node_graphs(kind: str) -> None:
    """Measured spectral gaps 1 − |λ₂(W)| of the 8-node graphs (build_graph defaults).

    =====================  ======  =============  ==========
    topology               degree  Metropolis–H.  max-degree
    =====================  ======  =============  ==========
    ring                   2       0.1953         0.1953
    complete               7       1.0000         1.0000
    star                   1 / 7   0.1250         0.1250
    exponential            5       0.6667         0.6667
    torus (2 × 4)          3       0.5000         0.5000
    one-peer-exp. round 0  2       0.1953         0.1953
    random-regular d=4     4       0.5172         0.5172
    erdos-renyi p=0.3      1–2     0.0507         0.0507
    small-world k=4 p=0.3  2–5     0.2731         0.2397
    =====================  ======  =============  ==========

    Random kinds at seed 0. One-peer exponential rounds 1 and 2 are disconnected (gap 0);
    the product of its three rounds' W contracts the disagreement by 1/3 (see docs).
    """
    graph = build_graph(kind, 8)
    mh, md = SPECTRAL_GAPS_8[kind]

    assert spectral_gap(mixing_matrix(graph)) == pytest.approx(mh, abs=5e-5)
    assert spectral_gap(mixing_matrix(graph, "max-degree")) == pytest.approx(md, abs=5e-5)
