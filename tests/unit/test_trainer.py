"""The agent's trainer and capability probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_agent.probe import capability_profile
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
