"""Secure-aggregation arithmetic: fixed point modulo 2^b, masks, shared coordinates, packing.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS 2017, §4 (and SecAgg+, Bell et al., CCS 2020). A sender of one instance encodes its
contribution u on a fixed-point grid modulo 2^b and sends::

    y = enc(u) + PRG(b_self) + Σ_k sign_k · PRG(m_k)   (mod 2^b)

where b_self is its self-mask seed and m_k the pairwise seed it shares with member k
(sign +1 towards a larger id, −1 towards a smaller one). Pairwise masks cancel in the
sum of all senders; the aggregator removes the self masks of the survivors and the
pairwise masks that survivors share with dropped members (:func:`unmask`), and
:meth:`FixedPoint.decode` turns the sum back into floats.

Everything here is numpy + stdlib (SHAKE-256 from :mod:`hashlib`); key agreement,
HKDF and Shamir sharing live with the protocol, not here. All integer arrays are
``uint64`` holding values in [0, 2^b); arithmetic wraps modulo 2^64, which is
consistent modulo 2^b because 2^b divides 2^64. The word-level pieces (the PRG,
shared coordinates, packing) live in :mod:`meshfl.aggregation.secure_words` and are
re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshfl.aggregation.secure_words import (
    _check_bits,
    _modulus_mask,
    pack_words,
    prg_words,
    shared_indices,
    unpack_words,
)
from meshfl.errors import CodecError, ConfigError

__all__ = [
    "MAX_MODULUS_BITS",
    "FixedPoint",
    "add_mod",
    "mask",
    "pack_words",
    "prg_words",
    "shared_indices",
    "skellam_noise",
    "unmask",
    "unpack_words",
]

MAX_MODULUS_BITS = 62
"""Largest b of the modulus 2^b: signed sums and their negation fit an int64."""

NOISE_MARGIN_SIGMAS = 8.0
"""Standard deviations of summed noise that the modulus must hold beyond n·L."""


def add_mod(arrays: Sequence[np.ndarray], modulus_bits: int) -> np.ndarray:
    """Sum equally shaped arrays modulo 2^b.

    Returns
    -------
    np.ndarray
        uint64, the shape of the inputs, values < 2^b.

    Raises
    ------
    ConfigError
        If ``arrays`` is empty, the shapes differ, or b is out of range.

    """
    _check_bits(modulus_bits)
    if not arrays:
        raise ConfigError("add_mod needs at least one array")
    shape = np.shape(arrays[0])
    total = np.zeros(shape, dtype=np.uint64)
    for array in arrays:
        if np.shape(array) != shape:
            raise ConfigError(f"add_mod got shapes {np.shape(array)} and {shape}")
        total += np.asarray(array, dtype=np.uint64)
    total &= _modulus_mask(modulus_bits)
    return total


def _apply_masks(
    values: np.ndarray,
    self_seeds: Sequence[bytes],
    pairwise: Sequence[tuple[bytes, int]],
    modulus_bits: int,
    direction: int,
) -> np.ndarray:
    _check_bits(modulus_bits)
    out = np.array(values, dtype=np.uint64).reshape(-1)
    n = out.size
    for seed in self_seeds:
        if direction > 0:
            out += prg_words(seed, n, modulus_bits)
        else:
            out -= prg_words(seed, n, modulus_bits)
    for seed, sign in pairwise:
        if sign not in (1, -1) or isinstance(sign, bool):
            raise ConfigError(f"pairwise mask sign must be +1 or -1, got {sign!r}")
        if sign * direction > 0:
            out += prg_words(seed, n, modulus_bits)
        else:
            out -= prg_words(seed, n, modulus_bits)
    out &= _modulus_mask(modulus_bits)
    return out.reshape(np.shape(values))


def mask(
    encoded: np.ndarray,
    self_seed: bytes,
    pairwise: Sequence[tuple[bytes, int]],
    modulus_bits: int,
) -> np.ndarray:
    """Mask an encoded input: ``enc + PRG(b_self) + Σ sign·PRG(m)`` modulo 2^b.

    Bonawitz et al. 2017, the masked input y_u of §4 (Round 2).

    Parameters
    ----------
    encoded : np.ndarray
        uint64, shape (n,), values < 2^b (from :meth:`FixedPoint.encode`).
    self_seed : bytes
        The sender's self-mask seed b for this instance.
    pairwise : sequence of (bytes, int)
        ``(m_k, sign_k)`` per other member k: the shared pairwise seed and +1 when the
        sender's id is smaller than k's, −1 otherwise.
    modulus_bits : int
        b.

    Returns
    -------
    np.ndarray
        uint64, shape (n,), uniformly distributed to anyone without the seeds.

    Raises
    ------
    ConfigError
        If a sign is not ±1 or b is out of range.

    """
    return _apply_masks(encoded, [self_seed], pairwise, modulus_bits, +1)


def unmask(
    total: np.ndarray,
    self_seeds: Sequence[bytes],
    pairwise: Sequence[tuple[bytes, int]],
    modulus_bits: int,
) -> np.ndarray:
    """Remove masks from a sum of masked inputs: ``total − Σ PRG(b) − Σ sign·PRG(m)``.

    Bonawitz et al. 2017, §4 (Round 4, unmasking). Pass the self seeds of every
    survivor and, for each (survivor k, dropped j) pair, ``(m_kj, sign)`` with the sign
    *k used when masking* (+1 if k < j). Pairwise masks between two survivors cancel
    in the sum and are not passed.

    Returns
    -------
    np.ndarray
        uint64, the shape of ``total``: Σ of the survivors' encoded inputs modulo 2^b.

    Raises
    ------
    ConfigError
        If a sign is not ±1 or b is out of range.

    """
    return _apply_masks(total, self_seeds, pairwise, modulus_bits, -1)


def skellam_noise(rng: np.random.Generator, n: int, variance: float) -> np.ndarray:
    """Integer Skellam noise: the difference of two Poisson(variance / 2) draws.

    The Skellam mechanism (Agarwal, Kairouz & Liu, NeurIPS 2021): zero mean, the given
    variance, integer-valued, and closed under summation (the sum of n members' noise
    of variance v/n is Skellam of variance v), which suits distributed DP on a
    fixed-point grid. The generator must be secret to the device.

    Parameters
    ----------
    rng : np.random.Generator
        Source of randomness.
    n : int
        Number of coordinates, ``>= 0``.
    variance : float
        Variance per coordinate in grid steps², ``>= 0`` (0 gives zeros).

    Returns
    -------
    np.ndarray
        int64, shape (n,).

    Raises
    ------
    ConfigError
        If ``variance`` is negative or not finite.

    """
    if not (math.isfinite(variance) and variance >= 0):
        raise ConfigError(f"Skellam variance must be finite and >= 0, got {variance!r}")
    if variance == 0 or n == 0:
        return np.zeros(n, dtype=np.int64)
    lam = variance / 2.0
    return rng.poisson(lam, n).astype(np.int64) - rng.poisson(lam, n).astype(np.int64)


@dataclass(frozen=True)
class FixedPoint:
    """A signed fixed-point grid stored modulo 2^b (two's-complement style).

    A coordinate is clipped to [−R, R] and scaled to an integer in [−L, L],
    L = 2^(bits−1) − 1, by unbiased stochastic rounding; sums of up to n inputs decode
    correctly while n·L (plus the noise margin) stays below 2^(b−1).

    Attributes
    ----------
    range_ : float
        R > 0, the clipping range of one coordinate.
    bits : int
        q in [2, 61]: bits of one encoded coordinate.
    modulus_bits : int
        b in [bits + 1, 62]: the modulus 2^b of masked sums.

    Raises
    ------
    ConfigError
        If a value is out of range.

    """

    range_: float
    bits: int
    modulus_bits: int

    def __post_init__(self) -> None:
        if not (isinstance(self.range_, (int, float)) and math.isfinite(self.range_)):
            raise ConfigError(f"fixed-point range must be a finite number, got {self.range_!r}")
        if self.range_ <= 0:
            raise ConfigError(f"fixed-point range must be > 0, got {self.range_!r}")
        _check_bits(self.bits, 2, MAX_MODULUS_BITS - 1)
        _check_bits(self.modulus_bits, self.bits + 1, MAX_MODULUS_BITS)

    @property
    def level(self) -> int:
        """L = 2^(bits−1) − 1, the largest magnitude of one encoded coordinate."""
        return (1 << (self.bits - 1)) - 1

    @property
    def step(self) -> float:
        """R / L, the value of one grid step."""
        return self.range_ / self.level

    @staticmethod
    def _needed(level: int, n_inputs: int, noise_std: float) -> float:
        return n_inputs * level + NOISE_MARGIN_SIGMAS * noise_std * math.sqrt(n_inputs)

    @classmethod
    def choose(
        cls, range_: float, bits: int, max_inputs: int, noise_std: float = 0.0
    ) -> FixedPoint:
        """Pick the smallest modulus that cannot overflow for ``max_inputs`` inputs.

        The smallest b in [bits + 1, 62] with
        ``max_inputs·L + 8·noise_std·√max_inputs < 2^(b−1)``.

        Parameters
        ----------
        range_ : float
            R.
        bits : int
            q, bits of one coordinate.
        max_inputs : int
            The most inputs summed in one instance (the largest neighbourhood), ``>= 1``.
        noise_std : float, default 0.0
            Standard deviation of each input's integer noise, in grid steps.

        Raises
        ------
        ConfigError
            If no b <= 62 fits, or an argument is out of range.

        """
        if isinstance(max_inputs, bool) or not isinstance(max_inputs, int) or max_inputs < 1:
            raise ConfigError(f"max_inputs must be an integer >= 1, got {max_inputs!r}")
        if not (math.isfinite(noise_std) and noise_std >= 0):
            raise ConfigError(f"noise std must be finite and >= 0, got {noise_std!r}")
        _check_bits(bits, 2, MAX_MODULUS_BITS - 1)
        level = (1 << (bits - 1)) - 1
        needed = cls._needed(level, max_inputs, noise_std)
        for b in range(bits + 1, MAX_MODULUS_BITS + 1):
            if needed < 2 ** (b - 1):
                return cls(float(range_), bits, b)
        raise ConfigError(
            f"{max_inputs} inputs of {bits}-bit fixed point with noise std {noise_std:g} could"
            f" overflow the modulus 2^{MAX_MODULUS_BITS}; use fewer bits or less noise"
        )

    def check_capacity(self, n_inputs: int, noise_std: float = 0.0) -> None:
        """Refuse a sum of ``n_inputs`` inputs that could overflow the modulus.

        Raises
        ------
        ConfigError
            If ``n_inputs·L + 8·noise_std·√n_inputs >= 2^(b−1)``.

        """
        if self._needed(self.level, n_inputs, noise_std) >= 2 ** (self.modulus_bits - 1):
            raise ConfigError(
                f"{n_inputs} inputs of {self.bits}-bit fixed point with noise std"
                f" {noise_std:g} could overflow the modulus 2^{self.modulus_bits}; use fewer"
                " bits or a larger modulus"
            )

    def encode(self, u: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip, scale and stochastically round ``u`` onto the grid, modulo 2^b.

        v = ⌊u·L/R⌋ + Bernoulli(frac), so E[v·step] = clip(u, −R, R) (unbiased).

        Parameters
        ----------
        u : np.ndarray
            float32/float64, any shape.
        rng : np.random.Generator
            Randomness of the rounding.

        Returns
        -------
        np.ndarray
            uint64, the shape of ``u``, values < 2^b (negative v as 2^b + v).

        Raises
        ------
        CodecError
            If ``u`` holds NaN or infinity.

        """
        arr = np.asarray(u, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise CodecError("cannot encode NaN or infinity on the fixed-point grid")
        scaled = np.clip(arr, -self.range_, self.range_) * (self.level / self.range_)
        scaled = np.clip(scaled, -self.level, self.level)
        low = np.floor(scaled)
        ints = (low + (rng.random(arr.shape) < (scaled - low))).astype(np.int64)
        return self.from_signed(ints)

    def from_signed(self, v: np.ndarray) -> np.ndarray:
        """Store signed integers modulo 2^b (uint64)."""
        return np.asarray(v, dtype=np.int64).astype(np.uint64) & _modulus_mask(self.modulus_bits)

    def to_signed(self, v: np.ndarray) -> np.ndarray:
        """Interpret values modulo 2^b as signed integers in [−2^(b−1), 2^(b−1)) (int64)."""
        reduced = (np.asarray(v, dtype=np.uint64) & _modulus_mask(self.modulus_bits)).astype(
            np.int64
        )
        half = 1 << (self.modulus_bits - 1)
        return np.where(reduced >= half, reduced - (1 << self.modulus_bits), reduced)

    def decode(self, v_sum: np.ndarray) -> np.ndarray:
        """Decode a (sum of) encoded input(s): signed value × step, float64."""
        return self.to_signed(v_sum).astype(np.float64) * self.step

    def dequantize(self, encoded: np.ndarray) -> np.ndarray:
        """The float64 value of one encoded input (what its sender commits)."""
        return self.decode(encoded)
