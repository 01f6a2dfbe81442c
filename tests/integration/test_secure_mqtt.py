"""Secure aggregation over a real Mosquitto, with a sniffer on every topic."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from secure_scenarios import build_fleet, complete_graph, run_rounds

from edge_agent.transport.mqtt import MqttTransport
from meshfl.aggregation import pack_words

pytestmark = pytest.mark.mqtt


def test_broker_traffic_of_a_secure_run_holds_no_plaintext_delta(mosquitto_url: str) -> None:
    captured: list[bytes] = []
    lock = threading.Lock()
    sniffer = MqttTransport(mosquitto_url)
    sniffer.connect("sniffer")

    def keep(topic: str, payload: bytes) -> None:
        with lock:
            captured.append(bytes(payload))

    sniffer.set_handler(keep)
    sniffer.subscribe("meshfl/#", qos=1)
    graph = complete_graph(4)
    devices, _ = build_fleet(lambda _: MqttTransport(mosquitto_url), graph, rounds=2,
                             threshold=2)  # fmt: skip

    run_rounds(devices, 2)
    sniffer.flush(5.0)
    sniffer.close()

    for name, device in devices.items():  # the run was a real secure run: sums unmasked
        assert device.missing == [[], []] and device.engine.stats.aggregated == 2, name
    traffic = b"".join(captured)
    assert len(traffic) > 10_000
    bits = devices["dev-0"].engine.fixed_point.modulus_bits
    checked = 0
    for device in devices.values():
        for c in device.contributions:
            # The plaintext of each delta: its packed fixed-point words and its float values.
            for plain in (pack_words(c.encoded, bits), c.value.astype(np.float32).tobytes()):
                for start in range(0, len(plain) - 16, 16):
                    window = plain[start : start + 16]
                    if len(set(window)) > 4:  # a run of equal bytes could match anything
                        assert window not in traffic
                        checked += 1
    assert checked > 100
