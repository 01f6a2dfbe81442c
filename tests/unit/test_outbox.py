"""Repair of lost gossip messages: the outbox, repair requests and re-sends (issue 7)."""

from __future__ import annotations

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.outbox import Outbox, parse_repair_request, repair_request
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.wire import parse_topic


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
    assert parse_repair_request(repair_request("job-1", 41)) == ("job-1", 41)


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
    ],
)
def test_anything_else_is_not_a_request(payload: bytes) -> None:
    assert parse_repair_request(payload) is None


@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_raise(payload: bytes) -> None:
    result = parse_repair_request(payload)
    assert result is None or (isinstance(result[0], str) and result[1] >= 0)
