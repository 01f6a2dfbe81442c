"""Serverless averaging of compressed updates with error feedback (all-to-all broadcast).

Local SGD with compressed, error-compensated updates — Qsparse-local-SGD (Basu, Data,
Karakus, Diggavi, NeurIPS 2019, Algorithm 1) and EF-SGD (Karimireddy, Rebjock, Stich,
Jaggi, ICML 2019, Algorithm 2) — with the server replaced by a broadcast: every device
holds the same shared model z (all start from the job's seeded x⁰), publishes one
compressed update a round on its own topic, hears everybody's, and computes the same
average itself. Per device i, round t::

    Δ_i = x_i − z                       (x_i: z after this round's local steps)
    q_i = C(Δ_i + e_i),   e_i ← Δ_i + e_i − D(q_i)                  (EF, Eq. 1)
    z  ← z + Σ_j a_j D(q_j)             (a_j: averaging weights, Σ_j a_j = 1)    (Eq. 2)
    x_i ← z                             (the next round starts from the shared model)

With the identity codec this is FedAvg exactly (tested). Error feedback keeps
``Σ_t D(q_i,t) + e_i,T = Σ_t Δ_i,t``: what the codec dropped is sent later, never lost.
This is Gossip-PGA (:mod:`meshfl.aggregation.pga`) with a global round every round, made
cheap by compression; it is CHOCO-SGD's message on the complete graph, except that a
device trains from the public average instead of the average plus its own residual.

**Why every device holds the same z.** z changes only by decoded messages, which are
bytes every device receives unchanged (signed envelopes); each device adds them in the
same order (its peers in sorted id order, accumulated in float64, then cast), so when
every message of a round arrives in time all copies of z are bit-identical. A message
that arrives late is applied in the round it arrives (the update is additive, applied
exactly once), so copies agree again up to float32 rounding; a device that missed a
message for good (a gap) takes a peer's z as a keyframe (:meth:`incoming_keyframe`).

Combines with: any codec (biased ones need the residual, which is here); update
momentum (:class:`~meshfl.aggregation.momentum.UpdateMomentum`, identical on every device) and
local momentum; secure aggregation (the round's Σ_j a_j D(q_j) is a sum over all
devices — the secure sum of the decoded updates reveals only that). Not asynchronous
rounds: z agrees only when every device applies every update.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

import numpy as np

from meshfl.aggregation._model import (
    check_model,
    decode_entries,
    identity_entries,
    layout_of,
)
from meshfl.aggregation.error_feedback import ErrorFeedback
from meshfl.codecs import Codec
from meshfl.errors import CodecError, ConfigError, WireError
from meshfl.wire import DType, TensorEntry

__all__ = ["EFAveraging"]


def _check_averaging_weights(peers: Mapping[str, float], self_weight: float) -> dict[str, float]:
    weights = {}
    for peer, a in {**peers, "<self>": self_weight}.items():
        if not isinstance(peer, str) or not peer:
            raise ConfigError(f"peer ids must be non-empty strings, got {peer!r}")
        ok = not isinstance(a, bool) and isinstance(a, (int, float, np.floating))
        if not (ok and math.isfinite(a) and a >= 0):
            raise ConfigError(f"averaging weight of {peer!r} must be finite and >= 0, got {a!r}")
        weights[peer] = float(a)
    if abs(math.fsum(weights.values()) - 1.0) > 1e-6:
        raise ConfigError("averaging weights (self included) must sum to 1")
    return weights


class EFAveraging:
    """One device's state: the shared model z, its residual e_i, the round's updates.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The shared starting model x⁰ (float32), the same on every device.
    peers : Mapping[str, float]
        Every *other* device of the job → its averaging weight a_j (1/n for equal weights,
        or n_j / Σn for sample-count weights). Every device must use the same weights.
    self_weight : float
        a_i; with the peers' weights it must sum to 1 (±1e-6), all ``>= 0``.
    codec : Codec
        Compressor C of the updates (e.g. ``Sign()``); its residual is kept here.
    self_id : str, default "<self>"
        This device's id: it decides where its own update falls in the fixed summation
        order (sorted ids), so every device sums in the same order.

    Raises
    ------
    ConfigError
        If a weight is negative or non-finite, the weights do not sum to 1, the codec is
        not a meshfl codec or a tensor is not floating.

    """

    message_kind: ClassVar[int] = 1  # meshfl.wire.MessageKind.DELTA
    __slots__ = ("_codec", "_feedback", "_layout", "_pending", "_self_id", "_weights", "_z")

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        peers: Mapping[str, float],
        self_weight: float,
        codec: Codec,
        self_id: str = "<self>",
    ) -> None:
        if not isinstance(codec, Codec):
            raise ConfigError(f"codec must be a meshfl Codec, got {type(codec).__name__}")
        if self_id in peers or "<self>" in peers:
            raise ConfigError(f"self id {self_id!r} (or '<self>') is also listed as a peer")
        self._weights = _check_averaging_weights(peers, self_weight)  # holds "<self>" too
        self._self_id = self_id
        self._layout = layout_of(params)
        self._z = [np.array(params[n], dtype=np.float32) for n, _ in self._layout]
        self._codec = codec
        self._feedback = ErrorFeedback(self._layout)
        self._pending: dict[str, list[np.ndarray]] = {}

    @property
    def peers(self) -> list[str]:
        """The other devices' ids, sorted."""
        return sorted(p for p in self._weights if p != "<self>")

    def shared_model(self) -> dict[str, np.ndarray]:
        """A copy of z, by tensor name (float32)."""
        return {n: a.copy() for (n, _), a in zip(self._layout, self._z, strict=True)}

    def residual_norm(self) -> float:
        """‖e_i‖ over all tensors (the error-feedback memory)."""
        return self._feedback.residual_norm()

    def outgoing(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return q_i = C(x − z + e_i) per tensor and update e_i (EF above).

        Raises
        ------
        ConfigError
            If ``x`` does not match the model layout.
        CodecError
            If an update holds NaN/inf.

        """
        tensors = check_model(x, self._layout)
        if not all(np.all(np.isfinite(t)) for t in tensors):  # before any residual moves
            raise CodecError("the model holds NaN or infinite values; no update was sent")
        entries, own = [], []
        for (name, shape), t, z in zip(self._layout, tensors, self._z, strict=True):
            payload, decoded = self._feedback.compress(self._codec, name, t - z)
            entries.append(TensorEntry(name, shape, DType.FLOAT32, self._codec.tag, payload))
            own.append(decoded)
        self._pending["<self>"] = own
        return tuple(entries)

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Hold a peer's decoded update D(q_j) until :meth:`mix` adds it.

        Raises
        ------
        WireError
            If ``sender`` is not a peer, the layout differs, or an update of ``sender``
            is already held (a second message before the mix).
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        decoded = decode_entries(sender, tensors, self._layout, self.peers)
        if sender in self._pending:
            raise WireError(f"a second update from {sender!r} before the round's mix")
        self._pending[sender] = decoded

    def mix(
        self, x: Mapping[str, np.ndarray], answered: Collection[str] = ()
    ) -> dict[str, np.ndarray]:
        """Add the held updates to z (Eq. 2) and return the new z (float32 copies).

        Updates are summed in sorted sender order (own update at ``self_id``'s place),
        in float64. ``answered`` is accepted for the engine's interface; every held
        update is applied, a peer whose update has not arrived is applied when it does.

        Raises
        ------
        ConfigError
            If ``x`` does not match the layout or :meth:`outgoing` was not called.

        """
        check_model(x, self._layout)
        if "<self>" not in self._pending:
            raise ConfigError("mix before outgoing: this round's own update is missing")
        order = sorted(self._pending, key=lambda p: self._self_id if p == "<self>" else p)
        for t in range(len(self._z)):
            acc = np.zeros(self._z[t].shape, dtype=np.float64)
            for peer in order:
                acc += self._weights[peer] * self._pending[peer][t].astype(np.float64)
            self._z[t] = (self._z[t].astype(np.float64) + acc).astype(np.float32)
        self._pending.clear()
        return self.shared_model()

    def has_state(self, peer: str) -> bool:
        """Whether ``peer`` is one of the averaged devices."""
        return peer in self._weights and peer != "<self>"

    def keyframe(self, x: Mapping[str, np.ndarray]) -> tuple[TensorEntry, ...]:
        """Return z losslessly (a repair for a peer that lost a message); ``x`` is checked."""
        check_model(x, self._layout)
        return identity_entries(self._z, self._layout)

    def incoming_keyframe(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Take a peer's z (after a gap): z := keyframe, held updates dropped."""
        decoded = decode_entries(sender, tensors, self._layout, self.peers)
        self._z = [np.array(a, dtype=np.float32) for a in decoded]
        self._pending.clear()

    def forget(self, peer: str) -> None:
        """Drop a held update of ``peer`` (it will be repaired by a keyframe)."""
        self._pending.pop(peer, None)
