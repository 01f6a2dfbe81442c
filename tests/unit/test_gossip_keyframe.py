"""CHOCO-SGD's error-triggered keyframes: exact replicas on demand, and stability."""

from __future__ import annotations

import numpy as np

from meshfl.aggregation import ChocoGossip
from meshfl.aggregation.choco import KEYFRAME_BASELINE
from meshfl.codecs import TopK
from meshfl.codecs.identity import Identity
from meshfl.topology import metropolis_hastings, ring

N = 8


def consensus(growth: float, steps: int, gamma: float = 0.9, density: float = 0.1) -> float:
    """Pure CHOCO-gossip on a ring (no training); returns the final consensus distance.

    The nodes start near a shared x⁰ (replicas at x⁰), as devices do after shared-start
    training rounds, so the first messages show the codec's normal error level.
    """
    rng = np.random.default_rng(0)
    x0 = {"w": rng.normal(size=200).astype(np.float32)}
    xs = [{"w": x0["w"] + rng.normal(scale=0.05, size=200).astype(np.float32)} for _ in range(N)]
    graph, w = ring(N), metropolis_hastings(ring(N))
    ids = [f"d{i}" for i in range(N)]
    nodes = [
        ChocoGossip(x0, {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}, float(w[i, i]),
                    consensus_step=gamma, codec=TopK(density), shared_start=True,
                    keyframe_growth=growth)
        for i in range(N)
    ]  # fmt: skip
    for _ in range(steps):
        out = [nodes[i].outgoing(xs[i]) for i in range(N)]
        for i in range(N):
            for j in graph.neighbours(i):
                nodes[i].incoming(ids[j], out[j])
        xs = [nodes[i].mix(xs[i], {ids[j] for j in graph.neighbours(i)}) for i in range(N)]
    stacked = np.stack([x["w"].astype(np.float64) for x in xs])
    return float(np.mean(np.sum((stacked - stacked.mean(axis=0)) ** 2, axis=1)))


def sender_after_a_quiet_baseline() -> tuple[ChocoGossip, dict[str, np.ndarray]]:
    """A sender whose first messages carry a 1 % relative error (its normal level)."""
    x = {"w": np.ones(100, np.float32)}
    node = ChocoGossip(x, {"peer": 0.5}, 0.5, consensus_step=0.5, codec=TopK(0.5),
                       shared_start=True, keyframe_growth=1.5)  # fmt: skip
    for step in range(KEYFRAME_BASELINE):
        x = {"w": x["w"] + np.float32(0.01) * (-1) ** step}
        node.outgoing(x)
    return node, x


def test_an_error_far_above_its_normal_level_sends_a_keyframe() -> None:
    node, x = sender_after_a_quiet_baseline()
    jumped = {"w": x["w"] + np.linspace(0, 1, 100, dtype=np.float32)}  # error ≫ 1.5 × normal

    keyframe = node.outgoing(jumped)
    after = node.outgoing(jumped)  # same model again: the replica must now be exact

    assert [e.codec for e in keyframe] == [Identity.tag] and node.keyframes_sent == 1
    assert [e.codec for e in after] == [TopK.tag]
    np.testing.assert_array_equal(TopK.decode(after[0].payload, (100,)), np.zeros(100))


def test_at_its_normal_level_messages_stay_compressed() -> None:
    node, x = sender_after_a_quiet_baseline()

    message = node.outgoing({"w": x["w"] + np.float32(0.01)})

    assert [e.codec for e in message] == [TopK.tag] and node.keyframes_sent == 0


def test_keyframes_keep_aggressive_choco_from_diverging() -> None:
    start = consensus(growth=0.0, steps=0)

    unbounded = consensus(growth=0.0, steps=300)
    bounded = consensus(growth=1.5, steps=300)

    assert unbounded > 10 * start  # top-k 0.1 with γ 0.9 blows up on its own
    assert bounded < start  # with keyframes it still reaches consensus
