"""The chaos proxy against real brokers: amqtt (MQTT 3.1.1) and Mosquitto (MQTT 5).

A paho subscriber reaches the broker through a :class:`ChaosProxy`; a publisher sends
QoS 1 messages straight to the broker. Every message the proxy did not drop arrives (a
duplicated one twice), and the broker keeps delivering after dozens of drops: the
forged PUBACKs free its in-flight slots (Mosquitto's window is 20).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.transport.address import parse_broker_address
from meshfl.app.local.lab.chaos_proxy import ChaosProxy, Faults
from meshfl.wire import delta_topic

pytestmark = pytest.mark.mqtt

TOPIC = delta_topic("local", "device-1")
MESSAGES = 200


@contextmanager
def _client(host: str, port: int, v5: bool, name: str) -> Iterator[paho.Client]:
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=name,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
    )
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        yield client
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("broker", ["amqtt", "mosquitto"])
def test_every_message_not_dropped_arrives_and_drops_never_stall_the_broker(
    broker: str, request: pytest.FixtureRequest
) -> None:
    address = parse_broker_address(request.getfixturevalue(f"{broker}_url"))
    host, port = address.host, address.port
    v5 = broker == "mosquitto"
    faults = Faults(drop=0.3, duplicate=0.2, reorder=0.1, corrupt=0.1)
    proxy = ChaosProxy(host, port, faults, seed="1:device-0")
    received: list[bytes] = []
    subscribed = threading.Event()
    proxy_port = proxy.start()
    try:
        with _client("127.0.0.1", proxy_port, v5, "receiver") as receiver:
            receiver.on_message = lambda c, u, m: received.append(m.payload)
            receiver.on_subscribe = lambda *args: subscribed.set()
            receiver.subscribe(TOPIC, qos=1)
            assert subscribed.wait(10)
            with _client(host, port, v5, "sender") as sender:
                for k in range(MESSAGES):
                    sender.publish(TOPIC, b"%06d" % k + bytes(200), qos=1).wait_for_publish(10)
            counts = proxy.counts  # live: the broker may still be relaying through the proxy

            def expected() -> int:  # read after every publish went through the proxy
                return MESSAGES - counts.dropped + counts.duplicated

            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                counts.publishes < MESSAGES
                or len(received) < expected()
                or counts.acks_swallowed < counts.duplicated  # the receiver's 2nd PUBACKs
            ):
                time.sleep(0.05)
    finally:
        proxy.stop()

    assert counts.publishes == MESSAGES
    assert 30 < counts.dropped < 90  # ~60 (0.3 of 200): far past an in-flight window of 20
    assert len(received) == expected()
    assert counts.acks_forged == counts.dropped
    assert counts.acks_swallowed == counts.duplicated
    assert counts.corrupted > 0 and counts.reordered > 0
