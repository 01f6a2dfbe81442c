"""CHOCO-SGD's error-triggered keyframes: exact replicas on demand, and stability."""

from __future__ import annotations

import numpy as np

from meshfl.aggregation import ChocoGossip
from meshfl.codecs import TopK
from meshfl.codecs.identity import Identity
from meshfl.topology import metropolis_hastings, ring

N = 8


def consensus(threshold: float, steps: int, gamma: float = 0.9, density: float = 0.1) -> float:
    """Pure CHOCO-gossip on a ring (no training); returns the final consensus distance."""
    rng = np.random.default_rng(0)
    xs = [{"w": rng.normal(size=200).astype(np.float32)} for _ in range(N)]
    graph, w = ring(N), metropolis_hastings(ring(N))
    ids = [f"d{i}" for i in range(N)]
    nodes = [
        ChocoGossip(xs[0], {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}, float(w[i, i]),
                    consensus_step=gamma, codec=TopK(density), keyframe_threshold=threshold)
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


def test_a_keyframe_makes_every_replica_exact() -> None:
    x0 = {"w": np.zeros(100, np.float32)}
    node = ChocoGossip(x0, {"peer": 0.5}, 0.5, consensus_step=0.5, codec=TopK(0.1),
                       keyframe_threshold=0.2)  # fmt: skip
    x = {"w": np.arange(100, dtype=np.float32)}

    message = node.outgoing(x)  # error ‖x − 0‖/‖x‖ = 1 > 0.2: a keyframe
    receiver = ChocoGossip(x0, {"sender": 0.5}, 0.5, consensus_step=0.5, codec=TopK(0.1))
    receiver.incoming("sender", message)

    assert [e.codec for e in message] == [Identity.tag]
    assert node.keyframes_sent == 1
    # the receiver's replica of the sender is now exactly x: mixing with weight 1/2 and
    # γ = 1/2 moves its (zero) model a quarter of the way to x
    np.testing.assert_array_equal(receiver.mix(x0, {"sender"})["w"], x["w"] * np.float32(0.25))


def test_below_the_threshold_messages_stay_compressed() -> None:
    x0 = {"w": np.ones(100, np.float32)}
    node = ChocoGossip(x0, {"peer": 0.5}, 0.5, consensus_step=0.5, codec=TopK(0.1),
                       shared_start=True, keyframe_threshold=0.5)  # fmt: skip

    message = node.outgoing({"w": x0["w"] * np.float32(1.1)})  # relative error 0.09

    assert [e.codec for e in message] == [TopK.tag] and node.keyframes_sent == 0


def test_keyframes_keep_aggressive_choco_from_diverging() -> None:
    start = consensus(threshold=0.0, steps=0)

    unbounded = consensus(threshold=0.0, steps=300)
    bounded = consensus(threshold=0.15, steps=300)

    assert unbounded > 10 * start  # top-k 0.1 with γ 0.9 blows up on its own
    assert bounded < start  # with keyframes it still reaches consensus
