"""W2's data: MNIST-1D generated offline by the mnist1d package."""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest

from models.datasets import dirichlet_partition, load_mnist1d_split


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access in a unit test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_default_arguments_give_4000_train_1000_test_of_length_40(no_network):
    split = load_mnist1d_split()
    assert split.x_train.shape == (4000, 40) and split.x_test.shape == (1000, 40)
    assert split.x_train.dtype == np.float32 and split.y_train.dtype == np.int64
    assert split.y_test.dtype == np.int64
    assert set(np.unique(split.y_train)) == set(range(10))
    everything = np.concatenate([split.x_train, split.x_test])
    assert abs(float(everything.mean())) < 1e-3 and abs(float(everything.std()) - 1) < 1e-3


def test_generation_is_deterministic_and_restores_global_rngs(no_network):
    np.random.seed(3)
    random.seed(3)
    expected_np, expected_py = np.random.random(), random.random()
    np.random.seed(3)
    random.seed(3)
    a = load_mnist1d_split()
    assert (np.random.random(), random.random()) == (expected_np, expected_py)
    b = load_mnist1d_split()
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    c = load_mnist1d_split(seed=1)
    assert not np.array_equal(a.x_train, c.x_train)


def test_w2_partition_covers_the_training_set():
    split = load_mnist1d_split()
    parts = dirichlet_partition(split.y_train, 16, 0.3, 0)
    assert len(parts) == 16 and all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(4000))
