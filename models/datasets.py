"""W1/W2 datasets, train/test splits of user files and per-device data files.

W1 (``docs/workloads.md``): scikit-learn digits, features / 16, stratified 20 % test
split with ``random_state=0``; 8 devices, Dirichlet(α = 0.5) label skew, numpy seed 0.
:func:`load_digits_split` and :func:`dirichlet_partition` reproduce its published indices
exactly.

W2: MNIST-1D (Greydanus & Kobak, ICML 2024), generated offline by the ``mnist1d``
package's ``make_dataset()`` with its default arguments; :func:`load_mnist1d_split`.

The partitioners live in :mod:`models.partition` (``dirichlet_partition`` and
``iid_partition`` are re-exported here); all built-in datasets by name in
:mod:`models.builtin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshfl.errors import ConfigError, DataError
from meshfl.files import atomic_write
from models.data import load_dataset_file
from models.partition import _check_partition_args, dirichlet_partition, iid_partition

__all__ = [
    "Split",
    "check_output_dir",
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


def split_dataset_file(
    path: str | Path,
    n_devices: int,
    alpha: float | None,
    seed: int,
    test_fraction: float = 0.2,
    label_column: str = "label",
    image_size: tuple[int, int] | None = None,
    grayscale: bool = False,
) -> Split:
    """Load a user's ``.npz``/``.csv``/image folder and make a stratified split like W1's.

    ``train_test_split(test_size=test_fraction, stratify=y, random_state=seed)``.
    ``n_devices`` and ``alpha`` are checked here (so a bad request fails before any file is
    written) and then used by :func:`dirichlet_partition` on ``split.y_train``.
    ``label_column``, ``image_size`` and ``grayscale`` are passed to
    :func:`models.data.load_dataset_file`.

    Raises
    ------
    DataError
        The file does not load (see :func:`models.data.load_dataset_file`), a class is too
        small to stratify, or the training set has fewer samples than ``n_devices``.
    ConfigError
        ``n_devices`` < 1, ``alpha`` ≤ 0 (None: not checked, for other schemes) or
        ``test_fraction`` outside (0, 1).

    """
    _check_partition_args(n_devices, alpha)
    x, y = load_dataset_file(path, label_column, image_size, grayscale)
    split = _stratified_split(x, y, test_fraction, seed, str(path))
    if len(split.y_train) < n_devices:
        raise DataError(
            f"{path}: {len(split.y_train)} training samples cannot be shared by {n_devices} "
            f"devices; use fewer devices or more data"
        )
    return split


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    atomic_write(path, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]


def check_output_dir(out_dir: str | Path) -> None:
    """Check, without creating anything, that ``out_dir`` can be an output directory.

    Raises
    ------
    ConfigError
        ``out_dir`` (or a parent of it) exists but is not a directory.

    """
    out = Path(out_dir)
    for candidate in (out, *out.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise ConfigError(
                    f"--out {out}: {candidate} is a file, not a directory; give a new or "
                    "existing directory"
                )
            return


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

    Raises
    ------
    ConfigError
        ``out_dir`` cannot be created or written (a file in the way, no permission, a
        read-only or virtual file system).

    """
    out = Path(out_dir)
    check_output_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _write_files(out, split, parts)
    except OSError as error:
        raise ConfigError(
            f"--out {out}: cannot write there ({error.strerror or type(error).__name__}); "
            "give a writable directory"
        ) from None


def _write_files(out: Path, split: Split, parts: list[np.ndarray]) -> tuple[list[Path], Path]:
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
