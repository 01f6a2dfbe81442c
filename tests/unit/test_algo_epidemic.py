"""Epidemic Learning (randomized s-peer gossip) with per-edge CHOCO replicas."""

from __future__ import annotations

import numpy as np
import pytest

from meshfl.aggregation.epidemic import EpidemicGossip, sample_peers
from meshfl.codecs import Identity, Sign, TopK
from meshfl.errors import ConfigError, WireError

N = 6
IDS = [f"dev{i}" for i in range(N)]


def models(seed: int, n: int = N) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.standard_normal((4, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32),
        }
        for _ in range(n)
    ]


def step(nodes: list[EpidemicGossip], xs: list[dict], round_: int) -> list[dict]:
    boxes = [node.outgoing(x, round_) for node, x in zip(nodes, xs, strict=True)]
    for i, box in enumerate(boxes):
        for target, msg in box.items():
            nodes[IDS.index(target)].incoming(IDS[i], msg)
    return [node.mix(x) for node, x in zip(nodes, xs, strict=True)]


def test_sample_peers_is_seeded_distinct_and_excludes_self() -> None:
    a = sample_peers(IDS, "dev2", 3, round_=7, seed=1)
    assert a == sample_peers(IDS, "dev2", 3, round_=7, seed=1)
    assert len(set(a)) == 3 and "dev2" not in a and a == sorted(a)
    draws = {tuple(sample_peers(IDS, "dev2", 3, round_=r, seed=1)) for r in range(20)}
    assert len(draws) > 1  # fresh each round
    with pytest.raises(ConfigError, match="s \\(peers"):
        sample_peers(IDS, "dev2", N, 0, 0)
    with pytest.raises(ConfigError, match="hold"):
        sample_peers(IDS, "nobody", 1, 0, 0)


def test_identity_step_is_the_el_average_of_what_arrived() -> None:
    x0 = models(0)[0]
    nodes = [EpidemicGossip(x0, IDS[i], IDS, 2, Identity(), seed=3) for i in range(N)]
    xs = models(1)
    out = step(nodes, xs, round_=1)
    for i in range(N):
        senders = [j for j in range(N) if IDS[i] in nodes[j].targets(1)]
        for k in x0:
            expected = (
                xs[i][k].astype(np.float64) + sum(xs[j][k].astype(np.float64) for j in senders)
            ) / (1 + len(senders))
            np.testing.assert_allclose(out[i][k], expected, rtol=1e-5, atol=1e-6)


def test_all_peers_with_identity_recovers_exact_averaging() -> None:
    x0 = models(0)[0]
    nodes = [EpidemicGossip(x0, IDS[i], IDS, N - 1, Identity()) for i in range(N)]
    xs = models(2)
    out = step(nodes, xs, round_=1)
    for k in x0:
        mean = np.mean([x[k].astype(np.float64) for x in xs], axis=0)
        for o in out:
            np.testing.assert_allclose(o[k], mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec", [Sign(), TopK(0.2)])
def test_edge_replicas_stay_bit_identical_under_compression(codec: object) -> None:
    x0 = models(0)[0]
    nodes = [EpidemicGossip(x0, IDS[i], IDS, 2, codec, 0.5, seed=5) for i in range(N)]
    xs = models(3)
    rng = np.random.default_rng(9)
    for r in range(1, 12):
        xs = [
            {k: v + 0.1 * rng.standard_normal(v.shape).astype(np.float32) for k, v in x.items()}
            for x in step(nodes, xs, r)
        ]
    for i in range(N):
        for j in range(N):
            if i != j:
                out = nodes[i].edge_replica(IDS[j], "out")
                held = nodes[j].edge_replica(IDS[i], "in")
                for k in x0:
                    np.testing.assert_array_equal(out[k], held[k])


def test_bad_messages_are_refused() -> None:
    x0 = models(0)[0]
    a = EpidemicGossip(x0, IDS[0], IDS, 1, Identity())
    b = EpidemicGossip(x0, IDS[1], IDS, 1, Identity())
    msg = next(iter(b.outgoing(x0, 1).values()))
    with pytest.raises(WireError, match="not a neighbour"):
        a.incoming("stranger", msg)
    a.incoming(IDS[1], msg)
    with pytest.raises(WireError, match="second message"):
        a.incoming(IDS[1], msg)
    with pytest.raises(ConfigError, match="γ"):
        EpidemicGossip(x0, IDS[0], IDS, 1, Identity(), consensus_step=0.0)
