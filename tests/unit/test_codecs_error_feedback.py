"""Error feedback state, and CHOCO-SGD gossip with every codec."""

from __future__ import annotations

import numpy as np
import pytest

from meshfl.aggregation import ChocoGossip, ErrorFeedback
from meshfl.codecs import (
    QSGD,
    BFloat16,
    Codec,
    Float16,
    Identity,
    Int8,
    PowerSGD,
    RandK,
    Sign,
    TopK,
    Zstd,
    parse_codec,
)
from meshfl.errors import CodecError, ConfigError
from meshfl.topology import build_graph, metropolis_hastings

LAYOUT = [("w", (8, 6)), ("b", (6,))]


@pytest.mark.parametrize(
    "codec", [TopK(0.1), Sign(), RandK(0.2, seed=0), Int8(4), PowerSGD(1, seed=0)], ids=repr
)
def test_error_feedback_telescopes(codec: Codec) -> None:
    rng = np.random.default_rng(0)
    ef = ErrorFeedback(LAYOUT)
    inputs = [rng.standard_normal((8, 6)).astype(np.float32) for _ in range(30)]

    sent = np.zeros((8, 6), dtype=np.float64)
    for x in inputs:
        _, decoded = ef.compress(codec, "w", x)
        sent += decoded

    total = np.sum(np.array(inputs, dtype=np.float64), axis=0)
    np.testing.assert_allclose(sent + ef.residual("w"), total, atol=1e-4)
    np.testing.assert_array_equal(ef.residual("b"), np.zeros(6, dtype=np.float32))


def test_error_feedback_residual_is_what_was_dropped() -> None:
    ef = ErrorFeedback(LAYOUT)
    x = np.array([3.0, -1.0, 0.5, 0.0, 2.0, -4.0], dtype=np.float32)

    payload, decoded = ef.compress(TopK(0.3), "b", x)  # k = 2: keeps -4 and 3
    assert ef.residual("b").tolist() == [0, -1.0, 0.5, 0, 2.0, 0]
    second_payload, second = ef.compress(TopK(0.3), "b", np.zeros(6, dtype=np.float32))

    np.testing.assert_array_equal(decoded, [3.0, 0, 0, 0, 0, -4.0])
    assert TopK.decode(payload, (6,)).tolist() == decoded.tolist()
    np.testing.assert_array_equal(second, [0, -1.0, 0, 0, 2.0, 0])  # the residual goes out
    np.testing.assert_array_equal(ef.residual("b"), [0, 0, 0.5, 0, 0, 0])
    assert ef.residual_norm() == pytest.approx(0.5)
    assert TopK.decode(second_payload, (6,)).tolist() == second.tolist()


def test_error_feedback_lossless_keeps_zero_residual_and_reset() -> None:
    ef = ErrorFeedback(LAYOUT)
    x = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)

    _, decoded = ef.compress(Identity(), "w", x)
    assert ef.residual_norm() == 0.0
    np.testing.assert_array_equal(decoded, x)
    ef.compress(Sign(), "w", x)
    assert ef.residual_norm() > 0
    ef.reset()
    assert ef.residual_norm() == 0.0


def test_error_feedback_rejects_bad_input_without_changing_state() -> None:
    ef = ErrorFeedback(LAYOUT)
    ef.compress(Sign(), "b", np.arange(6, dtype=np.float32))
    before = ef.residual("b")
    bad = np.ones(6, dtype=np.float32)
    bad[2] = np.nan

    with pytest.raises(CodecError):
        ef.compress(Sign(), "b", bad)
    with pytest.raises(ConfigError, match="shape"):
        ef.compress(Sign(), "b", np.ones(5, dtype=np.float32))
    with pytest.raises(ConfigError, match="no tensor"):
        ef.compress(Sign(), "nope", np.ones(6, dtype=np.float32))
    with pytest.raises(ConfigError):
        ErrorFeedback([("w", (2,)), ("w", (3,))])
    np.testing.assert_array_equal(ef.residual("b"), before)


EVERY_CODEC = [
    "identity",
    "fp16",
    "bf16",
    "int8",
    "int8:8",
    "qsgd:16",
    "topk:0.3",
    "randk:0.3",
    "randk:0.7:unbiased",  # ω = n/k − 1 < 1; at ω >= 1 the replicas diverge (docs)
    "sign",
    "powersgd:2",
    "topk:0.3+zstd",
    "int8+zstd:19",
]
LOSSLESS_ISH = {"identity", "fp16", "bf16", "int8", "int8:8", "int8+zstd:19"}


def consensus_distance(models: list[dict[str, np.ndarray]]) -> float:
    flat = np.array([np.concatenate([v.ravel() for v in m.values()]) for m in models], np.float64)
    return float(np.mean(np.sum((flat - flat.mean(axis=0)) ** 2, axis=1)))


@pytest.mark.parametrize("spec", EVERY_CODEC)
def test_choco_gossip_runs_with_every_codec(spec: str) -> None:
    n, rounds = 4, 50
    graph = build_graph("ring", n)
    w = metropolis_hastings(graph)
    ids = [f"d{i}" for i in range(n)]
    rng = np.random.default_rng(0)
    xs = [
        {
            "w": rng.standard_normal((8, 6)).astype(np.float32),
            "b": rng.standard_normal(6).astype(np.float32),
        }
        for _ in range(n)
    ]
    gamma = 0.5 if spec in LOSSLESS_ISH else 0.05
    algos = [
        ChocoGossip(
            xs[i],
            {ids[j]: float(w[i, j]) for j in graph.neighbours(i)},
            float(w[i, i]),
            gamma,
            parse_codec(spec, seed=i),
        )
        for i in range(n)
    ]
    start = consensus_distance(xs)

    for _ in range(rounds):
        sent = [algos[i].outgoing(xs[i]) for i in range(n)]
        for i in range(n):
            for j in graph.neighbours(i):
                algos[i].incoming(ids[j], sent[j])
        xs = [algos[i].mix(xs[i], {ids[j] for j in graph.neighbours(i)}) for i in range(n)]

    end = consensus_distance(xs)
    assert all(np.isfinite(v).all() for x in xs for v in x.values())
    assert sent[0][0].codec == parse_codec(spec).tag
    if spec in LOSSLESS_ISH:
        assert end < 1e-3 * start
    else:
        assert end < 1.5 * start


def test_codec_classes_used_are_all_registered() -> None:
    used = {type(parse_codec(spec)) for spec in EVERY_CODEC}

    assert used == {Identity, Float16, BFloat16, Int8, QSGD, TopK, RandK, Sign, PowerSGD, Zstd}
