"""CHOCO-SGD and D-PSGD state objects, simulated on n = 8 nodes in numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import meshfl.aggregation as aggregation
from meshfl.aggregation import (
    ChocoGossip,
    DPSGDGossip,
    GossipAlgorithm,
    consensus_distance,
    consensus_sketch,
)
from meshfl.codecs import Identity, TopK
from meshfl.errors import CodecError, ConfigError, WireError
from meshfl.topology import Graph, complete, exponential, metropolis_hastings, ring
from meshfl.wire import DType, TensorEntry

Model = dict[str, np.ndarray]
N = 8
IDS = [f"dev{i}" for i in range(N)]


def random_models(seed: int, n: int = N) -> list[Model]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.standard_normal((6, 5)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
            "s": np.array(rng.standard_normal(), dtype=np.float32),
        }
        for _ in range(n)
    ]


def row(graph: Graph, w: np.ndarray, i: int) -> tuple[dict[str, float], float]:
    return {IDS[j]: float(w[i, j]) for j in graph.neighbours(i)}, float(w[i, i])


def make_choco(graph: Graph, template: Model, gamma: float, codec: object) -> list[ChocoGossip]:
    w = metropolis_hastings(graph)
    return [ChocoGossip(template, *row(graph, w, i), gamma, codec) for i in range(graph.n)]  # type: ignore[arg-type]


def make_dpsgd(graph: Graph, template: Model) -> list[DPSGDGossip]:
    w = metropolis_hastings(graph)
    return [DPSGDGossip(template, *row(graph, w, i)) for i in range(graph.n)]


def gossip_round(
    graph: Graph,
    nodes: Sequence[GossipAlgorithm],
    xs: list[Model],
    offline: frozenset[int] = frozenset(),
) -> list[Model]:
    """One synchronous round; ``offline`` nodes neither send nor receive."""
    msgs = [None if i in offline else nodes[i].outgoing(xs[i]) for i in range(graph.n)]
    for i in range(graph.n):
        for j in graph.neighbours(i):
            message = msgs[j]
            if i not in offline and message is not None:
                nodes[i].incoming(IDS[j], message)
    return [
        nodes[i].mix(
            xs[i],
            [] if i in offline else [IDS[j] for j in graph.neighbours(i) if j not in offline],
        )
        for i in range(graph.n)
    ]


def stack(xs: list[Model]) -> np.ndarray:
    return np.stack([np.concatenate([np.ravel(t) for t in x.values()]) for x in xs]).astype(
        np.float64
    )


def local_step(x: Model, grad: Model) -> Model:
    return {k: (x[k] - 0.1 * grad[k]).astype(np.float32) for k in x}


def exact_consensus_distance(xs: list[Model]) -> float:
    a = stack(xs)
    return float(np.mean(np.sum((a - a.mean(axis=0)) ** 2, axis=1)))


def test_exported_members() -> None:
    assert sorted(aggregation.__all__) == sorted(
        [
            "ChocoGossip",
            "CompressedDPSGD",
            "Contribution",
            "FixedPoint",
            "SecureChoco",
            "add_mod",
            "mask",
            "pack_words",
            "prg_words",
            "shared_indices",
            "skellam_noise",
            "unmask",
            "unpack_words",
            "DPSGDGossip",
            "ErrorFeedback",
            "GaussianPrivatizer",
            "GossipAlgorithm",
            "Privatizer",
            "RobustMixer",
            "adaptive_tau",
            "clip_l2",
            "clipped_gossip",
            "consensus_distance",
            "consensus_sketch",
            "coordinate_median",
            "trimmed_mean",
        ]
    )
    assert ChocoGossip.message_kind == 1 and DPSGDGossip.message_kind == 2


def test_dpsgd_complete_graph_one_step_is_exact_mean() -> None:
    graph = complete(N)
    xs = random_models(0)
    nodes = make_dpsgd(graph, xs[0])
    mean = stack(xs).mean(axis=0)

    out = gossip_round(graph, nodes, xs)

    for x in out:
        assert all(t.dtype == np.float32 for t in x.values())
        np.testing.assert_allclose(stack([x])[0], mean, rtol=0, atol=1e-6)


def test_dpsgd_outgoing_is_identity_coded_full_model() -> None:
    x = random_models(1)[0]
    node = DPSGDGossip(x, {"a": 0.5}, 0.5)

    entries = node.outgoing(x)

    assert [e.name for e in entries] == ["w", "b", "s"]
    assert all(e.codec == Identity.tag and e.dtype == DType.FLOAT32 for e in entries)
    for e in entries:
        np.testing.assert_array_equal(Identity.decode(e.payload, e.shape), x[e.name])


def test_choco_identity_gamma_1_equals_dpsgd() -> None:
    graph = ring(N)
    xs = random_models(2)
    choco = make_choco(graph, xs[0], 1.0, Identity())
    dpsgd = make_dpsgd(graph, xs[0])
    rng = np.random.default_rng(3)
    xc, xd = xs, xs

    for _ in range(6):
        xc = gossip_round(graph, choco, xc)
        xd = gossip_round(graph, dpsgd, xd)
        np.testing.assert_allclose(stack(xc), stack(xd), rtol=0, atol=1e-5)
        # a local "gradient step" changes x between rounds, identically on both
        steps = random_models(int(rng.integers(1 << 30)))
        xc = [local_step(x, g) for x, g in zip(xc, steps, strict=True)]
        xd = [local_step(x, g) for x, g in zip(xd, steps, strict=True)]


def test_choco_topk_reaches_consensus_and_preserves_average() -> None:
    graph = ring(N)
    xs = random_models(4)
    nodes = make_choco(graph, xs[0], 0.1, TopK(0.1))
    start = exact_consensus_distance(xs)
    mean = stack(xs).mean(axis=0)

    for _ in range(300):
        xs = gossip_round(graph, nodes, xs)

    assert exact_consensus_distance(xs) < start / 100
    np.testing.assert_allclose(stack(xs).mean(axis=0), mean, rtol=0, atol=1e-5)


def test_choco_replicas_agree_bit_for_bit() -> None:
    graph = ring(N)
    xs = random_models(5)
    nodes = make_choco(graph, xs[0], 0.2, TopK(0.1))

    for _ in range(5):
        xs = gossip_round(graph, nodes, xs)

    for i in range(N):
        for j in graph.neighbours(i):
            for own, seen in zip(nodes[j]._own, nodes[i]._replicas[IDS[j]], strict=True):
                np.testing.assert_array_equal(own, seen)


@pytest.mark.parametrize("kind", ["choco", "dpsgd"])
def test_missing_neighbour_keeps_a_convex_combination(kind: str) -> None:
    graph = exponential(N)
    xs = random_models(6)
    nodes: Sequence[GossipAlgorithm] = (
        make_choco(graph, xs[0], 1.0, Identity()) if kind == "choco" else make_dpsgd(graph, xs[0])
    )
    mean = stack(xs).mean(axis=0)
    lo, hi = stack(xs).min(axis=0), stack(xs).max(axis=0)

    out = gossip_round(graph, nodes, xs, offline=frozenset({3}))

    a = stack(out)
    assert np.isfinite(a).all()
    assert (a >= lo - 1e-5).all() and (a <= hi + 1e-5).all()
    np.testing.assert_allclose(a[3], stack(xs)[3], atol=1e-6)  # offline node keeps its model
    np.testing.assert_allclose(a.mean(axis=0), mean, atol=1e-5)  # symmetric drop: W still DS


def test_missing_neighbour_weight_moves_to_self() -> None:
    x = {"v": np.array([1.0, 2.0], dtype=np.float32)}
    node = DPSGDGossip(x, {"a": 0.25, "b": 0.25}, 0.5)
    node.incoming("a", DPSGDGossip(x, {"z": 1.0}, 0.0).outgoing({"v": np.array([5.0, 6.0])}))

    out = node.mix(x, ["a"])

    np.testing.assert_allclose(out["v"], 0.75 * x["v"] + 0.25 * np.array([5.0, 6.0]))


@pytest.mark.parametrize("kind", ["choco", "dpsgd"])
def test_incoming_bad_message_raises_and_leaves_state_unchanged(kind: str) -> None:
    x = random_models(7)[0]
    node: GossipAlgorithm
    if kind == "choco":
        node = ChocoGossip(x, {"a": 0.5}, 0.5, 1.0, Identity())
    else:
        node = DPSGDGossip(x, {"a": 0.5}, 0.5)
    good = DPSGDGossip(x, {"z": 1.0}, 0.0).outgoing(x)
    node.incoming("a", good)
    before = node.mix(x, ["a"])
    wrong_shape = (good[0], TensorEntry("b", (4,), DType.FLOAT32, 1, b"\x00" * 16), good[2])
    wrong_names = (good[1], good[0], good[2])
    wrong_dtype = (good[0], TensorEntry("b", (5,), DType.FLOAT64, 1, good[1].payload), good[2])
    bad_payload = (good[0], good[1], TensorEntry("s", (), DType.FLOAT32, 1, b"\x00"))

    for message in (wrong_shape, wrong_names, wrong_dtype, good[:2]):
        with pytest.raises(WireError):
            node.incoming("a", message)
    with pytest.raises(CodecError):
        node.incoming("a", bad_payload)
    with pytest.raises(WireError, match="not a neighbour"):
        node.incoming("stranger", good)

    np.testing.assert_array_equal(stack([node.mix(x, ["a"])]), stack([before]))


def test_choco_outgoing_nan_leaves_state_unchanged() -> None:
    x = {"v": np.array([1.0, 2.0], dtype=np.float32)}
    node = ChocoGossip(x, {"a": 0.5}, 0.5, 1.0, TopK(0.5))

    with pytest.raises(CodecError):
        node.outgoing({"v": np.array([np.nan, 1.0], dtype=np.float32)})
    first = node.outgoing(x)

    np.testing.assert_array_equal(TopK.decode(first[0].payload, (2,)), [0.0, 2.0])


@pytest.mark.parametrize(
    ("neighbours", "self_weight", "gamma", "match"),
    [
        ({"a": 0.5}, 0.4, 0.5, "sum to"),
        ({"a": -0.1}, 1.1, 0.5, ">= 0"),
        ({"a": float("nan")}, 0.5, 0.5, "finite"),
        ({"a": 0.5}, 0.5, 0.0, "consensus step"),
        ({"a": 0.5}, 0.5, 1.5, "consensus step"),
    ],
)
def test_choco_config_validation(
    neighbours: dict[str, float], self_weight: float, gamma: float, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        ChocoGossip({"v": np.zeros(2, np.float32)}, neighbours, self_weight, gamma, Identity())


def test_mix_and_outgoing_reject_wrong_model_and_unknown_answered() -> None:
    x = {"v": np.zeros(2, np.float32)}
    node = ChocoGossip(x, {"a": 0.5}, 0.5, 0.5, Identity())

    with pytest.raises(ConfigError, match="non-neighbours"):
        node.mix(x, ["b"])
    with pytest.raises(ConfigError, match="shape"):
        node.outgoing({"v": np.zeros(3, np.float32)})
    with pytest.raises(ConfigError, match="do not match"):
        node.mix({"u": np.zeros(2, np.float32)}, [])
    with pytest.raises(WireError, match="sent no model"):
        DPSGDGossip(x, {"a": 0.5}, 0.5).mix(x, ["a"])


def test_sketch_estimates_consensus_distance() -> None:
    rng = np.random.default_rng(8)
    xs = random_models(8)
    for x in xs:
        x["big"] = rng.standard_normal(2000).astype(np.float32)

    sketches = np.stack([consensus_sketch(x, 256, seed=1234) for x in xs])

    assert sketches.shape == (N, 256) and sketches.dtype == np.float64
    estimate = consensus_distance(sketches)
    exact = exact_consensus_distance(xs)
    assert abs(estimate - exact) <= 0.2 * exact


def test_sketch_is_zero_for_equal_models_and_norm_unbiased() -> None:
    x = random_models(9)[0]
    sketches = np.stack([consensus_sketch(x, 64, seed=5)] * 4)

    assert consensus_distance(sketches) == 0.0
    norms = [np.sum(consensus_sketch(x, 64, seed=s) ** 2) for s in range(300)]
    assert np.mean(norms) == pytest.approx(np.sum(stack([x]) ** 2), rel=0.05)


def test_sketch_rejects_bad_input() -> None:
    x = {"v": np.ones(3, np.float32)}
    with pytest.raises(ConfigError):
        consensus_sketch(x, 0, seed=1)
    with pytest.raises(ConfigError):
        consensus_sketch(x, 8, seed=-1)
    with pytest.raises(ConfigError, match="NaN"):
        consensus_sketch({"v": np.array([np.inf])}, 8, seed=1)
    with pytest.raises(ConfigError):
        consensus_distance(np.zeros(3))


def test_message_kinds_are_the_wire_enum_not_bare_codes() -> None:
    from meshfl.aggregation import CompressedDPSGD
    from meshfl.wire import MessageKind

    assert ChocoGossip.message_kind is MessageKind.DELTA
    assert CompressedDPSGD.message_kind is MessageKind.MODEL
