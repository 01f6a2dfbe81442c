"""Randomized gossip: each round a fresh random set of s peers (Epidemic Learning).

de Vos, Farhadkhani, Guerraoui, Kermarrec, Pires, Sharma, "Epidemic Learning: Boosting
Decentralized Learning with Randomized Communication", NeurIPS 2023, Algorithm 1
(EL-Oracle: every node sends its model to s peers drawn uniformly at random each round;
a node averages its own model with the models it received, whatever their number)::

    S_i^t  ⊆ V − {i}, |S_i^t| = s, uniform, fresh every round            (send)
    R_i^t  = {j : i ∈ S_j^t}                                              (received)
    x_i ← x_i + γ / (1 + |R_i^t|) · Σ_{j ∈ R_i^t} (x̂_{j→i} − x_i)          (EL, Eq. 2)

γ = 1 with exact models is the paper's step ``(x_i + Σ_j x_j) / (1 + |R_i|)``.

**Compressed messages with exact replicas: one replica per directed edge.** A CHOCO
replica of j held by i is exact only if i applied *every* difference j sent; with a
fresh random receiver set, i hears j only in some rounds, so one broadcast-style replica
per sender would go stale. Here the replica lives on the edge: sender i keeps
x̂_{i→j}, receiver j keeps the same x̂_{i→j}, and both advance it by the decoded
difference q = C(x_i − x̂_{i→j}) *only when i sends to j*. Each edge's two copies apply
the same decoded bytes in the same order, so they are bit-identical at all times, for
every codec (biased, random or lossless) — a skipped round simply sends nothing on that
edge, and the next message carries everything since (CHOCO's difference is its own error
feedback). A lost message on an edge breaks only that edge; it is repaired by a lossless
keyframe on that edge. Messages are per-edge (the inbox topic ``node/{dst}/inbox/{src}``),
so upload is s messages a round, not one broadcast: at equal upload bytes a broadcast
over the complete graph mixes more (see ``docs/algorithms.md``). Replicas start at the
shared x⁰ (same model seed), so no keyframe is needed to start; memory is 2(n − 1)
model copies at most, created on first contact.

Pure peer sampling: :func:`sample_peers` draws from ``numpy.random.default_rng((seed,
index, round))``, so a lockstep run and a fleet draw the same peers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from meshfl.aggregation._model import check_model, decode_entries, layout_of
from meshfl.codecs import Codec
from meshfl.errors import ConfigError, WireError
from meshfl.wire import DType, TensorEntry

__all__ = ["EpidemicGossip", "sample_peers"]


def sample_peers(ids: Sequence[str], self_id: str, s: int, round_: int, seed: int) -> list[str]:
    """The s peers ``self_id`` sends to in ``round_``: uniform without replacement, sorted.

    Drawn from ``numpy.random.default_rng((seed, index of self_id, round_))``.

    Raises
    ------
    ConfigError
        If ``self_id`` is not in ``ids``, ids repeat, or s is not in [1, len(ids) − 1].

    """
    if self_id not in ids or len(set(ids)) != len(ids):
        raise ConfigError(f"ids must be distinct and hold {self_id!r}")
    others = [p for p in ids if p != self_id]
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= len(others):
        raise ConfigError(f"s (peers a round) must be an int in [1, {len(others)}], got {s!r}")
    rng = np.random.default_rng((int(seed), ids.index(self_id), int(round_)))
    chosen = rng.choice(len(others), size=s, replace=False)
    return sorted(others[int(k)] for k in chosen)


class EpidemicGossip:
    """One device's randomized-gossip state: per-edge replicas in and out.

    Parameters
    ----------
    params : Mapping[str, np.ndarray]
        The shared start x⁰ (float32) and the model layout.
    self_id : str
        This device's id, one of ``ids``.
    ids : Sequence[str]
        Every device of the job (the same list, in the same order, everywhere).
    peers : int
        s, receivers per round, in [1, len(ids) − 1].
    codec : Codec
        Compressor of the per-edge differences (identity: exact EL).
    consensus_step : float, default 1.0
        γ in (0, 1].
    seed : int, default 0
        Seed of :func:`sample_peers` (the job's seed).

    Raises
    ------
    ConfigError
        If s or γ is out of range, ``self_id`` is not in ``ids``, or the codec is not one.

    """

    message_kind: ClassVar[int] = 1  # meshfl.wire.MessageKind.DELTA, on the inbox topic
    __slots__ = (
        "_codec",
        "_gamma",
        "_ids",
        "_in",
        "_layout",
        "_out",
        "_received",
        "_s",
        "_seed",
        "_self",
        "_x0",
    )

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        self_id: str,
        ids: Sequence[str],
        peers: int,
        codec: Codec,
        consensus_step: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not isinstance(codec, Codec):
            raise ConfigError(f"codec must be a meshfl Codec, got {type(codec).__name__}")
        ok = not isinstance(consensus_step, bool) and isinstance(consensus_step, (int, float))
        if not (ok and 0.0 < consensus_step <= 1.0):
            raise ConfigError(f"consensus step γ must be in (0, 1], got {consensus_step!r}")
        self._ids = list(ids)
        sample_peers(self._ids, self_id, peers, 0, seed)  # validates ids, self_id and s
        self._self, self._s, self._seed = self_id, peers, int(seed)
        self._gamma = float(consensus_step)
        self._codec = codec
        self._layout = layout_of(params)
        self._x0 = [np.array(params[n], dtype=np.float32) for n, _ in self._layout]
        self._out: dict[str, list[np.ndarray]] = {}
        self._in: dict[str, list[np.ndarray]] = {}
        self._received: set[str] = set()

    def targets(self, round_: int) -> list[str]:
        """The peers this device sends to in ``round_`` (:func:`sample_peers`)."""
        return sample_peers(self._ids, self._self, self._s, round_, self._seed)

    def _replica(self, table: dict[str, list[np.ndarray]], peer: str) -> list[np.ndarray]:
        if peer not in table:
            table[peer] = [a.copy() for a in self._x0]
        return table[peer]

    def outgoing(
        self, x: Mapping[str, np.ndarray], round_: int
    ) -> dict[str, tuple[TensorEntry, ...]]:
        """Per target j: q = C(x − x̂_{i→j}), and x̂_{i→j} += D(q). Returns target → message.

        Raises
        ------
        ConfigError
            If ``x`` does not match the layout.
        CodecError
            If a difference holds NaN/inf; no replica has moved then.

        """
        tensors = check_model(x, self._layout)
        staged = []
        for peer in self.targets(round_):  # encode everything first: all or nothing
            replica = self._replica(self._out, peer)
            payloads = [self._codec.encode(t - r) for t, r in zip(tensors, replica, strict=True)]
            staged.append((peer, replica, payloads))
        out: dict[str, tuple[TensorEntry, ...]] = {}
        for peer, replica, payloads in staged:
            for r, payload, (_, shape) in zip(replica, payloads, self._layout, strict=True):
                r += self._codec.decode(payload, shape)
            out[peer] = tuple(
                TensorEntry(name, shape, DType.FLOAT32, self._codec.tag, payload)
                for (name, shape), payload in zip(self._layout, payloads, strict=True)
            )
        return out

    def incoming(self, sender: str, tensors: Sequence[TensorEntry]) -> None:
        """Apply an edge message: x̂_{j→i} += D(q); ``sender`` is mixed this round.

        Raises
        ------
        WireError
            If ``sender`` is not a device of the job (or is this one), a second message
            of ``sender`` arrives in one round, or the layout differs.
        CodecError
            If a payload does not decode. On any error the state is unchanged.

        """
        others = [p for p in self._ids if p != self._self]
        decoded = decode_entries(sender, tensors, self._layout, others)
        if sender in self._received:
            raise WireError(f"a second message from {sender!r} in one round")
        for r, q in zip(self._replica(self._in, sender), decoded, strict=True):
            r += q
        self._received.add(sender)

    def mix(self, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """EL's step over this round's received replicas (float64 sums, sorted order)."""
        tensors = check_model(x, self._layout)
        senders = sorted(self._received)
        scale = self._gamma / (1 + len(senders))
        out = {}
        for t, (name, _) in enumerate(self._layout):
            own = tensors[t].astype(np.float64)
            acc = np.zeros_like(own)
            for peer in senders:
                acc += self._in[peer][t].astype(np.float64) - own
            out[name] = (own + scale * acc).astype(np.float32)
        self._received.clear()
        return out

    def edge_replica(self, peer: str, direction: str) -> dict[str, np.ndarray]:
        """A copy of x̂_{self→peer} (``"out"``) or x̂_{peer→self} (``"in"``)."""
        table = self._out if direction == "out" else self._in
        replica = table.get(peer, self._x0)
        return {n: a.copy() for (n, _), a in zip(self._layout, replica, strict=True)}
