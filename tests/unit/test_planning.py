"""The capability-aware planner: work shares, byte budgets, battery, quorum, link-aware graphs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshfl.planning as planning
from meshfl.codecs import CodecPolicy, parse_codec
from meshfl.errors import ConfigError
from meshfl.planning import (
    Plan,
    battery_sit_out,
    byte_budgets,
    link_aware_graph,
    no_wait,
    plan_devices,
    quorum_size,
    slow_nodes,
    work_fractions,
)
from meshfl.topology import Graph, build_graph, complete, exponential, ring, star, torus

# The 64-64-10 MLP of `meshfl local`: 4 810 float32 parameters, 19 240 bytes dense.
LAYOUT = [("0.weight", (64, 64)), ("0.bias", (64,)), ("2.weight", (10, 64)), ("2.bias", (10,))]
DENSE_BYTES = 4 * sum(math.prod(shape) for _, shape in LAYOUT)
MBIT = 125_000  # bytes/s in 1 Mbit/s
FAST = 100e6  # 100 MB/s


def _degrees(graph: Graph) -> list[int]:
    return [graph.degree(i) for i in range(graph.n)]


def test_exported_members() -> None:
    assert sorted(planning.__all__) == sorted(
        [
            "Plan",
            "battery_sit_out",
            "byte_budgets",
            "link_aware_graph",
            "no_wait",
            "plan_devices",
            "quorum_size",
            "slow_nodes",
            "work_fractions",
        ]
    )


# ---------------------------------------------------------------- work fractions


def test_a_device_4x_slower_gets_a_quarter_of_the_work() -> None:
    fractions = work_fractions([400.0, 400.0, 100.0, 400.0, 410.0])

    assert fractions[2] == pytest.approx(0.25, abs=0.01)
    assert fractions[:2] + fractions[3:] == [1.0, 1.0, 1.0, 1.0]


def test_work_fractions_reference_floor_and_unmeasured() -> None:
    # median of the measured (100, 200, 300, 400) is 250; 0 and None are unmeasured
    assert work_fractions([100.0, 200.0, None, 300.0, 400.0, 0.0]) == [
        pytest.approx(0.4),
        pytest.approx(0.8),
        1.0,
        1.0,
        1.0,
        1.0,
    ]
    assert work_fractions([1.0, 1000.0, 1000.0]) == [0.05, 1.0, 1.0]
    assert work_fractions([1.0, 1000.0, 1000.0], floor=0.5) == [0.5, 1.0, 1.0]
    assert work_fractions([None, None]) == [1.0, 1.0]
    assert work_fractions([]) == []


@pytest.mark.parametrize(
    ("speeds", "floor", "match"),
    [
        ([1.0, -2.0], 0.05, "samples/s of device 1"),
        ([math.nan], 0.05, "samples/s of device 0"),
        ([math.inf], 0.05, "finite"),
        ([1.0], 0.0, r"floor must be in \(0, 1\]"),
        ([1.0], 1.5, "floor"),
    ],
)
def test_work_fractions_rejects(speeds: list[float], floor: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        work_fractions(speeds, floor=floor)


# ---------------------------------------------------------------- byte budgets


def test_a_1_mbit_device_gets_a_byte_budget_and_fast_ones_none() -> None:
    budgets = byte_budgets([FAST, MBIT, FAST], budget_s=0.05, dense_bytes=19_240)

    assert budgets == [0, 6_250, 0]


def test_byte_budget_floor_and_unmeasured() -> None:
    assert byte_budgets([1_000.0, None, 0.0], budget_s=0.05, dense_bytes=19_240) == [256, 0, 256]
    assert byte_budgets([1_000.0], budget_s=0.05, dense_bytes=19_240, floor_bytes=10) == [50]
    assert byte_budgets([384_800.0], budget_s=0.05, dense_bytes=19_240) == [0]  # exactly fits


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget_s": 0.0}, "uplink budget"),
        ({"budget_s": -1.0}, "uplink budget"),
        ({"budget_s": math.nan}, "uplink budget"),
        ({"dense_bytes": 0}, "dense_bytes must be an integer >= 1"),
        ({"floor_bytes": -1}, "floor_bytes must be an integer >= 0"),
        ({"uplink": [MBIT, -1.0]}, "uplink bytes/s of device 1"),
    ],
)
def test_byte_budgets_rejects(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"budget_s": 0.05, "dense_bytes": 19_240} | kwargs
    uplink = args.pop("uplink", [MBIT])

    with pytest.raises(ConfigError, match=match):
        byte_budgets(uplink, **args)  # type: ignore[arg-type]


def test_a_1_mbit_device_gets_a_sparser_codec() -> None:
    """End to end with the kernel codec policy: the budget lowers the top-k density."""
    codec = parse_codec("topk:0.15")
    budgets = byte_budgets([FAST, MBIT, FAST], budget_s=0.01, dense_bytes=DENSE_BYTES)

    policies = [
        CodecPolicy.from_options(codec, LAYOUT, dense_below=0, byte_budget=b) for b in budgets
    ]

    assert budgets == [0, 1_250, 0]
    densities = [p.codec_for("0.weight", (64, 64)).density for p in policies]  # type: ignore[attr-defined]
    assert densities[0] == densities[2] == 0.15
    assert 0.0 < densities[1] < 0.15
    assert policies[1].estimate_bytes(LAYOUT) <= 1_250 < policies[0].estimate_bytes(LAYOUT)


# ---------------------------------------------------------------- battery


def test_battery_rules() -> None:
    levels = [12.0, 12.0, 12.0, None, 50.0, 19.5, 20.0]
    charging: list[bool | None] = [False, True, None, False, False, False, False]

    sit_out = battery_sit_out(levels, charging, 20.0)

    assert sit_out == {
        0: "battery 12% < 20%, not charging",
        2: "battery 12% < 20%, not charging",  # unknown charging counts as not charging
        5: "battery 19.5% < 20%, not charging",
    }
    assert battery_sit_out(levels, charging, 0.0) == {}
    assert battery_sit_out([0.0], [False], 0) == {}


@pytest.mark.parametrize(
    ("levels", "charging", "threshold", "match"),
    [
        ([10.0], [False, True], 20.0, "same devices"),
        ([10.0], [False], -1.0, r"minimum battery percent must be in \[0, 100\]"),
        ([10.0], [False], 101.0, "minimum battery percent"),
        ([120.0], [False], 20.0, "battery of device 0"),
    ],
)
def test_battery_rejects(
    levels: list[float], charging: list[bool], threshold: float, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        battery_sit_out(levels, charging, threshold)


# ---------------------------------------------------------------- quorum


@pytest.mark.parametrize(
    ("degree", "quorum", "k"),
    [
        (0, 1.0, 0),
        (0, 0.5, 0),
        (1, 0.01, 1),
        (1, 1.0, 1),
        (2, 0.5, 1),
        (2, 0.51, 2),
        (4, 0.5, 2),
        (4, 0.75, 3),
        (5, 0.5, 3),
        (10, 0.7, 7),  # 0.7 · 10 is 7.000000000000001 in floating point
        (10, 0.3, 3),
        (7, 1.0, 7),
        (7, 0.01, 1),
    ],
)
def test_quorum_size_table(degree: int, quorum: float, k: int) -> None:
    assert quorum_size(degree, quorum) == k


@pytest.mark.parametrize(("degree", "quorum"), [(-1, 0.5), (3, 0.0), (3, 1.01), (3, math.nan)])
def test_quorum_size_rejects(degree: int, quorum: float) -> None:
    with pytest.raises(ConfigError):
        quorum_size(degree, quorum)


# ---------------------------------------------------------------- link-aware graph

GRAPHS = {
    "ring(8)": ring(8),
    "exponential(8)": exponential(8),
    "torus(16)": torus(16),
    "random-regular(12, 4)": build_graph("random-regular", 12, degree=4, seed=3),
    "random-regular(10, 3)": build_graph("random-regular", 10, degree=3, seed=1),
    "small-world(12)": build_graph("small-world", 12, degree=4, probability=0.3, seed=2),
    "erdos-renyi(10)": build_graph("erdos-renyi", 10, probability=0.5, seed=5),
    "complete(6)": complete(6),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_a_slow_node_becomes_a_leaf_and_the_graph_stays_connected(name: str) -> None:
    graph = GRAPHS[name]
    uplink: list[float | None] = [FAST] * graph.n
    uplink[3] = MBIT

    planned = link_aware_graph(graph, uplink)

    assert planned.n == graph.n and planned.is_connected()
    assert planned.degree(3) == 1
    assert planned.neighbours(3)[0] == min(graph.neighbours(3))  # all fast: lowest index
    # fast nodes get back to their original degree where a non-adjacent fast node exists
    for i in range(graph.n):
        if i != 3:
            assert planned.degree(i) >= graph.degree(i) - (name == "complete(6)")
    assert len(planned.edges & {e for e in graph.edges if 3 in e}) == 1


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(["ring", "torus", "exponential", "complete", "star", "erdos-renyi"]),
    st.integers(2, 20),
    st.integers(0, 1000),
    st.data(),
)
def test_link_aware_invariants(kind: str, n: int, seed: int, data: st.DataObject) -> None:
    graph = build_graph(kind, n, probability=0.5, seed=seed)
    uplink = data.draw(st.lists(st.sampled_from([None, MBIT, 10 * MBIT, FAST]), min_size=n,
                                max_size=n))  # fmt: skip

    planned = link_aware_graph(graph, uplink)

    measured = sorted(u for u in uplink if u is not None)
    median = (
        (measured[(len(measured) - 1) // 2] + measured[len(measured) // 2]) / 2 if measured else 0
    )
    slow = {i for i, u in enumerate(uplink) if u is not None and u < 0.25 * median}
    assert planned.is_connected()
    assert all(slow & set(e) for e in graph.edges - planned.edges)  # only slow links dropped
    assert not any(slow & set(e) for e in planned.edges - graph.edges)  # added: fast-fast
    for i in slow:
        assert planned.degree(i) <= graph.degree(i)


def test_link_aware_ring_and_exponential_exact() -> None:
    uplink: list[float | None] = [FAST] * 8
    uplink[3] = MBIT

    on_ring = link_aware_graph(ring(8), uplink)
    on_exp = link_aware_graph(exponential(8), uplink)

    # 3 keeps 2; 4 lost its edge and reconnects to the first fast non-neighbour, 0
    assert on_ring.edges == (ring(8).edges - {(3, 4)}) | {(0, 4)}
    # 3 keeps 1; 2, 4, 5, 7 lost an edge and pair up among themselves: 2-5 and 4-7
    assert on_exp.edges == (exponential(8).edges - {(2, 3), (3, 4), (3, 5), (3, 7)}) | {
        (2, 5),
        (4, 7),
    }
    assert _degrees(on_exp) == [5, 5, 5, 1, 5, 5, 5, 5]


def test_link_aware_keeps_the_fastest_neighbour_and_prefers_fast_candidates() -> None:
    uplink: list[float | None] = [FAST] * 8
    uplink[3] = MBIT
    uplink[4] = 2 * FAST
    uplink[6] = 3 * FAST

    planned = link_aware_graph(ring(8), uplink)

    assert planned.neighbours(3) == (4,)
    assert (2, 6) in planned.edges  # 2 lost an edge; 6 has the highest uplink


def test_link_aware_keeps_bridges() -> None:
    hub_slow = [MBIT] + [FAST] * 5
    path = Graph(4, frozenset({(0, 1), (1, 2), (2, 3)}))
    slow_middle: list[float | None] = [FAST, MBIT, FAST, FAST]

    assert link_aware_graph(star(6), hub_slow) == star(6)
    assert link_aware_graph(path, slow_middle) == path


def test_link_aware_two_slow_neighbours_keep_what_connectivity_needs() -> None:
    uplink: list[float | None] = [FAST] * 8
    uplink[3] = uplink[4] = MBIT

    planned = link_aware_graph(ring(8), uplink)

    assert planned.is_connected()
    assert planned.degree(3) == planned.degree(4) == 1


def test_link_aware_unchanged_without_slow_nodes() -> None:
    graph = torus(16)

    assert link_aware_graph(graph, [None] * 16) == graph
    assert link_aware_graph(graph, [FAST] * 16) == graph
    assert link_aware_graph(graph, [MBIT] * 16) == graph
    assert link_aware_graph(graph, [MBIT] + [None] * 15) == graph  # its own median
    slow_vs_unmeasured = link_aware_graph(graph, [MBIT, FAST] + [None] * 14)
    assert slow_vs_unmeasured.degree(0) == 1  # unmeasured counts as fast


@pytest.mark.parametrize(
    ("uplink", "kwargs", "match"),
    [
        ([FAST] * 7, {}, "7 uplinks for 8 nodes"),
        ([FAST] * 7 + [-1.0], {}, "uplink bytes/s of device 7"),
        ([FAST] * 8, {"slow_fraction": 0.0}, r"slow_fraction must be in \(0, 1\]"),
    ],
)
def test_link_aware_rejects(uplink: list[float], kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        link_aware_graph(ring(8), uplink, **kwargs)


# ---------------------------------------------------------------- plan_devices


def test_plan_devices_composes_the_rules() -> None:
    plan = plan_devices(
        samples_per_s=[400.0, 100.0, 400.0, 400.0, 1.0],
        uplink_bytes_per_s=[FAST, FAST, MBIT, None, FAST],
        battery_percent=[None, 80.0, None, 50.0, 5.0],
        charging=[None, False, None, True, False],
        budget_s=0.05,
        dense_bytes=19_240,
        min_battery_percent=20.0,
    )

    assert plan == Plan(
        participants=(0, 1, 2, 3),
        sit_out={4: "battery 5% < 20%, not charging"},
        work_fraction=(1.0, 0.25, 1.0, 1.0),  # the median excludes the sitting-out device
        byte_budget=(0, 0, 6_250, 0),
    )


def test_plan_devices_everyone_sits_out_and_length_mismatch() -> None:
    plan = plan_devices(
        [1.0], [1.0], [5.0], [False], budget_s=0.05, dense_bytes=100, min_battery_percent=20
    )

    assert plan.participants == () and plan.work_fraction == () and plan.byte_budget == ()
    assert list(plan.sit_out) == [0]
    with pytest.raises(ConfigError, match="lengths 2, 1, 1, 1"):
        plan_devices(
            [1.0, 2.0], [1.0], [5.0], [False], budget_s=0.05, dense_bytes=1, min_battery_percent=0
        )


# ---------------------------------------------------------------- compute time, no-wait


def test_work_that_fits_in_the_round_floor_is_not_cut() -> None:
    speeds = [4000.0, 1000.0, 4000.0, 4000.0]  # device 1 is 4x slower
    samples = [200.0] * 4  # 50 ms of training for the fast ones, 200 ms for device 1
    assert work_fractions(speeds, work_samples=samples, round_floor_s=0.0) == pytest.approx(
        [1.0, 0.25, 1.0, 1.0]
    )
    # A round spends 0.3 s communicating anyway: 200 ms of training holds nobody.
    assert work_fractions(speeds, work_samples=samples, round_floor_s=0.3) == [1.0] * 4
    # At 0.1 s the slow device does half its work, and finishes within the floor.
    assert work_fractions(speeds, work_samples=samples, round_floor_s=0.1) == pytest.approx(
        [1.0, 0.5, 1.0, 1.0]
    )


def test_work_samples_must_match_and_be_valid() -> None:
    with pytest.raises(ConfigError, match="one value per device"):
        work_fractions([1.0, 2.0], work_samples=[1.0])
    with pytest.raises(ConfigError, match="round_floor_s"):
        work_fractions([1.0], work_samples=[1.0], round_floor_s=-1.0)


def test_fast_nodes_do_not_wait_for_their_slow_neighbours() -> None:
    uplinks: list[float | None] = [1e8] * 8
    uplinks[3] = 125_000.0
    assert slow_nodes(uplinks) == [i == 3 for i in range(8)]
    skip = no_wait(ring(8), uplinks)
    assert skip == {2: frozenset({3}), 4: frozenset({3})}  # node 3 itself waits as usual
    assert no_wait(ring(8), [None] * 8) == {}
    with pytest.raises(ConfigError, match="one uplink per node"):
        no_wait(ring(8), uplinks[:4])
