"""Nothing a peer sends can end or starve an agent (issue 23, items 6 and 9).

Each test reproduces an attack on the in-memory bus (the transport twin) and checks that
the agent keeps running and counts a refusal: deeply nested JSON in a status (retained,
so it comes back at every restart) and in secure-protocol messages; a copied message id;
an envelope for round ≈ 4·10⁹; floods past a sender's quota; a full receive queue.
"""

from __future__ import annotations

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, run_engines
from secure_scenarios import build_fleet, complete_graph, run_rounds
from wire_fuzz import FLEET as FUZZ_FLEET
from wire_fuzz import PEER, TOPIC, delta_messages, fresh_inbox

from edge_agent.engine import GossipEngine
from edge_agent.inbox import MAX_HELD_PER_SENDER
from edge_agent.mailbox import MAX_ROUNDS_AHEAD
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.errors import QuotaError
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    Reassembler,
    TensorEntry,
    delta_topic,
    new_message_id,
    split_message,
    status_topic,
)
from meshfl.wire.serde import encode_envelope

NESTED = b"[" * 50_000  # RecursionError in json.loads on main; under every byte bound


@pytest.fixture
def bus() -> MemoryBroker:
    return MemoryBroker()


# -- item 6: crafted JSON ----------------------------------------------------------------


class BrokenChoco(ChocoGossip):
    """A gossip algorithm with a bug that a crafted keyframe exposes."""

    def incoming_keyframe(self, sender: str, tensors: object) -> None:  # type: ignore[override]
        raise RuntimeError("a bug a crafted message exposed")


def _engine(bus: MemoryBroker, algorithm_class: type[ChocoGossip] = ChocoGossip) -> GossipEngine:
    """dev-0, whose one neighbour is dev-1; the round deadline is 50 ms."""
    transport = MemoryTransport(bus)
    transport.connect("dev-0")
    x = {"w": np.zeros(4, np.float32)}
    algorithm = algorithm_class(x, {"dev-1": 0.5}, 0.5, 0.5, parse_codec("identity"))
    return GossipEngine(
        transport=transport,
        fleet=FLEET,
        job_id=JOB,
        device_id="dev-0",
        neighbours=["dev-1"],
        algorithm=algorithm,
        deadline_s=0.05,
    )


def test_a_retained_nested_status_is_rejected_at_every_restart(bus: MemoryBroker) -> None:
    hostile = MemoryTransport(bus)
    hostile.connect("dev-1")
    hostile.publish(status_topic(FLEET, "dev-1"), NESTED, retain=True)

    for _restart in range(2):  # the retained status comes back at each start
        engine = _engine(bus)
        engine.start()
        assert bus.drain()
        engine.drain()  # on main: RecursionError out of the engine
        assert engine.stats.rejected == 1
        assert "nested deeper" in engine.stats.rejected_reasons[0]
        engine.transport.close()


def test_gossip_rounds_run_through_a_hostile_retained_status(bus: MemoryBroker) -> None:
    hostile = MemoryTransport(bus)
    hostile.connect("intruder")
    hostile.publish(status_topic(FLEET, "dev-1"), NESTED, retain=True)

    results, _, engines = run_engines(lambda _id: MemoryTransport(bus), 3, 2, deadline_s=10.0)

    assert all(r is not None for r in results)
    assert engines[0].stats.rejected >= 1  # dev-0 subscribed before dev-1 replaced it


def test_an_exception_out_of_a_handler_is_a_counted_rejection(bus: MemoryBroker) -> None:
    engine = _engine(bus, BrokenChoco)
    engine.start()
    peer = MemoryTransport(bus)
    peer.connect("dev-1")
    env = Envelope(
        MessageKind.KEYFRAME, FLEET, JOB, 1, "dev-1", new_message_id(), 1,
        (TensorEntry("w", (4,), DType.FLOAT32, 0, bytes(16)),),
    )  # fmt: skip
    for chunk in split_message(encode_envelope(env), env.message_id):
        peer.publish(delta_topic(FLEET, "dev-1"), chunk)
    assert bus.drain()
    engine.drain()

    assert engine.stats.rejected == 1 and "RuntimeError" in engine.stats.rejected_reasons[0]
    assert engine.ledger.counts.rejected_malformed == 1


@pytest.mark.parametrize("what", ["body", "status"])
def test_nested_json_in_secure_messages_is_rejected(bus: MemoryBroker, what: str) -> None:
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), complete_graph(3), rounds=2,
                             threshold=2)  # fmt: skip
    run_rounds(devices, 1)
    victim, forger = devices["dev-0"].engine, devices["dev-1"].engine
    rejected = victim.stats.rejected
    if what == "status":
        forger.transport.publish(status_topic("lab", "dev-1"), NESTED, retain=True)
    else:
        entry = TensorEntry("body", (len(NESTED),), DType.UINT8, 0, NESTED)
        forger._send("dev-0", MessageKind.SECAGG, 1, (entry,))

    assert bus.drain()
    victim.drain()  # on main: RecursionError out of drain

    assert victim.stats.rejected == rejected + 1
    assert "nested deeper" in victim.stats.rejected_reasons[-1]


# -- item 9: dropped messages and memory ---------------------------------------------------


def test_a_secure_peer_cannot_pile_up_future_inputs(bus: MemoryBroker) -> None:
    devices, _ = build_fleet(lambda _: MemoryTransport(bus), complete_graph(3), rounds=2,
                             threshold=2)  # fmt: skip
    run_rounds(devices, 1)
    victim, forger = devices["dev-0"].engine, devices["dev-1"].engine
    rejected = victim.stats.rejected
    words = TensorEntry("masked:dev-0", (1,), DType.UINT8, 0, b"\0")
    listed = TensorEntry("masked_with", (2,), DType.UINT8, 0, b"[]")
    for round_ in (3, 3, 3, 4_000_000_000):  # one per round is all a member ever sends
        forger._send("dev-0", MessageKind.SECURE_INPUT, round_, (words, listed))
    assert bus.drain()
    victim.drain()

    assert victim.stats.rejected == rejected + 3
    assert [len(v) for v in victim._future.values()] == [1]


def test_a_copied_message_id_no_longer_destroys_the_honest_message() -> None:
    honest = split_message(delta_messages()[0], b"\x07" * 16, 1024)
    r = Reassembler()
    # An intruder publishes a one-chunk message under the honest id first (on main it
    # completed that id, and every honest chunk was then a "duplicate").
    (copy,) = split_message(b"garbage", b"\x07" * 16, 1024)
    assert r.feed(copy, "intruder", "meshfl/v1/test/node/intruder/delta") == b"garbage"

    out = [r.feed(chunk, PEER, TOPIC) for chunk in honest]

    assert out[-1] == delta_messages()[0] and r.stats.duplicates == 0


def test_a_copied_message_id_reaches_the_model_through_the_inbox() -> None:
    inbox = fresh_inbox()
    intruder_topic = delta_topic(FUZZ_FLEET, "intruder")
    for chunk in split_message(b"\x00" * 3000, b"\x09" * 16, 1024):  # same id, garbage
        inbox._dispatch(intruder_topic, chunk)
    for chunk in split_message(delta_messages()[0], b"\x09" * 16, 1024):
        inbox._dispatch(TOPIC, chunk)
    assert inbox.stats.applied == 2  # the keyframe, then the honest delta


def _future(round_: int, sequence: int, size: int = 16) -> Envelope:
    return Envelope(
        MessageKind.DELTA, FLEET, JOB, round_, "dev-1", new_message_id(), sequence,
        (TensorEntry("w", (size // 4,), DType.FLOAT32, 0, bytes(size)),),
    )  # fmt: skip


def test_an_envelope_for_round_four_billion_is_refused_not_held(bus: MemoryBroker) -> None:
    engine = _engine(bus)
    engine.start()
    engine.exchange(1, {"w": np.zeros(4, np.float32)})  # dev-1 is silent: the deadline
    peer = MemoryTransport(bus)
    peer.connect("dev-1")
    for env in (_future(4_000_000_000, 7), _future(1 + MAX_ROUNDS_AHEAD, 8)):
        for chunk in split_message(encode_envelope(env), env.message_id):
            peer.publish(delta_topic(FLEET, "dev-1"), chunk)
    assert bus.drain()
    engine.drain()

    assert engine.ledger.counts.rejected_quota == 1  # round ≈ 4·10⁹
    assert sorted(engine._held) == [1 + MAX_ROUNDS_AHEAD]  # the one inside the window
    assert engine.take_ledger()["rejected_quota"] == 1


def test_a_flood_of_held_envelopes_is_refused_past_the_senders_quota(bus: MemoryBroker) -> None:
    engine = _engine(bus)
    engine.start()
    peer = MemoryTransport(bus)
    peer.connect("dev-1")
    for k in range(MAX_HELD_PER_SENDER + 5):
        env = _future(2 + k % MAX_ROUNDS_AHEAD, k + 1)
        for chunk in split_message(encode_envelope(env), env.message_id):
            peer.publish(delta_topic(FLEET, "dev-1"), chunk)
    assert bus.drain()
    engine.drain()

    assert sum(len(v) for v in engine._held.values()) == MAX_HELD_PER_SENDER
    assert engine.ledger.counts.rejected_quota == 5


def test_a_chunk_flood_past_a_senders_quota_is_refused_and_others_are_untouched() -> None:
    r = Reassembler(sender_messages=4)
    honest = split_message(b"h" * 3000, b"\x01" * 16, 1024)
    assert r.feed(honest[0], "dev-2", "t2") is None
    for k in range(4):
        first = split_message(b"x" * 3000, bytes([k + 10]) * 16, 1024)[0]
        assert r.feed(first, "dev-1", "t1") is None
    flood = split_message(b"x" * 3000, b"\xff" * 16, 1024)[0]
    with pytest.raises(QuotaError):
        r.feed(flood, "dev-1", "t1")

    assert [r.feed(c, "dev-2", "t2") for c in honest[1:]][-1] == b"h" * 3000
    assert r.stats.refused == 1 and r.stats.evicted == 0


def test_a_message_over_a_senders_byte_quota_is_refused() -> None:
    r = Reassembler(sender_bytes=2000)
    with pytest.raises(QuotaError):
        r.feed(split_message(b"x" * 3000, b"\x02" * 16, 1024)[0], "dev-1", "t1")
    assert r.stats.refused == 1 and r.stats.pending_messages == 0


def test_the_receive_queue_is_bounded_and_drops_are_counted() -> None:
    inbox = fresh_inbox()
    inbox._queue_bounds = (3, 2**20)
    for _ in range(5):  # the transport's network thread hands over
        inbox._on_message(TOPIC, b"not a chunk")

    assert inbox.queue_depth() == 3
    inbox.drain()
    assert inbox.ledger.counts.rejected_quota == 2
    assert inbox.stats.rejected == 2 + 3  # the two dropped, the three that did not decode


def test_the_receive_queue_is_bounded_in_bytes() -> None:
    inbox = fresh_inbox()
    inbox._queue_bounds = (100, 10)
    inbox._on_message(TOPIC, b"x" * 8)
    inbox._on_message(TOPIC, b"x" * 8)  # over 10 bytes: dropped
    assert inbox.queue_depth() == 1
