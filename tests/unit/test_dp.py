"""DP-FedAvg's clipping and Gaussian noise, and the privatizer hook of CHOCO-SGD."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pytest

from meshfl.aggregation import ChocoGossip, GaussianPrivatizer, clip_l2
from meshfl.codecs import Codec, Identity, Int8
from meshfl.errors import CodecError, ConfigError


def norm64(arrays: Iterable[np.ndarray]) -> float:
    """The plain float64 norm (inf when the squares overflow)."""
    with np.errstate(over="ignore"):
        return math.sqrt(sum(float(np.sum(np.asarray(a, dtype=np.float64) ** 2)) for a in arrays))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_post_clip_norm_is_at_most_c_exactly_over_many_draws(dtype: type) -> None:
    rng = np.random.default_rng(0)
    for draw in range(400):
        log_scale = rng.uniform(-6, 30 if dtype == np.float32 else 200)
        arrays = [
            (rng.standard_normal(shape) * 10.0**log_scale).astype(dtype)
            for shape in [(int(rng.integers(1, 50)),), (3, int(rng.integers(1, 9)))]
        ]
        clip = float(10.0 ** rng.uniform(-3, 3))
        clipped, before = clip_l2(arrays, clip)
        assert norm64(clipped) <= clip, (draw, norm64(clipped), clip)
        assert [c.dtype for c in clipped] == [dtype, dtype]
        assert before == pytest.approx(norm64(arrays), rel=1e-9) or math.isinf(norm64(arrays))
        if before > clip:  # clipped onto the sphere (up to float32 rounding), same direction
            assert norm64(clipped) == pytest.approx(clip, rel=1e-5)
            np.testing.assert_allclose(clipped[0] * (before / clip), arrays[0], rtol=1e-4)


def test_clip_leaves_a_short_delta_unchanged_and_inputs_untouched() -> None:
    a = np.array([3.0, 4.0], dtype=np.float32)
    (out,), before = clip_l2([a], 10.0)
    assert before == 5.0
    np.testing.assert_array_equal(out, a)
    (out,), _ = clip_l2([a], 1.0)
    np.testing.assert_allclose(out, [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(a, [3.0, 4.0])


def test_clip_of_huge_float32_values_does_not_overflow() -> None:
    a = np.full(1000, 3e38, dtype=np.float32)
    (out,), before = clip_l2([a], 1.0)
    assert math.isfinite(before) and before > 1e39
    assert norm64([out]) <= 1.0


def test_clip_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="clipping norm"):
        clip_l2([np.ones(2)], 0.0)
    with pytest.raises(ConfigError, match="clipping norm"):
        clip_l2([np.ones(2)], math.inf)
    with pytest.raises(CodecError, match="NaN"):
        clip_l2([np.array([1.0, np.nan])], 1.0)


def test_noise_standard_deviation_is_sigma_times_c() -> None:
    sigma, clip = 1.3, 0.5
    privatizer = GaussianPrivatizer(clip, sigma, np.random.default_rng(1))
    out = privatizer.privatize({"w": np.zeros(100_000, dtype=np.float32)})["w"]
    assert out.dtype == np.float32 and privatizer.releases == 1
    n, std = out.size, sigma * clip
    # (n − 1)s²/σ² ~ χ²(n − 1) ≈ N(n − 1, 2(n − 1)): a 5-sigma interval on s².
    ratio = float(np.var(out.astype(np.float64), ddof=1)) / std**2
    assert abs(ratio - 1.0) < 5 * math.sqrt(2.0 / (n - 1))
    assert abs(float(np.mean(out))) < 5 * std / math.sqrt(n)


def test_privatize_clips_jointly_before_adding_noise() -> None:
    privatizer = GaussianPrivatizer(1.0, 0.0, np.random.default_rng(0))
    out = privatizer.privatize({"a": np.full(3, 10.0), "b": np.full(4, -10.0)})
    assert list(out) == ["a", "b"]
    assert norm64(out.values()) <= 1.0
    np.testing.assert_allclose(out["a"], 1 / math.sqrt(7), rtol=1e-6)


def test_privatizer_refuses_bad_options() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError):
        GaussianPrivatizer(0.0, 1.0, rng)
    with pytest.raises(ConfigError):
        GaussianPrivatizer(1.0, -1.0, rng)
    with pytest.raises(ConfigError):
        GaussianPrivatizer(1.0, 1.0, 42)  # type: ignore[arg-type]


def _model(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((3, 2), value, dtype=np.float32), "b": np.full(2, value, dtype=np.float32)}


@pytest.mark.parametrize("codec", [Identity(), Int8()])
def test_choco_privatizes_the_difference_and_replicas_stay_identical(codec: Codec) -> None:
    sender = ChocoGossip(
        _model(0.0),
        {"r": 1.0},
        0.0,
        1.0,
        codec,
        privatizer=GaussianPrivatizer(0.5, 0.1, np.random.default_rng(0)),
    )
    receiver = ChocoGossip(_model(0.0), {"s": 1.0}, 0.0, 1.0, codec)
    for step in range(1, 4):
        entries = sender.outgoing(_model(float(step)))
        receiver.incoming("s", entries)
    own = dict(zip(["w", "b"], sender._own, strict=True))
    held = receiver.mean_of(["s"])
    for name in own:
        np.testing.assert_array_equal(own[name], held[name])
    # Each released difference had norm <= C (+ noise): after 3 messages x̂ is far from x.
    assert norm64(own.values()) < 3 * (0.5 + 0.1 * 0.5 * 6)


def test_choco_refuses_keyframes_with_a_privatizer() -> None:
    privatizer = GaussianPrivatizer(1.0, 1.0, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="keyframe"):
        ChocoGossip(
            _model(0.0),
            {"r": 1.0},
            0.0,
            1.0,
            Identity(),
            keyframe_growth=2.0,
            privatizer=privatizer,
        )


def test_a_keyframe_under_dp_resends_the_public_replica_not_the_model() -> None:
    privatizer = GaussianPrivatizer(1.0, 1.0, np.random.default_rng(0))
    algo = ChocoGossip(_model(0.0), {"r": 1.0}, 0.0, 1.0, Identity(), privatizer=privatizer)
    receiver = ChocoGossip(_model(0.0), {"s": 1.0}, 0.0, 1.0, Identity())
    algo.outgoing(_model(5.0))  # a released (clipped, noised) difference; receiver missed it
    public = [a.copy() for a in algo._own]
    receiver.incoming_keyframe("s", algo.keyframe(_model(9.0)))
    held = receiver.mean_of(["s"])
    for name, replica in zip(["w", "b"], public, strict=True):
        np.testing.assert_array_equal(held[name], replica)  # x̂_i, never x
        assert not np.allclose(held[name], 9.0)
    np.testing.assert_array_equal(algo._own[0], public[0])  # x̂_i unchanged
    assert privatizer.releases == 1  # the keyframe released nothing new
    with pytest.raises(ConfigError, match="privatize"):
        ChocoGossip(_model(0.0), {"r": 1.0}, 0.0, 1.0, Identity(), privatizer=object())  # type: ignore[arg-type]
