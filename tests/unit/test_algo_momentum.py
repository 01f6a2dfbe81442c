"""Heavy-ball, quasi-global and update momentum against hand-computed steps."""

from __future__ import annotations

import numpy as np
import pytest

from meshfl.aggregation.momentum import (
    LocalMomentum,
    QuasiGlobalMomentum,
    UpdateMomentum,
    heavy_ball_step,
)
from meshfl.errors import ConfigError


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_heavy_ball_step_matches_hand_computation() -> None:
    x, g, buf = f32(1.0, 2.0), f32(0.5, -1.0), f32(0.2, 0.2)
    heavy_ball_step(x, g, buf, lr=0.1, beta=0.9)
    # buf = 0.9·0.2 + g = (0.68, −0.82); x = x − 0.1·buf
    np.testing.assert_allclose(buf, [0.68, -0.82], rtol=1e-6)
    np.testing.assert_allclose(x, [0.932, 2.082], rtol=1e-6)


def test_local_momentum_keeps_its_buffer_across_steps() -> None:
    opt = LocalMomentum(0.5)
    x = {"w": f32(0.0)}
    opt.step(x, {"w": f32(1.0)}, lr=0.1)  # v = 1, x = −0.1
    opt.step(x, {"w": f32(1.0)}, lr=0.1)  # v = 1.5, x = −0.25
    np.testing.assert_allclose(x["w"], [-0.25], rtol=1e-6)
    assert opt.buffer_norm() == pytest.approx(1.5)


def test_local_momentum_zero_beta_is_plain_sgd() -> None:
    opt = LocalMomentum(0.0)
    x = {"w": f32(1.0, 1.0)}
    for _ in range(3):
        opt.step(x, {"w": f32(1.0, -2.0)}, lr=0.1)
    np.testing.assert_allclose(x["w"], [0.7, 1.6], rtol=1e-6)


def test_quasi_global_momentum_hand_computed_round() -> None:
    qgm = QuasiGlobalMomentum(beta=0.9, mu=0.5)
    x = {"w": f32(1.0)}
    qgm.begin_round(x)
    qgm.step(x, {"w": f32(2.0)}, lr=0.1)  # m̂ = 0: x = 1 − 0.2 = 0.8
    qgm.step(x, {"w": f32(2.0)}, lr=0.1)  # x = 0.6
    np.testing.assert_allclose(x["w"], [0.6], rtol=1e-6)
    mixed = {"w": f32(0.7)}  # neighbours pulled it back
    qgm.end_round(mixed, lr=0.1, steps=2)  # d̂ = (1 − 0.7)/(0.1·2) = 1.5; m̂ = 0.5·1.5
    assert qgm.buffer_norm() == pytest.approx(0.75, rel=1e-6)
    x2 = {"w": f32(0.7)}
    qgm.begin_round(x2)
    qgm.step(x2, {"w": f32(0.0)}, lr=0.1)  # x = 0.7 − 0.1·(0 + 0.9·0.75)
    np.testing.assert_allclose(x2["w"], [0.7 - 0.0675], rtol=1e-6)


def test_quasi_global_momentum_mu_defaults_to_beta_and_needs_begin() -> None:
    qgm = QuasiGlobalMomentum(0.8)
    assert qgm.mu == 0.8
    with pytest.raises(ConfigError, match="begin_round"):
        qgm.end_round({"w": f32(0.0)}, lr=0.1, steps=1)
    qgm.begin_round({"w": f32(0.0)})
    with pytest.raises(ConfigError, match="steps"):
        qgm.end_round({"w": f32(0.0)}, lr=0.1, steps=0)


def test_update_momentum_is_fedavgm() -> None:
    um = UpdateMomentum(beta=0.5)
    start, mixed = {"w": f32(1.0)}, {"w": f32(0.8)}
    out = um.apply(start, mixed)  # u = 0.2, x = 0.8
    np.testing.assert_allclose(out["w"], [0.8], rtol=1e-6)
    out = um.apply({"w": f32(0.8)}, {"w": f32(0.7)})  # u = 0.1 + 0.1, x = 0.6
    np.testing.assert_allclose(out["w"], [0.6], rtol=1e-6)


def test_update_momentum_zero_beta_unit_alpha_returns_the_mixed_model() -> None:
    um = UpdateMomentum(0.0)
    mixed = {"w": f32(0.3, -4.0)}
    np.testing.assert_array_equal(um.apply({"w": f32(1.0, 1.0)}, mixed)["w"], mixed["w"])


@pytest.mark.parametrize("beta", [1.0, -0.1, float("nan"), True, "0.5"])
def test_invalid_momentum_is_refused(beta: object) -> None:
    for cls in (LocalMomentum, QuasiGlobalMomentum, UpdateMomentum):
        with pytest.raises(ConfigError, match=r"\[0, 1\)"):
            cls(beta)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="α"):
        UpdateMomentum(0.5, alpha=0.0)
