"""SecureChoco: per-edge CHOCO-SGD replicas driven by (masked) neighbourhood sums."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from meshfl.aggregation import Contribution, FixedPoint, SecureChoco
from meshfl.aggregation.secure import add_mod, mask, unmask
from meshfl.errors import ConfigError, WireError
from meshfl.topology import Graph, exponential, metropolis_hastings, ring

Model = dict[str, np.ndarray]


def ids(n: int) -> list[str]:
    return [f"dev{i}" for i in range(n)]


def start_model() -> Model:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
        "s": np.array(0.5, dtype=np.float32),
    }


def perturbed(x0: Model, n: int, seed: int, scale: float = 0.5) -> list[Model]:
    rng = np.random.default_rng(seed)
    return [
        {k: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in x0.items()}
        for _ in range(n)
    ]


def make_nodes(
    graph: Graph, x0: Model, fp: FixedPoint, gamma: float, **kw: float
) -> list[SecureChoco]:
    w = metropolis_hastings(graph)
    names = ids(graph.n)
    return [
        SecureChoco(
            x0,
            {names[j]: float(w[i, j]) for j in graph.neighbours(i)},
            float(w[i, i]),
            gamma,
            fp,
            **kw,
        )
        for i in range(graph.n)
    ]


def flat(xs: list[Model]) -> np.ndarray:
    return np.stack([np.concatenate([v.reshape(-1) for v in x.values()]) for x in xs]).astype(
        np.float64
    )


def consensus_distance(xs: list[Model]) -> float:
    a = flat(xs)
    return float(np.mean(np.sum((a - a.mean(axis=0)) ** 2, axis=1)))


def seed(*parts: object) -> bytes:
    return hashlib.sha256(" ".join(map(str, parts)).encode()).digest()


def secure_round(
    graph: Graph,
    nodes: list[SecureChoco],
    xs: list[Model],
    round_: int,
    rng: np.random.Generator,
    drop: float = 0.0,
    abort: float = 0.0,
) -> list[Model]:
    """One synchronous round: every neighbourhood masks, drops some senders, unmasks."""
    names = ids(graph.n)
    fp = nodes[0].fixed_point
    b = fp.modulus_bits
    for i in range(graph.n):
        members = [names[j] for j in graph.neighbours(i)]
        sent: dict[str, Contribution] = {}
        masked: dict[str, np.ndarray] = {}
        for j in graph.neighbours(i):
            me = names[j]
            c = nodes[j].contribution(xs[j], names[i], seed("index", round_, i), rng)
            pairwise = [
                (seed("pair", round_, i, *sorted((me, k))), 1 if me < k else -1)
                for k in members
                if k != me
            ]
            sent[me], masked[me] = c, mask(c.encoded, seed("self", round_, i, me), pairwise, b)
        survivors = [m for m in members if rng.random() >= drop]
        if not survivors or rng.random() < abort:
            continue  # aborted: nothing unmasked, nothing committed
        dropped = [m for m in members if m not in survivors]
        total = unmask(
            add_mod([masked[m] for m in survivors], b),
            [seed("self", round_, i, m) for m in survivors],
            [
                (seed("pair", round_, i, *sorted((k, d))), 1 if k < d else -1)
                for k in survivors
                for d in dropped
            ],
            b,
        )
        assert np.array_equal(total, add_mod([sent[m].encoded for m in survivors], b))
        nodes[i].absorb(fp.decode(total), sent[survivors[0]].indices)
        for m in survivors:
            nodes[names.index(m)].commit(sent[m])
    return [node.mix(x) for node, x in zip(nodes, xs, strict=True)]


def test_ring_reaches_consensus_and_preserves_the_mean() -> None:
    graph, x0 = ring(6), start_model()
    fp = FixedPoint.choose(8.0, 32, max_inputs=2)  # step ~4e-9: identity-like
    nodes = make_nodes(graph, x0, fp, gamma=0.8)
    xs = perturbed(x0, graph.n, seed=1)
    mean0, dist0 = flat(xs).mean(axis=0), consensus_distance(xs)
    rng = np.random.default_rng(2)
    for r in range(40):
        xs = secure_round(graph, nodes, xs, r, rng)
    np.testing.assert_allclose(flat(xs).mean(axis=0), mean0, atol=1e-5)
    assert consensus_distance(xs) < 1e-6 * dist0


def test_lossless_round_with_unit_step_is_dpsgd() -> None:
    graph, x0 = ring(5), start_model()
    fp = FixedPoint.choose(8.0, 32, max_inputs=2)
    nodes = make_nodes(graph, x0, fp, gamma=1.0)
    xs = perturbed(x0, graph.n, seed=3)
    w = metropolis_hastings(graph)
    expected = w @ flat(xs)
    out = secure_round(graph, nodes, xs, 0, np.random.default_rng(4))
    np.testing.assert_allclose(flat(out), expected, atol=1e-6)
    # after commit the edge replicas hold the models themselves
    np.testing.assert_allclose(nodes[0].replica("dev1"), flat(xs)[0], atol=1e-7)


def test_invariant_holds_exactly_with_dropouts_aborts_randk_noise_and_clipping() -> None:
    graph, x0 = exponential(8), start_model()
    fp = FixedPoint.choose(
        2.0, 16, max_inputs=max(graph.degree(i) for i in range(graph.n)), noise_std=3.0
    )
    nodes = make_nodes(graph, x0, fp, gamma=0.5, density=0.5, dp_clip=1.0, dp_noise_std=3.0)
    names = ids(graph.n)
    w = metropolis_hastings(graph)
    xs = perturbed(x0, graph.n, seed=5)
    mean0 = flat(xs).mean(axis=0)
    rng = np.random.default_rng(6)
    for r in range(25):
        xs = secure_round(graph, nodes, xs, r, rng, drop=0.3, abort=0.1)
        for i in range(graph.n):
            incoming = [nodes[j].replica_units(names[i]) for j in graph.neighbours(i)]
            np.testing.assert_array_equal(nodes[i].aggregate_units(), np.sum(incoming, axis=0))
            weighted = sum(w[i, j] * nodes[j].replica(names[i]) for j in graph.neighbours(i))
            np.testing.assert_allclose(nodes[i].aggregate(), weighted, atol=1e-9)
    assert any(nodes[0].aggregate_units())  # something was absorbed
    np.testing.assert_allclose(flat(xs).mean(axis=0), mean0, atol=1e-5)


def test_contribution_encoding_randk_clip_and_value() -> None:
    graph, x0 = ring(4), start_model()
    fp = FixedPoint.choose(4.0, 16, max_inputs=2)
    a, _, c, _ = make_nodes(graph, x0, fp, gamma=0.5, density=0.4, dp_clip=0.3)
    xs = perturbed(x0, 4, seed=7, scale=2.0)
    rng = np.random.default_rng(8)
    ca = a.contribution(xs[0], "dev1", b"instance", rng)
    cc = c.contribution(xs[2], "dev1", b"instance", rng)
    assert a.index_count == round(0.4 * a.flat_size)
    assert ca.indices is not None and cc.indices is not None
    np.testing.assert_array_equal(ca.indices, cc.indices)  # shared-seed random-k
    assert ca.encoded.dtype == np.uint64 and ca.encoded.shape == ca.indices.shape
    np.testing.assert_array_equal(ca.value, fp.to_signed(ca.encoded) * fp.step)
    assert np.linalg.norm(ca.value) <= 0.3  # clipped to C − √k·step: rounding stays ≤ C
    assert np.linalg.norm(ca.value) > 0.25  # the clip was active (the raw u is far larger)
    other = a.contribution(xs[0], "dev1", b"another instance", rng)
    assert not np.array_equal(other.indices, ca.indices)
    a.commit(ca)  # a late confirmation of an earlier contribution still commits (additive)
    before = a.replica("dev1")
    a.commit(other)
    moved = a.replica("dev1") - before
    np.testing.assert_allclose(moved[other.indices], other.value / a.neighbours["dev1"])
    assert not np.delete(moved, other.indices).any()
    with pytest.raises(ConfigError, match="not pending"):
        a.commit(other)  # exactly once
    with pytest.raises(ConfigError, match="not a neighbour"):
        a.contribution(xs[0], "dev2", b"x", rng)


def test_absorb_checks_its_input() -> None:
    x0 = start_model()
    fp = FixedPoint.choose(1.0, 16, max_inputs=2)
    node = SecureChoco(x0, {"dev1": 0.25, "dev2": 0.25}, 0.5, 0.5, fp)
    n = node.flat_size
    with pytest.raises(WireError, match="values"):
        node.absorb(np.zeros(n - 1), None)
    with pytest.raises(WireError, match="grid"):
        node.absorb(np.full(n, 0.4 * fp.step), None)
    with pytest.raises(WireError, match="outside"):
        node.absorb(np.zeros(2), np.array([0, n]))
    with pytest.raises(WireError, match="sorted"):
        node.absorb(np.zeros(2), np.array([3, 3]))
    assert not node.aggregate_units().any()  # refused input changed nothing
    node.absorb(np.array([3 * fp.step, -fp.step]), np.array([1, 4]))
    assert node.aggregate_units()[[1, 4]].tolist() == [3, -1]
    layout_mix = node.mix(x0)
    assert list(layout_mix) == ["w", "b", "s"] and layout_mix["w"].dtype == np.float32


@pytest.mark.parametrize(
    ("neighbours", "self_weight", "gamma", "kw", "match"),
    [
        ({"a": 0.5}, 0.4, 0.5, {}, "sum"),
        ({"a": 0.0, "b": 0.5}, 0.5, 0.5, {}, "weight 0"),
        ({"a": 0.5}, 0.5, 0.0, {}, "γ"),
        ({"a": 0.5}, 0.5, 1.5, {}, "γ"),
        ({"a": 0.5}, 0.5, 0.5, {"density": 0.0}, "density"),
        ({"a": 0.5}, 0.5, 0.5, {"dp_clip": -1.0}, "dp_clip"),
        ({"a": 0.5}, 0.5, 0.5, {"dp_noise_std": float("nan")}, "dp_noise_std"),
    ],
)
def test_bad_configuration_is_refused(neighbours, self_weight, gamma, kw, match) -> None:
    fp = FixedPoint.choose(1.0, 16, max_inputs=2)
    with pytest.raises(ConfigError, match=match):
        SecureChoco(start_model(), neighbours, self_weight, gamma, fp, **kw)
