"""DP-SGD in the trainer (record-level DP, ``dp_unit`` ``record``; edge_agent/dp_sgd.py).

Every expectation is computed independently of the product's vmap path: per-example
gradients by a plain loop of ``loss.backward()`` on one example at a time, clipping by
numpy, ε by Opacus' RDP accountant.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from edge_agent.dp_sgd import DPSGD, RecordDP, check_per_sample_model, clip_per_sample
from edge_agent.trainer import Trainer
from meshfl.errors import ConfigError
from models.zoo import build_model

MLP = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}


def _batch(b: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(b, 64)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, size=b).astype(np.int64))
    return x, y


def _loop_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-example gradients the naive way: one backward pass per example."""
    loss = nn.CrossEntropyLoss()
    out: dict[str, list[np.ndarray]] = {k: [] for k, _ in model.named_parameters()}
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        loss(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            assert p.grad is not None
            out[k].append(p.grad.detach().numpy().copy())
    return {k: np.stack(v) for k, v in out.items()}


def _dp(model: nn.Module, sigma: float = 1.0, clip: float = 1.0, seed: int = 0) -> DPSGD:
    return DPSGD(model, nn.CrossEntropyLoss(), RecordDP(sigma, clip), 8, seed=seed)


def test_per_example_gradients_equal_a_per_example_loop() -> None:
    model = build_model(MLP, 0)  # type: ignore[arg-type]
    x, y = _batch()
    grads, losses = _dp(model).per_sample_grads(x, y)
    expected = _loop_grads(model, x, y)
    assert set(grads) == set(expected)
    for k, g in grads.items():
        assert g.shape == (12, *dict(model.named_parameters())[k].shape)
        np.testing.assert_allclose(g.numpy(), expected[k], rtol=1e-4, atol=1e-6)
    assert losses.shape == (12,)


@pytest.mark.parametrize("clip", [0.05, 0.5, 100.0])
def test_every_clipped_per_example_gradient_is_within_c(clip: float) -> None:
    model = build_model(MLP, 0)  # type: ignore[arg-type]
    x, y = _batch(b=16, seed=1)
    x = x * 5  # large inputs: large gradients, most of them clipped at small C
    clipped, norms = clip_per_sample(_dp(model).per_sample_grads(x, y)[0], clip)
    loop = _loop_grads(model, x, y)
    flat_loop = np.concatenate([g.reshape(16, -1) for g in loop.values()], axis=1)
    raw = np.linalg.norm(flat_loop, axis=1)
    np.testing.assert_allclose(norms.numpy(), raw, rtol=1e-4)
    flat = np.concatenate([g.reshape(16, -1).numpy() for g in clipped.values()], axis=1)
    after = np.linalg.norm(flat, axis=1)
    assert (after <= clip * (1 + 1e-5)).all()
    # The clipped gradient is the loop's, scaled by min(1, C / ‖g‖): direction unchanged.
    scale = np.minimum(1.0, clip / (raw + 1e-6))
    np.testing.assert_allclose(flat, flat_loop * scale[:, None], rtol=1e-3, atol=1e-7)


def test_the_added_noise_has_std_sigma_c_over_b() -> None:
    sigma, clip, batch = 1.5, 0.7, 8
    model = build_model(MLP, 0)  # type: ignore[arg-type]
    x, y = _batch(b=batch, seed=2)
    dp = DPSGD(model, nn.CrossEntropyLoss(), RecordDP(sigma, clip), batch, seed=3)
    grads = dp.per_sample_grads(x, y)[0]
    summed = {k: g.sum(0) for k, g in clip_per_sample(grads, clip)[0].items()}
    noise = []
    for _ in range(20):  # 20 × 4,810 coordinates of noise
        noised, _ = dp.noised_gradient(x, y)
        noise += [(noised[k] - summed[k] / batch).flatten() for k in noised]
    sample = torch.cat(noise).numpy()
    assert sample.mean() == pytest.approx(0.0, abs=0.002)
    assert sample.std() == pytest.approx(sigma * clip / batch, rel=0.02)


def test_an_empty_poisson_sample_still_gets_its_noise() -> None:
    model = build_model(MLP, 0)  # type: ignore[arg-type]
    x, y = _batch(b=0)
    noised, loss = _dp(model, sigma=2.0, clip=1.0).noised_gradient(x, y)
    assert math.isnan(loss)
    sample = torch.cat([g.flatten() for g in noised.values()]).numpy()
    assert sample.std() == pytest.approx(2.0 / 8, rel=0.05)


def test_poisson_sampling_includes_each_example_with_probability_b_over_n() -> None:
    dp = _dp(build_model(MLP, 0))  # type: ignore[arg-type]
    sizes = [len(dp.sample(400)) for _ in range(400)]
    assert np.mean(sizes) == pytest.approx(8, rel=0.05)  # E|batch| = q·n = B
    assert len(set(sizes)) > 5  # the batch size varies: Poisson, not fixed-size
    assert RecordDP.sampling_rate(400, 8) == 0.02 and RecordDP.sampling_rate(5, 8) == 1.0


def test_the_trainer_refuses_bad_sigma_or_clip_and_batchnorm() -> None:
    for bad in [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (1.0, math.nan), (True, 1.0)]:
        with pytest.raises(ConfigError, match="DP-SGD"):
            Trainer(MLP, seed=0, learning_rate=0.1, batch_size=8, local_epochs=1,  # type: ignore[arg-type]
                    dp_sgd=bad)  # fmt: skip
    with pytest.raises(ConfigError, match=r"BatchNorm1d.*GroupNorm"):
        check_per_sample_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    check_per_sample_model(nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4)))


def test_the_trainer_counts_its_steps_and_sampling_rate_for_the_spend() -> None:
    trainer = Trainer(MLP, seed=0, learning_rate=0.1, batch_size=32, local_epochs=2,  # type: ignore[arg-type]
                      dp_sgd=(1.0, 1.0), dp_seed=0)  # fmt: skip
    assert trainer.record_dp == RecordDP(1.0, 1.0)
    assert trainer.dp_spend(100, 4, 1) == {"round": 4, "releases": 8, "sampling_rate": 0.32}
    x, y = _batch(b=100)
    assert trainer.train(x.numpy(), y.numpy()).steps == 8
    plain = Trainer(MLP, seed=0, learning_rate=0.1, batch_size=32, local_epochs=2)  # type: ignore[arg-type]
    assert plain.record_dp is None and plain.dp_spend(100, 2, 3) == {"round": 2, "releases": 3}


def test_momentum_applies_to_the_privatized_gradient() -> None:
    """Two steps by hand: v ← g̃₁, x ← x − η v; v ← β v + g̃₂, x ← x − η v."""
    x, y = _batch(b=40, seed=4)
    kwargs = {"seed": 0, "learning_rate": 0.1, "batch_size": 40, "local_epochs": 1}
    trainer = Trainer(MLP, momentum=0.5, dp_sgd=(1.0, 1.0), dp_seed=5, **kwargs)  # type: ignore[arg-type]
    twin = build_model(MLP, 0)  # type: ignore[arg-type]
    dp = DPSGD(twin, nn.CrossEntropyLoss(), RecordDP(1.0, 1.0), 40, seed=5)
    velocity: dict[str, torch.Tensor] = {}
    for _ in range(2):
        batch = dp.sample(40)
        noised, _ = dp.noised_gradient(x[batch], y[batch])
        with torch.no_grad():
            for k, p in twin.named_parameters():
                velocity[k] = noised[k] if k not in velocity else 0.5 * velocity[k] + noised[k]
                p -= 0.1 * velocity[k]
        trainer.train(x.numpy(), y.numpy())
    for k, p in twin.named_parameters():
        np.testing.assert_allclose(trainer.params()[k], p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_dp_sgd_on_digits_at_epsilon_8_learns_well_above_chance() -> None:
    """Pooled W1 data (1,437 examples), MLP 64-64-10, 15 epochs of DP-SGD at ε ≈ 8."""
    from coordinator.privacy import Spend, epsilon
    from models.datasets import load_digits_split

    split = load_digits_split(0)
    n, batch, epochs, sigma = len(split.y_train), 32, 15, 0.75
    steps = epochs * math.ceil(n / batch)
    eps = epsilon([Spend(sigma, steps, batch / n, "record")], 1e-5, "record")
    assert 6.0 < eps <= 8.0
    trainer = Trainer(MLP, seed=0, learning_rate=0.1, batch_size=batch, local_epochs=epochs,  # type: ignore[arg-type]
                      dp_sgd=(sigma, 4.0), dp_seed=0)  # fmt: skip
    trainer.train(split.x_train, split.y_train)
    accuracy, _ = trainer.evaluate(split.x_test, split.y_test)
    assert accuracy > 0.85  # chance: 0.1
