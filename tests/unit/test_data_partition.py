"""W1 split and partition: reproduce benchmarks/data/w1_partition.json exactly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.errors import ConfigError, DataError
from models.data import load_dataset_file, load_test_arrays
from models.datasets import (
    dirichlet_partition,
    iid_partition,
    load_digits_split,
    split_dataset_file,
    write_partition,
)

# Facts of benchmarks/data/w1_partition.json (the copy of the brief's), embedded as well.
W1_DEVICES_SHA256 = "b92aebddce50487cba93b2000eefce8f048d9c749f0e25fe20db3679523742e9"
W1_SIZES = [72, 338, 239, 246, 103, 236, 83, 120]
W1_LABEL_COUNTS = [
    [9, 0, 8, 1, 3, 1, 0, 6, 7, 37],
    [19, 66, 6, 74, 12, 12, 83, 45, 3, 18],
    [55, 24, 0, 2, 0, 7, 46, 60, 10, 35],
    [14, 29, 94, 39, 17, 9, 2, 1, 39, 2],
    [1, 13, 0, 2, 0, 20, 1, 9, 44, 13],
    [30, 0, 8, 11, 54, 82, 1, 20, 29, 1],
    [4, 2, 1, 3, 40, 0, 1, 0, 2, 30],
    [10, 12, 25, 14, 19, 14, 11, 2, 5, 8],
]
_ROOT = Path(__file__).resolve().parents[2]
_CANDIDATES = [
    Path(os.environ.get("MESHFL_W1_PARTITION", "/nonexistent")),
    _ROOT / "benchmarks" / "data" / "w1_partition.json",
    _ROOT / "shared" / "data" / "w1_partition.json",
    _ROOT.parent / "shared" / "data" / "w1_partition.json",
    _ROOT / "tests" / "data" / "w1_partition.json",
]


@pytest.fixture(scope="module")
def digits():
    return load_digits_split()


@pytest.fixture(scope="module")
def w1_parts(digits):
    return dirichlet_partition(digits.y_train, 8, 0.5, seed=0)


def test_digits_split_sizes_and_types(digits):
    assert (digits.x_train.shape, digits.x_test.shape) == ((1437, 64), (360, 64))
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert digits.x_train.min() >= 0.0 and digits.x_train.max() <= 1.0
    per_class = np.bincount(np.concatenate([digits.y_train, digits.y_test]))
    assert np.abs(np.bincount(digits.y_test) - 0.2 * per_class).max() <= 1  # stratified


def test_w1_partition_reproduces_published_indices(w1_parts, digits):
    as_lists = [p.tolist() for p in w1_parts]
    digest = hashlib.sha256(json.dumps(as_lists).encode()).hexdigest()
    assert digest == W1_DEVICES_SHA256
    assert [len(p) for p in w1_parts] == W1_SIZES
    counts = [np.bincount(digits.y_train[p], minlength=10).tolist() for p in w1_parts]
    assert counts == W1_LABEL_COUNTS
    for path in (c for c in _CANDIDATES if c.is_file()):
        ref = json.loads(path.read_text())
        assert as_lists == [sorted(d) for d in ref["devices"]]
        assert ref["device_sizes"] == W1_SIZES
        assert ref["device_label_counts"] == W1_LABEL_COUNTS


def test_partitions_are_sorted_int64(w1_parts):
    for part in w1_parts:
        assert part.dtype == np.int64
        np.testing.assert_array_equal(part, np.sort(part))


@settings(max_examples=40, deadline=None)
@given(
    y=st.lists(st.integers(0, 5), min_size=0, max_size=200),
    n=st.integers(1, 12),
    alpha=st.floats(0.05, 100.0),
    seed=st.integers(0, 2**31),
)
def test_dirichlet_partition_is_a_disjoint_cover(y, n, alpha, seed):
    labels = np.array(y, dtype=np.int64)
    parts = dirichlet_partition(labels, n, alpha, seed)
    assert len(parts) == n
    merged = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(merged, np.arange(len(labels)))


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 300), n=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_iid_partition_is_balanced_cover(size, n, seed):
    parts = iid_partition(np.zeros(size, dtype=np.int64), n, seed)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(size))


def test_partition_arguments_validated():
    with pytest.raises(ConfigError, match="devices"):
        dirichlet_partition(np.zeros(4, dtype=np.int64), 0, 0.5)
    with pytest.raises(ConfigError, match="alpha"):
        dirichlet_partition(np.zeros(4, dtype=np.int64), 2, 0.0)
    with pytest.raises(ConfigError, match="devices"):
        iid_partition(np.zeros(4, dtype=np.int64), -1)


def test_write_partition_round_trips(tmp_path, digits, w1_parts):
    device_files, test_file = write_partition(tmp_path / "w1", digits, w1_parts)
    assert [f.name for f in device_files] == [f"device-{i}.npz" for i in range(8)]
    x, y = load_dataset_file(device_files[3])
    np.testing.assert_array_equal(x, digits.x_train[w1_parts[3]])
    np.testing.assert_array_equal(y, digits.y_train[w1_parts[3]])
    xt, yt = load_test_arrays(device_files[3])
    np.testing.assert_array_equal(yt, digits.y_test)
    np.testing.assert_array_equal(xt, digits.x_test)
    x_test, y_test = load_test_arrays(test_file)
    np.testing.assert_array_equal(y_test, digits.y_test)
    assert x_test.shape == (360, 64) and not list(tmp_path.glob("w1/*.tmp"))


def test_split_dataset_file_csv_is_stratified(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(100, 3))
    y = np.repeat([0, 1, 2, 3], 25)
    rows = ["a,b,label,c"] + [f"{r[0]},{r[1]},{c},{r[2]}" for r, c in zip(x, y, strict=True)]
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(rows) + "\n")
    split = split_dataset_file(path, n_devices=4, alpha=0.5, seed=0, test_fraction=0.2)
    assert (len(split.y_train), len(split.y_test)) == (80, 20)
    np.testing.assert_array_equal(np.bincount(split.y_test), [5, 5, 5, 5])
    assert split.x_train.shape == (80, 3) and split.x_train.dtype == np.float32


def test_split_dataset_file_refuses_too_small_classes(tmp_path):
    path = tmp_path / "tiny.npz"
    np.savez(path, x=np.zeros((5, 2)), y=np.array([0, 0, 0, 0, 1]))
    with pytest.raises(DataError, match=r"tiny\.npz"):
        split_dataset_file(path, n_devices=2, alpha=0.5, seed=0)
