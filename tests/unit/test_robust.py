"""Robust mixing rules: median, trimmed mean, ClippedGossip, and their gossip hooks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshfl.aggregation import (
    ChocoGossip,
    DPSGDGossip,
    RobustMixer,
    adaptive_tau,
    clipped_gossip,
    coordinate_median,
    trimmed_mean,
)
from meshfl.aggregation.privacy import RobustRule, parse_robust
from meshfl.app.local.lab.attack import SignFlip
from meshfl.codecs import Identity, decode_tensor
from meshfl.errors import ConfigError

STACK = np.array(
    [
        [1.0, 10.0, -3.0],
        [2.0, 20.0, -1.0],
        [3.0, 30.0, -2.0],
        [4.0, 40.0, -5.0],
        [100.0, 50.0, -4.0],
    ]
)


def test_coordinate_median_by_hand() -> None:
    np.testing.assert_array_equal(coordinate_median(STACK), [3.0, 30.0, -3.0])
    np.testing.assert_array_equal(coordinate_median(STACK[:4]), [2.5, 25.0, -2.5])


def test_trimmed_mean_by_hand() -> None:
    # β = 0.2, m = 5: drop one value from each end per coordinate.
    np.testing.assert_allclose(trimmed_mean(STACK, 0.2), [3.0, 30.0, -3.0])
    # β = 0.1, m = 5: ⌊0.5⌋ = 0, the plain mean.
    np.testing.assert_allclose(trimmed_mean(STACK, 0.1), STACK.mean(axis=0))
    # m = 6, β = 0.2: ⌊1.2⌋ = 1 from each end.
    six = np.vstack([STACK, [[5.0, 60.0, 0.0]]])
    np.testing.assert_allclose(trimmed_mean(six, 0.2), [3.5, 35.0, -2.5])
    with pytest.raises(ConfigError, match="β"):
        trimmed_mean(STACK, 0.5)


def test_clipped_gossip_by_hand() -> None:
    x = np.zeros(2)
    neighbours = np.array([[3.0, 4.0], [0.6, 0.8]])  # distances 5 and 1
    weights = np.array([0.25, 0.5])
    out = clipped_gossip(x, neighbours, weights, tau=2.0)
    # 0.25 · (2/5)·(3, 4) + 0.5 · (0.6, 0.8)
    np.testing.assert_allclose(out, [0.25 * 1.2 + 0.3, 0.25 * 1.6 + 0.4])
    np.testing.assert_allclose(
        clipped_gossip(x, neighbours, weights, math.inf), weights @ neighbours
    )
    np.testing.assert_array_equal(clipped_gossip(x, neighbours, weights, 0.0), x)
    np.testing.assert_array_equal(clipped_gossip(x, np.zeros((0, 2)), np.zeros(0), 1.0), x)


def test_adaptive_tau_leaves_out_the_farthest_weight() -> None:
    x = np.zeros(1)
    neighbours = np.array([[1.0], [2.0], [3.0], [100.0]])
    weights = np.full(4, 0.2)
    assert adaptive_tau(x, neighbours, weights) == 3.0  # default: one Byzantine neighbour
    assert adaptive_tau(x, neighbours, weights, byzantine_fraction=0.25) == 3.0
    assert adaptive_tau(x, neighbours, weights, byzantine_fraction=0.5) == 2.0
    assert adaptive_tau(x, neighbours, weights, byzantine_fraction=0.0) == 100.0
    assert adaptive_tau(x, neighbours[:1], weights[:1]) == 1.0
    with pytest.raises(ConfigError):
        adaptive_tau(x, neighbours, weights, byzantine_fraction=1.0)


def test_an_outlier_at_1e6_moves_robust_rules_boundedly_and_the_mean_a_lot() -> None:
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(5, 50))
    attacked = np.vstack([honest, np.full((1, 50), 1e6)])
    x_i, weights = honest[0], np.full(5, 1 / 6)

    spread = float(np.max(np.abs(honest)))
    assert (
        float(np.max(np.abs(coordinate_median(attacked) - coordinate_median(honest)))) <= 2 * spread
    )
    assert float(np.max(np.abs(trimmed_mean(attacked, 0.2) - honest.mean(axis=0)))) <= 2 * spread
    assert float(np.linalg.norm(attacked.mean(axis=0) - honest.mean(axis=0))) > 1e5
    tau = 1.0
    clean = clipped_gossip(x_i, honest[1:], weights[1:], tau)
    dirty = clipped_gossip(x_i, attacked[1:], np.full(5, 1 / 6), tau)
    assert float(np.linalg.norm(dirty - clean)) <= 2 * tau / 6 + 1e-12
    tau_adaptive = adaptive_tau(x_i, attacked[1:], np.full(5, 1 / 6))
    assert tau_adaptive < 100  # the outlier sets no radius
    plain = x_i + np.full(5, 1 / 6) @ (attacked[1:] - x_i)
    assert float(np.linalg.norm(plain - x_i)) > 1e5


def model(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 2), value, dtype=np.float32), "b": np.full(3, value, dtype=np.float32)}


def test_robust_mixer_median_and_trimmed_per_tensor_jointly() -> None:
    peers = {f"p{k}": model(float(k)) for k in range(1, 5)} | {"bad": model(1e6)}
    weights = dict.fromkeys(peers, 1 / 6)
    x = model(0.0)
    median = RobustMixer(parse_robust("median")).mix(x, peers, weights, 1 / 6, 1.0)
    assert all(np.all(v == 2.5) for v in median.values())  # median of 0,1,2,3,4,1e6
    trimmed = RobustMixer(parse_robust("trimmed:0.2")).mix(x, peers, weights, 1 / 6, 0.5)
    assert all(np.allclose(v, 0.5 * 2.5) for v in trimmed.values())  # γ = 0.5 toward 2.5
    assert list(trimmed) == ["w", "b"] and trimmed["w"].dtype == np.float32


def test_robust_mixer_clipped_gossip_bounds_one_neighbour() -> None:
    peers = {"good": model(1.0), "bad": model(1e6)}
    weights = {"good": 0.25, "bad": 0.25}
    mixer = RobustMixer(parse_robust("clipped-gossip"))
    out = mixer.mix(model(0.0), peers, weights, 0.5, 1.0)
    assert mixer.last_tau == pytest.approx(math.sqrt(7))  # distance of the good neighbour
    flat = np.concatenate([v.ravel() for v in out.values()])
    assert float(np.linalg.norm(flat)) <= 0.5 * math.sqrt(7) + 1e-5
    with pytest.raises(ConfigError, match="weight"):
        mixer.mix(model(0.0), peers, {"good": 1.0}, 0.0, 1.0)


def _choco(robust: RobustRule | None = None) -> ChocoGossip:
    return ChocoGossip(
        model(0.0), {"a": 0.25, "b": 0.25, "c": 0.25}, 0.25, 1.0, Identity(), robust=robust
    )


def test_choco_with_a_robust_rule_mixes_the_replicas() -> None:
    senders = {
        name: ChocoGossip(model(0.0), {"me": 1.0}, 0.0, 1.0, Identity()) for name in ("a", "b", "c")
    }
    values = {"a": 1.0, "b": 2.0, "c": 1e6}
    plain, robust = _choco(), _choco(parse_robust("median"))
    for name, sender in senders.items():
        entries = sender.outgoing(model(values[name]))
        plain.incoming(name, entries)
        robust.incoming(name, entries)
    assert plain.mix(model(0.0), {"a", "b", "c"})["w"][0, 0] > 1e5
    out = robust.mix(model(0.0), {"a", "b", "c"})
    assert all(np.all(v == 1.5) for v in out.values())  # median of 0, 1, 2, 1e6
    # Only the answered neighbours count: median of 0, 1, 2.
    assert all(np.all(v == 1.0) for v in robust.mix(model(0.0), {"a", "b"}).values())


def test_dpsgd_with_a_robust_rule() -> None:
    algo = DPSGDGossip(
        model(0.0), {"a": 0.25, "b": 0.25, "c": 0.25}, 0.25, robust=parse_robust("trimmed:0.25")
    )
    for name, value in (("a", 1.0), ("b", 2.0), ("c", -1e6)):
        sender = DPSGDGossip(model(0.0), {"me": 1.0}, 0.0)
        algo.incoming(name, sender.outgoing(model(value)))
    out = algo.mix(model(0.0), {"a", "b", "c"})
    assert all(np.allclose(v, 0.5) for v in out.values())  # trim 1 of 4 per end: mean(0, 1)


def test_sign_flip_sends_minus_scale_times_the_honest_message() -> None:
    honest = ChocoGossip(model(0.0), {"r": 1.0}, 0.0, 1.0, Identity())
    attacker = SignFlip(ChocoGossip(model(0.0), {"r": 1.0}, 0.0, 1.0, Identity()), 20.0)
    for step in (1.0, 3.0):
        sent, flipped = honest.outgoing(model(step)), attacker.outgoing(model(step))
        for a, b in zip(sent, flipped, strict=True):
            decoded_a = decode_tensor(a.codec, a.payload, tuple(a.shape))
            decoded_b = decode_tensor(b.codec, b.payload, tuple(b.shape))
            np.testing.assert_array_equal(decoded_b, -20.0 * decoded_a)
    assert attacker.message_kind == 1
    with pytest.raises(ConfigError):
        SignFlip(honest, 0.0)
