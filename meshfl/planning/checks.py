"""Argument checks shared by the planning rules: numbers, measurements, positive values."""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshfl.errors import ConfigError

__all__: list[str] = []


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_measurements(values: Sequence[float | None], what: str) -> None:
    """Raise ConfigError unless every value is None or a finite number >= 0."""
    for i, value in enumerate(values):
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{what} of device {i} must be a finite number >= 0 (or None), got {value!r}"
            )


def _check_positive(value: float, what: str) -> float:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)
