"""The gossip engine over real brokers: the embedded amqtt (MQTT 3.1.1) and Mosquitto (MQTT 5)."""

from __future__ import annotations

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines

from edge_agent.transport.mqtt import MqttTransport

pytestmark = pytest.mark.mqtt


def test_choco_over_a_real_broker_matches_the_lockstep_reference(broker_url: str) -> None:
    expected = reference(4, 3, "choco", "topk:0.3")

    got, missing, engines = run_engines(lambda _id: MqttTransport(broker_url), 4, 3)

    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
        np.testing.assert_array_equal(g["b"], e["b"])
    assert all(m == [] for per_device in missing for m in per_device)
    assert all(e.stats.rejected == 0 for e in engines)


def test_dpsgd_with_a_missing_neighbour_over_a_real_broker(broker_url: str) -> None:
    got, missing, _ = run_engines(
        lambda _id: MqttTransport(broker_url),
        4,
        2,
        "dpsgd",
        "identity",
        deadline_s=1.0,
        absent=frozenset({0}),
    )

    assert missing[1] == [["dev-0"], ["dev-0"]]
    assert missing[3] == [["dev-0"], ["dev-0"]]
    # dev-2 may see its neighbours late while they wait out the deadline, never dev-0.
    assert all(set(m) <= {"dev-1", "dev-3"} for m in missing[2])
    assert got[0] is None and all(np.isfinite(g["w"]).all() for g in got[1:] if g is not None)
