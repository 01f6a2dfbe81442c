"""Data file loading: every bad file raises DataError naming the file."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from meshfl.errors import DataError
from models.data import check_model_fit, load_dataset_file, load_test_arrays

SPEC = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}


def test_npz_loads_with_dtypes(tmp_path):
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    path = tmp_path / "dev.npz"
    np.savez(path, x=x, y=np.array([0, 1, 2, 1]), extra=np.zeros(2))
    got_x, got_y = load_dataset_file(str(path))
    np.testing.assert_array_equal(got_x, x.astype(np.float32))
    np.testing.assert_array_equal(got_y, [0, 1, 2, 1])
    assert got_x.dtype == np.float32 and got_y.dtype == np.int64


def test_npz_images_are_flattened(tmp_path):
    path = tmp_path / "img.npz"
    np.savez(path, x=np.ones((3, 8, 8), dtype=np.float32), y=np.array([0, 1, 2]))
    assert load_dataset_file(path)[0].shape == (3, 64)


def test_csv_loads_label_column_anywhere(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text("f1,target,f2\n0.5,1,2\n1.5,0,3\n")
    x, y = load_dataset_file(path, label_column="target")
    np.testing.assert_array_equal(x, np.array([[0.5, 2], [1.5, 3]], dtype=np.float32))
    np.testing.assert_array_equal(y, [1, 0])


def test_test_arrays_prefer_x_test(tmp_path):
    path = tmp_path / "dev.npz"
    np.savez(path, x=np.zeros((2, 2)), y=[0, 0], x_test=np.ones((3, 2)), y_test=[1, 1, 1])
    x, y = load_test_arrays(path)
    np.testing.assert_array_equal(y, [1, 1, 1])
    assert x.shape == (3, 2)


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, dict):
        np.savez(path, **content)
    else:
        path.write_bytes(content)
    return path


BAD_FILES = {
    "empty.csv": (b"", "empty"),
    "empty.npz": (b"", "empty"),
    "garbage.npz": (b"not a zip file", "not a readable"),
    "ragged.csv": (b"a,label\n1,0\n2\n", "row 3"),
    "words.csv": (b"a,label\n1,0\nhello,1\n", "non-numeric"),
    "nolabel.csv": (b"a,b\n1,0\n", "no label column"),
    "header_only.csv": (b"a,label\n", "no samples"),
    "nan.csv": (b"a,label\nnan,0\n1,1\n", "NaN"),
    "negative.csv": (b"a,label\n1,-1\n", "negative label"),
    "fraction.csv": (b"a,label\n1,0.5\n", "label 0.5 of sample 0 is not an integer"),
    "data.txt": (b"1,2,3\n", "unsupported"),
    "nox.npz": ({"features": np.zeros((2, 2)), "y": np.zeros(2)}, "no array 'x'"),
    "noy.npz": ({"x": np.zeros((2, 2))}, "no array 'y'"),
    "lengths.npz": ({"x": np.zeros((3, 2)), "y": np.zeros(2)}, "3 feature rows but 2"),
    "nan.npz": ({"x": np.array([[1.0, np.inf]]), "y": np.zeros(1)}, "NaN or inf"),
    "flat.npz": ({"x": np.zeros(3), "y": np.zeros(3)}, "expected \\(n, d\\)"),
    "strings.npz": ({"x": np.array([["a"]]), "y": np.zeros(1)}, "non-numeric dtype"),
    "objects.npz": ({"x": np.array([[1, None]], dtype=object), "y": np.zeros(1)}, "object"),
    "huge_label.npz": (
        {"x": np.ones((4, 2)), "y": np.array([0, 2**40, 0, 2**40])},
        "label 1099511627776 .* not below 100000",
    ),
    "uint64_label.npz": (
        {"x": np.ones((2, 2)), "y": np.array([0, 2**64 - 1], dtype=np.uint64)},
        "label 18446744073709551615 .* not below 100000",
    ),
    "limit_label.npz": ({"x": np.ones((2, 2)), "y": np.array([0, 100_000])}, "not below"),
    "float_huge_label.npz": ({"x": np.ones((2, 2)), "y": np.array([0.0, 1e300])}, "not below"),
    "huge_label.csv": (b"a,label\n1,0\n2,99999999999999999999\n", "label 1000000000000000000"),
    "no_features.npz": ({"x": np.zeros((40, 0)), "y": np.arange(40) % 2}, "no feature columns"),
    "no_features_3d.npz": ({"x": np.zeros((4, 3, 0)), "y": np.zeros(4)}, "no feature columns"),
    "no_samples.npz": ({"x": np.zeros((0, 3)), "y": np.zeros(0)}, "no samples"),
    "complex.npz": ({"x": np.ones((2, 2)), "y": np.array([0j, 1j])}, "non-numeric dtype"),
    "duplicate.csv": (b"f0,f0,f1,label,label\n1,2,3,0,0\n", "repeats column name.*'f0', 'label'"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_raise_data_error_naming_the_file(tmp_path, name):
    content, problem = BAD_FILES[name]
    path = _write(tmp_path, name, content)
    with pytest.raises(DataError, match=problem) as info:
        load_dataset_file(path)
    message = str(info.value)
    assert name in message and "\n" not in message and ";" in message


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such data file") as info:
        load_dataset_file(tmp_path / "absent.npz")
    assert "absent.npz" in str(info.value)


def test_wrong_width_against_model(tmp_path):
    path = tmp_path / "narrow.npz"
    np.savez(path, x=np.zeros((5, 40)), y=np.zeros(5, dtype=np.int64))
    x, y = load_dataset_file(path)
    with pytest.raises(DataError, match="40 features but the job's model expects 64") as info:
        check_model_fit(x, y, SPEC, path)
    assert "narrow.npz" in str(info.value)


def test_label_beyond_classes_against_model():
    x = np.zeros((2, 64), dtype=np.float32)
    with pytest.raises(DataError, match="label 10 but the job's model has 10 classes"):
        check_model_fit(x, np.array([0, 10]), SPEC)


def test_fitting_data_passes():
    x = np.zeros((2, 64), dtype=np.float32)
    assert check_model_fit(x, np.array([0, 9]), SPEC) is None


def test_labels_up_to_the_class_limit_load_without_warnings(tmp_path):
    path = tmp_path / "wide.npz"
    np.savez(path, x=np.ones((3, 2)), y=np.array([0, 7, 99_999], dtype=np.uint64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, y = load_dataset_file(path)
    assert y.dtype == np.int64 and y.tolist() == [0, 7, 99_999]


def test_overflowing_csv_label_is_refused_without_warnings(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("a,label\n1,0\n2,99999999999999999999\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match="not below 100000"):
            load_dataset_file(path)
