"""Local differential privacy of a released delta: L2 clipping plus Gaussian noise.

DP-FedAvg (McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent
Language Models", ICLR 2018, Algorithm 1) clips each update to L2 norm C and adds
Gaussian noise N(0, σ²C²) per coordinate: the Gaussian mechanism with sensitivity C and
noise multiplier σ. Here a device does both to every delta it releases (local DP); ε is
accounted elsewhere from σ, the sampling rate and the number of releases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from meshfl.errors import CodecError, ConfigError

__all__ = ["GaussianPrivatizer", "Privatizer", "clip_l2"]

_SHRINK_STEPS = 64  # at most this many shrinks of the scale to absorb rounding
_MARGIN = 1e-9  # aim this far (relative) below C: any float64 norm recomputation stays <= C


class Privatizer(Protocol):
    """Anything that turns a delta into the delta that may be released."""

    def privatize(self, delta: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return the releasable version of ``delta`` (same names, shapes; float32)."""
        ...


def _norm64(arrays: Sequence[np.ndarray]) -> float:
    """Joint L2 norm in float64, safe from overflow (scaled by the largest magnitude)."""
    if not arrays:
        return 0.0
    flat = [np.asarray(a, dtype=np.float64).ravel() for a in arrays]
    peak = max((float(np.max(np.abs(f))) for f in flat if f.size), default=0.0)
    if peak == 0.0 or not math.isfinite(peak):
        return peak
    return peak * math.sqrt(math.fsum(float(np.sum((f / peak) ** 2)) for f in flat))


def _recomputed_norm(arrays: Sequence[np.ndarray]) -> float:
    """The larger of two float64 norm computations (scaled, and plain sum of squares)."""
    plain = math.sqrt(sum(float(np.sum(np.asarray(a, dtype=np.float64) ** 2)) for a in arrays))
    return max(_norm64(arrays), plain if math.isfinite(plain) else 0.0)


def clip_l2(arrays: Sequence[np.ndarray], clip: float) -> tuple[list[np.ndarray], float]:
    """Scale ``arrays`` jointly so that their joint L2 norm is at most ``clip``.

    ``x ← x · min(1, C / ‖x‖₂)`` with ‖x‖₂ over all tensors together (DP-FedAvg's
    per-update clipping). The result keeps each input's floating dtype. The scale aims
    1e-9 (relative) below C, and when rounding to that dtype still leaves the norm above
    C it is shrunk by a few ulps, so the norm of the returned arrays recomputed in
    float64 is ``<= C`` exactly, not just up to rounding.

    Parameters
    ----------
    arrays : Sequence of np.ndarray
        Floating tensors of any shapes (float32 or float64); not modified.
    clip : float
        C, the clipping norm (> 0, finite).

    Returns
    -------
    (list of np.ndarray, float)
        The clipped copies (same shapes and dtypes) and the norm ‖x‖₂ before clipping.

    Raises
    ------
    ConfigError
        If ``clip`` is not a finite number > 0.
    CodecError
        If a tensor holds NaN or inf (there is no norm to clip to).

    """
    if (
        isinstance(clip, bool)
        or not isinstance(clip, (int, float))
        or not (math.isfinite(clip) and clip > 0)
    ):
        raise ConfigError(f"clipping norm C must be a finite number > 0, got {clip!r}")
    tensors = [np.asarray(a) for a in arrays]
    for a in tensors:
        if not np.issubdtype(a.dtype, np.floating):
            raise ConfigError(f"clip_l2 takes floating tensors, got dtype {a.dtype}")
        if not np.all(np.isfinite(a)):
            raise CodecError("cannot clip a delta that holds NaN or inf")
    norm = _norm64(tensors)
    if norm <= clip:
        return [a.copy() for a in tensors], norm
    scale = clip / norm * (1.0 - _MARGIN)
    for _ in range(_SHRINK_STEPS):
        out = [(a.astype(np.float64) * scale).astype(a.dtype) for a in tensors]
        if _recomputed_norm(out) <= clip:
            return out, norm
        scale *= 1.0 - 2.0**-20  # float32 rounding can add ~1e-7 relative: shrink past it
    return [np.zeros_like(a) for a in tensors], norm  # unreachable in practice; still ≤ C


class GaussianPrivatizer:
    """Clip a delta to L2 norm C and add N(0, (σC)²) noise per coordinate (float32 out).

    DP-FedAvg's Gaussian mechanism (McMahan et al., ICLR 2018) applied by the device
    itself to every delta it releases (local DP). ``releases`` counts the calls to
    :meth:`privatize`, the number of compositions for the accountant.

    Parameters
    ----------
    clip : float
        C, the L2 norm a delta is clipped to (> 0).
    noise_multiplier : float
        σ (>= 0): the noise standard deviation is σ·C per coordinate. 0 only clips.
    rng : np.random.Generator
        The noise source; give each device its own seed (never share it with a peer).

    Raises
    ------
    ConfigError
        If C is not > 0, σ is negative or not finite, or ``rng`` is not a Generator.

    """

    __slots__ = ("_rng", "clip", "noise_multiplier", "releases")

    def __init__(self, clip: float, noise_multiplier: float, rng: np.random.Generator) -> None:
        clip_l2([], clip)  # the same check of C as everywhere
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)):
            raise ConfigError(f"noise multiplier σ must be a number, got {noise_multiplier!r}")
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ConfigError(
                f"noise multiplier σ must be finite and >= 0, got {noise_multiplier!r}"
            )
        if not isinstance(rng, np.random.Generator):
            raise ConfigError("rng must be a numpy Generator (np.random.default_rng(seed))")
        self.clip = float(clip)
        self.noise_multiplier = float(noise_multiplier)
        self.releases = 0
        self._rng = rng

    @property
    def noise_std(self) -> float:
        """σ·C: the standard deviation of the noise on each coordinate."""
        return self.noise_multiplier * self.clip

    def privatize(self, delta: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return clip(delta, C) + N(0, σ²C² I), one float32 array per tensor.

        Raises
        ------
        CodecError
            If ``delta`` holds NaN or inf; nothing is released (``releases`` unchanged).

        """
        names = list(delta)
        clipped, _ = clip_l2([np.asarray(delta[n]) for n in names], self.clip)
        std = self.noise_std
        out = {}
        for name, c in zip(names, clipped, strict=True):
            noisy = c.astype(np.float64)
            if std > 0:
                noisy = noisy + self._rng.normal(0.0, std, size=c.shape)
            out[name] = noisy.astype(np.float32)
        self.releases += 1
        return out
