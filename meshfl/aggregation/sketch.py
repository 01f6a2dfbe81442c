"""Count-sketch estimate of the consensus distance, without sharing models.

Count sketch (Charikar, Chen, Farach-Colton, "Finding frequent items in data streams",
ICALP 2002): coordinate ``c`` of the flattened model goes to bucket ``h(c)`` with sign
``s(c) ∈ {−1, +1}``, ``(S v)_b = Σ_{c: h(c)=b} s(c) v_c``. With independent uniform
``h`` and ``s``, ``E‖S v‖² = ‖v‖²``. S is linear and every device draws the same ``h``,
``s`` from a shared seed, so ``S x_i − mean_j S x_j = S(x_i − x̄)`` and

    mean_i ‖S x_i − s̄‖²

is an unbiased estimate of the consensus distance ``(1/n) Σ_i ‖x_i − x̄‖²`` from
``dim`` floats per device instead of a full model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from meshfl.errors import ConfigError

__all__ = ["consensus_distance", "consensus_sketch"]


def consensus_sketch(x: Mapping[str, np.ndarray], dim: int, seed: int) -> np.ndarray:
    """Count-sketch the flattened model ``x`` into ``dim`` buckets.

    Parameters
    ----------
    x : Mapping[str, np.ndarray]
        The model; tensors are flattened (C order) and concatenated in mapping order,
        which must be the same on every device.
    dim : int
        Sketch size (buckets), ``>= 1``. The relative standard deviation of the
        squared-norm estimate is about ``sqrt(2 / dim)`` per vector.
    seed : int
        Seed of ``np.random.default_rng``, the same on every device; per tensor, the
        buckets and then the signs are drawn in model order.

    Returns
    -------
    np.ndarray
        float64, shape (dim,). Memory O(largest tensor), time O(model size).

    Raises
    ------
    ConfigError
        If ``dim < 1``, ``seed`` is not a non-negative int, or ``x`` holds NaN/inf.

    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ConfigError(f"sketch dim must be an int >= 1, got {dim!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"sketch seed must be an int >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    sketch = np.zeros(dim, dtype=np.float64)
    for name, tensor in x.items():
        flat = np.asarray(tensor, dtype=np.float64).reshape(-1)
        if not bool(np.isfinite(flat).all()):
            raise ConfigError(f"tensor {name!r} holds NaN or inf; cannot sketch it")
        buckets = rng.integers(0, dim, size=flat.size)
        signs = rng.integers(0, 2, size=flat.size) * 2 - 1
        sketch += np.bincount(buckets, weights=signs * flat, minlength=dim)
    return sketch


def consensus_distance(sketches: np.ndarray) -> float:
    """Estimate the consensus distance ``(1/n) Σ_i ‖x_i − x̄‖²`` from device sketches.

    Parameters
    ----------
    sketches : np.ndarray
        float, shape (n_devices, dim): row i is :func:`consensus_sketch` of device i,
        all with the same ``dim`` and ``seed``.

    Returns
    -------
    float
        ``mean_i ‖s_i − s̄‖²``, unbiased; exactly 0.0 when all rows are equal.

    Raises
    ------
    ConfigError
        If ``sketches`` is not 2-D with at least one row, or holds NaN/inf.

    """
    s = np.asarray(sketches, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 1:
        raise ConfigError(f"sketches must have shape (n_devices, dim), got {s.shape}")
    if not bool(np.isfinite(s).all()):
        raise ConfigError("sketches hold NaN or inf")
    centred = s - s.mean(axis=0)
    return float(np.mean(np.sum(centred * centred, axis=1)))
