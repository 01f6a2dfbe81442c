"""Built-in datasets by name, and one entry point for "a built-in name or a user path".

Everything here ships with the install and reads no network: scikit-learn's bundled
loaders (``load_digits``, ``load_iris``, ``load_wine``, ``load_breast_cancer``) read files
inside the scikit-learn package (its ``fetch_*`` downloaders are never called), and
``mnist1d`` is generated offline (:func:`models.datasets.load_mnist1d_split`).

========================  =======  ========  =======  ===================================
name                      samples  features  classes  split
========================  =======  ========  =======  ===================================
``digits`` (W1)           1,797    64        10       features / 16; stratified 80/20
``mnist1d`` (W2)          5,000    40        10       the package's own 4,000 / 1,000
``iris``                  150      4         3        standardised; stratified 80/20
``wine``                  178      13        3        standardised; stratified 80/20
``breast_cancer``         569      30        2        standardised; stratified 80/20
========================  =======  ========  =======  ===================================
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshfl.errors import ConfigError
from models.datasets import (
    Split,
    _stratified_split,
    load_digits_split,
    load_mnist1d_split,
    split_dataset_file,
)

__all__ = ["BUILTIN_DATASETS", "check_dataset", "load_builtin", "load_split", "num_classes"]

_SKLEARN_TABULAR = ("iris", "wine", "breast_cancer")
BUILTIN_DATASETS: tuple[str, ...] = ("digits", "mnist1d", *_SKLEARN_TABULAR)
"""Names :func:`load_builtin` accepts."""


def _load_tabular(name: str, seed: int) -> Split:
    """A scikit-learn bundled table, stratified 80/20, standardised by the training set.

    z = (x − mean_train) / std_train per feature (a constant feature keeps std 1), so no
    test statistic leaks into training.
    """
    from sklearn import datasets

    bunch = getattr(datasets, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float64)
    split = _stratified_split(x, bunch.target.astype(np.int64), 0.2, seed, name)
    mean = split.x_train.astype(np.float64).mean(axis=0)
    std = split.x_train.astype(np.float64).std(axis=0)
    std[std == 0] = 1.0
    return Split(
        ((split.x_train - mean) / std).astype(np.float32),
        split.y_train,
        ((split.x_test - mean) / std).astype(np.float32),
        split.y_test,
    )


def load_builtin(name: str, seed: int = 0) -> Split:
    """A built-in dataset's train/test split, by name (see the module's table).

    Parameters
    ----------
    name : str
        One of :data:`BUILTIN_DATASETS`.
    seed : int, default 0
        ``random_state`` of the stratified 80/20 split (for ``mnist1d``: added to its
        generation seed). ``load_builtin("digits", 0)`` is W1's split bit for bit,
        ``load_builtin("mnist1d", 0)`` W2's.

    Returns
    -------
    Split
        ``x_*`` float32 (n, d), ``y_*`` int64 (n,) with labels 0 … K−1.

    Raises
    ------
    ConfigError
        Unknown name, or ``mnist1d`` without the ``mnist1d`` package.

    """
    if name == "digits":
        return load_digits_split(seed)
    if name == "mnist1d":
        return load_mnist1d_split(seed)
    if name in _SKLEARN_TABULAR:
        return _load_tabular(name, seed)
    raise ConfigError(
        f"unknown built-in dataset {name!r}; use one of {', '.join(BUILTIN_DATASETS)}"
    )


def load_split(
    dataset: str,
    seed: int = 0,
    *,
    n_devices: int = 1,
    label_column: str = "label",
    image_size: tuple[int, int] | None = None,
    grayscale: bool = False,
) -> Split:
    """A built-in dataset by name, or a user's ``.npz``/``.csv``/image folder split 80/20.

    A name in :data:`BUILTIN_DATASETS` wins over a file of that name. A path goes to
    :func:`models.datasets.split_dataset_file` (stratified 20 % test set with
    ``random_state=seed``; the other arguments are passed on).

    Raises
    ------
    ConfigError
        ``dataset`` is neither a built-in name nor an existing path.
    DataError
        The file or folder does not load, or has fewer training samples than
        ``n_devices``.

    """
    if dataset in BUILTIN_DATASETS:
        return load_builtin(dataset, seed)
    check_dataset(dataset)
    return split_dataset_file(
        dataset, n_devices, None, seed, label_column=label_column,
        image_size=image_size, grayscale=grayscale,
    )  # fmt: skip


def check_dataset(dataset: str) -> None:
    """Raise :class:`ConfigError` unless ``dataset`` is a built-in name or an existing path.

    Only a look at the name and the file system: whether the file loads is
    :func:`load_split`'s to say.
    """
    if dataset not in BUILTIN_DATASETS and not Path(dataset).exists():
        raise ConfigError(
            f"--dataset {dataset!r} is neither a built-in dataset "
            f"({', '.join(BUILTIN_DATASETS)}) nor an existing .npz/.csv file or image folder"
        )


def num_classes(split: Split) -> int:
    """Number of classes K = largest label + 1 over the train and test sets."""
    return int(max(split.y_train.max(initial=0), split.y_test.max(initial=0))) + 1
