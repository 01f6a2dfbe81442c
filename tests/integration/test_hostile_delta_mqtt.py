"""Hostile bytes on a neighbour's delta topic, published by a raw MQTT client (issue 7).

Four devices run CHOCO-SGD in a ring over Mosquitto. Between rounds 1 and 2,
``mosquitto_pub`` (no meshfl code) publishes on dev-1's delta topic:

1. random garbage (not a chunk);
2. an envelope cut short, in a well-formed chunk;
3. a valid-looking dev-1 envelope whose CRC-32 is wrong, in a well-formed chunk — it
   claims dev-1's next sequence number, so applying it would change every model;
4. an oversized payload: a chunk of up to 1 MiB announcing a 4 GiB message.

dev-1's ring neighbours (dev-0 and dev-2) each reject and count all four; every engine
finishes its three rounds with exactly the models of the clean lockstep reference, and
each neighbour applied exactly its 2 × 3 real messages. A fifth payload, larger than the
broker's ``max_packet_size``, is refused by Mosquitto itself and never reaches an agent.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, TransportFactory, make_algorithms, reference
from signed_scenarios import run_round

from broker.mosquitto import MAX_PACKET_BYTES, MosquittoProcess
from edge_agent.engine import GossipEngine
from edge_agent.transport.base import Message, Transport
from edge_agent.transport.mqtt import MqttTransport
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    TensorEntry,
    delta_topic,
    new_message_id,
    split_message,
    status_topic,
)
from meshfl.wire.serde import encode_chunk, encode_envelope

pytestmark = pytest.mark.mqtt

TOPIC = delta_topic(FLEET, "dev-1")


def start_engines(
    factory: TransportFactory, n: int
) -> tuple[list[GossipEngine], list[Transport], list[dict[str, np.ndarray]]]:
    """Started, ready, unsigned engines of an ``n``-ring (``gossip_scenarios``' models)."""
    ids, graph, xs, algos = make_algorithms(n, "choco", "topk:0.3")
    engines, transports = [], []
    for i in range(n):
        transport = factory(ids[i])
        will = Message(status_topic(FLEET, ids[i]), b'{"state": "offline"}', retain=True)
        transport.connect(ids[i], will=will)
        engine = GossipEngine(
            transport=transport,
            fleet=FLEET,
            job_id=JOB,
            device_id=ids[i],
            neighbours=[ids[j] for j in graph.neighbours(i)],
            algorithm=algos[i],
            deadline_s=20.0,
            max_payload=1024,
        )
        engine.start()
        engines.append(engine)
        transports.append(transport)
    for engine in engines:
        assert engine.wait_ready(20.0) == []
    return engines, transports, [dict(x) for x in xs]


def hostile_payloads() -> list[bytes]:
    """The four payloads of the module docstring, each one MQTT message."""
    fake = Envelope(
        MessageKind.DELTA,
        FLEET,
        JOB,
        2,
        "dev-1",
        new_message_id(),
        2,  # dev-1's next sequence number
        (
            TensorEntry("w", (6, 5), DType.FLOAT32, 1, bytes(120)),
            TensorEntry("b", (5,), DType.FLOAT32, 1, bytes(20)),
        ),
    )
    encoded = encode_envelope(fake)
    wrong_crc = encoded[:-1] + bytes([encoded[-1] ^ 0xFF])
    (truncated,) = split_message(encoded[:-30], new_message_id(), 1024)
    (bad_crc,) = split_message(wrong_crc, new_message_id(), 1024)
    body = bytes(min(2**20, MAX_PACKET_BYTES // 2))
    oversized = encode_chunk(new_message_id(), 0, 1, 2**32 - 1, body)
    return [random.Random(7).randbytes(300), truncated, bad_crc, oversized]


def mosquitto_pub(broker: MosquittoProcess, payload: bytes, path: Path) -> int:
    """Publish ``payload`` on dev-1's delta topic at QoS 1; the exit status."""
    path.write_bytes(payload)
    command = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1"]
    done = subprocess.run(
        [*command, "-i", "attacker", "-t", TOPIC, "-f", str(path)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode


def rejected(engines: list[GossipEngine]) -> list[int]:
    """Messages dev-1's neighbours (dev-0, dev-2) rejected so far."""
    return [engines[i].stats.rejected for i in (0, 2)]


def test_garbage_on_a_delta_topic_is_rejected_counted_and_never_applied(
    mosquitto_process: MosquittoProcess, tmp_path: Path
) -> None:
    # Prepare
    assert shutil.which("mosquitto_pub"), "install Debian's mosquitto-clients"
    engines, transports, xs = start_engines(lambda _id: MqttTransport(mosquitto_process.url), 4)
    payloads = hostile_payloads()
    try:
        # Execute: round 1, the hostile payloads, rounds 2 and 3
        assert run_round(engines, xs, 1) == [[], [], [], []]
        for payload in payloads:
            assert mosquitto_pub(mosquitto_process, payload, tmp_path / "payload") == 0
        too_big = bytes(MAX_PACKET_BYTES + 1)
        assert mosquitto_pub(mosquitto_process, too_big, tmp_path / "too-big") != 0
        for r in (2, 3):
            assert run_round(engines, xs, r) == [[], [], [], []]
        deadline = time.monotonic() + 10.0  # all were queued before dev-1's round 2
        while time.monotonic() < deadline and min(rejected(engines)) < len(payloads):
            for engine in engines:
                engine.drain()
            time.sleep(0.05)
        for engine in engines:
            engine.drain()
    finally:
        for t in transports:
            t.flush(5.0)
            t.close()

    # Assert: nothing of it was applied, all of it was counted, the models are untouched
    for got, want in zip(xs, reference(4, 3, "choco", "topk:0.3"), strict=True):
        np.testing.assert_array_equal(got["w"], want["w"])
        np.testing.assert_array_equal(got["b"], want["b"])
    for i in (0, 2):  # dev-1's neighbours in the ring
        stats = engines[i].stats
        assert stats.rejected == len(payloads), stats
        assert (stats.applied, stats.duplicates, stats.gaps) == (6, 0, 0), stats
    assert engines[3].stats.rejected == 0  # dev-3 does not listen to dev-1
