"""Partitioners: split a training set's indices over devices (numpy only).

Every partitioner takes integer labels ``y`` (n,), the number of devices and a seed, and
returns one sorted int64 index array per device; together they hold every index of ``y``
exactly once, and the same arguments give the same partition.

- ``iid``: a seeded permutation cut into near-equal parts.
- ``dirichlet``: label skew, per class p ~ Dirichlet(α·1) (Hsu et al., 2019).
- ``shards``: pathological label skew, sorted-by-label shards dealt out (McMahan et al.,
  AISTATS 2017).
- ``quantity``: quantity skew, device sizes ∝ q ~ Dirichlet(β·1), labels IID
  (Li et al., ICDE 2022, "Federated Learning on Non-IID Data Silos: An Experimental
  Study").

:func:`label_skew` measures how far the devices' label distributions are from the global
one (mean total-variation distance).
"""

from __future__ import annotations

import numpy as np

from meshfl.errors import ConfigError

__all__ = [
    "SCHEMES",
    "check_request",
    "device_label_distance",
    "dirichlet_partition",
    "iid_partition",
    "label_skew",
    "partition",
    "quantity_partition",
    "shards_partition",
]

SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "shards", "quantity")
"""Names :func:`partition` accepts."""


def _check_partition_args(n_devices: int, alpha: float | None = None) -> None:
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ConfigError(f"number of devices must be a positive integer, got {n_devices!r}")
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"Dirichlet alpha must be a positive number, got {alpha!r}")


def _sorted_parts(chunks: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.sort(np.concatenate([np.empty(0, np.int64), *c])).astype(np.int64) for c in chunks]


def dirichlet_partition(
    y: np.ndarray, n_devices: int, alpha: float, seed: int = 0
) -> list[np.ndarray]:
    """Dirichlet(α) label-skew partition (Hsu et al., 2019, arXiv:1909.06335).

    One ``np.random.default_rng(seed)`` serves all classes, taken in ascending order: for
    class c with n_c samples, shuffle its indices, draw p ~ Dirichlet(α · 1_n_devices) and
    split the shuffled indices at ``(cumsum(p) · n_c).astype(int)[:-1]``. This is W1's
    recipe and reproduces ``benchmarks/data/w1_partition.json`` for (α = 0.5, 8 devices, 0).

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
    return _sorted_parts(parts)


def iid_partition(y: np.ndarray, n_devices: int, seed: int = 0) -> list[np.ndarray]:
    """IID partition: a seeded permutation split into near-equal parts.

    Returns ``n_devices`` sorted int64 index arrays into ``y`` whose sizes differ by at
    most one (``np.array_split``). Raises ConfigError when ``n_devices`` < 1.
    """
    _check_partition_args(n_devices)
    order = np.random.default_rng(seed).permutation(len(y))
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, n_devices)]


def shards_partition(
    y: np.ndarray, n_devices: int, shards_per_device: int = 2, seed: int = 0
) -> list[np.ndarray]:
    """Shards (McMahan et al., AISTATS 2017, "Communication-Efficient Learning …", Sec. 3).

    Shuffle the indices, stable-sort them by label, cut the result into
    ``n_devices × shards_per_device`` contiguous shards (``np.array_split``: sizes differ
    by at most one) and deal each device ``shards_per_device`` shards in a random order.
    A device then holds about ``shards_per_device`` labels (one more where a shard spans
    a class boundary).

    Parameters
    ----------
    y : numpy.ndarray
        Integer labels, shape (n,).
    n_devices : int
        ≥ 1.
    shards_per_device : int, default 2
        ≥ 1; McMahan et al. use 2 (100 devices, 200 shards of 300 MNIST images).
    seed : int, default 0
        numpy seed of the shuffle and the deal.

    Raises
    ------
    ConfigError
        ``n_devices`` or ``shards_per_device`` < 1, or fewer samples than shards.

    """
    _check_partition_args(n_devices)
    if isinstance(shards_per_device, bool) or not isinstance(shards_per_device, int):
        raise ConfigError(f"shards per device must be an integer, got {shards_per_device!r}")
    if shards_per_device < 1:
        raise ConfigError(f"shards per device must be at least 1, got {shards_per_device}")
    labels = np.asarray(y)
    n_shards = n_devices * shards_per_device
    if len(labels) < n_shards:
        raise ConfigError(
            f"{len(labels)} samples cannot make {n_devices} x {shards_per_device} shards; use "
            f"fewer devices or fewer shards per device"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    shards = np.array_split(order, n_shards)
    dealt = rng.permutation(n_shards).reshape(n_devices, shards_per_device)
    return _sorted_parts([[shards[s] for s in row] for row in dealt])


def quantity_partition(
    y: np.ndarray, n_devices: int, beta: float = 0.5, seed: int = 0
) -> list[np.ndarray]:
    """Quantity skew: device sizes ∝ q ~ Dirichlet(β·1), labels IID.

    As Li et al. (ICDE 2022, arXiv:2102.02079, quantity skew) with one guarantee added: every
    device first gets one sample, the other n − N are shared by q (floor of q·(n − N),
    the remainder one each to the largest fractional parts, ties to the lower device);
    a seeded permutation is then cut at those sizes. Small β gives very unequal sizes,
    large β near-equal ones.

    Parameters
    ----------
    y : numpy.ndarray
        Labels, shape (n,) (only their number is used).
    n_devices : int
        ≥ 1 and ≤ n.
    beta : float, default 0.5
        Dirichlet concentration over devices, > 0.
    seed : int, default 0
        numpy seed of q and the permutation.

    Raises
    ------
    ConfigError
        ``n_devices`` < 1 or > n, or ``beta`` ≤ 0.

    """
    _check_partition_args(n_devices)
    if not (np.isfinite(beta) and beta > 0):
        raise ConfigError(f"quantity-skew beta must be a positive number, got {beta!r}")
    n = len(y)
    if n < n_devices:
        raise ConfigError(f"{n} samples cannot give each of {n_devices} devices one sample")
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(beta * np.ones(n_devices))
    share = q * (n - n_devices)
    sizes = np.floor(share).astype(np.int64)
    left = (n - n_devices) - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:left]] += 1
    sizes += 1
    order = rng.permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.split(order, np.cumsum(sizes)[:-1])]


MAX_SEED = 2**32 - 1
"""Largest seed accepted (scikit-learn's ``random_state`` limit)."""


def check_request(
    scheme: str,
    n_devices: int,
    *,
    alpha: float = 0.5,
    shards_per_device: int = 2,
    beta: float = 0.5,
    seed: int = 0,
) -> None:
    """Check a :func:`partition` request before any data is loaded (only the scheme's parameter).

    Raises
    ------
    ConfigError
        Unknown scheme, ``seed`` outside [0, 2**32 − 1], ``n_devices`` < 1, α ≤ 0
        (dirichlet), ``shards_per_device`` < 1 (shards) or β ≤ 0 (quantity).

    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed!r} is out of range; give an integer in [0, {MAX_SEED}]")
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown partition scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    _check_partition_args(n_devices, alpha if scheme == "dirichlet" else None)
    if scheme == "shards" and (
        isinstance(shards_per_device, bool)
        or not isinstance(shards_per_device, int)
        or shards_per_device < 1
    ):
        raise ConfigError(
            f"shards per device must be a positive integer, got {shards_per_device!r}"
        )
    if scheme == "quantity" and not (np.isfinite(beta) and beta > 0):
        raise ConfigError(f"quantity-skew beta must be a positive number, got {beta!r}")


def partition(
    y: np.ndarray,
    scheme: str,
    n_devices: int,
    *,
    seed: int = 0,
    alpha: float = 0.5,
    shards_per_device: int = 2,
    beta: float = 0.5,
) -> list[np.ndarray]:
    """Partition ``y`` by ``scheme`` (one of :data:`SCHEMES`); each scheme reads its parameter.

    ``alpha`` is for ``"dirichlet"``, ``shards_per_device`` for ``"shards"``, ``beta`` for
    ``"quantity"``. Returns ``n_devices`` sorted int64 index arrays covering ``y`` once.

    Raises
    ------
    ConfigError
        Unknown scheme, more devices than samples, a seed outside [0, 2**32 − 1], or a bad
        parameter (see the schemes).

    """
    check_request(
        scheme, n_devices, alpha=alpha, shards_per_device=shards_per_device, beta=beta, seed=seed
    )
    if len(y) < n_devices:
        raise ConfigError(
            f"{len(y)} training samples cannot be shared by {n_devices} devices; use at most "
            f"{len(y)} devices"
        )
    if scheme == "iid":
        return iid_partition(y, n_devices, seed)
    if scheme == "dirichlet":
        return dirichlet_partition(y, n_devices, alpha, seed)
    if scheme == "shards":
        return shards_partition(y, n_devices, shards_per_device, seed)
    return quantity_partition(y, n_devices, beta, seed)


def device_label_distance(y: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """Total-variation distance of each device's label distribution from the global one.

    TV_i = ½ Σ_c |p_i(c) − p(c)|, where p is the label distribution of all of ``y`` and
    p_i that of ``y[parts[i]]``; in [0, 1) (0: same mix as the whole set). float64
    (n_devices,); NaN for an empty device. Only the labels present are counted, so label
    values may be arbitrarily large.
    """
    _, labels = np.unique(np.asarray(y), return_inverse=True)
    labels = labels.reshape(-1)
    k = max(int(labels.max()) + 1 if labels.size else 1, 1)
    overall = np.bincount(labels, minlength=k) / max(labels.size, 1)
    out = np.full(len(parts), np.nan)
    for i, part in enumerate(parts):
        if len(part):
            local = np.bincount(labels[part], minlength=k) / len(part)
            out[i] = 0.5 * np.abs(local - overall).sum()
    return out


def label_skew(y: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean of :func:`device_label_distance` over the non-empty devices (0 = no label skew).

    An IID partition scores near 0 (sampling noise only: larger for small devices),
    ``shards`` with 2 shards per device of 10 balanced classes about 0.8.
    """
    distance = device_label_distance(y, parts)
    kept = distance[~np.isnan(distance)]
    return float(kept.mean()) if kept.size else 0.0
