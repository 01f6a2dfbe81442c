"""The link probe over real brokers on loopback: amqtt (MQTT 3.1.1) and Mosquitto (MQTT 5)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines

from edge_agent.link_probe import measure_link
from edge_agent.transport.mqtt import MqttTransport

pytestmark = pytest.mark.mqtt

log = logging.getLogger(__name__)


def test_loopback_link_is_fast(broker_url: str) -> None:
    t = MqttTransport(broker_url)
    t.connect("dev-0")
    try:
        link = measure_link(t, "lab", "dev-0", timeout_s=10.0)
    finally:
        t.close()

    print(f"{broker_url} ({t.protocol}): {link}")
    assert link.rtt_samples == 5 and link.burst_delivered == 5
    assert link.broker_rtt_s is not None and 0 < link.broker_rtt_s < 1.0
    assert link.uplink_bytes_per_s is not None and link.uplink_bytes_per_s > 1e6
    assert link.downlink_bytes_per_s == link.uplink_bytes_per_s


def test_engine_over_a_real_broker_after_a_probe(broker_url: str) -> None:
    expected = reference(3, 2, "choco", "topk:0.3")

    class Probed(MqttTransport):
        def connect(self, client_id: str, will=None) -> None:  # type: ignore[no-untyped-def]
            super().connect(client_id, will)
            assert measure_link(self, "test", client_id).broker_rtt_s is not None

    got, missing, engines = run_engines(lambda _id: Probed(broker_url), 3, 2)

    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    assert all(m == [] for per_device in missing for m in per_device)
    assert all(e.stats.rejected == 0 for e in engines)
