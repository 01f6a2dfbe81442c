"""The gossip engine's sending side: numbered, signed, chunked, kept, re-sent on request.

Each message gets the next sequence number, is signed (a ``signed_deltas`` job), cut
into chunks under the broker's payload limit and kept in the
:class:`~edge_agent.outbox.Outbox` for the neighbours that may ask for it again. A
message lost in spite of MQTT QoS 1 (the broker acknowledged it and then dropped it)
is asked for again while a sync round waits: the receiver publishes a repair request
(:func:`meshfl.wire.repair.encode_repair_request`: "your messages after sequence s") on
the sender's inbox topic, and the sender re-sends the messages it kept in its
:class:`~edge_agent.outbox.Outbox` on the receiver's inbox topic (negative
acknowledgements; ``docs/reliability.md``). :class:`Repairer` holds both sides' timing
for one :class:`~edge_agent.engine.GossipEngine`: :class:`Sender`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping

from edge_agent.inbox import EngineStats
from edge_agent.ledger import DeliveryLedger
from edge_agent.outbox import Outbox
from edge_agent.transport.base import Transport
from meshfl.wire import (
    Envelope,
    MessageKind,
    TensorEntry,
    delta_topic,
    inbox_topic,
    new_message_id,
    pack_message,
)
from meshfl.wire.repair import encode_repair_request
from meshfl.wire.serde import Sign

__all__ = ["MAX_ID_CHARS", "MAX_REPAIR_AFTER_S", "MIN_REPAIR_AFTER_S", "Sender"]

log = logging.getLogger("meshfl.agent.engine")

MIN_REPAIR_AFTER_S = 0.2
MAX_REPAIR_AFTER_S = 2.0
"""Bounds of ``repair_after_s`` (deadline / 8 between them)."""
MAX_ID_CHARS = 64
"""Longest device id (:func:`meshfl.wire.validate_id`)."""


class Sender:
    """Publish this device's messages; ask for overdue ones and answer such requests.

    Parameters
    ----------
    transport
        The engine's connected transport.
    fleet, job_id, device_id
        This device's job (topics and the request's job id).
    outbox
        The messages this device published and may re-send.
    sequence
        Sequence number of the last message published before (0: none).
    signer
        Signs every envelope (``sign(bytes) -> 64 bytes``); ``None``: unsigned.
    max_payload
        Maximum MQTT payload in bytes (the broker's limit where that is smaller).
    stats, ledger
        The engine's counters: ``repairs_requested``, ``resent`` and the ledger's
        ``sent`` and ``retransmitted`` are counted here.
    deadline_s
        The round deadline in seconds; ``repair_after_s`` is ``deadline_s / 8`` within
        [:data:`MIN_REPAIR_AFTER_S`, :data:`MAX_REPAIR_AFTER_S`].
    clock
        Monotonic clock (seconds).

    """

    def __init__(
        self,
        *,
        transport: Transport,
        fleet: str,
        job_id: str,
        device_id: str,
        outbox: Outbox,
        sequence: int,
        signer: Sign | None,
        max_payload: int,
        stats: EngineStats,
        ledger: DeliveryLedger,
        deadline_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.fleet, self.job_id, self.device_id = fleet, job_id, device_id
        self.outbox = outbox
        self.sequence = max(sequence, outbox.high)  # resumed: never a number twice
        """Sequence number of the latest message published."""
        self.signer, self.max_payload = signer, max_payload
        self.stats, self.ledger = stats, ledger
        self.clock = clock
        self.repair_after_s = min(max(deadline_s / 8, MIN_REPAIR_AFTER_S), MAX_REPAIR_AFTER_S)
        """Seconds a sync round waits for a neighbour's message before asking for it again."""
        self._next_repair: dict[str, float] = {}  # peer → earliest time of its next request
        self._served: dict[str, float] = {}  # peer → when its last request was answered
        self._longest_inbox = inbox_topic(fleet, "x" * MAX_ID_CHARS, device_id)

    def publish(
        self,
        round_: int,
        kind: MessageKind,
        tensors: tuple[TensorEntry, ...],
        receivers: Collection[str],
    ) -> None:
        """Publish one message of ``round_`` on this device's delta topic; keep it.

        It is kept in the outbox for ``receivers`` (the peers that may ask for it again),
        chunked for the longest topic it may travel on (a re-send: an inbox topic).
        """
        self.sequence += 1
        env = Envelope(
            kind=kind,
            fleet=self.fleet,
            job=self.job_id,
            round=round_,
            sender=self.device_id,
            message_id=new_message_id(),
            sequence=self.sequence,
            tensors=tensors,
        )
        topic = delta_topic(self.fleet, self.device_id)
        self.ledger.counts.sent += 1
        size = min(
            self.transport.chunk_size(topic, self.max_payload),
            self.transport.chunk_size(self._longest_inbox, self.max_payload),
        )
        chunks = pack_message(env, size, self.signer)
        self.outbox.add(self.sequence, round_, chunks, receivers)
        for chunk in chunks:
            self.transport.publish(topic, chunk, qos=1)

    def request(
        self,
        round_: int,
        peers: Iterable[str],
        *,
        answered: Collection[str],
        early: Collection[str],
        last_sequence: Mapping[str, int],
        published: float,
    ) -> None:
        """Ask ``peers`` whose message of ``round_`` is overdue to send it again.

        A neighbour is asked once ``repair_after_s`` passed since this device published
        (at ``published``, clock seconds; at once when a later message of it came first:
        ``early``), then every ``repair_after_s`` while the round waits. ``answered``:
        the peers whose message of ``round_`` arrived; ``last_sequence``: the latest
        sequence number applied per peer (the request asks for those after it).
        """
        now = self.clock()
        overdue = now - published >= self.repair_after_s
        for peer in peers:
            if now < self._next_repair.get(peer, 0.0):
                continue
            if not (peer in early or (overdue and peer not in answered)):
                continue
            self._next_repair[peer] = now + self.repair_after_s
            after = last_sequence.get(peer, 0)
            self.transport.publish(
                inbox_topic(self.fleet, peer, self.device_id),
                encode_repair_request(self.job_id, after),
                qos=1,
            )
            self.stats.repairs_requested += 1
            log.debug("round %d: asked %s for its messages after %d", round_, peer, after)

    def answer(self, peer: str, after: int) -> None:
        """Re-send ``peer`` the kept messages after ``after``, on its inbox topic.

        At most one answer per peer every ``repair_after_s / 2`` seconds: an honest peer
        of the job asks every ``repair_after_s`` (the same deadline gives it the same
        period), so a flood of requests re-sends no more than twice what honest requests
        would, however fast it comes.
        """
        kept = self.outbox.after(peer, after)  # acknowledges what the peer holds
        now = self.clock()
        if not kept or now - self._served.get(peer, -1e9) < self.repair_after_s / 2:
            return
        self._served[peer] = now
        topic = inbox_topic(self.fleet, peer, self.device_id)
        limit = self.transport.chunk_size(topic, max(len(c) for _, e in kept for c in e.chunks))
        for sequence, entry in kept:
            if any(len(c) > limit for c in entry.chunks):  # a broker with a smaller limit now
                log.debug("message %d is too large to re-send now: a keyframe repairs it", sequence)
                continue
            for chunk in entry.chunks:
                self.transport.publish(topic, chunk, qos=1)
            self.stats.resent += 1
            self.ledger.counts.retransmitted += 1
            log.debug("re-sent message %d (round %d) to %s", sequence, entry.round, peer)
