"""Built-in datasets, label-skew partitioners and per-device data files.

W1 (``shared/WORKLOADS.md``): scikit-learn digits, features / 16, stratified 20 % test
split with ``random_state=0``; 8 devices, Dirichlet(α = 0.5) label skew, numpy seed 0.
:func:`load_digits_split` and :func:`dirichlet_partition` reproduce its published indices
exactly.

W2: MNIST-1D (Greydanus & Kobak, ICML 2024), generated offline by the ``mnist1d``
package's ``make_dataset()`` with its default arguments; :func:`load_mnist1d_split`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshfl.errors import ConfigError, DataError
from models.data import load_dataset_file

__all__ = [
    "Split",
    "dirichlet_partition",
    "iid_partition",
    "load_digits_split",
    "load_mnist1d_split",
    "split_dataset_file",
    "write_partition",
]


@dataclass(frozen=True)
class Split:
    """A train/test split: ``x_*`` float32 (n, d), ``y_*`` int64 (n,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _stratified_split(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, source: str
) -> Split:
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test fraction must be in (0, 1), got {test_fraction}")
    try:
        x_train, x_test, y_train, y_test = train_test_split(
            x, y, test_size=test_fraction, stratify=y, random_state=seed
        )
    except ValueError as error:
        raise DataError(
            f"{source}: cannot make a stratified {test_fraction:.0%} test split ({error}); "
            f"add samples so every class has at least 2 and the test set one per class"
        ) from error
    return Split(
        np.ascontiguousarray(x_train, dtype=np.float32),
        np.ascontiguousarray(y_train, dtype=np.int64),
        np.ascontiguousarray(x_test, dtype=np.float32),
        np.ascontiguousarray(y_test, dtype=np.int64),
    )


def load_digits_split(seed: int = 0) -> Split:
    """W1's data: scikit-learn ``load_digits`` (1,797 8×8 digits, 10 classes).

    Features are divided by 16.0 (float32, shape (n, 64)); the test set is a stratified
    20 % with ``train_test_split(test_size=0.2, stratify=y, random_state=seed)``.

    Parameters
    ----------
    seed : int, default 0
        ``random_state`` of the split; 0 is W1 (1,437 train / 360 test samples).

    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return _stratified_split(x, digits.target.astype(np.int64), 0.2, seed, "digits")


MNIST1D_SEED = 42
"""Generation seed of ``mnist1d.data.get_dataset_args()`` (W2)."""


def load_mnist1d_split(seed: int = 0) -> Split:
    """W2's data: MNIST-1D generated offline (5,000 sequences of length 40, 10 classes).

    Calls ``mnist1d.data.make_dataset`` with ``get_dataset_args()`` (the package's
    defaults: 5,000 samples, 80 % train split, final sequence length 40) — never its
    download helpers. The package's own split gives 4,000 train / 1,000 test samples;
    features are float32 ``(n, 40)`` (standardised by the package), labels int64.

    Parameters
    ----------
    seed : int, default 0
        Added to the package's generation seed (42); 0 is W2 exactly. The package seeds
        numpy's and Python's global generators; their states are restored afterwards.

    Raises
    ------
    ConfigError
        The ``mnist1d`` package is not installed (``pip install mnist1d``).

    """
    import random

    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise ConfigError(
            "W2 needs the mnist1d package; install it with 'pip install mnist1d'"
        ) from None
    args = get_dataset_args()
    args.seed = MNIST1D_SEED + int(seed)
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    return Split(
        np.ascontiguousarray(data["x"], dtype=np.float32),
        np.ascontiguousarray(data["y"], dtype=np.int64),
        np.ascontiguousarray(data["x_test"], dtype=np.float32),
        np.ascontiguousarray(data["y_test"], dtype=np.int64),
    )


def _check_partition_args(n_devices: int, alpha: float | None = None) -> None:
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ConfigError(f"number of devices must be a positive integer, got {n_devices!r}")
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"Dirichlet alpha must be a positive number, got {alpha!r}")


def dirichlet_partition(
    y: np.ndarray, n_devices: int, alpha: float, seed: int = 0
) -> list[np.ndarray]:
    """Dirichlet(α) label-skew partition (Hsu et al., 2019, arXiv:1909.06335).

    One ``np.random.default_rng(seed)`` serves all classes, taken in ascending order: for
    class c with n_c samples, shuffle its indices, draw p ~ Dirichlet(α · 1_n_devices) and
    split the shuffled indices at ``(cumsum(p) · n_c).astype(int)[:-1]``. This is W1's
    recipe and reproduces ``shared/data/w1_partition.json`` for (α = 0.5, 8 devices, 0).

    Parameters
    ----------
    y : numpy.ndarray
        Integer labels, shape (n,).
    n_devices : int
        Number of parts, ≥ 1.
    alpha : float
        Concentration, > 0; small α gives strong skew, large α approaches IID.
    seed : int, default 0
        numpy seed.

    Returns
    -------
    list[numpy.ndarray]
        ``n_devices`` sorted int64 index arrays into ``y``, disjoint, covering all of it.
        A part may be empty when α is small.

    Raises
    ------
    ConfigError
        ``n_devices`` < 1 or ``alpha`` ≤ 0.

    """
    _check_partition_args(n_devices, alpha)
    labels = np.asarray(y)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_devices)]
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        p = rng.dirichlet(alpha * np.ones(n_devices))
        cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
        for device, chunk in enumerate(np.split(idx, cuts)):
            parts[device].append(chunk)
    return [np.sort(np.concatenate([np.empty(0, np.int64), *p])).astype(np.int64) for p in parts]


def iid_partition(y: np.ndarray, n_devices: int, seed: int = 0) -> list[np.ndarray]:
    """IID partition: a seeded permutation split into near-equal parts.

    Returns ``n_devices`` sorted int64 index arrays into ``y`` whose sizes differ by at
    most one (``np.array_split``). Raises ConfigError when ``n_devices`` < 1.
    """
    _check_partition_args(n_devices)
    order = np.random.default_rng(seed).permutation(len(y))
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, n_devices)]


def split_dataset_file(
    path: str | Path,
    n_devices: int,
    alpha: float,
    seed: int,
    test_fraction: float = 0.2,
    label_column: str = "label",
) -> Split:
    """Load a user's ``.npz``/``.csv`` and make a stratified train/test split like W1's.

    ``train_test_split(test_size=test_fraction, stratify=y, random_state=seed)``.
    ``n_devices`` and ``alpha`` are checked here (so a bad request fails before any file is
    written) and then used by :func:`dirichlet_partition` on ``split.y_train``.

    Raises
    ------
    DataError
        The file does not load (see :func:`models.data.load_dataset_file`), a class is too
        small to stratify, or the training set has fewer samples than ``n_devices``.
    ConfigError
        ``n_devices`` < 1, ``alpha`` ≤ 0 or ``test_fraction`` outside (0, 1).

    """
    _check_partition_args(n_devices, alpha)
    x, y = load_dataset_file(path, label_column)
    split = _stratified_split(x, y, test_fraction, seed, str(path))
    if len(split.y_train) < n_devices:
        raise DataError(
            f"{path}: {len(split.y_train)} training samples cannot be shared by {n_devices} "
            f"devices; use fewer devices or more data"
        )
    return split


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary output files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_partition(
    out_dir: str | Path, split: Split, parts: list[np.ndarray]
) -> tuple[list[Path], Path]:
    """Write one data file per device and the shared test file.

    Files (each written atomically): ``device-{i}.npz`` with ``x``/``y`` = the training
    samples ``parts[i]`` selects, plus ``x_test``/``y_test`` (the test set, so a job with
    ``test_data = None`` evaluates on it); ``test.npz`` with ``x``/``y`` = the test set.

    Returns
    -------
    tuple[list[Path], Path]
        The device files in device order, and the test file.

    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device_files: list[Path] = []
    for i, idx in enumerate(parts):
        target = out / f"device-{i}.npz"
        _save_npz(
            target,
            x=split.x_train[idx],
            y=split.y_train[idx],
            x_test=split.x_test,
            y_test=split.y_test,
        )
        device_files.append(target)
    test_file = out / "test.npz"
    _save_npz(test_file, x=split.x_test, y=split.y_test)
    return device_files, test_file
