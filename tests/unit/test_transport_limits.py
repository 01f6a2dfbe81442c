"""Broker limits from CONNACK, jittered reconnect delays and contained callbacks, no broker."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines

from edge_agent.transport.backoff import Backoff
from edge_agent.transport.limits import BrokerLimits, inflight_cap, payload_limit
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from edge_agent.transport.mqtt import MqttTransport
from meshfl.errors import ConfigError


def _varint_len(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16384 else 3 if n < 2097152 else 4


def _publish_packet_size(topic: str, payload: int) -> int:
    """Size of a QoS 1 MQTT 5 PUBLISH without properties (MQTT 5.0 §3.3)."""
    remaining = 2 + len(topic.encode()) + 2 + 1 + payload
    return 1 + _varint_len(remaining) + remaining


# -- broker limits ------------------------------------------------------------------------


def test_limits_are_read_from_connack_properties_and_absent_ones_are_none() -> None:
    props = SimpleNamespace(MaximumPacketSize=1048576, ReceiveMaximum=5)

    limits = BrokerLimits.from_properties(props)

    assert limits == BrokerLimits(max_packet_bytes=1048576, receive_maximum=5)
    assert limits.as_dict() == {"MaximumPacketSize": 1048576, "ReceiveMaximum": 5}
    assert BrokerLimits.from_properties(None) == BrokerLimits()


@pytest.mark.parametrize("max_packet", [200, 1000, 16384 + 100, 1048576, 268435455])
@pytest.mark.parametrize("topic", ["t", "meshfl/v1/fleet-1/node/dev-0123456789/delta"])
def test_a_payload_at_the_limit_fits_the_packet_and_the_overhead_is_tight(
    max_packet: int, topic: str
) -> None:
    limit = payload_limit(BrokerLimits(max_packet_bytes=max_packet), topic)

    assert limit is not None
    assert _publish_packet_size(topic, limit) <= max_packet
    assert _publish_packet_size(topic, limit + 4) > max_packet  # at most 3 bytes of slack
    assert payload_limit(BrokerLimits(), topic) is None


def test_inflight_is_capped_at_the_brokers_receive_maximum() -> None:
    assert inflight_cap(20, BrokerLimits(receive_maximum=5)) == 5
    assert inflight_cap(20, BrokerLimits(receive_maximum=65535)) == 20
    assert inflight_cap(20, BrokerLimits()) == 20
    assert inflight_cap(20, BrokerLimits(receive_maximum=0)) == 1


class LimitedTransport(MemoryTransport):
    """A bus transport whose "broker" accepts at most ``limit`` payload bytes per publish."""

    def __init__(self, broker: MemoryBroker, limit: int) -> None:
        super().__init__(broker)
        self.limit = limit
        self.largest = 0
        self._sizes = threading.Lock()

    def payload_limit(self, topic: str) -> int | None:
        return self.limit

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        with self._sizes:
            self.largest = max(self.largest, len(payload))
        super().publish(topic, payload, qos=qos, retain=retain)


def test_engines_chunk_under_the_brokers_limit_when_it_is_below_the_jobs() -> None:
    bus = MemoryBroker()
    transports: list[LimitedTransport] = []

    def factory(_id: str) -> LimitedTransport:
        transports.append(LimitedTransport(bus, 120))
        return transports[-1]

    got, missing, _ = run_engines(factory, 4, 2, max_payload=1024)

    expected = reference(4, 2, "choco", "topk:0.3")
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    assert all(m == [] for per_device in missing for m in per_device)
    assert max(t.largest for t in transports) == 120
    assert transports[0].chunk_size("any", 1024) == 120
    assert transports[0].chunk_size("any", 100) == 100


# -- reconnect backoff --------------------------------------------------------------------


def test_the_backoff_schedule_is_exponential_jittered_and_capped() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(7))
    twin = random.Random(7)

    delays = [backoff.next_delay() for _ in range(7)]

    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert delays == [twin.uniform(c / 2, c) for c in ceilings]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert backoff.failures == 7
    backoff.reset()
    assert 0.25 <= backoff.next_delay() <= 0.5


def test_two_clients_draw_different_delays() -> None:
    a, b = Backoff(1.0, 30.0, random.Random(1)), Backoff(1.0, 30.0, random.Random(2))

    assert [a.next_delay() for _ in range(5)] != [b.next_delay() for _ in range(5)]


def test_many_failures_stay_finite_and_capped() -> None:
    backoff = Backoff(0.1, 30.0, random.Random(0))

    delays = [backoff.next_delay() for _ in range(200)]

    assert max(delays) <= 30.0 and min(delays[10:]) >= 15.0


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_bad_backoff_bounds_are_config_errors(lo: float, hi: float) -> None:
    with pytest.raises(ConfigError, match="reconnect delays need 0 < min <= max"):
        Backoff(lo, hi)
    with pytest.raises(ConfigError, match="reconnect delays"):
        MqttTransport("mqtt://127.0.0.1:1883", reconnect_min_s=lo, reconnect_max_s=hi)


class RecordingClient:
    """Stands in for paho's client: records what the transport sets as the next delay."""

    def __init__(self) -> None:
        self.delays: list[tuple[float, float]] = []

    def reconnect_delay_set(self, min_delay: float, max_delay: float) -> None:
        self.delays.append((min_delay, max_delay))


def test_the_transport_hands_paho_one_seeded_delay_per_failed_try() -> None:
    transport = MqttTransport("mqtt://127.0.0.1:1883", reconnect_min_s=0.2, reconnect_max_s=1.0)
    transport.backoff = Backoff(0.2, 1.0, random.Random(3))
    twin = Backoff(0.2, 1.0, random.Random(3))
    client: Any = RecordingClient()

    transport._on_disconnect(client, None, None, "lost", None)
    for _ in range(3):
        transport._on_connect_fail(client, None)

    expected = [twin.next_delay() for _ in range(4)]
    assert client.delays == [(d, d) for d in expected]


def test_an_exception_in_a_wrapped_callback_is_counted_not_raised() -> None:
    transport = MqttTransport("mqtt://127.0.0.1:1883")

    def broken(*args: Any) -> None:
        raise ValueError("bug")

    contained = transport._contained(broken)
    contained(1, 2)
    contained(3)

    assert transport.callback_errors == 2


def test_a_failing_message_handler_is_counted_on_the_bus() -> None:
    bus = MemoryBroker()
    sub, pub = MemoryTransport(bus), MemoryTransport(bus)
    got: list[bytes] = []

    def handler(topic: str, payload: bytes) -> None:
        got.append(payload)
        if payload == b"0":
            raise RuntimeError("first message breaks the handler")

    sub.connect("sub")
    sub.set_handler(handler)
    sub.subscribe("t")
    pub.connect("pub")
    for i in range(3):
        pub.publish("t", str(i).encode())
    assert bus.drain()

    assert got == [b"0", b"1", b"2"] and sub.callback_errors == 1


@pytest.mark.parametrize(
    ("url", "error", "attempts"),
    [
        ("mqtts://127.0.0.1:8883", "TLS handshake ... failed (Connection reset by peer)", 2),
        ("mqtt://127.0.0.1:1883", "connection reset", 1),  # no TLS: no reload race to ride
        ("mqtts://127.0.0.1:8883", "unreachable", 1),  # nothing there: no second wait
    ],
)
def test_a_tls_handshake_reset_is_tried_once_more_and_nothing_else_is(
    monkeypatch: pytest.MonkeyPatch, url: str, error: str, attempts: int
) -> None:
    # Mosquitto resets the TLS handshakes under way while it reloads on SIGHUP, which the
    # coordinator sends after adding each enrolled device's login (the loop of 2026-12-07
    # caught one: tests/integration/test_broker_security.py).
    from edge_agent.transport import mqtt
    from meshfl.errors import BrokerUnreachable, TransportError

    calls: list[str] = []
    failure = BrokerUnreachable(error) if error == "unreachable" else TransportError(error)

    def connect_once(self: MqttTransport, client_id: str, will: object) -> None:
        calls.append(client_id)
        if len(calls) == 1:
            raise failure

    monkeypatch.setattr(MqttTransport, "_connect_once", connect_once)
    monkeypatch.setattr(mqtt.time, "sleep", lambda s: calls.append(f"sleep {s}"))
    transport = MqttTransport(url)
    if attempts == 1:
        with pytest.raises(type(failure)):
            transport.connect("dev-1")
        assert calls == ["dev-1"]
    else:
        transport.connect("dev-1")
        assert calls == ["dev-1", f"sleep {mqtt.LOGIN_RETRY_S}", "dev-1"]
