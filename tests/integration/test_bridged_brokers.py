"""Bridged Mosquitto brokers (broker/bridge.py): what crosses a bridge, once, and what waits.

Each test starts its own hub and leaves on free loopback ports (``BridgedBrokers``, the
project's Mosquitto config plus a bridge) and talks to them with plain paho clients, so
that the QoS and retain flag of every delivered message can be checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.bridge import BridgedBrokers
from broker.tuning import MosquittoTuning
from edge_agent.transport.address import parse_broker_address
from meshfl.wire import control_topic, delta_topic, inbox_topic, probe_topic, status_topic

pytestmark = pytest.mark.mqtt

Received = list[tuple[str, bytes, int, bool]]  # topic, payload, qos, retain


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    # Generous: it returns as soon as the predicate holds; a loaded host delays bridges.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class Client:
    """A paho MQTT 5 client that records every delivery (persistent session if ``persistent``)."""

    def __init__(self, url: str, client_id: str, *, will: str | None = None,
                 persistent: bool = False) -> None:  # fmt: skip
        self.received: Received = []
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        if will is not None:
            self.paho.will_set(will, b"offline", qos=1, retain=True)
        self.paho.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600 if persistent else 0
        address = parse_broker_address(url)
        host, port = address.host, address.port
        self.paho.connect(host, port, keepalive=30, clean_start=not persistent, properties=props)
        self.paho.loop_start()

    def _on_message(self, _client: object, _userdata: object, m: mqtt.MQTTMessage) -> None:
        self.received.append((m.topic, bytes(m.payload), m.qos, bool(m.retain)))

    def subscribe(self, topic_filter: str) -> None:
        done: list[bool] = []
        self.paho.on_subscribe = lambda *_: done.append(True)
        self.paho.subscribe(topic_filter, qos=1)
        assert wait_until(lambda: bool(done)), f"no SUBACK for {topic_filter}"

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.paho.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def payloads(self, topic: str) -> list[bytes]:
        return [p for t, p, _, _ in self.received if t == topic]

    def crash(self) -> None:
        """Close the socket without DISCONNECT: the broker publishes the Will."""
        self.paho.loop_stop()
        sock = self.paho.socket()
        assert sock is not None
        sock.close()

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[BridgedBrokers]:
    """A hub and one leaf (set up before the clients, so stopped after them)."""
    with BridgedBrokers(tmp_path / "brokers", 2) as brokers:
        yield brokers


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[BridgedBrokers]:
    """A hub and two leaves."""
    with BridgedBrokers(tmp_path / "brokers", 3) as brokers:
        yield brokers


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(url: str, client_id: str, **kwargs: object) -> Client:
        client = Client(url, client_id, **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_qos1_messages_cross_the_bridge_both_ways_exactly_once(
    pair: BridgedBrokers, clients: Callable[..., Client]
) -> None:
    hub, leaf = pair.urls
    on_hub, on_leaf = clients(hub, "sub-hub"), clients(leaf, "sub-leaf")
    for sub in (on_hub, on_leaf):
        sub.subscribe("meshfl/#")
    from_hub, from_leaf = delta_topic("f", "d0"), inbox_topic("f", "d0", "d1")
    control = control_topic("f")

    clients(hub, "pub-hub").publish(from_hub, b"delta from the hub")
    clients(hub, "pub-control").publish(control, b"start")
    clients(leaf, "pub-leaf").publish(from_leaf, b"inbox from the leaf")

    expected = {(from_hub, b"delta from the hub"), (control, b"start"),
                (from_leaf, b"inbox from the leaf")}  # fmt: skip
    assert wait_until(
        lambda: all({(t, p) for t, p, _, _ in s.received} == expected for s in (on_hub, on_leaf))
    )
    time.sleep(0.3)  # a loop or an echo over the bridge would add copies by now
    for sub in (on_hub, on_leaf):
        assert sorted(sub.received) == sorted((t, p, 1, False) for t, p in expected)


def test_an_agents_probe_stays_on_its_own_broker(
    pair: BridgedBrokers, clients: Callable[..., Client]
) -> None:
    hub, leaf = pair.urls
    on_hub, on_leaf = clients(hub, "sub-hub"), clients(leaf, "sub-leaf")
    for sub in (on_hub, on_leaf):
        sub.subscribe("meshfl/#")
    probe, delta = probe_topic("f", "d1"), delta_topic("f", "d1")

    publisher = clients(leaf, "d1")
    publisher.publish(probe, b"ping")
    publisher.publish(delta, b"after the probe")  # same client, same order: a marker

    assert wait_until(lambda: on_hub.payloads(delta) == [b"after the probe"])
    assert wait_until(lambda: on_leaf.payloads(probe) == [b"ping"])
    assert on_hub.payloads(probe) == []  # the bridge forwards in order: it came before


def test_a_retained_status_and_a_last_will_cross_the_bridge(
    pair: BridgedBrokers, clients: Callable[..., Client]
) -> None:
    hub, leaf = pair.urls
    status = status_topic("f", "dev-7")
    agent = clients(leaf, "dev-7", will=status)  # an agent on the leaf
    agent.publish(status, b"online", retain=True)
    watcher = clients(hub, "coordinator")  # the coordinator on the hub, subscribed late
    watcher.subscribe("meshfl/v1/f/node/+/status")
    assert wait_until(lambda: watcher.received == [(status, b"online", 1, True)])

    agent.crash()

    # the live watcher gets the Will as a live message; a new subscriber on the hub
    # finds it retained there
    assert wait_until(lambda: watcher.payloads(status) == [b"online", b"offline"])
    late = clients(hub, "late")
    late.subscribe(status)
    assert wait_until(lambda: late.received == [(status, b"offline", 1, True)])


def test_messages_published_while_a_leaf_restarts_wait_for_it(
    pair: BridgedBrokers, clients: Callable[..., Client]
) -> None:
    hub, leaf = pair.urls
    topic = delta_topic("f", "d0")
    device = clients(leaf, "d1", persistent=True)
    device.subscribe(topic)
    device.close()
    publisher = clients(hub, "d0")
    leaf_broker = pair.leaves[0]

    leaf_broker.stop()  # SIGTERM: its sessions are saved; the bridge's hub session stays
    for k in range(5):
        publisher.publish(topic, f"round {k}".encode())
    offset = pair.hub.log_size()
    leaf_broker.start()
    pair.wait_bridged(offset)
    device = clients(leaf, "d1", persistent=True)  # resumes its session on the leaf

    expected = [f"round {k}".encode() for k in range(5)]
    assert wait_until(lambda: device.payloads(topic) == expected)


def test_a_message_between_two_leaves_crosses_the_hub_once(
    trio: BridgedBrokers, clients: Callable[..., Client]
) -> None:
    hub, first, second = trio.urls
    assert [trio.url_for(i) for i in range(4)] == [hub, first, second, hub]
    watchers = [clients(url, f"sub-{i}") for i, url in enumerate(trio.urls)]
    for sub in watchers:
        sub.subscribe("meshfl/#")
    topic = delta_topic("f", "d1")

    clients(first, "d1").publish(topic, b"from leaf 1")

    assert wait_until(lambda: all(s.payloads(topic) == [b"from leaf 1"] for s in watchers))
    time.sleep(0.3)
    assert [len(sub.received) for sub in watchers] == [1, 1, 1]


def test_a_bridge_queue_is_bounded_like_a_clients(
    tmp_path: Path, clients: Callable[..., Client]
) -> None:
    tuning = MosquittoTuning(max_queued_messages=3, max_inflight_messages=2)
    with BridgedBrokers(tmp_path / "brokers", 2, tuning=tuning) as brokers:
        hub, leaf = brokers.urls
        topic = delta_topic("f", "d0")
        device = clients(leaf, "d1", persistent=True)
        device.subscribe(topic)
        device.close()
        publisher = clients(hub, "d0")
        brokers.leaves[0].stop()
        for k in range(10):
            publisher.publish(topic, f"round {k}".encode())
        offset = brokers.hub.log_size()
        brokers.leaves[0].start()
        brokers.wait_bridged(offset)
        device = clients(leaf, "d1", persistent=True)

        # the hub kept the bridge's first 3 messages and dropped the rest, saying so
        expected = [f"round {k}".encode() for k in range(3)]
        assert wait_until(lambda: device.payloads(topic) == expected)
        time.sleep(0.3)
        assert device.payloads(topic) == expected
        log = brokers.hub.log_path.read_text()
        assert f"Outgoing messages are being dropped for client {brokers.bridge_name(1)}" in log
        publisher.close()
        device.close()
