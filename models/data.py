"""Loading a device's data file (``.npz`` or ``.csv``) and checking it against a model.

Formats (see ``docs/data.md``):

- ``.npz``: arrays ``x`` (n, d) numeric features and ``y`` (n,) integer class labels;
  other arrays are ignored (device files may carry ``x_test``/``y_test``). Arrays of more
  than two dimensions (e.g. (n, 8, 8) images) are flattened to (n, d).
- ``.csv``: a header row of distinct column names, one label column (``label`` by
  default), every other column a numeric feature; one sample per row.
- a directory: an image folder, one sub-folder per class (:mod:`models.images`).

Labels must be integers in ``[0, MAX_CLASSES)`` (:data:`meshfl.contract.MAX_CLASSES`,
the coordinator's limit on ``num_classes``); at least one sample and one feature.

Every problem raises :class:`meshfl.errors.DataError` with a one-line message
``"<file>: <problem>; <fix>"``.
"""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import numpy as np

from meshfl.contract import MAX_CLASSES, ModelSpec
from meshfl.errors import DataError

__all__ = ["check_labels", "check_model_fit", "load_dataset_file", "load_test_arrays"]

_FORMATS = ".npz, .csv or an image folder"


def _fail(path: str | Path, problem: str, fix: str) -> DataError:
    return DataError(f"{path}: {problem}; {fix}")


def _read_npz(path: Path, test: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            x_name, y_name = "x", "y"
            if test and {"x_test", "y_test"} <= names:
                x_name, y_name = "x_test", "y_test"
            for name in (x_name, y_name):
                if name not in names:
                    found = ", ".join(sorted(names)) or "none"
                    raise _fail(
                        path,
                        f"no array {name!r} in the .npz (arrays found: {found})",
                        f"save the features as {x_name!r} and the labels as {y_name!r}, "
                        f"e.g. np.savez(path, {x_name}=x, {y_name}=y)",
                    )
            return archive[x_name], archive[y_name]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as error:
        raise _fail(
            path,
            f"not a readable .npz file ({type(error).__name__})",
            "write it with numpy.savez (object arrays are refused)",
        ) from error


def _read_csv(path: Path, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise _fail(
            path, f"not a readable CSV file ({type(error).__name__})", "save it as UTF-8 CSV"
        ) from error
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        raise _fail(path, "the CSV file has no header row", "add a header naming the columns")
    header = [cell.strip() for cell in rows[0]]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise _fail(
            path,
            f"the CSV header repeats column name(s) {', '.join(map(repr, repeated))}",
            "give every column a distinct name",
        )
    if label_column not in header:
        raise _fail(
            path,
            f"no label column {label_column!r} in the CSV header ({', '.join(header)})",
            "add it or pass the name of the label column",
        )
    if len(header) < 2:
        raise _fail(path, "the CSV file has no feature columns", "add numeric feature columns")
    label_at = header.index(label_column)
    values = np.empty((len(rows) - 1, len(header)), dtype=np.float64)
    for r, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise _fail(
                path,
                f"row {r + 2} has {len(row)} fields but the header has {len(header)}",
                "give every row one value per column",
            )
        for c, cell in enumerate(row):
            try:
                values[r, c] = float(cell)
            except ValueError:
                raise _fail(
                    path,
                    f"non-numeric value {cell.strip()!r} in row {r + 2}, column {header[c]!r}",
                    "all columns must be numbers (encode categories as integers)",
                ) from None
    features = [c for c in range(len(header)) if c != label_at]
    return values[:, features], values[:, label_at]


def _real(a: np.ndarray) -> bool:
    return (
        a.dtype == np.bool_
        or np.issubdtype(a.dtype, np.integer)
        or (np.issubdtype(a.dtype, np.floating))
    )


def check_labels(path: str | Path, y: np.ndarray) -> np.ndarray:
    """Labels (n,) of any real dtype → int64 in [0, MAX_CLASSES), compared before any cast.

    Raises
    ------
    DataError
        Naming ``path`` and the first offending label (e.g. ``3.5``) and its sample.

    """
    fix = f"number the classes 0, 1, 2, … (at most {MAX_CLASSES} classes)"
    if y.dtype == np.bool_:
        return y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.integer):
        with np.errstate(over="ignore", invalid="ignore"):
            wide = y.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(wide) | (wide != np.round(wide)))
        if bad.size:
            first = int(bad[0])
            raise _fail(
                path,
                f"label {float(wide[first]):g} of sample {first} is not an integer"
                f" ({bad.size} such labels)",
                "store class labels as 0, 1, 2, …",
            )
        y = wide
    low, high = y.min(), y.max()
    if low < 0:
        raise _fail(path, f"negative label {int(low)}", "number classes from 0")
    if high >= MAX_CLASSES:
        first = int(np.flatnonzero(y >= MAX_CLASSES)[0])
        raise _fail(
            path,
            f"label {int(high)} (first out of range in sample {first}) is not below {MAX_CLASSES}",
            fix,
        )
    return y.astype(np.int64)


def _validate(path: Path, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    fix_x = "store the features as a numeric (n, d) array without NaN or inf"
    if not _real(x):
        raise _fail(path, f"features have non-numeric dtype {x.dtype}", fix_x)
    if not _real(y):
        raise _fail(path, f"labels have non-numeric dtype {y.dtype}", "store integer labels")
    if x.ndim < 2:
        raise _fail(path, f"features have shape {x.shape}, expected (n, d)", fix_x)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise _fail(path, f"labels have shape {y.shape}, expected (n,)", "store labels as (n,)")
    if x.shape[0] == 0:
        raise _fail(path, "the file holds no samples", "add at least one labelled sample")
    if x.shape[0] != y.shape[0]:
        raise _fail(
            path,
            f"{x.shape[0]} feature rows but {y.shape[0]} labels",
            "give every sample exactly one label",
        )
    if int(np.prod(x.shape[1:])) == 0:
        raise _fail(
            path, f"features have shape {x.shape}: no feature columns", "add at least one feature"
        )
    with np.errstate(over="ignore"):
        x = x.reshape(x.shape[0], -1).astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise _fail(path, f"features contain NaN or inf (first in sample {bad})", fix_x)
    return x, check_labels(path, y)


def _load(
    path: str | Path,
    label_column: str,
    test: bool,
    image_size: tuple[int, int] | None = None,
    grayscale: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    if path.is_dir():
        from models.images import load_image_folder

        folder = load_image_folder(path, image_size, grayscale)
        return _validate(path, folder.x, folder.y)
    if not path.is_file():
        raise _fail(path, "no such data file", "check the path (--data) or create the file")
    if path.stat().st_size == 0:
        raise _fail(path, "the data file is empty", f"write samples to it ({_FORMATS})")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        x, y = _read_npz(path, test)
    elif suffix == ".csv":
        x, y = _read_csv(path, label_column)
    else:
        raise _fail(path, f"unsupported file type {path.suffix!r}", f"use {_FORMATS}")
    return _validate(path, x, y)


def load_dataset_file(
    path: str | Path,
    label_column: str = "label",
    image_size: tuple[int, int] | None = None,
    grayscale: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Read a device's training data.

    Parameters
    ----------
    path : str or Path
        A ``.npz`` file with arrays ``x`` and ``y``, a ``.csv`` file with a header, or a
        directory: an image folder (:func:`models.images.load_image_folder`).
    label_column : str, default "label"
        The CSV column holding the class label (ignored otherwise).
    image_size : tuple[int, int], optional
        (height, width) pixels images are resized to; None: the first image's size (every
        image must have it). Image folders only.
    grayscale : bool, default False
        Read images as 8-bit grayscale (1 channel) instead of RGB. Image folders only.

    Returns
    -------
    x : numpy.ndarray
        float32, shape (n, d), n ≥ 1, d ≥ 1, all finite (features beyond float32's range
        are refused as inf).
    y : numpy.ndarray
        int64, shape (n,), all in [0, MAX_CLASSES) (:data:`meshfl.contract.MAX_CLASSES`).

    Raises
    ------
    DataError
        Missing, empty or unreadable file, unknown suffix, missing array or column,
        repeated CSV column names, non-numeric or complex values, no samples or no
        features, NaN/inf, mismatched lengths, non-integer, negative or too large labels;
        for an image folder also the problems :func:`models.images.load_image_folder`
        names.

    """
    return _load(path, label_column, False, image_size, grayscale)


def load_test_arrays(
    path: str | Path, label_column: str = "label"
) -> tuple[np.ndarray, np.ndarray]:
    """Read test data; like :func:`load_dataset_file`.

    A ``.npz`` holding ``x_test`` and ``y_test`` (a device file written by
    :func:`models.datasets.write_partition`) gives those arrays; otherwise ``x`` and ``y``.
    """
    return _load(path, label_column, test=True)


def check_model_fit(
    x: np.ndarray, y: np.ndarray, spec: ModelSpec, path: str | Path | None = None
) -> None:
    """Check that data fits the job's model.

    Parameters
    ----------
    x : numpy.ndarray
        Features, shape (n, d).
    y : numpy.ndarray
        Integer labels, shape (n,).
    spec : ModelSpec
        The job's model; ``input_dim`` must equal d and every label be < ``num_classes``.
    path : str or Path, optional
        The file the data came from, named in the message (``"device data"`` when None).

    Raises
    ------
    DataError
        e.g. ``"device data has 40 features but the job's model expects 64; …"``.

    """
    where = f"{path}: " if path is not None else ""
    if x.ndim != 2:
        raise DataError(f"{where}device data has shape {x.shape}, expected (n, d)")
    if x.shape[1] != spec["input_dim"]:
        raise DataError(
            f"{where}device data has {x.shape[1]} features but the job's model expects "
            f"{spec['input_dim']}; use a data file with {spec['input_dim']} feature columns "
            f"or a job whose model input_dim is {x.shape[1]}"
        )
    if y.shape != (x.shape[0],):
        raise DataError(f"{where}device data has {x.shape[0]} samples but labels {y.shape}")
    if y.size and int(y.max()) >= spec["num_classes"]:
        raise DataError(
            f"{where}device data has label {int(y.max())} but the job's model has "
            f"{spec['num_classes']} classes (labels 0..{spec['num_classes'] - 1}); relabel "
            f"the data or raise the model's num_classes"
        )
    if y.size and int(y.min()) < 0:
        raise DataError(f"{where}device data has negative label {int(y.min())}; number from 0")
