"""Compressed D-PSGD: gossip of compressed *models*, optionally with error feedback.

Each device sends its compressed model and mixes with its neighbours' latest decoded
models x̃_j, D-PSGD's step (Lian et al., NeurIPS 2017) with x_j replaced by x̃_j::

    outgoing:  q_i = C(x_i)                                   (error_feedback=False)
               q_i = C(x_i + e_i),  e_i ← x_i + e_i − D(q_i)    (error_feedback=True)
    incoming:  x̃_j ← D(q_j)
    mix:       x_i ← w_ii x_i + Σ_{j ∈ answered} w_ij x̃_j + Σ_{j ∉ answered} w_ij x_i

Without error feedback this is the naive scheme of Tang, Gan, Zhang, Zhang, Liu,
"Communication Compression for Decentralized Training", NeurIPS 2018, Sec. 3: they show
it does not converge when the compression error is large (each round throws most of
every neighbour's model away). It is kept to measure that, not to use.

With error feedback the residual e_i (a :class:`ErrorFeedback`, the explicit state
object; never inside a codec) re-sends what earlier rounds dropped, so
``Σ_t D(q_i,t) + e_i,T = Σ_t x_i,t``. What is known, stated with care: Tang, Lian,
Qiu, Yuan, Zhang, Zhang, Liu, "DeepSqueeze: Decentralization Meets Error-Compensated
Compression", arXiv:1907.07346, 2019, analyse error-compensated gossip of compressed
models and prove convergence for their scheme, whose mixing has a consensus step η that
must be small enough for the compression error; here the step is D-PSGD's (η = 1), so
their theorem is not claimed to cover this class. Koloskova, Stich, Jaggi (ICML 2019,
CHOCO-SGD) and Koloskova, Lin, Stich, Jaggi (ICLR 2020) take the other route: compress
replica differences x − x̂, which carry the dropped part without any residual, with
convergence guarantees; prefer :class:`ChocoGossip`. This class is an empirical
baseline; W1 numbers (8-device ring, top-k 1 %, 30 rounds) are in ``docs/algorithms.md``.
"""

from __future__ import annotations

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
from meshfl.aggregation.error_feedback import ErrorFeedback
from meshfl.codecs import Codec, CodecPolicy
from meshfl.errors import CodecError, ConfigError, WireError
from meshfl.wire import DType, MessageKind, TensorEntry

__all__ = ["CompressedDPSGD"]


class CompressedDPSGD:
    """The compressed D-PSGD state of one device: neighbours' latest decoded models.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The model layout (ordered names and shapes, float32); values are not read.
    neighbours : Mapping[str, float]
        Neighbour id → mixing weight w_ij.
    self_weight : float
        w_ii; with the neighbour weights it must sum to 1 (±1e-6), all ``>= 0``.
    codec : Codec or CodecPolicy
        Compressor C of the outgoing models (e.g. ``TopK(0.01)``), or a per-tensor policy
        (:class:`meshfl.codecs.CodecPolicy`). A lossless codec makes this D-PSGD.
    error_feedback : bool, default False
        Send C(x_i + e_i) and keep e_i in an :class:`ErrorFeedback` (residuals start at
        zero). ``False`` is Tang et al.'s naive scheme.

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, the weights do not sum to 1, the codec is
        not a meshfl codec or policy, or a tensor is not floating.

    """

    message_kind: ClassVar[int] = MessageKind.MODEL
    __slots__ = (
        "_codecs",
        "_feedback",
        "_latest",
        "_layout",
        "_self_weight",
        "_tracked",
        "_weights",
    )

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        neighbours: Mapping[str, float],
        self_weight: float,
        codec: Codec | CodecPolicy,
        error_feedback: bool = False,
    ) -> None:
        if not isinstance(codec, (Codec, CodecPolicy)):
            raise ConfigError(f"codec must be a meshfl Codec, got {type(codec).__name__}")
        if not isinstance(error_feedback, bool):
            raise ConfigError(f"error_feedback must be a bool, got {error_feedback!r}")
        self._weights = check_weights(neighbours, self_weight)
        self._self_weight = float(self_weight)
        self._layout = layout_of(params)
        policy = codec if isinstance(codec, CodecPolicy) else CodecPolicy(codec, dense_below=0)
        self._codecs = [policy.codec_for(name, shape) for name, shape in self._layout]
        self._feedback = ErrorFeedback(self._layout) if error_feedback else None
        self._latest: dict[str, list[np.ndarray]] = {}
        self._tracked = frozenset(self._weights)

    def set_neighbours(
        self, neighbours: Mapping[str, float], self_weight: float, listen: Collection[str] = ()
    ) -> None:
        """Switch to another row of W (a topology version, or a time-varying graph's round).

        The latest models of peers still tracked (in ``neighbours`` or ``listen``) are
        kept, the others dropped. Raises ConfigError on invalid weights (state unchanged).
        """
        weights = check_weights(neighbours, self_weight)
        tracked = tracked_peers(weights, listen)
        self._weights, self._self_weight, self._tracked = weights, float(self_weight), tracked
        for peer in [p for p in self._latest if p not in tracked]:
            del self._latest[peer]

    def forget(self, peer: str) -> None:
        """Drop what is held of ``peer`` (a gap in its messages): it needs a keyframe."""
        self._latest.pop(peer, None)

    def mean_of(self, peers: Collection[str]) -> dict[str, np.ndarray]:
        """Return the float32 mean of the held states of ``peers`` (a joiner's start model).

        Raises ConfigError if ``peers`` is empty or holds a peer without state.
        """
        return mean_of_states(self._latest, peers, self._layout)

    def has_state(self, peer: str) -> bool:
        """Whether a model of ``peer`` has arrived (it can be mixed)."""
        return peer in self._latest

    def keyframe(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return ``x`` losslessly (identity codec); residuals are not touched."""
        return identity_entries(check_model(x, self._layout), self._layout)

    def incoming_keyframe(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Store a keyframe like any model (:meth:`incoming`)."""
        self.incoming(sender, tensors)

    @property
    def error_feedback(self) -> ErrorFeedback | None:
        """The residual state (read it, e.g. ``residual_norm()``); None without feedback."""
        return self._feedback

    def outgoing(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return C(x_i) — or C(x_i + e_i), updating e_i — one entry per tensor.

        Returns
        -------
        tuple of TensorEntry
            One FLOAT32 entry per tensor, in model order, codec tag of that tensor's codec.

        Raises
        ------
        ConfigError
            If ``x`` does not match the model layout.
        CodecError
            If a tensor (plus its residual) holds NaN/inf; the residuals are then unchanged.

        """
        tensors = check_model(x, self._layout)
        feedback = self._feedback
        if feedback is None:
            payloads = [c.encode(t) for c, t in zip(self._codecs, tensors, strict=True)]
        else:
            for (name, _), t in zip(self._layout, tensors, strict=True):
                with np.errstate(over="ignore", invalid="ignore"):
                    finite = bool(np.all(np.isfinite(t + feedback.residual(name))))
                if not finite:  # refuse before any residual moves: all or nothing
                    raise CodecError(f"tensor {name!r} plus its residual holds NaN/inf")
            payloads = [
                feedback.compress(c, name, t)[0]
                for c, (name, _), t in zip(self._codecs, self._layout, tensors, strict=True)
            ]
        return tuple(
            TensorEntry(name, shape, DType.FLOAT32, c.tag, payload)
            for c, (name, shape), payload in zip(self._codecs, self._layout, payloads, strict=True)
        )

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Store ``sender``'s latest decoded model x̃_j (replacing the previous one).

        Raises
        ------
        WireError
            If ``sender`` is not a neighbour or names/shapes/dtypes differ from the model.
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        self._latest[sender] = decode_entries(sender, tensors, self._layout, self._tracked)

    def mix(self, x: Mapping[str, np.ndarray], answered: Collection[str]) -> dict[str, np.ndarray]:
        """Return w_ii x_i + Σ_{answered} w_ij x̃_j + Σ_{missing} w_ij x_i (float64 sums).

        Returns
        -------
        dict of str to np.ndarray
            The new float32 model; ``x`` is not modified.

        Raises
        ------
        ConfigError
            If ``x`` does not match the layout or ``answered`` holds a non-neighbour.
        WireError
            If a neighbour in ``answered`` has never sent a model.

        """
        tensors = check_model(x, self._layout)
        peers = check_answered(answered, self._weights)
        ordered = [peer for peer in self._weights if peer in peers]  # deterministic sum order
        missing = sorted(peer for peer in peers if peer not in self._latest)
        if missing:
            raise WireError(f"answered neighbours {missing!r} have sent no model yet")
        own_weight = self._self_weight + sum(
            w for peer, w in self._weights.items() if peer not in peers
        )
        out: dict[str, np.ndarray] = {}
        for t, (name, _) in enumerate(self._layout):
            acc = own_weight * tensors[t].astype(np.float64)
            for peer in ordered:
                acc += self._weights[peer] * self._latest[peer][t].astype(np.float64)
            out[name] = acc.astype(np.float32)
        return out
