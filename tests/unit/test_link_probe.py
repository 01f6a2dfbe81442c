"""The link probe (RTT and throughput through the broker) and the battery reading."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines

from edge_agent import capability_probe
from edge_agent.link_probe import LinkProfile, measure_link
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.wire import TopicInfo, delta_topic, parse_topic, probe_topic


class DroppingTransport(MemoryTransport):
    """Loses every message published on a probe topic (as a broker ACL or a dead link)."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if parse_topic(topic).kind == "probe":
            self._bytes_sent += len(payload)
            return
        super().publish(topic, payload, qos=qos, retain=retain)


@pytest.fixture
def bus() -> MemoryBroker:
    return MemoryBroker()


def test_probe_topic_is_the_devices_own_and_parses() -> None:
    assert probe_topic("lab", "pi-01") == "meshfl/v1/lab/node/pi-01/probe"
    assert parse_topic(probe_topic("lab", "pi-01")) == TopicInfo("lab", "pi-01", "probe")


def test_memory_bus_gives_finite_positive_rtt_and_throughput(bus: MemoryBroker) -> None:
    t = MemoryTransport(bus)
    t.connect("dev-0")

    link = measure_link(t, "lab", "dev-0", payload_bytes=16 * 1024, rounds=4, timeout_s=5.0)

    assert link.rtt_samples == 4 and link.burst_delivered == 4
    for value in (link.broker_rtt_s, link.uplink_bytes_per_s, link.downlink_bytes_per_s):
        assert value is not None and math.isfinite(value) and value > 0
    assert link.uplink_bytes_per_s == link.downlink_bytes_per_s  # one loop: min(up, down)
    assert set(link.profile_fields()) == {
        "broker_rtt_s",
        "uplink_bytes_per_s",
        "downlink_bytes_per_s",
    }
    t.close()


class SmallPacketTransport(MemoryTransport):
    """A bus whose broker announced a 4 KiB payload limit and refuses anything larger."""

    def payload_limit(self, topic: str) -> int | None:
        return 4096

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if len(payload) > 4096:
            raise AssertionError(f"{len(payload)} bytes published over the broker's limit")
        super().publish(topic, payload, qos=qos, retain=retain)


def test_the_burst_stays_under_the_brokers_payload_limit(bus: MemoryBroker) -> None:
    t = SmallPacketTransport(bus)
    t.connect("dev-0")

    link = measure_link(t, "lab", "dev-0", rounds=3, timeout_s=5.0)  # 64 KiB asked

    assert link.burst_delivered == 3
    assert link.uplink_bytes_per_s is not None and link.uplink_bytes_per_s > 0
    t.close()


def test_dropped_probe_messages_give_none_within_the_timeout(bus: MemoryBroker) -> None:
    t = DroppingTransport(bus)
    t.connect("dev-0")

    started = time.monotonic()
    link = measure_link(t, "lab", "dev-0", timeout_s=0.5)

    assert time.monotonic() - started < 1.5
    assert link == LinkProfile(None, None, None, rtt_samples=0, burst_delivered=0)
    assert link.profile_fields() == {}


def test_other_messages_reach_the_previous_handler_and_it_is_restored(
    bus: MemoryBroker,
) -> None:
    t = MemoryTransport(bus)
    t.connect("dev-0")
    t.subscribe(delta_topic("lab", "dev-1"))
    neighbour = MemoryTransport(bus)
    neighbour.connect("dev-1")
    seen: list[tuple[str, bytes]] = []

    def engine_handler(topic: str, payload: bytes) -> None:
        seen.append((topic, payload))

    t.set_handler(engine_handler)

    # A neighbour's delta published while the probe holds the handler is forwarded.
    original = t.publish

    def publish(topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        original(topic, payload, qos=qos, retain=retain)
        neighbour.publish(delta_topic("lab", "dev-1"), b"delta", qos=1)

    t.publish = publish  # type: ignore[method-assign]
    link = measure_link(t, "lab", "dev-0", payload_bytes=4096, rounds=3, timeout_s=5.0)
    t.flush(2.0)

    assert link.broker_rtt_s is not None
    assert t.handler is engine_handler
    assert seen and all(topic == delta_topic("lab", "dev-1") for topic, _ in seen)
    assert len(seen) == 6  # 3 pings + 3 burst messages, one delta each


def test_the_engine_still_works_after_a_probe(bus: MemoryBroker) -> None:
    expected = reference(4, 3, "choco", "topk:0.3")
    links: list[LinkProfile] = []

    def factory(device: str) -> MemoryTransport:
        class Probed(MemoryTransport):
            def connect(self, client_id: str, will=None) -> None:  # type: ignore[no-untyped-def]
                super().connect(client_id, will)
                links.append(measure_link(self, "test", client_id, payload_bytes=8192))

        return Probed(bus)

    got, missing, engines = run_engines(factory, 4, 3)

    assert len(links) == 4 and all(link.broker_rtt_s is not None for link in links)
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    assert all(m == [] for per_device in missing for m in per_device)
    assert all(e.stats.rejected == 0 for e in engines)


def test_battery_status_without_a_battery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capability_probe.psutil, "sensors_battery", lambda: None)
    assert capability_probe.battery_status() == (None, None)


def test_battery_status_reads_percent_and_charging(monkeypatch: pytest.MonkeyPatch) -> None:
    battery = SimpleNamespace(percent=42, secsleft=100, power_plugged=True)
    monkeypatch.setattr(capability_probe.psutil, "sensors_battery", lambda: battery)
    assert capability_probe.battery_status() == (42.0, True)
    profile = capability_probe.capability_profile(None)
    assert profile["battery_percent"] == 42.0 and profile["charging"] is True
    assert profile["measured_at"] > 0


def test_battery_status_where_psutil_cannot_read_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise OSError("no sysfs")

    monkeypatch.setattr(capability_probe.psutil, "sensors_battery", broken)
    assert capability_probe.battery_status() == (None, None)
