"""The 1-D ConvNet of the model zoo (W2) and the W2 MLP: sizes, determinism, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_agent.trainer import Trainer
from meshfl.errors import ConfigError
from models.arrays import to_arrays
from models.datasets import load_mnist1d_split
from models.zoo import MODELS, build_model, cnn1d_lengths

CNN = {"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25]}
MLP = {"name": "mlp", "input_dim": 40, "num_classes": 10, "hidden": [100, 100]}


def test_cnn1d_is_registered_next_to_mlp():
    assert MODELS[:2] == ("mlp", "cnn1d")


def test_w2_cnn_has_5210_float32_parameters():
    arrays = to_arrays(build_model(CNN, seed=0))
    # conv 1→25 k5, conv 25→25 k3 twice, linear 25·5 → 10
    expected = (25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + (25 * 5 * 10 + 10)
    assert sum(a.size for a in arrays.values()) == expected == 5210
    assert all(a.dtype == np.float32 for a in arrays.values())


def test_w2_mlp_has_15210_parameters():
    arrays = to_arrays(build_model(MLP, seed=0))
    assert sum(a.size for a in arrays.values()) == 40 * 100 + 100 + 100 * 100 + 100 + 1010


def test_lengths_follow_the_convolution_formula():
    assert cnn1d_lengths(40, 3) == [19, 10, 5]
    assert cnn1d_lengths(8, 2) == [(8 + 2 - 5) // 2 + 1, ((8 + 2 - 5) // 2 + 1 - 1) // 2 + 1]


def test_forward_maps_sequences_to_logits():
    model = build_model({**CNN, "hidden": [4, 8]}, seed=1)
    assert model(torch.zeros(3, 40)).shape == (3, 10)


def test_same_seed_same_weights_and_no_global_rng():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    a = to_arrays(build_model(CNN, seed=7))
    assert torch.equal(torch.rand(3), expected)
    b, c = to_arrays(build_model(CNN, seed=7)), to_arrays(build_model(CNN, seed=8))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_init_bounds_follow_fan_in():
    arrays = to_arrays(build_model(CNN, seed=0))
    assert np.abs(arrays["convs.0.weight"]).max() <= 1 / np.sqrt(1 * 5)
    assert np.abs(arrays["convs.1.weight"]).max() <= 1 / np.sqrt(25 * 3)
    assert np.abs(arrays["head.weight"]).max() <= 1 / np.sqrt(125)


@pytest.mark.parametrize(
    "change,match",
    [({"hidden": []}, "hidden"), ({"input_dim": 2, "hidden": [4, 4, 4, 4]}, "input_dim"),
     ({"hidden": [0]}, "hidden"), ({"num_classes": 0}, "num_classes")],
)  # fmt: skip
def test_bad_cnn_specs_raise_config_error(change, match):
    with pytest.raises(ConfigError, match=match):
        build_model({**CNN, **change}, seed=0)


def test_centralised_training_learns_mnist1d():
    split = load_mnist1d_split()
    trainer = Trainer(CNN, seed=0, learning_rate=0.1, batch_size=32, local_epochs=6)
    before = trainer.evaluate(split.x_test, split.y_test)[0]
    trainer.train(split.x_train, split.y_train)
    after = trainer.evaluate(split.x_test, split.y_test)[0]
    assert before < 0.2  # ten classes, untrained
    assert after > 0.4  # measured 0.45 after six epochs
