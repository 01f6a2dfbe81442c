"""Density → k for the sparsifiers (top-k, random-k), computed from the written decimal."""

from __future__ import annotations

import math
from fractions import Fraction

from meshfl.errors import CodecSpecError

__all__ = ["check_density", "k_for"]


def check_density(density: object) -> tuple[float, Fraction]:
    """Validate a sparsifier density and return it as a float and as an exact fraction.

    Parameters
    ----------
    density : float
        Fraction of entries kept, ``0 < density <= 1``.

    Returns
    -------
    tuple of (float, Fraction)
        The density and ``Fraction(repr(density))``: the decimal as written, so that
        ``0.1 · 30`` gives exactly 3.

    Raises
    ------
    CodecSpecError
        If ``density`` is not a finite number in ``(0, 1]``.

    """
    if isinstance(density, bool) or not isinstance(density, (int, float)):
        raise CodecSpecError(f"density must be a number, got {density!r}")
    value = float(density)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise CodecSpecError(f"density must be in (0, 1], got {density!r}")
    return value, Fraction(repr(value))


def k_for(density: Fraction, numel: int) -> int:
    """Return ``k = max(1, ceil(density · numel))`` capped at ``numel``; 0 when empty.

    Parameters
    ----------
    density : Fraction
        Exact density from :func:`check_density`.
    numel : int
        Number of elements.

    """
    if numel <= 0:
        return 0
    return min(numel, max(1, math.ceil(density * numel)))
