"""Broker limits honoured and callbacks contained, against a Mosquitto configured by the test.

Each test starts its own Mosquitto on a free port with a :class:`MosquittoTuning` it chooses:
a 1 MiB Maximum Packet Size (a 2.5 MB delta must be chunked, never re-sent forever) and a
Receive Maximum of 5 (an agent sending 50 chunks at once must cap its in-flight window).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from broker.mosquitto import MosquittoProcess
from broker.tuning import MosquittoTuning
from edge_agent.engine import GossipEngine
from edge_agent.transport.mqtt import MqttTransport
from meshfl.aggregation import DPSGDGossip
from meshfl.errors import TransportError
from meshfl.wire import Reassembler, delta_topic, split_message

pytestmark = pytest.mark.mqtt

MIB = 1024 * 1024


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def small_packets(tmp_path: Path) -> Iterator[MosquittoProcess]:
    with MosquittoProcess(workdir=tmp_path, tuning=MosquittoTuning(max_packet_bytes=MIB)) as p:
        yield p


@pytest.fixture
def five_inflight(tmp_path: Path) -> Iterator[MosquittoProcess]:
    with MosquittoProcess(workdir=tmp_path, tuning=MosquittoTuning(max_inflight_messages=5)) as p:
        yield p


def _connected(url: str, client_id: str) -> MqttTransport:
    transport = MqttTransport(url, keepalive_s=5, reconnect_min_s=0.1, reconnect_max_s=1.0)
    transport.connect(client_id)
    return transport


def test_a_2_5_mb_delta_is_chunked_under_a_1_mib_broker_and_applied_exactly(
    small_packets: MosquittoProcess,
) -> None:
    rng = np.random.default_rng(7)
    ids = ["dev-0", "dev-1"]
    x0 = [{"w": rng.normal(size=640_000).astype(np.float32)} for _ in ids]  # 2.56 MB each
    transports = [_connected(small_packets.url, i) for i in ids]
    engines = [
        GossipEngine(
            transport=t,
            fleet="f",
            job_id="j",
            device_id=ids[i],
            neighbours=[ids[1 - i]],
            algorithm=DPSGDGossip(x0[i], {ids[1 - i]: 0.5}, 0.5),
            deadline_s=20.0,
            max_payload=4 * MIB,  # the job allows more than the broker does
        )
        for i, t in enumerate(transports)
    ]
    for engine in engines:
        engine.start()
    for engine in engines:
        assert engine.wait_ready(10.0) == []
    results: list[Any] = [None, None]

    def device(i: int) -> None:
        results[i] = engines[i].exchange(1, x0[i])

    threads = [threading.Thread(target=device, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)

    reference = [DPSGDGossip(x0[i], {ids[1 - i]: 0.5}, 0.5) for i in range(2)]
    outgoing = [reference[i].outgoing(x0[i]) for i in range(2)]
    for i in range(2):
        reference[i].incoming(ids[1 - i], outgoing[1 - i])
    expected = [reference[i].mix(x0[i], {ids[1 - i]}) for i in range(2)]
    for i, t in enumerate(transports):
        limit = t.payload_limit(delta_topic("f", ids[i]))
        assert t.limits.max_packet_bytes == MIB and limit is not None and limit < MIB
        assert t.chunk_size(delta_topic("f", ids[i]), 4 * MIB) == limit
        x, missing = results[i]
        assert missing == []
        np.testing.assert_array_equal(x["w"], expected[i]["w"])
        assert engines[i].stats.applied == 1 and engines[i].stats.rejected == 0
        assert t.reconnects == 0  # no oversized packet ever got us disconnected
        assert t.bytes_sent > 2_560_000
        t.flush(5.0)
        t.close()


def test_an_oversized_publish_is_refused_once_instead_of_resent_forever(
    small_packets: MosquittoProcess,
) -> None:
    transport = _connected(small_packets.url, "big")
    topic = "meshfl/v1/f/node/big/delta"
    limit = transport.payload_limit(topic)
    assert limit == MIB - 10 - len(topic)

    with pytest.raises(TransportError, match="accepts packets of at most 1048576 bytes"):
        transport.publish(topic, b"x" * (limit + 1))
    transport.publish(topic, b"x" * limit)  # exactly the limit: accepted by the broker

    assert transport.flush(10.0)
    assert transport.connected and transport.reconnects == 0
    transport.close()


def test_fifty_chunks_at_once_through_a_receive_maximum_of_5_all_arrive(
    five_inflight: MosquittoProcess,
) -> None:
    received: list[bytes] = []
    lock = threading.Lock()

    def handler(topic: str, payload: bytes) -> None:
        with lock:
            received.append(payload)

    sub = MqttTransport(five_inflight.url, keepalive_s=5)
    sub.set_handler(handler)
    sub.subscribe("meshfl/v1/f/node/+/delta")
    sub.connect("sub")
    pub = _connected(five_inflight.url, "pub")
    message = np.random.default_rng(1).bytes(50 * 1000)
    chunks = split_message(message, b"m" * 16, 1000 + 38)

    assert len(chunks) == 50
    assert pub.limits.receive_maximum == 5 and pub.max_inflight == 5
    for chunk in chunks:
        pub.publish("meshfl/v1/f/node/pub/delta", chunk)
    assert pub.flush(20.0)
    assert wait_until(lambda: len(received) >= 50)
    reassembler = Reassembler()
    done = [m for m in (reassembler.feed(c) for c in received) if m is not None]
    assert done == [message] and len(received) == 50
    assert pub.reconnects == 0 and sub.reconnects == 0
    pub.close()
    sub.close()


def test_an_exception_in_a_paho_callback_is_counted_and_the_loop_carries_on(
    five_inflight: MosquittoProcess,
) -> None:
    got: list[bytes] = []
    sub = MqttTransport(five_inflight.url, keepalive_s=5)

    def handler(topic: str, payload: bytes) -> None:
        got.append(payload)
        if len(got) == 1:
            raise RuntimeError("handler bug on the first message")

    sub.set_handler(handler)
    sub.subscribe("t/#")
    sub.connect("sub")
    pub = MqttTransport(five_inflight.url, keepalive_s=5)
    on_publish = pub._on_publish
    calls = {"n": 0}

    def flaky_on_publish(*args: Any) -> None:  # a bug in our own PUBACK callback, once
        on_publish(*args)
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("callback bug on the first PUBACK")

    pub._on_publish = flaky_on_publish  # type: ignore[method-assign]
    pub.connect("pub")
    for i in range(5):
        pub.publish("t/x", str(i).encode())

    assert pub.flush(10.0)  # paho's loop survived the first PUBACK's exception
    assert wait_until(lambda: len(got) == 5)
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    assert sub.callback_errors == 1 and pub.callback_errors == 1
    assert pub.connected and sub.connected
    pub.close()
    sub.close()
