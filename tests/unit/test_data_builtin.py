"""Built-in datasets: shapes, dtypes, standardisation, W1 unchanged, nothing downloaded."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from meshfl.errors import ConfigError
from models.builtin import BUILTIN_DATASETS, load_builtin, load_split, num_classes
from models.datasets import load_digits_split

# name: (train, test, features, classes)
TABULAR = {
    "iris": (120, 30, 4, 3),
    "wine": (142, 36, 13, 3),
    "breast_cancer": (455, 114, 30, 2),
}


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a built-in dataset tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_names():
    assert BUILTIN_DATASETS == ("digits", "mnist1d", "iris", "wine", "breast_cancer")


@pytest.mark.parametrize("name", sorted(TABULAR))
def test_tabular_split_shapes_and_standardisation(name, no_network):
    train, test, features, classes = TABULAR[name]
    split = load_builtin(name, seed=0)
    assert split.x_train.shape == (train, features) and split.x_test.shape == (test, features)
    assert split.x_train.dtype == np.float32 and split.y_train.dtype == np.int64
    assert num_classes(split) == classes
    # standardised with the training set's statistics
    np.testing.assert_allclose(split.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(split.x_train.std(axis=0), 1.0, atol=1e-4)
    assert np.abs(split.x_test.mean(axis=0)).max() > 1e-3  # not re-standardised on test
    # stratified: the test set keeps the class proportions within one sample
    per_class = np.bincount(np.concatenate([split.y_train, split.y_test]))
    assert np.abs(np.bincount(split.y_test, minlength=classes) - 0.2 * per_class).max() <= 1


def test_seed_changes_the_split_deterministically():
    a, b, c = load_builtin("wine", 0), load_builtin("wine", 0), load_builtin("wine", 1)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.y_test, c.y_test) or not np.array_equal(a.x_test, c.x_test)


def test_digits_is_w1_bit_for_bit(no_network):
    builtin, direct = load_builtin("digits", 0), load_digits_split(0)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        got, want = getattr(builtin, field), getattr(direct, field)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert num_classes(builtin) == 10


def test_mnist1d_is_w2s_generator(monkeypatch):
    # Generation takes ~10 s and is tested offline in test_mnist1d.py; check the delegation.
    import models.builtin

    calls = []
    monkeypatch.setattr(models.builtin, "load_mnist1d_split", lambda seed: calls.append(seed))
    load_builtin("mnist1d", 3)
    assert calls == [3]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match="breast_cancer") as info:
        load_builtin("cifar10")
    assert "cifar10" in str(info.value) and "\n" not in str(info.value)


def test_load_split_takes_names_and_paths(tmp_path):
    assert load_split("iris").x_train.shape == (120, 4)
    path = tmp_path / "mine.npz"
    np.savez(path, x=np.arange(40.0).reshape(20, 2), y=np.arange(20) % 2)
    split = load_split(str(path), seed=0, n_devices=2)
    assert (len(split.y_train), len(split.y_test)) == (16, 4)
    with pytest.raises(ConfigError, match="neither a built-in dataset") as info:
        load_split(str(tmp_path / "absent.csv"))
    assert "absent.csv" in str(info.value)


def test_lockstep_uses_the_builtins():
    from meshfl.app.local.lab.lockstep import load_split as lockstep_split

    assert lockstep_split("wine", 0).x_train.shape == (142, 13)
    with pytest.raises(ConfigError, match="unknown built-in dataset"):
        lockstep_split("nope", 0)
