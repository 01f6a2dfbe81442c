"""One transport behaviour suite on three backends: memory, amqtt (3.1.1), Mosquitto (5).

Each test takes ``net``: a small factory that makes connected transports for one backend
and can make a client die abruptly (memory: ``kill()``; real brokers: a subprocess that
is SIGKILLed, so its socket closes without DISCONNECT).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from broker.embedded import EmbeddedBroker
from broker.mosquitto import MosquittoProcess
from broker.ports import free_port
from edge_agent.transport.address import parse_broker_address
from edge_agent.transport.base import Message, Transport
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from edge_agent.transport.mqtt import MqttTransport
from meshfl.errors import BrokerUnreachable, ConfigError

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import sys, threading
from edge_agent.transport.base import Message
from edge_agent.transport.mqtt import MqttTransport
url, cid, will_topic, sub = sys.argv[1:5]
seen = threading.Event()
t = MqttTransport(url, keepalive_s=5, connect_timeout_s=5)
t.set_handler(lambda topic, payload: seen.set() if topic == f"probe/{cid}" else None)
t.subscribe(f"probe/{cid}")
if sub != "-":
    t.subscribe(sub)
t.connect(cid, will=Message(will_topic, b"offline") if will_topic != "-" else None)
t.publish(f"probe/{cid}", b"x")  # proves the subscriptions are active at the broker
if not seen.wait(5):
    sys.exit(3)
print("ready", flush=True)
threading.Event().wait()
"""


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@dataclass
class Inbox:
    """A thread-safe handler that records (topic, payload) pairs."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.items.append((topic, payload))

    def topics(self) -> set[str]:
        with self.lock:
            return {t for t, _ in self.items}

    def payloads(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p in self.items if t == topic]


class Net:
    """Makes transports on one backend and closes them at the end of the test."""

    def __init__(self, kind: str, url: str | None, memory: MemoryBroker | None) -> None:
        self.kind, self.url, self.memory = kind, url, memory
        self.open: list[Transport] = []
        self.children: list[subprocess.Popen[str]] = []

    def transport(self) -> Transport:
        if self.memory is not None:
            t: Transport = MemoryTransport(self.memory)
        else:
            assert self.url is not None
            t = MqttTransport(self.url, keepalive_s=5, connect_timeout_s=5, reconnect_min_s=0.1)
        self.open.append(t)
        return t

    def client(
        self,
        cid: str,
        inbox: Inbox | None = None,
        subs: tuple[str, ...] = (),
        will: Message | None = None,
    ) -> Transport:
        t = self.transport()
        if inbox is not None:
            t.set_handler(inbox)
        for s in subs:
            t.subscribe(s)
        t.connect(cid, will=will)
        return t

    def crash(self, cid: str, will_topic: str | None = None, sub: str | None = None) -> None:
        """Connect a client ``cid`` (with a will and/or a subscription) and kill it abruptly."""
        if self.memory is not None:
            t = MemoryTransport(self.memory)
            if sub:
                t.subscribe(sub)
            t.connect(cid, will=Message(will_topic, b"offline") if will_topic else None)
            t.kill()
            return
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-c", _CHILD, str(self.url), cid, will_topic or "-", sub or "-"]
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        self.children.append(child)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGKILL)
        child.wait()

    def settle(self) -> None:
        """Give the backend time to deliver whatever it would (for negative checks)."""
        if self.memory is not None:
            self.memory.drain(2.0)
        else:
            time.sleep(0.3)

    def close(self) -> None:
        for t in self.open:
            t.close()
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


BACKENDS = [
    "memory",
    pytest.param("amqtt", marks=pytest.mark.mqtt),
    pytest.param("mosquitto", marks=pytest.mark.mqtt),
]


@pytest.fixture(params=BACKENDS)
def net(request: pytest.FixtureRequest) -> Iterator[Net]:
    memory = MemoryBroker() if request.param == "memory" else None
    url = None if memory is not None else request.getfixturevalue(f"{request.param}_url")
    n = Net(request.param, url, memory)
    yield n
    n.close()
    if memory is not None:
        memory.stop()


def test_pubsub_routes_by_plus_and_hash_filters(net: Net) -> None:
    # Prepare
    deltas, everything = Inbox(), Inbox()
    net.client("n1", deltas, subs=("meshfl/v1/f/node/+/delta",))
    net.client("n2", everything, subs=("meshfl/v1/f/#",))
    pub = net.client("n3")
    sent = {
        "meshfl/v1/f/node/a/delta": b"d-a",
        "meshfl/v1/f/node/b/delta": b"d-b",
        "meshfl/v1/f/node/a/inbox/b": b"i",
        "meshfl/v1/f/control": b"c",
        "meshfl/v1/other/control": b"x",
    }
    # Execute
    for topic, payload in sent.items():
        pub.publish(topic, payload)
    assert pub.flush(5.0)
    # Assert
    want_deltas = {"meshfl/v1/f/node/a/delta", "meshfl/v1/f/node/b/delta"}
    want_all = {t for t in sent if t.startswith("meshfl/v1/f/")}
    assert wait_until(lambda: deltas.topics() == want_deltas and everything.topics() == want_all)
    net.settle()
    assert deltas.topics() == want_deltas
    assert everything.topics() == want_all
    assert pub.bytes_sent == sum(len(p) for p in sent.values())


def test_retained_status_reaches_late_subscribers_and_empty_payload_deletes_it(net: Net) -> None:
    pub = net.client("dev")
    pub.publish("meshfl/v1/f/node/dev/status", b"online", retain=True)
    assert pub.flush(5.0)
    late = Inbox()
    net.client("late", late, subs=("meshfl/v1/f/node/+/status",))
    assert wait_until(lambda: late.payloads("meshfl/v1/f/node/dev/status") == [b"online"])

    pub.publish("meshfl/v1/f/node/dev/status", b"", retain=True)
    assert pub.flush(5.0)
    later = Inbox()
    net.client("later", later, subs=("meshfl/v1/f/node/+/status",))
    net.settle()
    assert later.items == []


def test_qos1_delivers_a_1_mib_payload_intact(net: Net) -> None:
    payload = np.random.default_rng(0).integers(0, 256, size=1 << 20, dtype=np.uint8).tobytes()
    inbox = Inbox()
    sub = net.client("sub", inbox, subs=("big/#",))
    pub = net.client("pub")
    pub.publish("big/delta", payload, qos=1)
    assert pub.flush(10.0)
    assert wait_until(lambda: len(inbox.items) == 1, 10.0)
    assert inbox.payloads("big/delta") == [payload]
    assert (pub.bytes_sent, sub.bytes_received) == (1 << 20, 1 << 20)


def test_last_will_fires_retained_when_a_client_dies_abruptly(net: Net) -> None:
    watcher = Inbox()
    net.client("watcher", watcher, subs=("status/#",))
    net.crash("victim", will_topic="status/victim")
    assert wait_until(lambda: watcher.payloads("status/victim") == [b"offline"])
    late = Inbox()
    net.client("late", late, subs=("status/#",))
    # QoS 1 is at-least-once: amqtt 0.12 may hand a retained will to a new subscriber twice.
    assert wait_until(lambda: late.payloads("status/victim")[:1] == [b"offline"])
    assert set(late.payloads("status/victim")) == {b"offline"}


def test_clean_close_does_not_fire_the_will(net: Net) -> None:
    watcher = Inbox()
    net.client("watcher", watcher, subs=("status/#",))
    leaver = net.client("leaver", will=Message("status/leaver", b"offline"))
    leaver.close()
    assert not leaver.connected
    net.settle()
    assert watcher.items == []


def test_protocol_is_negotiated(net: Net) -> None:
    t = net.client("p")
    expected = {"memory": "memory", "amqtt": "MQTTv311", "mosquitto": "MQTTv5"}[net.kind]
    assert (t.protocol, t.connected) == (expected, True)


def test_a_failing_handler_does_not_stop_delivery(
    net: Net, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[bytes] = []

    def handler(topic: str, payload: bytes) -> None:
        got.append(payload)
        if payload == b"1":
            raise RuntimeError("handler bug")

    sub = net.transport()
    sub.set_handler(handler)
    sub.subscribe("h/#")
    sub.connect("sub")
    pub = net.client("pub")
    with caplog.at_level(logging.ERROR, logger="meshfl.transport"):
        for i in range(1, 4):
            pub.publish("h/x", str(i).encode())
        assert wait_until(lambda: len(got) == 3)
    assert got == [b"1", b"2", b"3"]
    assert sub.callback_errors == 1
    assert any("handler failed" in r.getMessage() for r in caplog.records)


def test_an_unreachable_broker_fails_fast_with_a_one_line_message(net: Net) -> None:
    port = free_port()
    if net.memory is not None:
        net.memory.stop()
        t: Transport = MemoryTransport(net.memory)
    else:
        t = MqttTransport(f"mqtt://127.0.0.1:{port}", connect_timeout_s=5)
    start = time.monotonic()
    with pytest.raises(BrokerUnreachable) as caught:
        t.connect("x")
    assert time.monotonic() - start < 1.0
    message = str(caught.value)
    assert "\n" not in message
    if net.memory is None:
        assert f"127.0.0.1:{port}" in message and "--port" in message


# amqtt 0.12 drops anonymous sessions on disconnect, so this runs on memory and Mosquitto.
@pytest.mark.parametrize(
    "net", ["memory", pytest.param("mosquitto", marks=pytest.mark.mqtt)], indirect=True
)
def test_a_persistent_session_gets_qos1_messages_sent_while_away(net: Net) -> None:
    pub = net.client("pub")
    # cleanly disconnected subscriber
    net.client("clean-sub", subs=("away/clean",)).close()
    # subscriber that dies without DISCONNECT
    net.crash("dead-sub", sub="away/dead")
    pub.publish("away/clean", b"while-closed", qos=1)
    pub.publish("away/dead", b"while-dead", qos=1)
    assert pub.flush(5.0)

    clean, dead = Inbox(), Inbox()
    net.client("clean-sub", clean)
    net.client("dead-sub", dead)
    assert wait_until(lambda: clean.payloads("away/clean") == [b"while-closed"])
    assert wait_until(lambda: dead.payloads("away/dead") == [b"while-dead"])


@pytest.mark.mqtt
def test_reconnect_after_mosquitto_restart_keeps_subscriptions(
    mosquitto_process: MosquittoProcess,
) -> None:
    inbox = Inbox()
    sub = MqttTransport(
        mosquitto_process.url, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=1
    )
    pub = MqttTransport(
        mosquitto_process.url, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=1
    )
    try:
        sub.set_handler(inbox)
        sub.subscribe("r/#")
        sub.connect("sub")
        pub.connect("pub")
        pub.publish("r/before", b"1")
        assert wait_until(lambda: inbox.payloads("r/before") == [b"1"])

        mosquitto_process.restart()
        assert wait_until(lambda: sub.reconnects == 1 and pub.reconnects == 1 and sub.connected)
        assert wait_until(lambda: pub.connected)
        pub.publish("r/after", b"2")
        assert pub.flush(5.0)
        assert wait_until(lambda: inbox.payloads("r/after") == [b"2"])
    finally:
        sub.close()
        pub.close()


@pytest.mark.mqtt
def test_reconnect_resubscribes_when_the_broker_lost_the_session(tmp_path: Path) -> None:
    # Mosquitto killed with SIGKILL right after the subscription: nothing was persisted,
    # so the broker answers session_present=0 and the transport must subscribe again.
    process = MosquittoProcess(workdir=tmp_path)
    process.start()
    inbox = Inbox()
    sub = MqttTransport(process.url, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=1)
    pub = MqttTransport(process.url, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=1)
    try:
        sub.set_handler(inbox)
        sub.subscribe("k/#")
        sub.connect("sub")
        process.kill()
        process.start()
        assert wait_until(lambda: sub.reconnects == 1)
        pub.connect("pub")
        pub.publish("k/x", b"after-crash")
        assert wait_until(lambda: inbox.payloads("k/x") == [b"after-crash"])
    finally:
        sub.close()
        pub.close()
        process.stop()


def test_embedded_broker_speaks_only_mqtt_311_and_is_detected_quickly() -> None:
    with EmbeddedBroker(port=free_port()) as broker:
        t = MqttTransport(broker.url, connect_timeout_s=5)
        start = time.monotonic()
        t.connect("fast")
        elapsed = time.monotonic() - start
        t.close()
    assert t.protocol == "MQTTv311"
    assert elapsed < 1.0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://broker.local:1884", ("broker.local", 1884)),
        ("mqtt://10.0.0.5", ("10.0.0.5", 1883)),
        ("127.0.0.1:2883", ("127.0.0.1", 2883)),
        ("localhost", ("localhost", 1883)),
    ],
)
def test_broker_urls_parse(url: str, expected: tuple[str, int]) -> None:
    address = parse_broker_address(url)
    assert (address.host, address.port) == expected


@pytest.mark.parametrize(
    "url", ["http://h:1883", "mqtt://h:notaport", "mqtt://:1883", "mqtt://h:1/x"]
)
def test_bad_broker_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="mqtt://HOST:PORT"):
        MqttTransport(url)
