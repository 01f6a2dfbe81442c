"""Input and output files of ``meshfl predict`` (edge_agent.predict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.predict import accuracy, read_inputs, write_predictions
from meshfl.errors import DataError


def test_npz_with_and_without_labels(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    np.savez(tmp_path / "l.npz", x=x, y=np.array([1, 0]))
    np.savez(tmp_path / "u.npz", x_test=x)

    xl, yl = read_inputs(tmp_path / "l.npz")
    xu, yu = read_inputs(tmp_path / "u.npz")

    assert xl.dtype == np.float32 and xl.shape == (2, 6)
    np.testing.assert_array_equal(xu, xl)
    assert yl is not None and yl.dtype == np.int64 and yl.tolist() == [1, 0]
    assert yu is None


def test_csv_label_column_is_optional(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_text("a,label,b\n1,2,3\n4,0,6\n")
    (tmp_path / "u.csv").write_text("a,b\n1,3\n4,6\n")
    (tmp_path / "c.csv").write_text("a,cls,b\n1,2,3\n4,0,6\n")

    xl, yl = read_inputs(tmp_path / "l.csv")
    xu, yu = read_inputs(tmp_path / "u.csv")
    xc, yc = read_inputs(tmp_path / "c.csv", label_column="cls")

    np.testing.assert_array_equal(xl, [[1, 3], [4, 6]])
    np.testing.assert_array_equal(xu, xl)
    np.testing.assert_array_equal(xc, xl)
    assert yu is None and yl is not None and yc is not None
    assert yl.tolist() == yc.tolist() == [2, 0]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("r.csv", "a,b\n1,2\n3\n", "row 3 has 1 fields"),
        ("n.csv", "a,b\n1,x\n", "non-numeric value in row 2"),
        ("e.csv", "", "no header row"),
        ("f.csv", "a,label\nnan,1\n", "NaN or inf"),
        ("g.csv", "a,label\n1,0.5\n", "labels are not all integers"),
        ("d.txt", "1,2\n", "unsupported input type '.txt'"),
        ("z.npz", "not a zip", "not a readable .npz"),
    ],
)
def test_bad_inputs_are_one_line_data_errors(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    (tmp_path / name).write_text(content)

    with pytest.raises(DataError, match=message) as info:
        read_inputs(tmp_path / name)

    assert str(tmp_path / name) in str(info.value) and "\n" not in str(info.value)


def test_missing_x_missing_file_and_missing_label_column(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", features=np.zeros((2, 2)))
    (tmp_path / "u.csv").write_text("a,b\n1,3\n")

    with pytest.raises(DataError, match="no array 'x'"):
        read_inputs(tmp_path / "w.npz")
    with pytest.raises(DataError, match="no such input file"):
        read_inputs(tmp_path / "absent.npz")
    with pytest.raises(DataError, match="no label column 'cls'"):
        read_inputs(tmp_path / "u.csv", label_column="cls")


def test_predictions_round_trip_through_csv_and_npz(tmp_path: Path) -> None:
    preds = np.array([2, 0], np.int64)
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32)
    labels = np.array([2, 1], np.int64)

    text = write_predictions(None, preds, probs)
    write_predictions(tmp_path / "p.csv", preds, probs, labels)
    write_predictions(tmp_path / "p.npz", preds, probs, labels)

    assert text == "prediction,p_0,p_1,p_2\n2,0.1,0.2,0.7\n0,0.5,0.25,0.25\n"
    assert (tmp_path / "p.csv").read_text().splitlines()[0].endswith(",label")
    with np.load(tmp_path / "p.npz") as archive:
        np.testing.assert_array_equal(archive["predictions"], preds)
        np.testing.assert_array_equal(archive["probabilities"], probs)
        np.testing.assert_array_equal(archive["labels"], labels)
    assert accuracy(preds, labels) == 0.5
    with pytest.raises(DataError, match="unsupported output type"):
        write_predictions(tmp_path / "p.json", preds, probs)
