"""Signed deltas behind a broker that lets everything through (plain anonymous Mosquitto).

A raw paho client plays the attacker: it records dev-1's real round-1 message, then,
between rounds 1 and 2, publishes on dev-1's delta topic a replay of those exact chunks,
the same envelope re-chunked (past reassembly's duplicate filter), a delta claiming to be
dev-1's next one but signed with dev-0's key, and an unsigned one. dev-1's neighbours
refuse all of them, count them, and train exactly as the clean run (the lockstep
reference) does.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import numpy as np
import paho.mqtt.client as paho
import pytest
from gossip_scenarios import FLEET, JOB, reference
from signed_scenarios import run_round, signed_engines

from edge_agent.signing import Signer
from edge_agent.transport.mqtt import MqttTransport
from meshfl.wire import Envelope, Reassembler, delta_topic, new_message_id, split_message
from meshfl.wire.serde import decode_chunk, decode_envelope_signed, encode_envelope

pytestmark = pytest.mark.mqtt

TOPIC = delta_topic(FLEET, "dev-1")


class Attacker:
    """A raw MQTT client that records dev-1's first message and publishes anything."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.captured: list[bytes] = []  # the chunks of dev-1's first complete message
        self.message = b""
        self._chunks: dict[bytes, list[bytes]] = {}
        self._reassembler = Reassembler()
        self.got_one = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_args: subscribed.set()
        self.client.connect(parts.hostname or "127.0.0.1", parts.port or 1883)
        self.client.loop_start()
        self.client.subscribe(TOPIC, qos=1)
        assert subscribed.wait(10.0)

    def _on_message(self, _client: object, _userdata: object, msg: paho.MQTTMessage) -> None:
        if self.got_one.is_set():
            return
        chunk = bytes(msg.payload)
        self._chunks.setdefault(decode_chunk(chunk).message_id, []).append(chunk)
        message = self._reassembler.feed(chunk)
        if message is not None:
            self.captured = self._chunks[decode_chunk(chunk).message_id]
            self.message = message
            self.got_one.set()

    def publish(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            self.client.publish(TOPIC, payload, qos=1).wait_for_publish(10.0)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_spoofed_and_replayed_deltas_are_refused_over_mosquitto(mosquitto_url: str) -> None:
    engines, transports, xs, keys = signed_engines(lambda _id: MqttTransport(mosquitto_url), 4)
    attacker = Attacker(mosquitto_url)
    try:
        assert run_round(engines, xs, 1) == [[], [], [], []]
        assert attacker.got_one.wait(10.0)
        real = decode_envelope_signed(attacker.message).envelope
        assert real.sender == "dev-1" and real.sequence == 1
        forged = Envelope(
            real.kind, FLEET, JOB, 2, "dev-1", new_message_id(), 2, real.tensors
        )  # dev-1's next message, as the attacker would have it
        attacker.publish(
            attacker.captured  # the same bytes again: dropped by reassembly (QoS 1 dup)
            + split_message(attacker.message, new_message_id(), 1024)  # re-chunked
            + split_message(encode_envelope(forged, sign=Signer(keys[0])), forged.message_id)
            + split_message(encode_envelope(forged), new_message_id())
        )
        # Published before round 2: each receiver handles them before dev-1's round 2.
        for r in (2, 3):
            assert run_round(engines, xs, r) == [[], [], [], []]
    finally:
        attacker.close()
        for t in transports:
            t.flush(5.0)
            t.close()

    for got, want in zip(xs, reference(4, 3, "choco", "topk:0.3"), strict=True):
        np.testing.assert_array_equal(got["w"], want["w"])
        np.testing.assert_array_equal(got["b"], want["b"])
    for i in (0, 2):  # dev-1's neighbours in the ring
        stats = engines[i].stats
        assert (stats.unsigned, stats.bad_signature, stats.replayed) == (1, 1, 1), stats
        assert stats.applied == 6 and stats.rejected == 0
    assert engines[3].stats.bad_signature == 0  # dev-3 does not listen to dev-1
