"""The receiving side of a device's gossip engine: what arrived, from whom, and for when.

:class:`Inbox` owns everything the engine learns from the broker — neighbours' messages
(reassembled, applied exactly once by ``(sender, sequence)``, held when they belong to a
future round), their statuses (online, offline, ready, the keyframes they ``need``) and
control-topic messages — and the requests for keyframes this device makes when it lacks
a replica. :class:`~edge_agent.engine.GossipEngine` adds publishing and rounds.

The transport's network thread only puts ``(topic, payload)`` pairs on a queue; all
handling happens on the thread that calls :meth:`Inbox.drain` or the engine's waits.

**Signed deltas.** With a :class:`~edge_agent.signing.Verifier` (a ``signed_deltas`` job),
every envelope of this job is verified before anything else reads it: unsigned ones are
counted in ``unsigned``, ones whose signature does not verify with the sender's
registered key (or whose sender has none) in ``bad_signature``, and validly signed ones
whose sequence number is at or below the highest already accepted from that sender — or,
from a sender not heard from before, whose round is older than this device can use — in
``replayed``. Each is dropped; the model never sees it. Without a verifier (unit tests on
the in-memory bus) nothing is checked and repeated sequence numbers count as duplicates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from edge_agent.ledger import DeliveryLedger
from edge_agent.mailbox import Mailbox
from edge_agent.signing import RejectLog, Verdict, Verifier
from meshfl.aggregation import GossipAlgorithm
from meshfl.errors import MeshflError
from meshfl.wire import Envelope, MessageKind, Reassembler, parse_topic
from meshfl.wire.serde import DecodedEnvelope, decode_envelope_signed

__all__ = ["EngineStats", "Inbox"]

log = logging.getLogger("meshfl.agent.engine")

FIRST_CONTACT_ROUNDS = 2
"""Rounds beyond ``staleness`` a first message from a sender may lag this device's round
(older: refused as replayed; later messages are held to their sequence numbers)."""


@dataclass
class EngineStats:
    """Counters of what the engine did with incoming messages."""

    applied: int = 0
    duplicates: int = 0
    stale: int = 0
    rejected: int = 0
    late: int = 0
    foreign: int = 0
    keyframes_received: int = 0
    keyframes_sent: int = 0
    awaiting_keyframe: int = 0  # differences dropped because their replica was unknown
    gaps: int = 0  # sequence gaps that forced a keyframe request
    unsigned: int = 0  # signed job: envelopes without a signature
    bad_signature: int = 0  # signed job: signature invalid, or the sender has no key
    replayed: int = 0  # signed job: a (sender, sequence) or round already used up
    rejected_reasons: list[str] = field(default_factory=list)


class Inbox(Mailbox):
    """Receive state of one device in one job (see the module docstring).

    Parameters
    ----------
    fleet, job_id, device_id
        Identify this device's job; messages of other fleets or jobs are ignored.
    peers
        Device ids whose messages and statuses are tracked.
    algorithm
        The gossip algorithm that applies neighbours' messages.
    deadline_s
        The round deadline (seconds); chunk reassembly waits at least 4× as long.
    clock
        Monotonic clock (seconds).
    verifier
        Checks peers' signatures (a ``signed_deltas`` job); ``None`` (default): no
        checks (see the module docstring).

    """

    def __init__(
        self,
        *,
        fleet: str,
        job_id: str,
        device_id: str,
        peers: Collection[str],
        algorithm: GossipAlgorithm,
        deadline_s: float,
        clock: Callable[[], float],
        verifier: Verifier | None = None,
    ) -> None:
        self.fleet = fleet
        self.job_id = job_id
        self.device_id = device_id
        self.peers: set[str] = set(peers)
        self.algorithm = algorithm
        super().__init__(clock)
        self.stats = EngineStats()
        self.ledger = DeliveryLedger(self.peers)  # docs/reliability.md
        self.verifier = verifier
        self._refusals = RejectLog(log, clock=clock)
        self._high_seq: dict[str, int] = {}  # signed job: highest sequence accepted per sender
        self.control: list[dict[str, Any]] = []
        self._reassembler = Reassembler(timeout_s=max(60.0, 4 * deadline_s))
        self._applied: dict[str, set[int]] = {n: set() for n in self.peers}
        self._last_seq: dict[str, int] = {}
        self._answered: dict[int, set[str]] = {}
        self._held: dict[int, list[Envelope]] = {}
        self._latest_round: dict[str, int] = {}
        self._offline: set[str] = set()
        self._suspected: set[str] = set()
        self._ready: set[str] = set()
        self._need: set[str] = set()
        self._keyframe_due = False
        self._started = False
        self._catching_up = False
        self._round = 0
        self.staleness = 0

    def _publish_status(self) -> None:
        """Publish this device's retained status (the engine does)."""
        raise NotImplementedError

    @property
    def duplicates(self) -> int:
        """Duplicates dropped: repeated chunks and repeated ``(sender, sequence)`` messages."""
        return self.stats.duplicates + self._reassembler.stats.duplicates

    @property
    def need(self) -> frozenset[str]:
        """Peers whose keyframe this device is waiting for."""
        return frozenset(self._need)

    def request_keyframes(self, peers: Collection[str]) -> None:
        """Ask ``peers`` (tracked ones) for a keyframe through the retained status."""
        wanted = {p for p in peers if p in self.peers} - self._need
        if not wanted:
            return
        for peer in wanted:
            self.algorithm.forget(peer)
            self._last_seq.pop(peer, None)
        self._need |= wanted
        if self._started:
            self._publish_status()

    def drain(self) -> None:
        """Handle whatever already arrived without waiting (late messages, statuses)."""
        self._drain_queue()

    def _fresh(self, peer: str, round_: int) -> bool:
        return (
            self.algorithm.has_state(peer)
            and self._latest_round.get(peer, 0) >= round_ - self.staleness
        )

    def _handle(self, topic: str, payload: bytes) -> None:
        kind = None
        try:
            info = parse_topic(topic)
            kind = info.kind
            if info.kind == "status":
                self._on_status(info.device, payload)
            elif info.kind == "control":
                self._on_control(payload)
            elif info.kind == "delta":
                message = self._reassembler.feed(payload)
                if message is not None:
                    self._on_envelope(info.device, decode_envelope_signed(message), topic)
        except MeshflError as exc:
            if kind == "delta":  # a chunk or envelope that did not decode
                self.ledger.counts.rejected_malformed += 1
            self._reject(f"dropped a message on {topic}: {exc}")

    def _on_control(self, payload: bytes) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            if payload:
                self.stats.rejected += 1
            return
        if isinstance(message, dict) and message.get("job") == self.job_id:
            self.control.append(message)

    def _on_status(self, device: str | None, payload: bytes) -> None:
        if device is None or device not in self._applied:
            return
        # An empty payload only deletes a retained status: it says nothing about liveness.
        # Anything that is not a status object is ignored too (and counted).
        try:
            status = json.loads(payload)
            state, job = status.get("state"), status.get("job")
            need = status.get("need") or []
        except (ValueError, AttributeError):
            if payload:
                self.stats.rejected += 1
            return
        if state == "offline" or (state == "declined" and job == self.job_id):
            self._offline.add(device)
        elif state == "online" and job == self.job_id:
            self._offline.discard(device)
            self._ready.add(device)
            if isinstance(need, list) and self.device_id in need and device in self.peers:
                self._keyframe_due = True
        elif state == "online" and device in self._ready:
            self._offline.add(device)  # it was in this job and has left it (done or stopped)

    def _on_envelope(self, topic_device: str | None, decoded: DecodedEnvelope, topic: str) -> None:
        env = decoded.envelope
        if env.fleet != self.fleet or env.job != self.job_id:
            self.stats.foreign += 1
            return
        self.ledger.counts.delivered += 1
        verdict = None if self.verifier is None else self.verifier.verify(decoded)
        if verdict is not None:
            self._refuse(verdict, env, topic)
            return
        if env.sender != topic_device or env.sender not in self._applied:
            self.ledger.counts.rejected_other += 1
            self._reject(f"dropped a message from {env.sender!r} on {topic_device!r}'s topic")
            return
        if self.verifier is not None:
            if self._replayed(env):
                self._refuse(Verdict.REPLAYED, env, topic)
                return
            self._high_seq[env.sender] = env.sequence
        seen = self._applied[env.sender]
        if env.sequence in seen:
            self.stats.duplicates += 1
            return
        seen.add(env.sequence)
        if env.sender in self.peers:
            self.ledger.arrived(env.sender, env.sequence)
        if env.round > self._round and not self._catching_up:
            self._held.setdefault(env.round, []).append(env)
        else:
            self._apply(env)

    def _replayed(self, env: Envelope) -> bool:
        """A validly signed envelope this device must not use again (or cannot use)."""
        high = self._high_seq.get(env.sender)
        if high is not None:
            return env.sequence <= high
        return env.round + self.staleness + FIRST_CONTACT_ROUNDS < self._round

    def _refuse(self, verdict: Verdict, env: Envelope, topic: str) -> None:
        self._refusals(self.stats, verdict, env.sender, env.round, topic)

    def _apply(self, env: Envelope) -> None:
        sender = env.sender
        if sender not in self.peers:
            self.stats.foreign += 1  # a former peer of an older topology version
            self.ledger.counts.rejected_other += 1
            return
        if env.kind == MessageKind.MODEL and env.round < self._latest_round.get(sender, 0):
            self.stats.stale += 1
            return
        if env.kind == MessageKind.DELTA and not self._in_sequence(sender, env.sequence):
            return
        try:
            if env.kind == MessageKind.KEYFRAME:
                self.algorithm.incoming_keyframe(sender, env.tensors)
                self.stats.keyframes_received += 1
            else:
                self.algorithm.incoming(sender, env.tensors)
        except MeshflError as exc:
            self.ledger.counts.rejected_other += 1
            self._reject(f"dropped {sender}'s round {env.round} message: {exc}")
            return
        self.ledger.applied(sender, env.sequence, full_state=env.kind != MessageKind.DELTA)
        self._last_seq[sender] = env.sequence
        if sender in self._need and env.kind != MessageKind.DELTA:
            self._need.discard(sender)
            self._publish_status()
        self._latest_round[sender] = max(env.round, self._latest_round.get(sender, 0))
        self._suspected.discard(sender)
        self.stats.applied += 1
        if env.round < self._round:
            self.stats.late += 1
        else:
            self._answered.setdefault(env.round, set()).add(sender)

    def _in_sequence(self, sender: str, sequence: int) -> bool:
        """Whether a CHOCO difference continues the replica held of ``sender``."""
        if not self.algorithm.has_state(sender):
            self.stats.awaiting_keyframe += 1
            self.ledger.unusable(sender, sequence)
            self.request_keyframes([sender])
            return False
        last = self._last_seq.get(sender)
        if last is not None and sequence != last + 1:
            self.stats.gaps += 1
            log.warning(
                "gap in %s's messages (%d after %d): asking for a keyframe", sender, sequence, last
            )
            self.ledger.unusable(sender, sequence)
            self.request_keyframes([sender])
            return False
        return True
