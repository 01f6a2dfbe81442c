"""The agent's delivery ledger on the in-memory bus: duplicates, garbage, gaps, keyframes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, run_engines
from test_engine import DuplicatingTransport, VandalTransport

from edge_agent.engine import GossipEngine
from edge_agent.ledger import DeliveryLedger
from edge_agent.transport.base import Message
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.contract import RoundLedger
from meshfl.wire import (
    Envelope,
    MessageKind,
    delta_topic,
    new_message_id,
    split_message,
    status_topic,
)
from meshfl.wire.serde import encode_envelope

X0 = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}


def totals(engine: GossipEngine) -> RoundLedger:
    """The whole run's ledger of ``engine`` (one call takes every count so far)."""
    engine.drain()
    return engine.take_ledger(final=True)


def test_repeated_chunks_are_counted_as_duplicates_and_applied_once() -> None:
    bus = MemoryBroker()

    _, _, engines = run_engines(
        lambda _id: DuplicatingTransport(bus), 4, 3, max_payload=1 << 20
    )  # one chunk per message: every second copy is a duplicate

    for engine in engines:
        ledger = totals(engine)
        # ring of 4: two neighbours × three rounds, each message published twice
        assert (ledger["sent"], ledger["delivered"], ledger["applied"]) == (3, 6, 6)
        assert ledger["duplicates"] == 6
        assert ledger["applied_twice"] == ledger["lost"] == ledger["missing"] == 0


def test_garbage_is_rejected_as_malformed_and_never_delivered() -> None:
    bus = MemoryBroker()

    _, _, engines = run_engines(lambda _id: VandalTransport(bus), 3, 2)

    for engine in engines:
        ledger = totals(engine)
        # three bad copies before each of two neighbours' messages, two rounds
        assert ledger["rejected_malformed"] == 12 == engine.stats.rejected
        assert (ledger["delivered"], ledger["applied"], ledger["rejected_other"]) == (4, 4, 0)
        assert ledger["unrepaired"] == ledger["lost"] == 0


class ScriptedPeer:
    """``dev-1``, publishing hand-made envelopes (any sequence, any kind) on its topic."""

    def __init__(self, bus: MemoryBroker) -> None:
        self.bus = bus
        self.transport = MemoryTransport(bus)
        self.transport.connect("dev-1")
        self.algorithm = ChocoGossip(
            X0, {"dev-0": 0.5}, 0.5, 0.5, parse_codec("identity"), shared_start=True
        )
        self.topic = delta_topic(FLEET, "dev-1")
        self.last: list[bytes] = []

    def send(self, round_: int, sequence: int, kind: MessageKind = MessageKind.DELTA) -> None:
        """Publish dev-1's message of ``round_`` with ``sequence`` (and wait for delivery)."""
        x = {"w": X0["w"] + np.float32(round_)}
        keyframe = kind == MessageKind.KEYFRAME
        tensors = self.algorithm.keyframe(x) if keyframe else self.algorithm.outgoing(x)
        env = Envelope(kind=kind, fleet=FLEET, job=JOB, round=round_, sender="dev-1",
                       message_id=new_message_id(), sequence=sequence, tensors=tensors)  # fmt: skip
        self.last = split_message(encode_envelope(env), env.message_id, 1 << 20)
        self.raw(*self.last)

    def raw(self, *payloads: bytes) -> None:
        for payload in payloads:
            self.transport.publish(self.topic, payload, qos=1)
        self.bus.drain()


@pytest.fixture
def device() -> tuple[GossipEngine, ScriptedPeer]:
    """``dev-0``, a real engine whose only neighbour is the scripted ``dev-1``."""
    bus = MemoryBroker()
    transport = MemoryTransport(bus)
    transport.connect("dev-0", will=Message(status_topic(FLEET, "dev-0"), b"", retain=True))
    algorithm = ChocoGossip(
        X0, {"dev-1": 0.5}, 0.5, 0.5, parse_codec("identity"), shared_start=True
    )
    engine = GossipEngine(transport=transport, fleet=FLEET, job_id=JOB, device_id="dev-0",
                          neighbours=["dev-1"], algorithm=algorithm, deadline_s=0.3)  # fmt: skip
    engine.start()
    return engine, ScriptedPeer(bus)


def play(engine: GossipEngine, round_: int, *, final: bool = False) -> RoundLedger:
    engine.exchange(round_, {"w": X0["w"] + np.float32(round_)})
    return engine.take_ledger(final=final)


def test_a_gap_is_counted_missing_then_recovered_by_the_keyframe(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    peer.send(1, 1)
    first = play(engine, 1)
    # round 2: dev-1's message (sequence 2) is lost on the way
    second = play(engine, 2)
    peer.send(3, 3)  # the gap: 2 is missing, 3 cannot be applied without a keyframe
    peer.raw(*peer.last)  # a repeated chunk
    peer.raw(b"not an envelope")
    third = play(engine, 3)
    peer.send(4, 4, MessageKind.KEYFRAME)  # dev-1 answers the keyframe request
    fourth = play(engine, 4, final=True)

    assert (first["sent"], first["delivered"], first["applied"]) == (1, 1, 1)
    assert (second["delivered"], second["missing"], second["unrepaired"]) == (0, 0, 0)
    assert third["delivered"] == 1 and third["applied"] == 0
    assert (third["missing"], third["awaiting_keyframe"], third["unrepaired"]) == (1, 1, 2)
    assert (third["duplicates"], third["rejected_malformed"]) == (1, 1)
    assert engine.need == frozenset()  # the keyframe was applied
    assert (fourth["applied"], fourth["recovered_by_keyframe"]) == (1, 2)
    assert (fourth["lost"], fourth["unrepaired"], fourth["applied_twice"]) == (0, 0, 0)


def test_a_gap_never_repaired_is_lost_at_the_last_round(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    peer.send(1, 1)
    play(engine, 1)
    peer.send(2, 3)  # sequence 2 never arrives; no keyframe follows
    before = play(engine, 2)
    last = play(engine, 3, final=True)

    assert (before["missing"], before["awaiting_keyframe"], before["lost"]) == (1, 1, 0)
    assert before["unrepaired"] == 2
    assert (last["lost"], last["unrepaired"], last["recovered_by_keyframe"]) == (2, 0, 0)


def test_an_overtaken_message_that_arrives_late_is_applied_and_counted_delivered_late(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    peer.send(1, 1)
    play(engine, 1)
    peer.send(2, 3)  # 3 overtakes 2: held, and a keyframe is asked for at once
    peer.send(2, 2)  # 2 arrives late: both apply, the request is withdrawn
    ledger = play(engine, 2, final=True)

    assert engine.need == frozenset() and engine.stats.gaps == 1
    assert (ledger["missing"], ledger["awaiting_keyframe"], ledger["delivered_late"]) == (1, 1, 2)
    assert (ledger["applied"], ledger["recovered_by_keyframe"], ledger["lost"]) == (2, 0, 0)
    assert (ledger["unrepaired"], ledger["applied_twice"], ledger["rejected_stale"]) == (0, 0, 0)


def test_a_late_message_that_a_keyframe_holds_is_dropped_as_stale(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    peer.send(1, 1)
    play(engine, 1)
    peer.send(2, 3)  # 2 is overtaken ...
    second = play(engine, 2)
    peer.send(3, 4, MessageKind.KEYFRAME)  # ... the keyframe asked for comes first ...
    peer.send(2, 2)  # ... and 2 after it: the keyframe already holds it
    third = play(engine, 3, final=True)

    assert second["unrepaired"] == 2 and engine.need == frozenset()
    assert (third["applied"], third["recovered_by_keyframe"], third["rejected_stale"]) == (1, 2, 1)
    assert (third["delivered_late"], third["lost"], third["unrepaired"]) == (0, 0, 0)


def test_a_keyframe_request_is_repeated_when_its_answer_is_overdue(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    needs: list[list[str]] = []  # dev-0's statuses as dev-1 sees them
    peer.transport.set_handler(
        lambda _topic, payload: needs.append(json.loads(payload).get("need", []))
    )
    peer.transport.subscribe(status_topic(FLEET, "dev-0"))
    peer.send(1, 1)
    play(engine, 1)
    peer.send(2, 3)  # 2 is lost: dev-0 asks for a keyframe
    play(engine, 2)
    peer.send(3, 4)  # sent before dev-1 saw the request: no reason to ask again
    play(engine, 3)
    peer.send(4, 5)  # still no keyframe: the request (or its answer) was lost
    play(engine, 4)
    peer.send(5, 6, MessageKind.KEYFRAME)
    last = play(engine, 5, final=True)
    peer.bus.drain()

    assert [n for n in needs if n] == [["dev-1"], ["dev-1"]]  # asked, then asked again
    assert engine.need == frozenset() and needs[-1] == []
    assert (last["recovered_by_keyframe"], last["lost"], last["unrepaired"]) == (4, 0, 0)


def test_a_neighbour_merely_behind_is_not_suspected(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    play(engine, 1)  # nothing from dev-1 in time: suspected (not waited for next round)
    suspected_after_1 = set(engine._suspected)
    peer.send(1, 1)  # ... but its round-1 message comes during round 2: it is alive
    play(engine, 2)

    assert suspected_after_1 == {"dev-1"}
    assert engine._suspected == set()  # waited for again: no running ahead of it unmixed


def test_a_repeated_sequence_is_a_duplicate_not_applied_twice(
    device: tuple[GossipEngine, ScriptedPeer],
) -> None:
    engine, peer = device
    peer.send(1, 1)
    peer.send(1, 1)  # the same (sender, sequence) again under a new message id

    ledger = play(engine, 1, final=True)

    assert (ledger["delivered"], ledger["applied"], ledger["duplicates"]) == (2, 1, 1)
    assert ledger["applied_twice"] == 0


def test_the_ledger_counts_an_applied_repeat_and_a_late_peer() -> None:
    quiet = dict.fromkeys(("applied", "stale", "duplicates", "unsigned", "bad_signature",
                           "replayed"), 0)  # fmt: skip
    ledger = DeliveryLedger(["a"])
    ledger.arrived("a", 1)
    ledger.applied("a", 1, full_state=False)
    ledger.applied("a", 1, full_state=False)  # what the engine's dedupe prevents
    ledger.track(["b"])  # a peer of a new topology version: counted from its first message
    ledger.arrived("b", 40)
    ledger.arrived("b", 42)

    counts = ledger.take_round(quiet)
    ledger.untrack(["b"])
    after = ledger.take_round(quiet)

    assert (counts["applied_twice"], counts["missing"], counts["unrepaired"]) == (1, 1, 1)
    assert (after["lost"], after["unrepaired"], after["applied_twice"]) == (1, 0, 0)


def test_a_forged_sequence_jump_counts_at_most_max_gap_and_keyframe_repairs_it() -> None:
    from edge_agent.ledger import MAX_GAP

    ledger = DeliveryLedger(["dev-1"])
    ledger.arrived("dev-1", 1)
    ledger.arrived("dev-1", 2**64 - 1)  # forged: no run of 2**64 real messages
    ledger.unusable("dev-1", 2**64 - 10)  # already counted missing: not counted twice
    ledger.unusable("dev-1", 5)  # below the counted window: a new entry

    assert ledger.counts.missing == MAX_GAP
    assert ledger.counts.awaiting_keyframe == 1
    assert ledger.unrepaired == MAX_GAP + 1
    ledger.applied("dev-1", 2**64, full_state=True)  # a keyframe above repairs them all
    assert (ledger.counts.recovered_by_keyframe, ledger.unrepaired) == (MAX_GAP + 1, 0)
