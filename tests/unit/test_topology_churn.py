"""Churn: devices joining and leaving a graph keep it connected with a valid mixing matrix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.errors import ConfigError
from meshfl.topology import (
    TOPOLOGIES,
    Graph,
    add_node,
    build_graph,
    check_mixing_matrix,
    complete,
    exponential,
    metropolis_hastings,
    remove_node,
    ring,
    star,
)

STATIC = tuple(kind for kind in TOPOLOGIES if kind != "one-peer-exponential")


@st.composite
def connected_graphs(draw: st.DrawFn, min_n: int = 1) -> Graph:
    """A graph from any static builder, with valid parameters for its size."""
    kind = draw(st.sampled_from(STATIC))
    n = draw(st.integers(max(min_n, 3 if kind == "small-world" else 1), 24))
    params: dict[str, int | float] = {"seed": draw(st.integers(0, 2**16))}
    if kind == "random-regular":
        params["degree"] = draw(
            st.sampled_from([d for d in range(2, n) if n * d % 2 == 0] or [n - 1])
        )
    elif kind == "small-world":
        params["degree"] = draw(st.sampled_from(list(range(2, n, 2))))
        params["probability"] = draw(st.floats(0.0, 1.0))
    elif kind == "erdos-renyi":
        params["probability"] = draw(st.floats(0.5, 1.0))
    return build_graph(kind, n, **params)  # type: ignore[arg-type]


def _degrees(graph: Graph) -> list[int]:
    return [graph.degree(i) for i in range(graph.n)]


# ---------------------------------------------------------------- remove_node


@settings(max_examples=150, deadline=None)
@given(connected_graphs(min_n=2), st.data())
def test_a_dead_device_leaves_the_graph_connected(graph: Graph, data: st.DataObject) -> None:
    dead = data.draw(st.integers(0, graph.n - 1))

    after, mapping = remove_node(graph, dead)

    assert after.n == graph.n - 1 and after.is_connected()
    check_mixing_matrix(metropolis_hastings(after), after)
    assert mapping[dead] == -1
    assert sorted(m for m in mapping if m >= 0) == list(range(graph.n - 1))
    # every surviving edge is kept under the relabelling; new edges join former neighbours
    kept = {(mapping[i], mapping[j]) for i, j in graph.edges if dead not in (i, j)}
    former = {mapping[j] for j in graph.neighbours(dead)}
    assert kept <= after.edges
    assert all(i in former and j in former for i, j in after.edges - kept)
    assert len(after.edges - kept) <= max(0, len(former) - 1)


@given(st.integers(3, 64), st.data())
def test_a_ring_minus_a_node_is_the_ring(n: int, data: st.DataObject) -> None:
    dead = data.draw(st.integers(0, n - 1))

    after, mapping = remove_node(ring(n), dead)

    assert after == ring(n - 1)
    assert mapping == [j if j < dead else j - 1 for j in range(dead)] + [-1] + list(
        range(dead, n - 1)
    )


def test_remove_node_examples() -> None:
    hub_gone, _ = remove_node(star(5), 0)
    leaf_gone, mapping = remove_node(star(5), 2)

    assert hub_gone == Graph(4, frozenset({(0, 1), (1, 2), (2, 3)}))  # leaves chained
    assert leaf_gone == star(4) and mapping == [0, 1, -1, 2, 3]
    assert remove_node(complete(5), 4)[0] == complete(4)
    assert remove_node(ring(2), 1) == (Graph(1, frozenset()), [0, -1])
    assert remove_node(exponential(8), 0)[0].is_connected()


@pytest.mark.parametrize(
    ("graph", "i", "match"),
    [
        (ring(1), 0, "cannot remove the last device"),
        (ring(4), 4, r"graph has devices 0 \.\. 3"),
        (ring(4), -1, "cannot remove device -1"),
    ],
)
def test_remove_node_rejects(graph: Graph, i: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        remove_node(graph, i)


# ---------------------------------------------------------------- add_node


@settings(max_examples=150, deadline=None)
@given(connected_graphs(), st.integers(1, 6))
def test_a_joining_device_is_attached_to_the_least_loaded_nodes(graph: Graph, degree: int) -> None:
    after = add_node(graph, degree)

    new = graph.n
    assert after.n == new + 1 and after.is_connected()
    assert after.degree(new) == min(degree, graph.n)
    assert after.edges - graph.edges == {(i, new) for i in after.neighbours(new)}
    chosen = set(after.neighbours(new))
    others = set(range(new)) - chosen
    if others:
        assert max(graph.degree(i) for i in chosen) <= min(graph.degree(i) for i in others)
    check_mixing_matrix(metropolis_hastings(after), after)


def test_add_node_ties_by_uplink_then_index() -> None:
    assert add_node(ring(6), 2).neighbours(6) == (0, 1)
    assert add_node(ring(6), 2, [1.0, 5.0, 1.0, 9.0, 1.0, 1.0]).neighbours(6) == (1, 3)
    assert add_node(ring(6), 2, [1.0, None, 1.0, 9.0, 1.0, 1.0, 7.0]).neighbours(6) == (1, 3)
    assert add_node(star(5), 2).neighbours(5) == (1, 2)  # leaves before the hub
    assert add_node(Graph(1, frozenset()), 3) == ring(2)


@pytest.mark.parametrize(
    ("degree", "uplink", "match"),
    [(0, None, "degree >= 1"), (2, [1.0, 2.0], r"one uplink per node \(4\), got 2")],
)
def test_add_node_rejects(degree: int, uplink: list[float] | None, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        add_node(ring(4), degree, uplink)


@settings(max_examples=60, deadline=None)
@given(connected_graphs(min_n=2), st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_churn_sequences_keep_the_graph_connected(
    graph: Graph, joins: list[bool], data: st.DataObject
) -> None:
    for join in joins:
        if join or graph.n == 1:
            graph = add_node(graph, data.draw(st.integers(1, 4)))
        else:
            graph, _ = remove_node(graph, data.draw(st.integers(0, graph.n - 1)))

        assert graph.is_connected()
        check_mixing_matrix(metropolis_hastings(graph), graph)
