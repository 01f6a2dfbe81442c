"""The gossip round engine of one device in one job.

Each round the device publishes its message (CHOCO-SGD's compressed difference or
D-PSGD's model) once on its own delta topic — the broker fans it out to every
subscriber — then waits for its neighbours' messages and takes the consensus step:

- **sync** (default): until ``quorum_size(d, quorum)`` of its d neighbours answered this
  round (all of them with quorum 1), the rest were reported offline by their status
  topic (Last Will), or the round deadline passed. A neighbour that missed the previous
  round and sent nothing else during it is *suspected*: its message is taken if already
  there but not waited for, so one hung device costs its neighbours one deadline, not
  one per round (a neighbour that is merely behind, whose older messages still arrive,
  is waited for: otherwise this device would run ahead of it unmixed).
- **async** (AD-PSGD, Lian et al., ICML 2018, with bounded staleness τ as in Hop, Luo et
  al., ASPLOS 2019): never for this round's messages — only until every neighbour's
  latest message is at most τ rounds old; it mixes whatever each neighbour last sent.

Delivery is at least once (MQTT QoS 1, persistent sessions); the engine applies each
message exactly once by ``(sender, sequence)``. Messages for a future round are held
until the device reaches it; a CHOCO difference that arrives late is still applied
(replica updates are additive) unless a keyframe applied since already holds it, a D-PSGD
model older than the one held is dropped. A message lost in spite of QoS 1 (the broker
acknowledged it and then dropped it) is asked for again while the round waits, and the
sender re-sends it from its :class:`~edge_agent.outbox.Outbox` on the receiver's inbox
topic (negative acknowledgements; :mod:`edge_agent.outbox`).

**Keyframes.** A CHOCO replica needs every difference of its peer since a known state.
A device that lacks one — a neighbour new to it after a topology change, a joiner, a
gap in a peer's sequence numbers — lists the peer under ``need`` in its retained status;
a device that sees its id there sends its next message as a lossless KEYFRAME (x̂_i :=
x_i), which sets every receiver's replica. Peers awaiting a keyframe without a replica
are not waited for. A difference that overtook its predecessor is held for it
(:mod:`edge_agent.inbox`): its sender answered the round and is mixed with its replica as
of the message before the missing one (a stale replica, as in the async mode).

**Topology versions.** :meth:`set_peers` tracks the peers of a new version (subscribing
to their topics); :meth:`exchange` takes this round's row of W, so time-varying graphs
and version switches are a matter of the caller. Control-topic messages for this job
are collected in :attr:`control` for the job runner.

**Signed deltas.** With a ``signer`` every envelope this device publishes carries its
Ed25519 signature; with a ``verifier`` neighbours' envelopes are checked before use
(:mod:`edge_agent.inbox`, ``docs/security.md``). Both default to ``None``: no signing.

Malformed bytes are counted and dropped: nothing a neighbour sends can stop the engine.
The engine runs on the agent's main thread; the transport's network thread only puts
``(topic, payload)`` pairs on a queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import numpy as np

from edge_agent.inbox import EngineStats, Inbox
from edge_agent.outage import OutageWatch
from edge_agent.outbox import KEEP_ROUNDS, Outbox
from edge_agent.sender import Sender
from edge_agent.signing import Verifier
from edge_agent.transport.base import Transport
from meshfl.aggregation import GossipAlgorithm
from meshfl.contract import RoundLedger
from meshfl.errors import ConfigError
from meshfl.planning import quorum_size
from meshfl.wire import (
    DEFAULT_MAX_PAYLOAD,
    MessageKind,
    control_topic,
    delta_topic,
    inbox_filter,
    status_topic,
)
from meshfl.wire.serde import Sign
from meshfl.wire.status import encode_status

__all__ = ["EngineStats", "GossipEngine"]

log = logging.getLogger("meshfl.agent.engine")

Params = Mapping[str, np.ndarray]
MODES = ("sync", "async")
WILL_SETTLE_S = 1.0
"""Least (and default) ``offline_grace_s``: seconds a neighbour's "offline" status waits
before a round stops waiting for it. A broker that stops cleanly publishes every
client's Last Will just before it closes the connections: the marks that came in the
second before this device's own connection dropped are the broker's doing, not the
neighbours' (ignored after the reconnect)."""


class GossipEngine(Inbox):
    """Exchange messages with neighbours, round by round, for one job.

    Parameters
    ----------
    transport
        A connected :class:`~edge_agent.transport.base.Transport`.
    fleet, job_id, device_id
        Identify this device's messages; messages of other fleets or jobs are ignored.
    neighbours
        Device ids of the peers to track at start: the neighbours of the first topology
        version (for a time-varying graph, the union of its rounds' neighbours).
    algorithm
        The gossip algorithm holding the replicas (:class:`~meshfl.aggregation.ChocoGossip`
        or :class:`~meshfl.aggregation.CompressedDPSGD`).
    deadline_s
        Seconds a round waits for neighbours after this device published (default 30).
    max_payload
        Maximum MQTT payload in bytes; messages are chunked under it, or under the
        broker's limit where that is smaller (``Transport.chunk_size``; default 128 KiB).
    mode
        ``"sync"`` (default) or ``"async"`` (see the module docstring).
    staleness
        τ of the async mode: the oldest usable neighbour message is ``round − τ``
        (default 2; 0 makes async wait like sync).
    quorum
        Fraction of neighbours a sync round waits for, in (0, 1] (default 1: all).
    signer
        Signs every envelope this device publishes (``sign(bytes) -> 64 bytes``, e.g.
        :class:`~edge_agent.signing.Signer`); ``None`` (default): unsigned.
    verifier
        Verifies neighbours' envelopes (:class:`~edge_agent.signing.Verifier`); ``None``
        (default): nothing is verified.
    first_sequence
        Sequence number of the last message this device published in the job before
        this engine (default 0: none; the first message is 1). A device resumed from a
        checkpoint (:mod:`edge_agent.checkpoint`) passes one above anything it may have
        published; its first message is then a KEYFRAME, since its neighbours' replicas
        of it may be ahead of its checkpoint.
    outbox_folder
        Keep the outbox on disk there too (:class:`~edge_agent.outbox.Outbox`'s
        ``folder``): loaded back when ``first_sequence`` > 0 (resumed), emptied
        otherwise. Default None: in memory only.
    offline_grace_s
        Seconds a round keeps waiting for a neighbour after its "offline" status (its
        Last Will: its connection dropped) before it mixes without it; the round
        deadline still bounds the wait (default and least :data:`WILL_SETTLE_S`, 1 s).
        Set it to a device's restart time to have a rebooting neighbour waited for
        instead of mixed without (``meshfl agent run --offline-grace``).

    Raises
    ------
    ConfigError
        An unknown mode, a negative staleness, a quorum outside (0, 1], a negative
        ``first_sequence`` or an ``offline_grace_s`` below 1 s.

    """

    def __init__(
        self,
        *,
        transport: Transport,
        fleet: str,
        job_id: str,
        device_id: str,
        neighbours: list[str],
        algorithm: GossipAlgorithm,
        deadline_s: float = 30.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        mode: str = "sync",
        staleness: int = 2,
        quorum: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        signer: Sign | None = None,
        verifier: Verifier | None = None,
        first_sequence: int = 0,
        outbox_folder: Path | None = None,
        offline_grace_s: float = WILL_SETTLE_S,
    ) -> None:
        if isinstance(offline_grace_s, bool) or not (
            isinstance(offline_grace_s, (int, float)) and offline_grace_s >= WILL_SETTLE_S
        ):
            raise ConfigError(
                f"offline_grace_s must be >= {WILL_SETTLE_S}, got {offline_grace_s!r}"
            )
        if isinstance(first_sequence, bool) or not isinstance(first_sequence, int):
            raise ConfigError(f"first_sequence must be an integer, got {first_sequence!r}")
        if first_sequence < 0:
            raise ConfigError(f"first_sequence must be >= 0, got {first_sequence}")
        if mode not in MODES:
            raise ConfigError(f"unknown gossip mode {mode!r}; use sync or async")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(f"staleness must be an integer >= 0, got {staleness!r}")
        if not (isinstance(quorum, (int, float)) and 0.0 < quorum <= 1.0):
            raise ConfigError(f"quorum must be in (0, 1], got {quorum!r}")
        super().__init__(
            fleet=fleet,
            job_id=job_id,
            device_id=device_id,
            peers=neighbours,
            algorithm=algorithm,
            deadline_s=deadline_s,
            clock=clock,
            verifier=verifier,
        )
        self.transport = transport
        self.deadline_s = deadline_s
        self.mode, self.staleness, self.quorum = mode, staleness, float(quorum)
        self.offline_grace_s = float(offline_grace_s)
        self._row: dict[str, float] | None = None  # this round's neighbours (row of W)
        self._keyframe_due = first_sequence > 0  # resumed: reset the neighbours' replicas
        self.outbox = Outbox(
            keep_rounds=max(KEEP_ROUNDS, staleness + 1),
            folder=outbox_folder,
            restore=first_sequence > 0,
        )
        self.sender = Sender(
            transport=transport,
            fleet=fleet,
            job_id=job_id,
            device_id=device_id,
            outbox=self.outbox,
            sequence=first_sequence,
            signer=signer,
            max_payload=max_payload,
            stats=self.stats,
            ledger=self.ledger,
            deadline_s=deadline_s,
            clock=clock,
        )
        self.outage = OutageWatch(transport, deadline_s, self._publish_status, clock)
        self._done_self = False  # announced done (linger)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the peers' and control topics, then announce readiness.

        The retained status ``{"state": "online", "job": JOB}`` is published only after
        the broker acknowledged every subscription, so a neighbour that waits for it
        (:meth:`wait_ready`) before its first round cannot publish into the void.
        """
        self.transport.set_handler(self._on_message)
        self.transport.subscribe(control_topic(self.fleet), qos=1)
        self.transport.subscribe(inbox_filter(self.fleet, self.device_id), qos=1)
        for n in sorted(self.peers):
            self._subscribe(n)
        self._started = True
        self.outage.started()
        self._publish_status()

    def _subscribe(self, peer: str) -> None:
        self.transport.subscribe(delta_topic(self.fleet, peer), qos=1)
        self.transport.subscribe(status_topic(self.fleet, peer), qos=1)

    def _publish_status(self) -> None:
        self.transport.publish(
            status_topic(self.fleet, self.device_id),
            encode_status("online", self.job_id, self._round, self._need, self._done_self),
            qos=1,
            retain=True,
        )

    def linger(self, timeout_s: float) -> None:
        """After this device's last round: answer repair requests until the neighbours are done.

        The last message has no later round in which a lost copy would be asked for again,
        so the device announces ``done`` (its status) and keeps handling its inbox —
        repair requests included (:mod:`edge_agent.outbox`) — until every neighbour is
        done, has left or is offline, or ``timeout_s`` seconds passed (the job uses the
        round deadline: no neighbour waits longer for the message).
        """
        self._done_self = True
        self._publish_status()
        end = self.clock() + timeout_s
        while not self.peers <= self._done | self._offline:
            if not self._wait_one(end):
                log.debug("linger: %s not done", sorted(self.peers - self._done - self._offline))
                return

    def leave(self) -> None:
        """Announce that this device left the job (finished, stopped or failed)."""
        self.transport.publish(
            status_topic(self.fleet, self.device_id), encode_status("online"), qos=1, retain=True
        )

    def set_peers(self, peers: Collection[str], need: Collection[str] = ()) -> None:
        """Track ``peers`` (a new topology version) and ask ``need`` for keyframes.

        New peers' topics are subscribed; a peer no longer listed is ignored from now on.
        ``need`` (peers new to this device, whose replica it lacks) is published in the
        retained status so that each of them answers with a keyframe.
        """
        fresh = sorted(set(peers) - self.peers)
        for peer in fresh:
            self._applied.setdefault(peer, set())
            if self._started:
                self._subscribe(peer)
        self.ledger.track(fresh)
        self.ledger.untrack(self.peers - set(peers))
        self.outbox.forget(self.peers - set(peers))
        for peer in self.peers - set(peers):
            self._early.pop(peer, None)
        self.peers = set(peers)
        self.request_keyframes(need)

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Wait until every peer announced this job or is offline (the start barrier).

        Returns the sorted ids of peers that were not ready after ``timeout_s`` seconds;
        the job proceeds without waiting for them.
        """
        deadline = self.clock() + timeout_s
        while not all(n in self._ready or n in self._offline for n in self.peers):
            if not self._wait_one(deadline):
                break
        return sorted(self.peers - self._ready - self._offline)

    # -- one round --------------------------------------------------------------------

    def exchange(
        self,
        round_: int,
        x: Params,
        weights: Mapping[str, float] | None = None,
        self_weight: float | None = None,
        no_wait: Collection[str] = (),
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Publish this round's message, gather the neighbours', take the consensus step.

        Parameters
        ----------
        round_
            The round number (1-based; rounds may be skipped in async mode).
        x
            This device's model after local training (name → float32 array).
        weights, self_weight
            This round's row of W (neighbour id → w_ij, and w_ii); ``None``: keep the
            row in use. Every neighbour must be a tracked peer.
        no_wait
            Neighbours behind slow links (the planner's ``no_wait``): never waited for,
            mixed with their latest state if it is at most ``staleness`` rounds old.

        Returns
        -------
        (params, missing)
            The model after the consensus step, and the sorted ids of neighbours that
            were not mixed this round (no message in time, or no keyframe yet).

        """
        if weights is not None:
            unknown = sorted(set(weights) - self.peers)
            if unknown:
                raise ConfigError(f"neighbours {unknown} are not tracked; call set_peers first")
            self.algorithm.set_neighbours(
                weights, 1.0 if self_weight is None else self_weight, listen=self.peers
            )
            self._row = dict(weights)
        row = set(self._current_row())
        if self._round == 0 and round_ > 1:  # a device that starts late (joined, resumed)
            self.ledger.from_first_seen(self.peers)
            for peer in self.peers:  # sequence numbers from the first that arrives
                if not self._applied.get(peer):
                    self._last_seq.pop(peer, None)
        self._round = round_
        self.drain()
        self._publish(round_, x)
        for r in sorted(k for k in self._held if k <= round_):
            for env in self._held.pop(r):
                self._apply(env)
        published = self.clock()
        deadline = published + self.deadline_s
        slow = set(no_wait) & row
        deadline = self.outage.deadline(deadline, published)
        while not self._round_complete(round_, row - slow):
            self.sender.request(  # no keyframe request: the status topic repairs those
                round_,
                sorted(row - slow - self._offline - self._need - self._suspected),
                answered=self._answered.get(round_, set()),
                early=self._early,
                last_sequence=self._last_seq,
                published=published,
            )
            if self._keyframe_due:  # a neighbour asked for one meanwhile (resumed, joined)
                self._publish(round_, x)
            deadline = self.outage.deadline(deadline, published)
            if not self._wait_one(deadline):
                break
        self.drain()
        answered = self._answered.pop(round_, set())
        for r in [k for k in self._answered if k < round_]:
            del self._answered[r]
        if self.mode == "async":
            mixed = {p for p in row if self._fresh(p, round_)}
        else:
            mixed = {p for p in answered & row if self.algorithm.has_state(p)}
            mixed |= {p for p in slow - self._offline if self._fresh(p, round_)}
            # Suspected: nothing at all came this round (a peer merely behind is not).
            self._suspected = (row - answered) - self._unknown() - slow - self._heard
        self._heard = set()
        missing = sorted(row - mixed)
        if missing:
            log.debug("round %d: mixing without %s", round_, ", ".join(missing))
        return self.algorithm.mix(x, mixed), missing

    @property
    def sequence(self) -> int:
        """Sequence number of the latest message published (``first_sequence``: none yet)."""
        return self.sender.sequence

    def frontier(self) -> int:
        """The latest round any current neighbour has sent (0: none yet)."""
        return max((self._latest_round.get(p, 0) for p in self._current_row()), default=0)

    def catch_up(self, timeout_s: float) -> tuple[int, dict[str, np.ndarray]] | None:
        """A joiner's first step: ask every neighbour for a keyframe and adopt their mean.

        Waits until every live neighbour's keyframe (CHOCO) or model (D-PSGD) arrived or
        ``timeout_s`` passed. Returns ``(round, model)`` — the latest round the keyframes
        came from and their mean — or ``None`` when none arrived; this device's next
        message is then a keyframe so that its neighbours can mix it.
        """
        row = set(self._current_row())
        self.ledger.from_first_seen(self.peers)  # earlier messages were not for this device
        self.request_keyframes(row)
        self._catching_up = True  # take keyframes of any round now: they set the start
        deadline = self.clock() + timeout_s
        while any(
            not self.algorithm.has_state(p) and p not in self._offline for p in row
        ) and self._wait_one(deadline):
            pass
        self.drain()
        self._catching_up = False
        self._keyframe_due = True
        have = sorted(p for p in row if self.algorithm.has_state(p))
        if not have:
            return None
        return max(self._latest_round.get(p, 0) for p in have), self.algorithm.mean_of(have)

    def take_ledger(self, *, final: bool = False) -> RoundLedger:
        """The delivery ledger since the previous call (:mod:`edge_agent.ledger`).

        ``final``: this device's last round of the job; unrepaired messages become lost.
        """
        stats = self.stats
        counts = {
            "applied": stats.applied,
            "stale": stats.stale,
            "duplicates": self.duplicates,
            "unsigned": stats.unsigned,
            "bad_signature": stats.bad_signature,
            "replayed": stats.replayed,
            "sequence": self.sender.sequence,
        }
        return self.ledger.take_round(counts, final=final)

    def _current_row(self) -> dict[str, float]:
        if self._row is None:
            self._row = {p: 1.0 for p in self.peers}
        return self._row

    def _publish(self, round_: int, x: Params) -> None:
        keyframe = self._keyframe_due
        self._keyframe_due = False
        if keyframe:
            tensors, kind = self.algorithm.keyframe(x), MessageKind.KEYFRAME
            self.stats.keyframes_sent += 1
        else:
            tensors, kind = self.algorithm.outgoing(x), MessageKind(self.algorithm.message_kind)
        self.sender.publish(round_, kind, tensors, self.peers - self._offline)

    def _on_repair_request(self, peer: str, after: int) -> None:
        self.sender.answer(peer, after)

    def _unknown(self) -> set[str]:
        """Peers awaiting a keyframe without any replica (not waited for, not suspected)."""
        return {p for p in self._need if not self.algorithm.has_state(p)}

    def _round_complete(self, round_: int, row: set[str]) -> bool:
        if not self.transport.connected:
            return False  # nothing can arrive: wait out the outage (OutageWatch.deadline)
        self.outage.notice()
        now = self.clock()
        settled = now - self.offline_grace_s
        offline = {p for p in self._offline if self._offline_at.get(p, -1e9) <= settled}
        suspected = self._suspected
        if self.outage.just_back(now):
            # Just back from an outage: the broker may still hold neighbours' Last Wills
            # from its own shutdown, and the outage made them miss a round, until they
            # reconnect and announce themselves again.
            offline, suspected = set(), set()
        waitable = row - offline - self._unknown()
        if self.mode == "async":
            return all(self._fresh(p, round_) for p in waitable)
        waitable -= suspected
        answered = self._answered.get(round_, set()) & row
        wanted = min(quorum_size(len(row), self.quorum), len(waitable))
        return len(answered) >= wanted and (wanted < len(waitable) or waitable <= answered)
