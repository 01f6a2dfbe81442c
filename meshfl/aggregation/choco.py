"""CHOCO-SGD / CHOCO-Gossip: gossip with compressed replica differences.

Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms
with Compressed Communication", ICML 2019, Algorithm 1 (CHOCO-Gossip) and Algorithm 2
(CHOCO-SGD). Node ``i`` keeps public replicas x̂_i of itself and x̂_j of each neighbour,
all starting at zero. Each round::

    q_i   = C(x_i − x̂_i)                         (outgoing, per tensor)
    x̂_i  ← x̂_i + q_i,   x̂_j ← x̂_j + q_j          (outgoing / incoming)
    x_i   ← x_i + γ Σ_{j ∈ answered} w_ij (x̂_j − x̂_i)   (mix)

The decoded q is applied, so sender and receivers hold bit-identical replicas.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

import numpy as np

from meshfl.aggregation._model import (
    check_answered,
    check_model,
    check_weights,
    decode_entries,
    identity_entries,
    layout_of,
    mean_of_states,
    tracked_peers,
)
from meshfl.aggregation.dp import Privatizer
from meshfl.aggregation.privacy import RobustRule
from meshfl.aggregation.robust import RobustMixer
from meshfl.codecs import Codec, CodecPolicy, Identity
from meshfl.errors import ConfigError, WireError
from meshfl.wire import DType, MessageKind, TensorEntry

KEYFRAME_BASELINE = 10
"""Messages whose relative compression error sets a device's normal level (median)."""

__all__ = ["ChocoGossip"]


class ChocoGossip:
    """The CHOCO state of one device: its own and its neighbours' public replicas.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The model layout (ordered tensor names and shapes; float32), and the shared
        starting point x⁰ when ``shared_start`` is set.
    neighbours : Mapping[str, float]
        Neighbour id → mixing weight w_ij (a row of W, e.g. Metropolis–Hastings).
    self_weight : float
        w_ii; with the neighbour weights it must sum to 1 (±1e-6), all ``>= 0``.
    consensus_step : float
        γ in (0, 1]. γ = 1 with a lossless codec is D-PSGD; a codec of density δ needs
        a smaller γ (the paper's γ* = ρ²δ / (16ρ + ρ² + 4β² + 2ρβ² − 8ρδ), Theorem 2).
    codec : Codec or CodecPolicy
        Compressor C for the outgoing differences (e.g. ``TopK(0.1)``), or a per-tensor
        policy (small tensors dense, density from a byte budget; see
        :class:`meshfl.codecs.CodecPolicy`).
    shared_start : bool, default False
        Start every replica at ``params`` instead of zero. Valid when every device
        starts from the same x⁰ (the same model seed), which then costs no bytes to
        agree on: the replicas are exact from round one and the compressed channel
        only has to carry what training changed. With ``False`` the first rounds spend
        their bytes transmitting x⁰ itself (the paper's x̂⁰ = 0).
    keyframe_growth : float, default 0.0
        Error-triggered keyframes. The relative compression error r = ‖x − x̂_i‖ / ‖x‖ is
        measured locally before each message; the median of its first
        ``KEYFRAME_BASELINE`` values is the codec's normal level. When r exceeds
        ``keyframe_growth`` times that level, the message is a lossless *keyframe*: every
        replica of x̂_i becomes x_i exactly. 0 disables it; otherwise it must be > 1.
        With a biased codec and a large γ, CHOCO-SGD's error can grow without bound once
        training slows down (measured on W1: top-k 0.15, γ 0.9 diverges after ~100
        rounds); keyframes bound it at the cost of one uncompressed message each time.
        Being relative to the codec's own level, the rule fits coarse and fine codecs
        alike. See ``docs/algorithms.md``.
    privatizer : Privatizer, optional
        Applied to the difference x − x̂_i *before* compression in :meth:`outgoing`
        (e.g. :class:`~meshfl.aggregation.dp.GaussianPrivatizer`: clip to C, add
        N(0, σ²C²)). x̂_i and every receiver's replica advance by the decoded privatized
        message, so they stay bit-identical. Keyframes are unmasked models, so they are
        refused: ``keyframe_growth`` must be 0 and :meth:`keyframe` raises. None: off.
    robust : RobustRule or RobustMixer, optional
        Mix with a robust rule (:class:`~meshfl.aggregation.robust.RobustMixer`; pass a
        mixer to set ClippedGossip's τ or δ) over the neighbours' replicas x̂_j instead
        of the weighted average; ``None``: plain CHOCO mixing.

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, the weights do not sum to 1, γ is outside
        (0, 1], a tensor is not floating, or a privatizer comes with keyframes.

    """

    message_kind: ClassVar[int] = MessageKind.DELTA
    __slots__ = (
        "_baseline",
        "_codec",
        "_gamma",
        "_keyframe_growth",
        "_layout",
        "_mixer",
        "_own",
        "_privatizer",
        "_replicas",
        "_tracked",
        "_weights",
        "keyframes_sent",
    )

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
        consensus_step: float,
        codec: Codec | CodecPolicy,
        shared_start: bool = False,
        keyframe_growth: float = 0.0,
        privatizer: Privatizer | None = None,
        robust: RobustRule | RobustMixer | None = None,
    ) -> None:
        if not (math.isfinite(keyframe_growth) and (keyframe_growth == 0 or keyframe_growth > 1)):
            raise ConfigError(f"keyframe growth must be 0 (off) or > 1, got {keyframe_growth!r}")
        if privatizer is not None and not callable(getattr(privatizer, "privatize", None)):
            raise ConfigError(f"privatizer must have privatize(dict) -> dict, got {privatizer!r}")
        if privatizer is not None and keyframe_growth > 0:
            raise ConfigError(
                "keyframes are unmasked models and cannot be privatized: set keyframe_growth"
                " to 0 when a privatizer (differential privacy) is on"
            )
        self._privatizer = privatizer
        self._mixer = (
            robust if isinstance(robust, RobustMixer) or robust is None else RobustMixer(robust)
        )
        self._keyframe_growth = float(keyframe_growth)
        self._baseline: list[float] = []
        self.keyframes_sent = 0
        if isinstance(consensus_step, bool) or not (
            isinstance(consensus_step, (int, float)) and 0.0 < consensus_step <= 1.0
        ):
            raise ConfigError(f"consensus step γ must be in (0, 1], got {consensus_step!r}")
        if not isinstance(codec, (Codec, CodecPolicy)):
            raise ConfigError(f"codec must be a meshfl Codec, got {type(codec).__name__}")
        self._weights = check_weights(neighbours, self_weight)
        self._layout = layout_of(params)
        self._gamma = float(consensus_step)
        policy = codec if isinstance(codec, CodecPolicy) else CodecPolicy(codec, dense_below=0)
        self._codec = [policy.codec_for(name, shape) for name, shape in self._layout]

        def start() -> list[np.ndarray]:
            if shared_start:
                return [np.array(params[name], dtype=np.float32) for name, _ in self._layout]
            return [np.zeros(shape, dtype=np.float32) for _, shape in self._layout]

        self._own = start()
        self._replicas = {peer: start() for peer in self._weights}
        self._tracked = frozenset(self._weights)

    def set_neighbours(
        self, neighbours: Mapping[str, float], self_weight: float, listen: Collection[str] = ()
    ) -> None:
        """Switch to another row of W: a new topology version, or a time-varying graph's round.

        Replicas of peers still tracked (in ``neighbours`` or ``listen``) are kept; those of
        peers no longer tracked are dropped. A newly tracked peer has *no* replica: its
        compressed differences are refused until its keyframe
        (:meth:`incoming_keyframe`) arrives, and it cannot be mixed before
        (:meth:`has_state`). The device's own replica x̂_i is unchanged.

        Raises
        ------
        ConfigError
            If the weights are invalid (see the class); the state is then unchanged.

        """
        weights = check_weights(neighbours, self_weight)
        tracked = tracked_peers(weights, listen)
        self._weights, self._tracked = weights, tracked
        for peer in [p for p in self._replicas if p not in tracked]:
            del self._replicas[peer]

    def forget(self, peer: str) -> None:
        """Drop what is held of ``peer`` (a gap in its messages): it needs a keyframe."""
        self._replicas.pop(peer, None)

    def mean_of(self, peers: Collection[str]) -> dict[str, np.ndarray]:
        """Return the float32 mean of the held states of ``peers`` (a joiner's start model).

        Raises ConfigError if ``peers`` is empty or holds a peer without state.
        """
        return mean_of_states(self._replicas, peers, self._layout)

    def has_state(self, peer: str) -> bool:
        """Whether this device holds a replica of ``peer`` (it can be mixed)."""
        return peer in self._replicas

    def own_replica(self) -> dict[str, np.ndarray]:
        """Return a copy of this device's public replica x̂_i, by tensor name.

        float32 arrays in model order, each shaped like the tensor of ``params`` given
        at construction. Every neighbour's replica of this device equals it (they apply
        the same decoded messages), so a restarted device must get it back
        (:meth:`restore_own_replica`) to keep sending differences they can apply.
        """
        return {name: a.copy() for (name, _), a in zip(self._layout, self._own, strict=True)}

    def keyframe_baseline(self) -> list[float]:
        """The relative compression errors r = ‖x − x̂_i‖ / ‖x‖ measured so far.

        At most ``KEYFRAME_BASELINE`` (10) floats, dimensionless; their median is the
        codec's normal level for error-triggered keyframes (empty before any message).
        """
        return list(self._baseline)

    def restore_own_replica(
        self, replica: Mapping[str, np.ndarray], baseline: Sequence[float] = ()
    ) -> None:
        """Put back x̂_i (and the keyframe baseline) saved by :meth:`own_replica`.

        Parameters
        ----------
        replica : mapping of str to ndarray
            Tensor name → array, in model order, shapes as the model's; copied as
            float32.
        baseline : sequence of float, optional
            :meth:`keyframe_baseline`'s values (at most ``KEYFRAME_BASELINE`` kept);
            empty: measured afresh.

        Raises
        ------
        ConfigError
            If the names (in order) or shapes differ from the model's, or a value is
            NaN or infinite; the state is then unchanged.

        """
        tensors = check_model(replica, self._layout)
        if not all(np.all(np.isfinite(t)) for t in tensors):
            raise ConfigError("the saved replica x̂_i holds NaN or infinite values")
        values = [float(v) for v in baseline][:KEYFRAME_BASELINE]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ConfigError(f"keyframe baseline must be finite and >= 0, got {values}")
        self._own = [np.array(t, dtype=np.float32) for t in tensors]
        self._baseline = values

    def keyframe(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return a lossless keyframe of ``x`` and set x̂_i := x (sent as a KEYFRAME).

        Receivers set their replica of this device to the keyframe
        (:meth:`incoming_keyframe`): it (re)starts a replica that a new neighbour never
        had, or one that lost a message. Raises ConfigError if ``x`` mismatches the layout.

        With a privatizer (differential privacy) the keyframe is the public replica x̂_i
        itself, not x: it is the sum of messages already released, so sending it again is
        post-processing and costs no privacy, and x̂_i stays as it is.
        """
        if self._privatizer is not None:
            self.keyframes_sent += 1
            return identity_entries(self._own, self._layout)
        tensors = check_model(x, self._layout)
        self._own = [t.copy() for t in tensors]
        self.keyframes_sent += 1
        return identity_entries(tensors, self._layout)

    def incoming_keyframe(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Set the replica of ``sender`` to its keyframe: x̂_j := x_j.

        Raises
        ------
        WireError
            If ``sender`` is not tracked or the layout differs.
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        decoded = decode_entries(sender, tensors, self._layout, self._tracked)
        self._replicas[sender] = [np.array(q, dtype=np.float32) for q in decoded]

    @property
    def codecs(self) -> list[Codec]:
        """The codec of each tensor, in model order (from the codec or the policy)."""
        return list(self._codec)

    def outgoing(
        self, x: Mapping[str, np.ndarray], codec: Codec | None = None
    ) -> tuple[TensorEntry, ...]:
        """Compress ``x − x̂_i`` per tensor, advance x̂_i by the decoded message, return it.

        Parameters
        ----------
        x : Mapping[str, np.ndarray]
            The current model (after local steps), same names/shapes as ``params``.
        codec : Codec, optional
            Use this codec for this message instead of the configured one. A lossless
            codec makes the message a *keyframe*: every replica of x̂_i becomes x_i
            exactly, which resets the compression error x − x̂ to zero.

        Returns
        -------
        tuple of TensorEntry
            One FLOAT32 entry per tensor, in model order, codec tag ``codec.tag``.

        Raises
        ------
        ConfigError
            If ``x`` does not match the model layout.
        CodecError
            If a difference holds NaN/inf; the state is then unchanged.

        """
        tensors = check_model(x, self._layout)
        codecs = self._codec if codec is None else [codec] * len(tensors)
        if codec is None and self._keyframe_growth > 0.0 and self._needs_keyframe(tensors):
            codecs = [Identity()] * len(tensors)
            self.keyframes_sent += 1
        diffs = [t - r for t, r in zip(tensors, self._own, strict=True)]
        if self._privatizer is not None:
            diffs = self._privatize(self._privatizer, diffs)
        payloads = [c.encode(d) for c, d in zip(codecs, diffs, strict=True)]
        decoded = [
            c.decode(p, shape)
            for c, p, (_, shape) in zip(codecs, payloads, self._layout, strict=True)
        ]
        for replica, q in zip(self._own, decoded, strict=True):
            replica += q
        return tuple(
            TensorEntry(name, shape, DType.FLOAT32, c.tag, payload)
            for c, (name, shape), payload in zip(codecs, self._layout, payloads, strict=True)
        )

    def _privatize(self, privatizer: Privatizer, diffs: list[np.ndarray]) -> list[np.ndarray]:
        names = [name for name, _ in self._layout]
        released = privatizer.privatize(dict(zip(names, diffs, strict=True)))
        if list(released) != names:
            raise ConfigError(f"privatizer returned tensors {list(released)}, expected {names}")
        out = []
        for name, shape in self._layout:
            arr = np.asarray(released[name], dtype=np.float32)
            if arr.shape != shape:
                raise ConfigError(f"privatizer changed the shape of {name!r} to {arr.shape}")
            out.append(arr)
        return out

    def _needs_keyframe(self, tensors: Sequence[np.ndarray]) -> bool:
        pairs = zip(tensors, self._own, strict=True)
        error = sum(float(np.sum((t - r).astype(np.float64) ** 2)) for t, r in pairs)
        norm = sum(float(np.sum(t.astype(np.float64) ** 2)) for t in tensors)
        if norm == 0.0:
            return False
        relative = math.sqrt(error / norm)
        if len(self._baseline) < KEYFRAME_BASELINE:
            self._baseline.append(relative)
            return False
        return relative > self._keyframe_growth * statistics.median(self._baseline)

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Apply a neighbour's compressed difference: x̂_j ← x̂_j + decode(q_j).

        Any registered codec is accepted (neighbours may use different codecs). The
        caller guarantees exactly-once delivery; a late message is still applied.

        Raises
        ------
        WireError
            If ``sender`` is not a neighbour or names/shapes/dtypes differ from the model.
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        decoded = decode_entries(sender, tensors, self._layout, self._tracked)
        if sender not in self._replicas:
            raise WireError(f"no replica of {sender!r} yet: its keyframe must come first")
        for replica, q in zip(self._replicas[sender], decoded, strict=True):
            replica += q

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Consensus step x_i + γ Σ_{j ∈ answered} w_ij (x̂_j − x̂_i).

        With a ``robust`` rule the step is the rule's instead (see
        :class:`~meshfl.aggregation.robust.RobustMixer`), over x_i and the answered
        neighbours' replicas x̂_j.

        A neighbour not in ``answered`` gets w_ij = 0 this round (its weight stays on
        the self weight), so the step stays a convex combination. Accumulates in float64.

        Returns
        -------
        dict of str to np.ndarray
            The new float32 model, same names/shapes; ``x`` is not modified.

        Raises
        ------
        ConfigError
            If ``x`` does not match the layout or ``answered`` holds a non-neighbour.

        """
        tensors = check_model(x, self._layout)
        peers = check_answered(answered, self._weights)
        unknown = sorted(peer for peer in peers if peer not in self._replicas)
        if unknown:
            raise WireError(f"answered neighbours {unknown!r} have no replica yet")
        ordered = [peer for peer in self._weights if peer in peers]  # deterministic sum order
        if self._mixer is not None:
            names = [name for name, _ in self._layout]
            states = {p: dict(zip(names, self._replicas[p], strict=True)) for p in ordered}
            x_in = dict(zip(names, tensors, strict=True))
            self_weight = 1.0 - math.fsum(self._weights.values())
            return self._mixer.mix(x_in, states, self._weights, self_weight, self._gamma)
        out: dict[str, np.ndarray] = {}
        for t, ((name, _), own) in enumerate(zip(self._layout, self._own, strict=True)):
            acc = np.zeros(own.shape, dtype=np.float64)
            for peer in ordered:
                acc += self._weights[peer] * (
                    self._replicas[peer][t].astype(np.float64) - own.astype(np.float64)
                )
            out[name] = (tensors[t] + self._gamma * acc).astype(np.float32)
        return out
