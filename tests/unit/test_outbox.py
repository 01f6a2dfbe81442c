"""Repair of lost gossip messages: the outbox, repair requests and re-sends (issue 7)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, drift, make_algorithms, reference, run_engines
from hypothesis import given
from hypothesis import strategies as st

from edge_agent import outbox as outbox_module
from edge_agent.engine import GossipEngine
from edge_agent.inbox import EngineStats
from edge_agent.ledger import DeliveryLedger
from edge_agent.outbox import Outbox
from edge_agent.sender import Sender
from edge_agent.transport.base import Message
from edge_agent.transport.limits import PUBLISH_OVERHEAD
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.errors import PayloadError, TransportError
from meshfl.wire import parse_topic, status_topic
from meshfl.wire.repair import RepairRequest, decode_repair_request, encode_repair_request


class LosingTransport(MemoryTransport):
    """Loses the first copy of every ``every``-th chunk published on a delta topic.

    The broker acknowledged it and never delivers it: a loss QoS 1 does not repair.
    Re-sends (on inbox topics) always go through.
    """

    def __init__(self, bus: MemoryBroker, every: int) -> None:
        super().__init__(bus)
        self.every = every
        self.count = self.lost = 0

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if not retain and parse_topic(topic).kind == "delta":
            self.count += 1
            if self.count % self.every == 0:
                self.lost += 1
                return
        super().publish(topic, payload, qos=qos, retain=retain)


def test_lost_chunks_are_asked_for_and_resent_within_the_round() -> None:
    bus = MemoryBroker()
    transports: list[LosingTransport] = []

    def losing(_id: str) -> LosingTransport:
        transports.append(LosingTransport(bus, every=3))
        return transports[-1]

    expected = reference(4, 6, "choco", "topk:0.3")
    got, missing, engines = run_engines(losing, 4, 6, deadline_s=10.0, max_payload=256)

    assert sum(t.lost for t in transports) > 0
    # Every loss was repaired before its round ended: the result is the loss-free one.
    assert all(m == [] for per_device in missing for m in per_device)
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    assert sum(e.stats.repairs_requested for e in engines) > 0
    resent = sum(e.stats.resent for e in engines)
    assert resent > 0
    assert sum(e.ledger.counts.retransmitted for e in engines) == resent
    assert sum(e.ledger.counts.applied_twice for e in engines) == 0


def test_without_losses_nobody_asks_or_resends() -> None:
    bus = MemoryBroker()
    _, missing, engines = run_engines(lambda _id: MemoryTransport(bus), 3, 3, deadline_s=10.0)

    assert all(m == [] for per_device in missing for m in per_device)
    assert sum(e.stats.resent for e in engines) == 0


def test_a_request_acknowledges_what_the_peer_holds_and_returns_the_rest() -> None:
    box = Outbox(keep_rounds=3)
    for seq in (1, 2, 3):
        box.add(seq, seq, [b"c%d" % seq], {"a", "b"})

    assert [s for s, _ in box.after("a", 1)] == [2, 3]
    assert [s for s, _ in box.after("b", 2)] == [3]  # 1 acknowledged by both: dropped
    assert len(box) == 2
    assert [s for s, _ in box.after("a", 3)] == []
    assert [s for s, _ in box.after("b", 3)] == []
    assert len(box) == 0 and box.bytes_held == 0


def test_old_messages_and_departed_peers_are_let_go() -> None:
    box = Outbox(keep_rounds=2)
    box.add(1, 1, [b"x" * 10], {"a"})
    box.add(2, 2, [b"x" * 10], {"a", "b"})
    box.add(3, 4, [b"x" * 10], {"a"})  # round 4: round 1 is more than 2 rounds old

    assert [s for s, _ in box.after("a", 0)] == [2, 3]
    box.forget({"a"})
    assert [s for s, _ in box.after("b", 0)] == [2]
    assert box.bytes_held == 10


def test_the_byte_bound_drops_the_oldest_but_keeps_the_newest() -> None:
    box = Outbox(keep_rounds=10, max_bytes=25)
    for seq in (1, 2, 3):
        box.add(seq, seq, [b"x" * 10], {"a"})
    assert [s for s, _ in box.after("a", 0)] == [2, 3]
    box.add(4, 4, [b"x" * 100], {"a"})
    assert [s for s, _ in box.after("a", 0)] == [4]


def test_requests_round_trip() -> None:
    payload = encode_repair_request("job-1", 41)
    assert payload == b'{"job":"job-1","after":41}'  # golden bytes
    assert decode_repair_request(payload) == RepairRequest("job-1", 41)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"MFLC\x01",
        b"{",
        b"[1]",
        b'{"job": 1, "after": 2}',
        b'{"job": "j", "after": true}',
        b'{"job": "j", "after": -1}',
        b'{"job": "j", "after": 18446744073709551616}',
        b'{"job": "j", "after": 1.5}',
        b'{"job": "j", "after": 1' + b" " * 600 + b"}",
        b'{"job": "j", "after": 1, "job": "k"}',
        b'{"job": "j", "after": [[[1]]]}',
        b'{"job": "j/k", "after": 1}',
    ],
)
def test_anything_else_is_refused_with_a_payload_error(payload: bytes) -> None:
    with pytest.raises(PayloadError):
        decode_repair_request(payload)


@given(st.binary(max_size=600))
def test_arbitrary_bytes_raise_nothing_but_a_payload_error(payload: bytes) -> None:
    try:
        result = decode_repair_request(payload)
    except PayloadError:
        return
    assert isinstance(result.job, str) and 0 <= result.after < 2**64


# -- the outbox on disk ------------------------------------------------------------


def test_messages_on_disk_come_back_after_a_restart_and_go_when_acknowledged(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "job-1.outbox"
    box = Outbox(folder=folder)
    box.add(1, 1, [b"a1", b"", b"a3"], {"p", "q"})
    box.add(2, 2, [b"b" * 1000], {"p"})
    assert sorted(f.name for f in folder.glob("*.msg")) == [f"{1:020d}.msg", f"{2:020d}.msg"]

    again = Outbox(folder=folder, restore=True)  # the restarted agent
    assert len(again) == 2 and again.bytes_held == box.bytes_held
    ((seq, entry),) = again.after("q", 0)
    assert (seq, entry.round, entry.chunks, entry.pending) == (
        1,
        1,
        [b"a1", b"", b"a3"],
        {"p", "q"},
    )
    assert [s for s, _ in again.after("p", 1)] == [2]  # p held 1; q still waits for it
    assert again.after("q", 1) == []  # now nobody waits for 1: its file is gone
    assert sorted(f.name for f in folder.glob("*.msg")) == [f"{2:020d}.msg"]

    fresh = Outbox(folder=folder)  # a fresh start numbers from 1 again: nothing kept
    assert len(fresh) == 0 and list(folder.glob("*.msg")) == []
    fresh.add(1, 1, [b"x"], {"p"})
    fresh.remove()
    assert not folder.exists()


def test_the_highest_sequence_is_on_disk_after_every_step_with_one_write_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "job-1.outbox"
    box = Outbox(folder=folder, keep_rounds=1)
    writes: list[str] = []
    write = outbox_module.atomic_write
    monkeypatch.setattr(
        outbox_module,
        "atomic_write",
        lambda path, w: writes.append(Path(path).name) or write(path, w),
    )
    steps = [  # (what the sender does, the highest sequence used so far)
        (lambda: box.add(1, 1, [b"a"], {"p", "q"}), 1),
        (lambda: box.add(2, 2, [b"b"], {"p"}), 2),
        (lambda: box.add(3, 3, [b"c"], set()), 3),  # kept for nobody: no file names it
        (lambda: box.after("p", 2), 3),  # p holds 1 and 2; q still waits for 1
        (lambda: box.add(4, 4, [b"d"], {"q"}), 4),  # round 4 expires round 1 and 2
        (lambda: box.after("q", 4), 4),  # everything acknowledged: no message file left
        (lambda: box.add(5, 5, [b"e"], {"q"}), 5),
    ]
    for step, high in steps:
        step()
        assert Outbox(folder=folder, restore=True).high == high  # a crash here loses nothing

    assert writes.count("sequence") == 2  # for message 3 and before 4's file went
    assert len(writes) == 2 + 4  # and one file for each message kept for someone
    assert sorted(f.name for f in folder.glob("*.msg")) == [f"{5:020d}.msg"]


@pytest.mark.parametrize(
    "content",
    [b"", b"MFOB1\n", b"MFOB1\n{}\n", b'MFOB1\n{"round": 1, "pending": ["p"], "chunks": [5]}\nab',
     b'MFOB1\n[1]\n', b"\x00" * 40],
)  # fmt: skip
def test_a_file_that_does_not_parse_is_dropped_with_a_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "ob"
    Outbox(folder=folder).add(3, 1, [b"ok"], {"p"})
    (folder / f"{4:020d}.msg").write_bytes(content)
    (folder / "junk.msg").write_bytes(content)

    box = Outbox(folder=folder, restore=True)

    assert [s for s, _ in box.after("p", 0)] == [3]
    assert sorted(f.name for f in folder.glob("*.msg")) == [f"{3:020d}.msg"]
    assert caplog.text.count("does not parse") == 2


class DeadLink(MemoryTransport):
    """Delivers nothing this device publishes on a delta or inbox topic (the status passes)."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if parse_topic(topic).kind in ("delta", "inbox"):
            return
        super().publish(topic, payload, qos=qos, retain=retain)


def test_a_restarted_sender_re_sends_a_lost_message_from_its_outbox_on_disk(
    tmp_path: Path,
) -> None:
    # dev-0 publishes its round-1 message, which never arrives, and dies; restarted from
    # its checkpoint, it answers dev-1's repair request from the outbox it left on disk.
    bus = MemoryBroker()
    ids, _, xs, algos = make_algorithms(2, "choco", "topk:0.3")
    folder = tmp_path / "dev-0" / "job-1.outbox"

    def engine(i: int, transport: MemoryTransport, first_sequence: int = 0) -> GossipEngine:
        will = Message(status_topic(FLEET, ids[i]), b'{"state": "offline"}', retain=True)
        transport.connect(ids[i], will=will)
        return GossipEngine(
            transport=transport, fleet=FLEET, job_id=JOB, device_id=ids[i],
            neighbours=[ids[1 - i]], algorithm=algos[i], deadline_s=10.0,
            first_sequence=first_sequence, outbox_folder=folder if i == 0 else None,
        )  # fmt: skip

    sender, receiver = engine(0, DeadLink(bus)), engine(1, MemoryTransport(bus))
    sender.start()
    receiver.start()
    got: dict[str, object] = {}

    def receive() -> None:
        got["x"], got["missing"] = receiver.exchange(1, drift(xs[1], 1, 1))
        receiver.linger(10.0)

    thread = threading.Thread(target=receive)
    thread.start()
    sender.exchange(1, drift(xs[0], 1, 0))  # the receiver's message came; its own did not
    sender.transport.close()  # SIGKILL: the process and its memory are gone
    assert receiver.stats.applied == 0
    restarted = engine(0, MemoryTransport(bus), first_sequence=sender.sequence + 16)
    restarted.start()
    restarted.linger(10.0)  # serves the receiver's requests until it is done
    thread.join(timeout=30)

    assert got["missing"] == []  # mixed with the message that had been lost
    assert restarted.stats.resent >= 1
    assert receiver.ledger.counts.applied_twice == 0


def test_a_folder_that_cannot_be_written_leaves_the_outbox_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder's parent should be")
    box = Outbox(folder=blocker / "job-1.outbox")

    box.add(1, 1, [b"x"], {"p"})

    assert box.folder is None and "keeping sent messages in memory only" in caplog.text
    assert [s for s, _ in box.after("p", 0)] == [1]


class LimitedLosingTransport(LosingTransport):
    """A :class:`LosingTransport` behind a broker whose CONNACK allows ``packet`` bytes.

    Like :class:`~edge_agent.transport.mqtt.MqttTransport` it refuses to publish a
    payload over the limit on its topic (Mosquitto would drop the connection).
    """

    def __init__(self, bus: MemoryBroker, every: int, packet: int) -> None:
        super().__init__(bus, every)
        self.packet = packet
        self.too_large = 0

    def payload_limit(self, topic: str) -> int | None:
        return self.packet - PUBLISH_OVERHEAD - len(topic.encode())

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        limit = self.payload_limit(topic)
        assert limit is not None
        if len(payload) > limit:
            self.too_large += 1
            raise TransportError(f"cannot publish {len(payload)} bytes to {topic}: at most {limit}")
        super().publish(topic, payload, qos=qos, retain=retain)


def test_re_sends_fit_the_broker_packet_limit_and_repair_like_an_unlimited_broker() -> None:
    # Issue 25: chunks sized for the delta topic were re-sent on the longer inbox topic
    # and refused by the broker. Every chunk, first send or re-send, must fit.
    bus = MemoryBroker()
    transports: list[LimitedLosingTransport] = []

    def limited(_id: str) -> LimitedLosingTransport:
        transports.append(LimitedLosingTransport(bus, every=3, packet=150))
        return transports[-1]

    expected = reference(4, 6, "choco", "topk:0.3")
    got, missing, engines = run_engines(limited, 4, 6, deadline_s=10.0, max_payload=1 << 20)

    assert sum(t.lost for t in transports) > 0 and sum(e.stats.resent for e in engines) > 0
    assert sum(t.too_large for t in transports) == 0
    assert all(m == [] for per_device in missing for m in per_device)
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])


class RecordingTransport(MemoryTransport):
    """A transport that records what is published and delivers nothing."""

    def __init__(self, bus: MemoryBroker) -> None:
        super().__init__(bus)
        self.published: list[str] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        self.published.append(topic)


def test_a_flood_of_repair_requests_re_sends_at_most_twice_per_honest_period() -> None:
    now = [100.0]
    transport = RecordingTransport(MemoryBroker())
    box = Outbox(keep_rounds=5)
    sender = Sender(
        transport=transport,
        fleet=FLEET,
        job_id=JOB,
        device_id="dev-0",
        outbox=box,
        sequence=0,
        signer=None,
        max_payload=4096,
        stats=EngineStats(),
        ledger=DeliveryLedger({"dev-1"}),
        deadline_s=8.0,  # repair_after_s = 1 s
        clock=lambda: now[0],
    )
    for seq in (1, 2, 3):
        box.add(seq, seq, [b"c%d" % seq], {"dev-1"})
    assert sender.repair_after_s == 1.0

    # A hostile peer asks every 10 ms for 10 s: 1,000 requests.
    for _ in range(1000):
        sender.answer("dev-1", 0)
        now[0] += 0.01
    # One answer every repair_after_s / 2 at most: 20 answers of the 3 kept messages.
    assert len(transport.published) <= 3 * 20
    assert len(transport.published) >= 3 * 19
    # An honest peer, asking every repair_after_s, is answered every time.
    transport.published.clear()
    for _ in range(5):
        now[0] += sender.repair_after_s
        sender.answer("dev-1", 0)
    assert len(transport.published) == 3 * 5
