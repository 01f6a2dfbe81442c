"""Partitioners: deterministic, a disjoint cover, skew controlled by α/β; the CLI writes files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.app.cli import main
from meshfl.errors import ConfigError
from models.data import load_dataset_file, load_test_arrays
from models.datasets import dirichlet_partition as reexported
from models.datasets import load_digits_split
from models.partition import (
    SCHEMES,
    device_label_distance,
    dirichlet_partition,
    label_skew,
    partition,
    quantity_partition,
    shards_partition,
)

PARAMS = {"alpha": 0.5, "shards_per_device": 2, "beta": 0.5}


@pytest.fixture(scope="module")
def y_digits() -> np.ndarray:
    return load_digits_split().y_train


def test_old_import_path_still_works():
    assert reexported is dirichlet_partition


@pytest.mark.parametrize("scheme", SCHEMES)
def test_deterministic_for_a_seed(scheme, y_digits):
    first = partition(y_digits, scheme, 8, seed=3, **PARAMS)
    again = partition(y_digits, scheme, 8, seed=3, **PARAMS)
    other = partition(y_digits, scheme, 8, seed=4, **PARAMS)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 6), min_size=1, max_size=300),
    n=st.integers(1, 12),
    spd=st.integers(1, 4),
    scheme=st.sampled_from(SCHEMES),
    seed=st.integers(0, 2**31),
)
def test_every_sample_exactly_once(labels, n, spd, scheme, seed):
    y = np.array(labels, dtype=np.int64)
    if len(y) < n * (spd if scheme == "shards" else 1):
        with pytest.raises(ConfigError):
            partition(y, scheme, n, seed=seed, alpha=0.3, shards_per_device=spd, beta=0.3)
        return
    parts = partition(y, scheme, n, seed=seed, alpha=0.3, shards_per_device=spd, beta=0.3)
    assert len(parts) == n
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no repeats within a device
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))
    if scheme in ("quantity", "shards", "iid"):
        assert min(len(p) for p in parts) >= 1


def _mean_skew(y, alpha, seeds=range(5)):
    return np.mean([label_skew(y, dirichlet_partition(y, 8, alpha, s)) for s in seeds])


def test_alpha_controls_label_skew(y_digits):
    strong, medium, weak = (_mean_skew(y_digits, a) for a in (0.1, 1.0, 100.0))
    assert strong > medium > weak
    assert weak < 0.1 and strong > 0.5


def test_iid_has_little_skew_and_shards_much(y_digits):
    iid = label_skew(y_digits, partition(y_digits, "iid", 8, seed=0))
    shards = label_skew(y_digits, shards_partition(y_digits, 20, 2, seed=0))
    assert iid < 0.1 < 0.6 < shards


def test_beta_controls_size_spread(y_digits):
    def spread(beta: float) -> float:
        sizes = [
            np.std([len(p) for p in quantity_partition(y_digits, 10, beta, s)]) for s in range(5)
        ]
        return float(np.mean(sizes))

    assert spread(0.1) > spread(1.0) > spread(100.0)
    # labels stay IID within each device: far less skew than the shards scheme
    assert label_skew(y_digits, quantity_partition(y_digits, 4, 100.0, 0)) < 0.1


def test_quantity_gives_every_device_a_sample():
    y = np.zeros(12, dtype=np.int64)
    for seed in range(20):
        parts = quantity_partition(y, 12, 0.05, seed)
        assert [len(p) for p in parts] == [1] * 12


def test_shards_bound_the_labels_per_device(y_digits):
    for spd in (1, 2, 3):
        parts = shards_partition(y_digits, 20, spd, seed=1)
        labels = [len(np.unique(y_digits[p])) for p in parts]
        # A shard (~1437 / (20·spd) samples) is smaller than a class (~144), so it spans
        # at most two labels: at most 2·spd labels per device, about spd on average.
        assert max(labels) <= 2 * spd
        assert np.mean(labels) <= spd + 1


def test_label_distance_is_exact_on_a_small_case():
    y = np.array([0, 0, 1, 1])
    parts = [np.array([0, 1]), np.array([2]), np.array([3]), np.array([], dtype=np.int64)]
    distance = device_label_distance(y, parts)
    np.testing.assert_allclose(distance[:3], [0.5, 0.5, 0.5])
    assert np.isnan(distance[3])
    assert label_skew(y, parts) == pytest.approx(0.5)
    assert label_skew(y, [np.arange(4)]) == 0.0


@pytest.mark.parametrize(
    ("scheme", "n", "params", "words"),
    [
        ("iid", 11, {}, "10 training samples cannot be shared by 11 devices"),
        ("dirichlet", 2, {"alpha": 0.0}, "alpha"),
        ("dirichlet", 2, {"alpha": float("nan")}, "alpha"),
        ("shards", 3, {"shards_per_device": 4}, "cannot make 3 x 4 shards"),
        ("shards", 3, {"shards_per_device": 0}, "shards per device"),
        ("quantity", 2, {"beta": -1.0}, "beta"),
        ("ring", 2, {}, "unknown partition scheme"),
        ("iid", 0, {}, "number of devices"),
    ],
)
def test_impossible_requests_are_refused(scheme, n, params, words):
    with pytest.raises(ConfigError, match=words) as info:
        partition(np.arange(10) % 2, scheme, n, **params)
    assert "\n" not in str(info.value)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["data", "partition", *args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_cli_shards_writes_files_that_load(tmp_path, capsys, y_digits):
    code, out, _ = _cli(capsys, "--scheme", "shards", "--devices", "4", "--out", str(tmp_path))
    assert code == 0
    loaded = [load_dataset_file(tmp_path / f"device-{i}.npz") for i in range(4)]
    assert sum(len(y) for _, y in loaded) == len(y_digits)
    assert all(x.shape[1] == 64 for x, _ in loaded)
    assert load_test_arrays(tmp_path / "test.npz")[0].shape == (360, 64)
    assert "label skew" in out and "device-3.npz:" in out


def test_cli_default_is_w1(tmp_path, capsys):
    code, _, _ = _cli(capsys, "--out", str(tmp_path))
    assert code == 0
    sizes = [len(load_dataset_file(tmp_path / f"device-{i}.npz")[1]) for i in range(8)]
    assert sizes == [72, 338, 239, 246, 103, 236, 83, 120]


def test_cli_builtin_tabular(tmp_path, capsys):
    code, _, _ = _cli(capsys, "--dataset", "iris", "--scheme", "iid", "--devices", "3",
                      "--out", str(tmp_path))  # fmt: skip
    assert code == 0
    x, y = load_dataset_file(tmp_path / "device-0.npz")
    assert x.shape == (40, 4) and set(y.tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--scheme", "zipf"], "zipf"),
        (["--scheme", "quantity", "--beta", "0"], "beta"),
        (["--scheme", "shards", "--devices", "100", "--shards-per-device", "20"], "shards"),
        (["--dataset", "nope.csv"], "nope.csv"),
        (["--dataset", "iris", "--devices", "500", "--scheme", "iid"], "500 devices"),
        (["--image-size", "big"], "--image-size"),
    ],
)
def test_cli_bad_options_exit_2_with_one_line(tmp_path, capsys, args, words):
    code, _, err = _cli(capsys, "--out", str(tmp_path / "out"), *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshfl: error:") and words in lines[0], err
    assert not list(tmp_path.glob("out/*.npz"))


def _one_line(code: int, err: str, words: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshfl: error:") and words in lines[0], err


def test_cli_huge_labels_refused_before_writing(tmp_path, capsys):
    data = tmp_path / "hugey.npz"
    y = np.where(np.arange(40) % 2 == 1, 2**40, 0)
    np.savez(data, x=np.random.default_rng(0).random((40, 4)), y=y)
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", str(data), "--out", str(out), "--devices", "2",
                        "--scheme", "iid")  # fmt: skip
    _one_line(code, err, "hugey.npz: label 1099511627776")
    assert not out.exists()


def test_label_distance_handles_any_label_values():
    y = np.array([0, 2**40, 0, 2**40])
    parts = [np.array([0, 1]), np.array([2, 3])]
    np.testing.assert_allclose(device_label_distance(y, parts), [0.0, 0.0])


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_cli_seed_out_of_range_names_seed(tmp_path, capsys, seed):
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", "iris", "--out", str(out), "--seed", seed)
    _one_line(code, err, f"--seed {seed}")
    assert not out.exists()


def test_cli_out_is_an_existing_file(tmp_path, capsys):
    taken = tmp_path / "ok.csv"
    taken.write_text("f0,label\n")
    for out in (taken, taken / "sub"):
        code, _, err = _cli(capsys, "--dataset", "iris", "--out", str(out), "--scheme", "iid")
        _one_line(code, err, "is a file, not a directory")
    assert taken.read_text() == "f0,label\n"


def test_cli_out_cannot_be_created(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", "iris", "--out", str(out), "--scheme", "iid")
    _one_line(code, err, "cannot write there (Permission denied)")
    assert not out.exists()


def test_cli_image_size_too_large_refused_before_reading(tmp_path, capsys):
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", str(tmp_path), "--out", str(out),
                        "--image-size", "100000x100000")  # fmt: skip
    _one_line(code, err, "--image-size")
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("f0,f0,f1,label,label\n" + "1,2,3,0,0\n1,2,3,1,1\n" * 10, "repeats column name"),
        ("f0,label\n" + "1,0\n2,99999999999999999999\n" * 10, "not below 100000"),
    ],
)
def test_cli_bad_csv_refused_before_writing(tmp_path, capsys, content, words):
    data = tmp_path / "bad.csv"
    data.write_text(content)
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", str(data), "--out", str(out), "--devices", "2")
    _one_line(code, err, words)
    assert not out.exists()


def test_cli_zero_features_refused_before_writing(tmp_path, capsys):
    data = tmp_path / "d0.npz"
    np.savez(data, x=np.zeros((40, 0)), y=np.arange(40) % 2)
    out = tmp_path / "o"
    code, _, err = _cli(capsys, "--dataset", str(data), "--out", str(out), "--devices", "2")
    _one_line(code, err, "no feature columns")
    assert not out.exists()
