"""The agent's trainer and capability probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_agent.capability_probe import capability_profile
from edge_agent.trainer import Trainer, TrainResult
from meshfl.errors import ConfigError, DataError
from models.arrays import spec_hash
from models.datasets import load_digits_split

W1 = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}


@pytest.fixture(scope="module")
def digits():
    return load_digits_split()


def _trainer(**overrides):
    kwargs = {"seed": 0, "learning_rate": 0.1, "batch_size": 32, "local_epochs": 1}
    return Trainer(W1, **{**kwargs, **overrides})


def _assert_params_equal(a, b):
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_centralised_w1_training_reaches_90_percent(digits):
    trainer = _trainer(local_epochs=10)
    result = trainer.train(digits.x_train, digits.y_train)
    accuracy, loss = trainer.evaluate(digits.x_test, digits.y_test)
    assert isinstance(result, TrainResult)
    assert result.samples == 10 * 1437 and result.seconds > 0 and np.isfinite(result.loss)
    assert accuracy > 0.9 and loss < 0.5


def test_training_is_reproducible_and_seeded(digits):
    x, y = digits.x_train[:200], digits.y_train[:200]
    a, b, c = _trainer(), _trainer(), _trainer(data_seed=1)
    for t in (a, b, c):
        t.train(x, y)
    _assert_params_equal(a.params(), b.params())
    assert not np.array_equal(a.params()["0.weight"], c.params()["0.weight"])


def test_one_sgd_step_matches_numpy():
    trainer = _trainer(batch_size=4)
    before = trainer.params()
    x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    trainer.train(x, y)  # one batch covering all samples: order does not matter
    h = np.maximum(x @ before["0.weight"].T + before["0.bias"], 0)
    logits = h @ before["2.weight"].T + before["2.bias"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d_logits = (p - np.eye(10)[y]) / 4
    expected = before["2.bias"] - 0.1 * d_logits.sum(0)
    np.testing.assert_allclose(trainer.params()["2.bias"], expected, rtol=1e-5, atol=1e-6)


def test_set_params_and_params_are_copies():
    trainer, other = _trainer(), _trainer(seed=3)
    trainer.set_params(other.params())
    _assert_params_equal(trainer.params(), other.params())
    with pytest.raises(ConfigError, match=r"0\.weight"):
        trainer.set_params({**other.params(), "0.weight": np.zeros((2, 2), np.float32)})


def test_throughput_positive_and_params_unchanged(digits):
    trainer = _trainer()
    before = trainer.params()
    speed = trainer.measure_throughput(digits.x_train[:100], digits.y_train[:100], batches=10)
    assert speed > 0
    _assert_params_equal(trainer.params(), before)
    untouched = _trainer()  # measuring does not shift the training shuffle either
    trainer.train(digits.x_train[:100], digits.y_train[:100])
    untouched.train(digits.x_train[:100], digits.y_train[:100])
    _assert_params_equal(trainer.params(), untouched.params())


def test_evaluate_and_train_refuse_bad_data():
    trainer = _trainer()
    with pytest.raises(DataError, match="no samples"):
        trainer.evaluate(np.zeros((0, 64), np.float32), np.zeros(0, np.int64))
    with pytest.raises(DataError, match="40 features"):
        trainer.train(np.zeros((3, 40), np.float32), np.zeros(3, np.int64))


@pytest.mark.parametrize("field", ["learning_rate", "batch_size", "local_epochs", "threads"])
def test_hyper_parameters_validated(field):
    with pytest.raises(ConfigError):
        _trainer(**{field: 0})


def test_save_writes_loadable_state_dict_and_npz(tmp_path):
    trainer = _trainer(seed=4)
    target = tmp_path / "out" / "model.pt"
    trainer.save(target)
    state = torch.load(target, weights_only=True)
    for name, value in trainer.params().items():
        np.testing.assert_array_equal(state[name].numpy(), value)
    with np.load(tmp_path / "out" / "model.npz") as npz:
        np.testing.assert_array_equal(npz["2.bias"], trainer.params()["2.bias"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.npz", "model.pt"]


def test_spec_hash_property():
    assert _trainer().spec_hash == _trainer(seed=9).spec_hash == spec_hash(_trainer().params())


def test_capability_profile(digits):
    trainer = _trainer()
    profile = capability_profile(trainer, digits.x_train[:64], digits.y_train[:64])
    assert profile["cores"] >= 1 and profile["memory_bytes"] > 0
    assert profile["train_samples_per_s"] > 0 and profile["model_hash"] == trainer.spec_hash
    assert profile["accelerator"] is None or profile["accelerator"].startswith("cuda:")
    bare = capability_profile(None, None, None)
    assert "train_samples_per_s" not in bare and "model_hash" not in bare
    assert isinstance(bare["platform"], str) and bare["platform"]


class _FakeClock:
    """perf_counter advancing 1 s per reading; sleep records its argument."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_slowdown_sleeps_in_proportion_to_each_measured_step(digits, monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr("edge_agent.trainer.time", clock)
    trainer = _trainer(slowdown=4.0)

    result = trainer.train(digits.x_train[:100], digits.y_train[:100])

    # every step reads the clock twice, 1 s apart: each step "took" 1 s → sleep 3 s
    assert result.steps == 4
    assert clock.sleeps == [3.0] * 4


def test_an_emulated_step_time_is_a_floor_scaled_by_the_slowdown(digits, monkeypatch):
    clock = _FakeClock()  # every step "takes" 1 s of real time
    monkeypatch.setattr("edge_agent.trainer.time", clock)
    x, y = digits.x_train[:100], digits.y_train[:100]

    _trainer(step_time_s=2.5).train(x, y)  # a device whose steps take 2.5 s
    _trainer(step_time_s=2.5, slowdown=4.0).train(x, y)  # 4x slower: 10 s a step
    _trainer(step_time_s=0.5).train(x, y)  # the real step is slower already: no sleep

    assert clock.sleeps == [1.5] * 4 + [9.0] * 4
    with pytest.raises(ConfigError, match="step time must be a finite number >= 0 s"):
        _trainer(step_time_s=-0.1)


def test_slowdown_does_not_change_the_arithmetic(digits):
    x, y = digits.x_train[:64], digits.y_train[:64]
    plain, slowed = _trainer(), _trainer(slowdown=1.5)
    plain.train(x, y)
    slowed.train(x, y)
    _assert_params_equal(plain.params(), slowed.params())


def test_slowed_throughput_is_measured_through_the_same_steps(digits, monkeypatch):
    import threading
    import time

    real_sleep, sleeps, me = time.sleep, [], threading.get_ident()

    def recording_sleep(seconds: float) -> None:
        if threading.get_ident() == me:  # time.sleep is global: other tests' threads sleep too
            sleeps.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr("edge_agent.trainer.time.sleep", recording_sleep)
    trainer = _trainer(slowdown=3.0)
    x, y = digits.x_train[:64], digits.y_train[:64]

    speed = trainer.measure_throughput(x, y, batches=4)
    profile = capability_profile(trainer, x, y)

    assert len(sleeps) == (1 + 4) + (1 + 20)  # warm-up + timed steps; the probe times 20
    timed = sum(sleeps[1:5])  # the first call's timed steps
    assert 4 * 32 / speed >= timed > 0  # elapsed time includes at least the sleeps
    assert profile["train_samples_per_s"] > 0


@pytest.mark.parametrize("slowdown", [0.5, 0.0, -1.0, float("inf"), float("nan"), True])
def test_slowdown_must_be_finite_and_at_least_one(slowdown):
    with pytest.raises(ConfigError, match="slowdown must be a finite number >= 1"):
        _trainer(slowdown=slowdown)


@pytest.mark.parametrize(
    ("n", "epochs", "fraction", "steps", "samples"),
    [
        (100, 1, 1.0, 4, 100),  # 32 + 32 + 32 + 4
        (100, 1, 0.5, 2, 64),
        (100, 1, 0.01, 1, 32),  # at least one step
        (100, 2, 0.75, 6, 164),  # one full epoch, then two steps of the second
        (100, 3, 1.0, 12, 300),
    ],
)
def test_work_fraction_runs_the_first_steps(digits, n, epochs, fraction, steps, samples):
    trainer = _trainer(local_epochs=epochs)

    result = trainer.train(digits.x_train[:n], digits.y_train[:n], work_fraction=fraction)

    assert (result.steps, result.samples) == (steps, samples)
    assert np.isfinite(result.loss)


def test_partial_work_is_a_prefix_of_the_full_round(digits):
    x, y = digits.x_train[:64], digits.y_train[:64]  # two steps per epoch
    half = _trainer()
    half.train(x, y, work_fraction=0.5)
    first = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:32].numpy()
    one_step = _trainer()
    one_step.train(x[first], y[first])  # one step on the same 32 samples

    for name, value in one_step.params().items():
        np.testing.assert_allclose(half.params()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan"), True])
def test_work_fraction_outside_zero_one_is_refused(digits, fraction):
    with pytest.raises(ConfigError, match=r"work fraction must be in \(0, 1\]"):
        _trainer().train(digits.x_train[:10], digits.y_train[:10], work_fraction=fraction)
