"""The receiving side of a device's gossip engine: what arrived, from whom, and for when.

:class:`Inbox` owns everything the engine learns from the broker — neighbours' messages
(reassembled, applied exactly once by ``(sender, sequence)``, held when they belong to a
future round), their statuses (online, offline, ready, the keyframes they ``need``) and
control-topic messages — and the requests for keyframes this device makes when it lacks
a replica. :class:`~edge_agent.engine.GossipEngine` adds publishing and rounds.

The device's own inbox topics (``.../node/{me}/inbox/{peer}``) carry the neighbours'
repair requests and the messages they re-send on this device's requests
(:mod:`edge_agent.outbox`); a re-sent message goes through the same reassembly, checks and
``(sender, sequence)`` bookkeeping as one from the delta topic.

The transport's network thread only puts ``(topic, payload)`` pairs on a queue; all
handling happens on the thread that calls :meth:`Inbox.drain` or the engine's waits.
Statuses, control messages and repair requests are decoded by :mod:`meshfl.wire`
(``status``, ``control``, ``repair``); whatever does not decode is rejected and counted.

**Bounds against hostile peers** (each refusal counted in the ledger's
``rejected_quota``): chunks are reassembled per ``(sender, topic, message id)``, within a
per-sender quota of partial messages and bytes (:class:`~meshfl.wire.Reassembler`); an
envelope more than :data:`~edge_agent.mailbox.MAX_ROUNDS_AHEAD` rounds ahead of this
device's round is refused, not held, and a sender may have at most
:data:`MAX_HELD_PER_SENDER` envelopes (:data:`MAX_HELD_BYTES_PER_SENDER` bytes) held for
future rounds; the receive queue is bounded (:mod:`edge_agent.mailbox`). Envelopes of
past rounds are never held (applied at once, or dropped), so they need no bound.

**Signed deltas.** With a :class:`~edge_agent.signing.Verifier` (a ``signed_deltas`` job),
every envelope of this job is verified before anything else reads it: unsigned ones are
counted in ``unsigned``, ones whose signature does not verify with the sender's
registered key (or whose sender has none) in ``bad_signature``, and validly signed ones
whose sequence number was already accepted from that sender or lies below its
anti-replay window (:class:`~edge_agent.signing.ReplayWindow`, RFC 4303 §3.4.3) — or,
from a sender not heard from before, whose round is older than this device can use — in
``replayed``. Each is dropped; the model never sees it. Without a verifier (unit tests on
the in-memory bus) nothing is checked and repeated sequence numbers count as duplicates.

**Order of CHOCO differences.** A replica x̂_j is a keyframe (or the shared start) plus
every difference after it, and differences add (x̂_j ← x̂_j + q_j; Koloskova et al.,
ICML 2019), so each one is applied exactly once, in any order — but a replica is mixed
only while it holds every difference up to the latest applied. A difference that
overtook a predecessor is held (at most ``REORDER_WINDOW`` sequence numbers ahead) and a
keyframe is requested at once; when the predecessor arrives late both are applied and the
request is withdrawn, and when the keyframe comes first it replaces what the replica
lacked: held differences it covers are dropped, later ones applied on top. A difference
that arrives after a keyframe with a higher sequence number is already in it: dropped
and counted ``stale``. A request whose keyframe does not come (the request or the
keyframe lost) is repeated once the peer's sequence numbers show it was passed over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from edge_agent.ledger import DeliveryLedger
from edge_agent.mailbox import MAX_ROUNDS_AHEAD, Mailbox
from edge_agent.signing import RejectLog, ReplayWindow, Verdict, Verifier
from meshfl.aggregation import GossipAlgorithm
from meshfl.errors import MeshflError, QuotaError
from meshfl.wire import Envelope, MessageKind, Reassembler, parse_topic
from meshfl.wire.control import ControlMessage, decode_control
from meshfl.wire.repair import decode_repair_request, is_repair_request
from meshfl.wire.serde import DecodedEnvelope, decode_envelope_signed
from meshfl.wire.status import decode_status

__all__ = ["EngineStats", "Inbox"]

log = logging.getLogger("meshfl.agent.engine")

FIRST_CONTACT_ROUNDS = 2
"""Rounds beyond ``staleness`` a first message from a sender may lag this device's round
(older: dropped as stale; later messages are held to their sequence numbers)."""

REORDER_WINDOW = 64
"""Sequence numbers a CHOCO difference may run ahead of its replica and still be held for
its late predecessors (further: the replica is dropped and resynced from a keyframe)."""

MAX_HELD_PER_SENDER = 2 * MAX_ROUNDS_AHEAD
"""Most envelopes of one sender held for this device's future rounds."""
MAX_HELD_BYTES_PER_SENDER = 128 * 2**20
"""Most tensor bytes of one sender held for future rounds (its first one always fits)."""


@dataclass
class EngineStats:
    """Counters of what the engine did with incoming messages."""

    applied: int = 0
    duplicates: int = 0
    stale: int = 0  # a D-PSGD model older than held, a CHOCO difference a keyframe covers
    rejected: int = 0
    late: int = 0
    foreign: int = 0
    keyframes_received: int = 0
    keyframes_sent: int = 0
    awaiting_keyframe: int = 0  # differences dropped because their replica was unknown
    gaps: int = 0  # sequence gaps that made a keyframe request (some filled late)
    unsigned: int = 0  # signed job: envelopes without a signature
    bad_signature: int = 0  # signed job: signature invalid, or the sender has no key
    replayed: int = 0  # signed job: a (sender, sequence) or round already used up
    repairs_requested: int = 0  # repair requests this device sent (edge_agent.outbox)
    resent: int = 0  # messages this device re-sent on neighbours' repair requests
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
        self._window = ReplayWindow()  # signed job: sequence numbers accepted per sender
        self.control: list[ControlMessage] = []
        self._reassembler = Reassembler(timeout_s=max(60.0, 4 * deadline_s))
        self._applied: dict[str, set[int]] = {n: set() for n in self.peers}
        # CHOCO: the sequence number up to which a replica holds every message (0: the
        # shared start), the differences held behind a missing one, and the highest
        # sequence number seen when a keyframe was requested (see the module docstring).
        self._last_seq: dict[str, int] = {p: 0 for p in self.peers if algorithm.has_state(p)}
        self._early: dict[str, dict[int, Envelope]] = {}
        self._asked: dict[str, int] = {}
        self._answered: dict[int, set[str]] = {}
        self._held: dict[int, list[Envelope]] = {}
        self._latest_round: dict[str, int] = {}
        self._offline: set[str] = set()
        self._offline_at: dict[str, float] = {}  # peer → clock() of its "offline" status
        self._suspected: set[str] = set()
        self._heard: set[str] = set()  # peers with a new message since the last round ended
        self._ready: set[str] = set()
        self._done: set[str] = set()  # peers that mixed their last round (status "done")
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
        """Ask ``peers`` (tracked ones) for a keyframe through the retained status.

        Their replicas are dropped: nothing of them is mixed before the keyframe.
        """
        wanted = {p for p in peers if p in self.peers} - self._need
        if not wanted:
            return
        for peer in wanted:
            self._forget(peer)
        self._need |= wanted
        if self._started:
            self._publish_status()

    def _forget(self, peer: str) -> None:
        self.algorithm.forget(peer)
        self._last_seq.pop(peer, None)
        self._early.pop(peer, None)  # the ledger keeps them as awaiting a keyframe

    def _ask(self, peer: str, sequence: int) -> None:
        """Request ``peer``'s keyframe after its ``sequence`` (again, if one is overdue).

        A keyframe answers within two messages of the request (the peer may have sent
        one before it saw the request); a later difference means the request or the
        keyframe was lost, and the request is published again.
        """
        asked = self._asked.get(peer)
        if peer in self._need:
            if asked is None:  # asked without a sequence number (a new peer, a joiner)
                self._asked[peer] = sequence
            if asked is None or sequence <= asked + 1:
                return
            log.info("no keyframe from %s after %d: asking again", peer, asked)
        self._asked[peer] = sequence
        self._need.add(peer)
        if self._started:
            self._publish_status()

    def _withdraw(self, peer: str) -> None:
        """The replica of ``peer`` is whole again without a keyframe: stop asking."""
        self._asked.pop(peer, None)
        if peer in self._need and self.algorithm.has_state(peer):
            self._need.discard(peer)
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
                message = self._reassembler.feed(payload, info.device or "", topic)
                if message is not None:
                    self._on_envelope(info.device, decode_envelope_signed(message), topic)
            elif info.kind == "inbox" and info.device == self.device_id:
                self._on_inbox(info.peer, topic, payload)
        except QuotaError as exc:
            self.ledger.counts.rejected_quota += 1
            self._reject(f"refused a message on {topic}: {exc}")
        except MeshflError as exc:
            if kind in ("delta", "inbox"):  # a chunk or envelope that did not decode
                self.ledger.counts.rejected_malformed += 1
            self._reject(f"dropped a message on {topic}: {exc}")

    def _on_handler_error(self, topic: str, exc: Exception) -> None:
        self.ledger.counts.rejected_malformed += 1
        super()._on_handler_error(topic, exc)

    def _on_queue_full(self, dropped: int) -> None:
        self.ledger.counts.rejected_quota += dropped
        super()._on_queue_full(dropped)

    def _on_inbox(self, peer: str | None, topic: str, payload: bytes) -> None:
        """A neighbour's repair request, or its message re-sent on request (the outbox)."""
        if is_repair_request(payload):
            request = decode_repair_request(payload)
            if request.job == self.job_id and peer in self.peers:
                self._on_repair_request(peer, request.after)
            else:
                self.stats.foreign += 1
            return
        message = self._reassembler.feed(payload, peer or "", topic)
        if message is not None:
            self._on_envelope(peer, decode_envelope_signed(message), topic)

    def _on_repair_request(self, peer: str, after: int) -> None:
        """Re-send ``peer`` this device's kept messages after ``after`` (the engine does)."""
        raise NotImplementedError

    def _on_control(self, payload: bytes) -> None:
        if not payload:  # a deleted retained message
            return
        message = decode_control(payload)  # PayloadError: rejected and counted
        if message.job == self.job_id:
            self.control.append(message)

    def _on_status(self, device: str | None, payload: bytes) -> None:
        if device is None or device not in self._applied:
            return
        # An empty payload only deletes a retained status: it says nothing about liveness.
        # Anything that is not a status raises PayloadError: rejected and counted.
        status = decode_status(payload)
        if status is None:
            return
        state, job, need = status.state, status.job, status.need
        if state == "offline" or (state == "declined" and job == self.job_id):
            self._offline.add(device)
            if state == "offline":  # a Last Will, perhaps a stopping broker's (engine)
                self._offline_at[device] = self.clock()
        elif state == "online" and job == self.job_id:
            self._offline.discard(device)
            self._ready.add(device)
            if status.done:
                self._done.add(device)
            if self.device_id in need and device in self.peers:
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
            self._refusals(self.stats, verdict, env.sender, env.round, topic)
            return
        if env.sender != topic_device or env.sender not in self._applied:
            self.ledger.counts.rejected_other += 1
            self._reject(f"dropped a message from {env.sender!r} on {topic_device!r}'s topic")
            return
        early_keyframe = self._round == 0 and env.kind == MessageKind.KEYFRAME
        hold = env.round > self._round and not (self._catching_up or early_keyframe)
        if self._round > 0 and env.round > self._round + MAX_ROUNDS_AHEAD:
            self._refuse_quota(env, f"round {env.round} is past this device's window")
            return
        if hold and self._over_held_quota(env):
            return
        if self.verifier is not None and self._stale_first_contact(env):
            self.stats.stale += 1  # too old to use (a replayed one would be refused alike)
            log.info("dropped %s's round %d: too old for a first message", env.sender, env.round)
            return
        seen = self._applied[env.sender]
        resent = env.sequence in seen and not topic.endswith("/delta")  # a repair crossed it
        if self.verifier and not (resent or self._window.accept(env.sender, env.sequence)):
            self._refusals(self.stats, Verdict.REPLAYED, env.sender, env.round, topic)
            return
        if env.sequence in seen:
            self.stats.duplicates += 1
            return
        seen.add(env.sequence)
        self._heard.add(env.sender)
        if env.sender in self.peers:
            self.ledger.arrived(env.sender, env.sequence)
        if hold:
            # A message of a later round waits for it; a keyframe before this device's
            # first round (asked for by a resumed or joining device) is its start state.
            self._held.setdefault(env.round, []).append(env)
        else:
            self._apply(env)

    def _over_held_quota(self, env: Envelope) -> bool:
        """Refuse ``env`` (True) if holding it takes its sender past its held quota."""
        mine = [e for held in self._held.values() for e in held if e.sender == env.sender]
        size = sum(_size(e) for e in mine)
        if mine and (
            len(mine) >= MAX_HELD_PER_SENDER or size + _size(env) > MAX_HELD_BYTES_PER_SENDER
        ):
            self._refuse_quota(env, f"{len(mine)} messages of {size} bytes already held")
            return True
        return False

    def _refuse_quota(self, env: Envelope, why: str) -> None:
        self.ledger.counts.rejected_quota += 1
        self._reject(f"refused {env.sender}'s round {env.round} message: {why}")

    def _stale_first_contact(self, env: Envelope) -> bool:
        """A validly signed first message of a sender, older than this device can use.

        Its sequence number says nothing yet (the sender's anti-replay window starts with
        it), so its round does: a new neighbour's catch-up rounds, or a replay.
        """
        return not self._window.knows(env.sender) and (
            env.round + self.staleness + FIRST_CONTACT_ROUNDS < self._round
        )

    def _apply(self, env: Envelope) -> None:
        sender = env.sender
        if sender not in self.peers:
            self.stats.foreign += 1  # a former peer of an older topology version
            self.ledger.counts.rejected_other += 1
            return
        if env.kind == MessageKind.DELTA:
            self._difference(env)
            return
        if self._outdated(env):
            self.stats.stale += 1
            return
        if self._use(env) and env.kind == MessageKind.KEYFRAME:
            # It replaces the replica: held differences it covers are in it (the ledger
            # counts them recovered), later ones apply on top.
            early = self._early.get(sender, {})
            for sequence in [s for s in early if s <= env.sequence]:
                del early[sequence]
            self._release(sender)

    def _outdated(self, env: Envelope) -> bool:
        """A D-PSGD model older than the one held, or a keyframe older than the replica."""
        sender = env.sender
        if env.kind == MessageKind.MODEL:
            return env.round < self._latest_round.get(sender, 0)
        last = self._last_seq.get(sender)
        return last is not None and env.sequence <= last and self.algorithm.has_state(sender)

    def _use(self, env: Envelope) -> bool:
        """Give ``env`` to the algorithm and book it; False if its tensors were refused."""
        sender = env.sender
        try:
            if env.kind == MessageKind.KEYFRAME:
                self.algorithm.incoming_keyframe(sender, env.tensors)
                self.stats.keyframes_received += 1
            else:
                self.algorithm.incoming(sender, env.tensors)
        except MeshflError as exc:
            self.ledger.counts.rejected_other += 1
            self._reject(f"dropped {sender}'s round {env.round} message: {exc}")
            return False
        self.ledger.applied(sender, env.sequence, full_state=env.kind != MessageKind.DELTA)
        self._last_seq[sender] = max(env.sequence, self._last_seq.get(sender, 0))
        self._latest_round[sender] = max(env.round, self._latest_round.get(sender, 0))
        self._suspected.discard(sender)
        self.stats.applied += 1
        if env.round < self._round:
            self.stats.late += 1
        else:
            self._answered.setdefault(env.round, set()).add(sender)
        if sender in self._need and env.kind != MessageKind.DELTA:
            self._need.discard(sender)
            self._asked.pop(sender, None)
            self._publish_status()
        return True

    def _difference(self, env: Envelope) -> None:
        """Apply a CHOCO difference in sequence, hold it for a late predecessor, or drop it."""
        sender, sequence = env.sender, env.sequence
        if not self.algorithm.has_state(sender):
            self.stats.awaiting_keyframe += 1
            self.ledger.unusable(sender, sequence)
            self._ask(sender, sequence)
            return
        last = self._last_seq.get(sender)
        if last is None or sequence == last + 1:  # None: counted from the first that came
            if self._use(env):
                self._release(sender)
            return
        if sequence <= last:  # older than a keyframe applied since, which holds it
            self.stats.stale += 1
            return
        if sequence - last > REORDER_WINDOW:
            self.stats.gaps += 1
            log.warning(
                "gap in %s's messages (%d after %d): asking for a keyframe", sender, sequence, last
            )
            self.ledger.unusable(sender, sequence)
            self._forget(sender)
            self._ask(sender, sequence)
            return
        early = self._early.setdefault(sender, {})
        if not early:
            self.stats.gaps += 1
            log.info("gap in %s's messages (%d after %d): holding it", sender, sequence, last)
        early[sequence] = env
        self.ledger.unusable(sender, sequence)
        if env.round >= self._round:  # it answered: mixed with its replica so far
            self._answered.setdefault(env.round, set()).add(sender)
        self._ask(sender, sequence)

    def _release(self, sender: str) -> None:
        """Apply the held differences that now continue the replica of ``sender``."""
        early = self._early.get(sender)
        while early:
            env = early.pop(self._last_seq[sender] + 1, None)
            if env is None or not self._use(env):
                return  # still a hole: the keyframe requested repairs it
        self._early.pop(sender, None)
        self._withdraw(sender)


def _size(env: Envelope) -> int:
    """Tensor payload bytes of ``env``."""
    return sum(len(t.payload) for t in env.tensors)
