"""Input and output files of ``meshfl predict`` (numpy + stdlib; no torch, no models).

Inputs (the data formats of ``docs/data.md``, labels optional):

- ``.npz``: array ``x`` (n, d) numeric features (``x_test`` when there is no ``x``), and
  optionally ``y`` (``y_test``) (n,) integer labels; (n, h, w) arrays are flattened.
- ``.csv``: a header row and one sample per row, every column numeric; the label column
  (``label`` by default) is optional: when present it is read as the labels.

Outputs: ``.csv`` with a header ``prediction,p_0,…,p_{k-1}`` (plus ``label`` when the
input had labels) and one row per sample, or ``.npz`` with ``predictions`` int64 (n,),
``probabilities`` float32 (n, k) and ``labels`` int64 (n,) when present.

Every problem raises :class:`meshfl.errors.DataError` ``"<file>: <problem>; <fix>"``.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from meshfl.errors import DataError
from meshfl.files import atomic_write

__all__ = ["accuracy", "read_inputs", "write_predictions"]


def _fail(path: Path, problem: str, fix: str) -> DataError:
    return DataError(f"{path}: {problem}; {fix}")


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            x_name, y_name = ("x", "y") if "x" in names else ("x_test", "y_test")
            if x_name not in names:
                found = ", ".join(sorted(names)) or "none"
                raise _fail(path, f"no array 'x' in the .npz (arrays found: {found})",
                            "save the features as 'x', e.g. np.savez(path, x=x)")  # fmt: skip
            return archive[x_name], archive[y_name] if y_name in names else None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as error:
        raise _fail(path, f"not a readable .npz file ({type(error).__name__})",
                    "write it with numpy.savez (object arrays are refused)") from error  # fmt: skip


def _read_csv(path: Path, label_column: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.reader(handle) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise _fail(path, f"not a readable CSV file ({type(error).__name__})",
                    "save it as UTF-8 CSV") from error  # fmt: skip
    if not rows:
        raise _fail(path, "the CSV file has no header row", "add a header naming the columns")
    header = [cell.strip() for cell in rows[0]]
    wanted = label_column or "label"
    if label_column is not None and label_column not in header:
        raise _fail(path, f"no label column {label_column!r} in the CSV header",
                    "pass the name of the label column, or drop --label-column")  # fmt: skip
    label_at = header.index(wanted) if wanted in header else None
    values = np.empty((len(rows) - 1, len(header)), dtype=np.float64)
    for r, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise _fail(path, f"row {r + 2} has {len(row)} fields but the header has "
                        f"{len(header)}", "give every row one value per column")  # fmt: skip
        try:
            values[r] = [float(cell) for cell in row]
        except ValueError:
            raise _fail(path, f"non-numeric value in row {r + 2}",
                        "all columns must be numbers") from None  # fmt: skip
    if label_at is None:
        return values, None
    features = [c for c in range(len(header)) if c != label_at]
    return values[:, features], values[:, label_at]


def read_inputs(
    path: Path, label_column: str | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read the samples to predict, and their labels when the file has them.

    Parameters
    ----------
    path : Path
        A ``.npz`` or ``.csv`` file (see the module docstring).
    label_column : str, optional
        CSV only: the label column, which must then exist. None: a column named
        ``label`` is the label column if there is one, else every column is a feature.

    Returns
    -------
    x : numpy.ndarray
        float32 (n, d), n ≥ 1, finite.
    y : numpy.ndarray or None
        int64 (n,) labels ≥ 0, or None when the file has none.

    Raises
    ------
    DataError
        Missing, empty or unreadable file, unknown suffix, missing ``x``/label column,
        ragged or non-numeric rows, NaN/inf features, non-integer or negative labels,
        label and sample counts that differ.

    """
    path = Path(path)
    if path.is_dir():
        raise _fail(path, "is a directory", "pass a .npz or .csv file of feature rows")
    if not path.is_file():
        raise _fail(path, "no such input file", "pass an existing .npz or .csv file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        x, y = _read_npz(path)
    elif suffix == ".csv":
        x, y = _read_csv(path, label_column)
    else:
        raise _fail(path, f"unsupported input type {path.suffix!r}", "use .npz or .csv")
    if x.dtype.kind not in "biuf" or x.ndim < 2 or x.shape[0] == 0:
        raise _fail(path, f"features of dtype {x.dtype} and shape {x.shape}",
                    "store at least one sample as a numeric (n, d) array")  # fmt: skip
    x = x.reshape(x.shape[0], -1).astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise _fail(path, f"features contain NaN or inf (first in sample {bad})",
                    "remove or impute them")  # fmt: skip
    if y is None:
        return x, None
    labels = np.asarray(y).reshape(-1)
    ok = labels.dtype.kind in "biuf" and labels.shape == (x.shape[0],)
    if not ok or not np.isfinite(labels.astype(np.float64)).all():
        raise _fail(path, f"labels of dtype {labels.dtype} and shape {labels.shape} for "
                    f"{x.shape[0]} samples", "store one integer label per sample")  # fmt: skip
    if (labels != np.round(labels)).any() or (labels < 0).any():
        raise _fail(path, "labels are not all integers ≥ 0", "number classes 0, 1, 2, …")
    return x, labels.astype(np.int64)


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of ``predictions`` equal to ``labels`` (both int (n,), n ≥ 1)."""
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def _csv_text(predictions: np.ndarray, probs: np.ndarray, labels: np.ndarray | None) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    head = ["prediction", *(f"p_{k}" for k in range(probs.shape[1]))]
    writer.writerow(head + (["label"] if labels is not None else []))
    for i, (pred, row) in enumerate(zip(predictions.tolist(), probs.tolist(), strict=True)):
        tail = [int(labels[i])] if labels is not None else []
        writer.writerow([pred, *(f"{p:.6g}" for p in row), *tail])
    return buffer.getvalue()


def write_predictions(
    path: Path | None,
    predictions: np.ndarray,
    probabilities: np.ndarray,
    labels: np.ndarray | None = None,
) -> str | None:
    """Write predictions to ``path`` (.csv or .npz, atomically); None: return the CSV text.

    Raises
    ------
    DataError
        An output suffix other than .csv or .npz, or a folder that cannot be written.

    """
    if path is None:
        return _csv_text(predictions, probabilities, labels)
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".npz"):
        raise _fail(path, f"unsupported output type {path.suffix!r}", "use .csv or .npz")

    def write(handle: BinaryIO) -> None:
        if suffix == ".csv":
            handle.write(_csv_text(predictions, probabilities, labels).encode())
        else:
            arrays = {"predictions": predictions, "probabilities": probabilities}
            if labels is not None:
                arrays["labels"] = labels
            np.savez(handle, **arrays)  # type: ignore[arg-type]

    try:
        atomic_write(path, write)
    except OSError as error:
        raise _fail(
            path, f"cannot write here ({error.strerror})", "choose another --output"
        ) from error
    return None
