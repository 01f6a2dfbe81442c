"""CHOCO-SGD over securely aggregated neighbourhoods: per-edge replicas, masked sums.

Koloskova, Stich, Jaggi, ICML 2019, Algorithm 2 (CHOCO-SGD), in the per-edge form that
secure aggregation (Bonawitz et al., CCS 2017) needs. Aggregator i learns only the sum
of its neighbours' contributions, and a neighbour j's contribution may be dropped in one
instance and included in another, so every *edge* j→i keeps its own public replica
x̂_{j→i} instead of one x̂_j shared by all of j's neighbours. Per round, device j::

    u_{j→i} = w_ij (x_j − x̂_{j→i})               (one contribution per neighbour i)
    x̂_{j→i} ← x̂_{j→i} + dequant(enc(u_{j→i})) / w_ij   (commit, once i included it)

and aggregator i, from the unmasked sum S_i over the included senders::

    ŝ_i ← ŝ_i + S_i                               (absorb; ŝ_i = Σ_j w_ij x̂_{j→i})
    x_i ← x_i + γ (ŝ_i − Σ_j w_ij x̂_{i→j})          (mix)

With a symmetric W (Metropolis–Hastings) Σ_i (ŝ_i − Σ_j w_ij x̂_{i→j}) = 0, so the mean
of the models is preserved whatever the dropouts, provided a sender commits exactly when
its input was included. With a lossless code and γ = 1 a round is D-PSGD.

Every replica starts at the shared x⁰ (all devices start from the same model), and the
replicas are kept *exactly*, as integer offsets in grid steps of the fixed point:
w_ij x̂_{j→i} = w_ij x⁰ + step · a_{j→i} and ŝ_i = (Σ_j w_ij) x⁰ + step · A_i, so the
invariant A_i = Σ_j a_{j→i} holds bit for bit on both sides of every edge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from meshfl.aggregation._model import Layout, check_model, check_weights, layout_of
from meshfl.aggregation.secure import FixedPoint, shared_indices, skellam_noise
from meshfl.errors import ConfigError, WireError

_MAX_PENDING = 8
"""Uncommitted contributions kept per aggregator (late confirmations are additive)."""

__all__ = ["Contribution", "SecureChoco"]


@dataclass(frozen=True, eq=False)
class Contribution:
    """One device's contribution to one secure-aggregation instance, before masking.

    Attributes
    ----------
    aggregator : str
        The neighbour i whose instance this is for.
    indices : np.ndarray or None
        int64, shape (k,), the shared random-k coordinates (sorted); ``None`` when dense.
    encoded : np.ndarray
        uint64, shape (k,) or (flat_size,): the fixed-point values modulo 2^b, noise
        included; this is what gets masked.
    value : np.ndarray
        float64, the same shape: the dequantized contribution, noise included — what the
        aggregator will attribute to this edge.

    """

    aggregator: str
    indices: np.ndarray | None
    encoded: np.ndarray
    value: np.ndarray


def _nonnegative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)


class SecureChoco:
    """The per-edge CHOCO-SGD state of one device under secure aggregation.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The model layout and the shared starting point x⁰ of every replica.
    neighbours : Mapping[str, float]
        Neighbour id → w_ij, a row of a *symmetric* mixing matrix (w_ij = w_ji, as
        Metropolis–Hastings gives): the same weight scales j's contribution to i and
        i's sum. Every weight must be > 0.
    self_weight : float
        w_ii; with the neighbour weights it sums to 1 (±1e-6).
    consensus_step : float
        γ in (0, 1].
    fixed_point : FixedPoint
        The grid and modulus shared by every member of an instance. Its capacity for the
        largest neighbourhood (:meth:`FixedPoint.check_capacity`) is checked by whoever
        plans the job, before any round.
    density : float, default 1.0
        Fraction of coordinates sent, in (0, 1]; below 1, shared-seed random-k on
        k = max(1, round(density · n)) coordinates (no 1/density scaling).
    dp_clip : float, default 0.0
        C: the L2 norm each contribution u is clipped to before encoding (0: none).
    dp_noise_std : float, default 0.0
        Standard deviation, in grid steps, of the integer Skellam noise added to each
        coordinate of each contribution (distributed DP; 0: none).

    Raises
    ------
    ConfigError
        Weights that are negative, zero for a neighbour, or do not sum to 1; γ outside
        (0, 1]; density outside (0, 1]; a negative clip or noise; a non-floating tensor.

    """

    __slots__ = (
        "_dp_clip",
        "_dp_noise_std",
        "_fp",
        "_gamma",
        "_layout",
        "_out_units",
        "_pending",
        "_sum_units",
        "_weights",
        "_x0",
        "density",
    )

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
        consensus_step: float,
        fixed_point: FixedPoint,
        density: float = 1.0,
        dp_clip: float = 0.0,
        dp_noise_std: float = 0.0,
    ) -> None:
        if isinstance(consensus_step, bool) or not (
            isinstance(consensus_step, (int, float)) and 0.0 < consensus_step <= 1.0
        ):
            raise ConfigError(f"consensus step γ must be in (0, 1], got {consensus_step!r}")
        if not isinstance(fixed_point, FixedPoint):
            raise ConfigError(f"fixed_point must be a FixedPoint, got {type(fixed_point).__name__}")
        if isinstance(density, bool) or not (
            isinstance(density, (int, float)) and 0.0 < density <= 1.0
        ):
            raise ConfigError(f"random-k density must be in (0, 1], got {density!r}")
        self._weights = check_weights(neighbours, self_weight)
        zero = sorted(peer for peer, w in self._weights.items() if w == 0.0)
        if zero:
            raise ConfigError(f"neighbours {zero!r} have weight 0; drop them from the neighbours")
        self._gamma = float(consensus_step)
        self._fp = fixed_point
        self.density = float(density)
        self._dp_clip = _nonnegative("dp_clip", dp_clip)
        self._dp_noise_std = _nonnegative("dp_noise_std", dp_noise_std)
        self._layout: Layout = layout_of(params)
        self._x0 = self.flatten(params)
        n = self._x0.size
        self._out_units = {peer: np.zeros(n, dtype=np.int64) for peer in self._weights}
        self._sum_units = np.zeros(n, dtype=np.int64)
        self._pending: dict[str, list[Contribution]] = {}

    # -- layout ------------------------------------------------------------------------

    @property
    def flat_size(self) -> int:
        """n, the number of coordinates of the model."""
        return int(self._x0.size)

    @property
    def noise_std(self) -> float:
        """Std of the integer DP noise per coordinate of a contribution, in grid steps."""
        return self._dp_noise_std

    @property
    def index_count(self) -> int:
        """k, the coordinates of one contribution: n, or max(1, round(density·n))."""
        n = self.flat_size
        return n if self.density == 1.0 else min(n, max(1, round(self.density * n)))

    @property
    def neighbours(self) -> dict[str, float]:
        """Neighbour id → w_ij (a copy)."""
        return dict(self._weights)

    @property
    def layout(self) -> Layout:
        """The ordered (tensor name, shape) pairs of the model."""
        return self._layout

    @property
    def fixed_point(self) -> FixedPoint:
        """The fixed-point grid and modulus of every contribution."""
        return self._fp

    def flatten(self, x: Mapping[str, np.ndarray]) -> np.ndarray:
        """Concatenate a model's tensors in layout order (float64, shape (n,)).

        Raises ConfigError if ``x`` does not match the layout.
        """
        tensors = check_model(x, self._layout)
        if not tensors:
            return np.zeros(0, dtype=np.float64)
        return np.concatenate([t.reshape(-1).astype(np.float64) for t in tensors])

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Split a flat vector of n values into the model's float32 tensors.

        Raises ConfigError if ``flat`` does not hold n values.
        """
        arr = np.asarray(flat).reshape(-1)
        if arr.size != self.flat_size:
            raise ConfigError(f"flat model has {arr.size} values, expected {self.flat_size}")
        out, start = {}, 0
        for name, shape in self._layout:
            size = math.prod(shape)
            out[name] = arr[start : start + size].reshape(shape).astype(np.float32)
            start += size
        return out

    # -- replicas ----------------------------------------------------------------------

    def replica(self, peer: str) -> np.ndarray:
        """x̂_{self→peer}, the public replica on the edge to ``peer`` (float64, (n,))."""
        units = self._units_of(peer)
        return self._x0 + units.astype(np.float64) * (self._fp.step / self._weights[peer])

    def replica_units(self, peer: str) -> np.ndarray:
        """a_{self→peer} (int64, (n,)): w·x̂_{self→peer} = w·x⁰ + step·a, exactly."""
        return self._units_of(peer).copy()

    def aggregate(self) -> np.ndarray:
        """ŝ = Σ_j w_ij x̂_{j→self}, as absorbed from unmasked sums (float64, (n,))."""
        total_weight = math.fsum(self._weights.values())
        return total_weight * self._x0 + self._sum_units.astype(np.float64) * self._fp.step

    def aggregate_units(self) -> np.ndarray:
        """A (int64, (n,)): ŝ = (Σ_j w_ij)·x⁰ + step·A, exactly."""
        return self._sum_units.copy()

    def _units_of(self, peer: str) -> np.ndarray:
        if peer not in self._out_units:
            raise ConfigError(f"{peer!r} is not a neighbour of this device")
        return self._out_units[peer]

    # -- one round ---------------------------------------------------------------------

    def contribution(
        self,
        x: Mapping[str, np.ndarray],
        aggregator: str,
        index_seed: bytes,
        rng: np.random.Generator,
    ) -> Contribution:
        """Encode u = w_i (x − x̂_{self→i}) for the instance of neighbour ``aggregator``.

        On the shared random-k coordinates ``shared_indices(index_seed, n, k)`` when
        density < 1; clipped to L2 norm C when ``dp_clip`` is set; stochastically
        rounded onto the grid; plus Skellam noise of variance ``dp_noise_std²`` when set.
        The contribution becomes the *pending* one of ``aggregator`` (replacing an
        earlier one that was never committed): :meth:`commit` it once the aggregator
        declares it included.

        Parameters
        ----------
        x : Mapping[str, np.ndarray]
            The device's current model.
        aggregator : str
            The neighbour i.
        index_seed : bytes
            The public seed of the instance (ignored when dense).
        rng : np.random.Generator
            Secret randomness for the rounding and the noise.

        Returns
        -------
        Contribution

        Raises
        ------
        ConfigError
            If ``aggregator`` is not a neighbour or ``x`` mismatches the layout.
        CodecError
            If the model holds NaN or infinity.

        """
        weight = self._weights.get(aggregator)
        if weight is None:
            raise ConfigError(f"{aggregator!r} is not a neighbour of this device")
        units = self._out_units[aggregator]
        u = weight * (self.flatten(x) - self._x0) - units.astype(np.float64) * self._fp.step
        indices = None
        if self.density < 1.0:
            indices = shared_indices(index_seed, self.flat_size, self.index_count)
            u = u[indices]
        if self._dp_clip > 0:
            # Stochastic rounding moves each coordinate by less than one step, so clipping
            # to C − √k·step keeps the encoded contribution's norm ≤ C (the sensitivity the
            # accountant assumes).
            bound = self._dp_clip - math.sqrt(u.size) * self._fp.step
            if bound <= 0:
                raise ConfigError(
                    f"dp_clip {self._dp_clip:g} is below the rounding error of the fixed point"
                    f" (√k·step = {math.sqrt(u.size) * self._fp.step:.3g}); raise dp_clip or"
                    " lower secure_range"
                )
            norm = float(np.linalg.norm(u))
            if norm > bound:
                u = u * (bound / norm)
        encoded = self._fp.encode(u, rng)
        if self._dp_noise_std > 0:
            noise = skellam_noise(rng, encoded.size, self._dp_noise_std**2)
            encoded = self._fp.from_signed(self._fp.to_signed(encoded) + noise)
        result = Contribution(aggregator, indices, encoded, self._fp.decode(encoded))
        pending = self._pending.setdefault(aggregator, [])
        pending.append(result)
        del pending[:-_MAX_PENDING]  # an older one's aggregator can no longer confirm it
        return result

    def commit(self, contribution: Contribution) -> None:
        """Apply an included contribution to its edge: x̂_{self→i} += value / w_i.

        Call exactly once, when the aggregator's declaration lists this device among
        the survivors (never for a dropped or aborted instance).

        A confirmation may come late (after the next contribution to the same aggregator):
        updates are additive, so any of the last ``_MAX_PENDING`` uncommitted contributions
        can still be committed.

        Raises
        ------
        ConfigError
            If ``contribution`` is not pending (already committed, or too old).

        """
        pending = self._pending.get(contribution.aggregator, [])
        position = next((i for i, c in enumerate(pending) if c is contribution), None)
        if position is None:
            raise ConfigError(
                f"contribution to {contribution.aggregator!r} is not pending: it was already"
                " committed or is too old"
            )
        del pending[position]
        signed = self._fp.to_signed(contribution.encoded)
        units = self._out_units[contribution.aggregator]
        if contribution.indices is None:
            units += signed
        else:
            units[contribution.indices] += signed

    def absorb(self, total: np.ndarray, indices: np.ndarray | None) -> None:
        """Add an instance's unmasked sum to the aggregate: ŝ += total on ``indices``.

        Parameters
        ----------
        total : np.ndarray
            float64, shape (k,) or (n,): ``FixedPoint.decode`` of the unmasked sum (it
            lies on the grid and is snapped to it exactly).
        indices : np.ndarray or None
            The instance's shared coordinates; ``None`` when dense.

        Raises
        ------
        WireError
            If the length does not match the coordinates, the indices are out of range
            or not sorted and distinct, or ``total`` is not on the fixed-point grid. The
            state is then unchanged.

        """
        values = np.asarray(total, dtype=np.float64).reshape(-1)
        expected = self.flat_size if indices is None else int(np.size(indices))
        if values.size != expected:
            raise WireError(f"unmasked sum has {values.size} values, expected {expected}")
        if indices is not None:
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
            if indices.size and (indices[0] < 0 or indices[-1] >= self.flat_size):
                raise WireError(f"unmasked sum has an index outside [0, {self.flat_size})")
            if np.any(np.diff(indices) <= 0):
                raise WireError("unmasked sum indices are not sorted and distinct")
        scaled = values / self._fp.step
        if not np.all(np.isfinite(scaled)) or np.any(np.abs(scaled) >= 2.0**62):
            raise WireError("unmasked sum is not finite or exceeds the fixed-point range")
        units = np.rint(scaled)
        if np.any(np.abs(scaled - units) > 1e-3):
            raise WireError("unmasked sum is not on the fixed-point grid of this device")
        if indices is None:
            self._sum_units += units.astype(np.int64)
        else:
            self._sum_units[indices] += units.astype(np.int64)

    def mix(self, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Consensus step x + γ (ŝ − Σ_i w_i x̂_{self→i}), float32 out (float64 inside).

        The x⁰ terms cancel, so this is x + γ·step·(A − Σ_i a_{self→i}) exactly.

        Raises ConfigError if ``x`` does not match the layout; ``x`` is not modified.
        """
        flat = self.flatten(x)
        offset = self._sum_units.copy()
        for units in self._out_units.values():
            offset -= units
        return self.unflatten(flat + self._gamma * self._fp.step * offset.astype(np.float64))
