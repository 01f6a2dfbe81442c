"""MemoryBroker/MemoryTransport specifics (the shared behaviour suite is in
tests/integration/test_transport_mqtt.py and also runs on memory)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import edge_agent.transport as transport_pkg
from edge_agent.transport import MemoryBroker, MemoryTransport, Message
from edge_agent.transport.memory import topic_matches
from meshfl.errors import BrokerUnreachable, TransportError

levels = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4)


@pytest.fixture
def bus() -> MemoryBroker:
    return MemoryBroker()


def test_exported_names() -> None:
    assert sorted(transport_pkg.__all__) == [
        "Handler",
        "MemoryBroker",
        "MemoryTransport",
        "Message",
        "Transport",
    ]


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("a/b", "a/b/c", False),
        ("+", "a", True),
    ],
)
def test_topic_matching_follows_mqtt(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@given(levels)
def test_a_topic_matches_itself_hash_and_its_plus_pattern(topic_levels: list[str]) -> None:
    topic = "/".join(topic_levels)
    assert topic_matches(topic, topic)
    assert topic_matches("#", topic)
    assert topic_matches("/".join("+" for _ in topic_levels), topic)
    assert not topic_matches(topic + "/x", topic)


def test_a_handler_that_publishes_does_not_deadlock(bus: MemoryBroker) -> None:
    echo, done = MemoryTransport(bus), threading.Event()
    echo.set_handler(lambda t, p: echo.publish("pong", p) if t == "ping" else done.set())
    echo.subscribe("ping")
    echo.subscribe("pong")
    echo.connect("echo")
    echo.publish("ping", b"1")
    assert done.wait(2.0)
    assert echo.flush(2.0)
    assert (echo.bytes_sent, echo.bytes_received) == (2, 2)


def test_kill_fires_the_will_retained_and_close_does_not(bus: MemoryBroker) -> None:
    a, b = MemoryTransport(bus), MemoryTransport(bus)
    a.connect("a", will=Message("s/a", b"offline"))
    b.connect("b", will=Message("s/b", b"offline"))
    a.kill()
    b.close()
    assert bus.drain(2.0)
    assert (bus.retained("s/a"), bus.retained("s/b")) == (b"offline", None)
    assert not a.connected


def test_publish_before_connect_is_a_transport_error(bus: MemoryBroker) -> None:
    with pytest.raises(TransportError, match="not connected"):
        MemoryTransport(bus).publish("t", b"x")


def test_a_stopped_broker_is_unreachable(bus: MemoryBroker) -> None:
    t = MemoryTransport(bus)
    t.connect("x")
    bus.stop()
    assert not t.connected
    with pytest.raises(BrokerUnreachable):
        MemoryTransport(bus).connect("y")


def test_reconnect_counts_and_resumes_the_session(bus: MemoryBroker) -> None:
    got: list[bytes] = []
    sub, pub = MemoryTransport(bus), MemoryTransport(bus)
    sub.set_handler(lambda t, p: got.append(p))
    sub.subscribe("q", qos=1)
    sub.connect("sub")
    pub.connect("pub")
    sub.kill()
    pub.publish("q", b"queued", qos=1)
    pub.publish("q", b"lost", qos=0)
    sub.connect("sub")
    assert bus.drain(2.0)
    assert (got, sub.reconnects, sub.protocol) == ([b"queued"], 1, "memory")
