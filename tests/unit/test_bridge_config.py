"""The Mosquitto bridge configuration (broker/bridge.py): its settings and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.bridge import BRIDGE_TOPICS, BridgedBrokers, bridge_config
from meshfl.errors import ConfigError


def settings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_a_bridge_carries_the_fleet_topics_at_qos1_over_a_persistent_311_session() -> None:
    lines = settings(bridge_config("meshfl-bridge-1", 1884, max_packet_bytes=131072))

    assert lines[:5] == [
        "connection meshfl-bridge-1",
        "address 127.0.0.1:1884",
        "remote_clientid meshfl-bridge-1",
        "local_clientid meshfl-bridge-1.local",
        "bridge_protocol_version mqttv311",
    ]
    assert {"try_private true", "cleansession false", "local_cleansession false",
            "bridge_max_packet_size 131072", "restart_timeout 1 5"} <= set(lines)  # fmt: skip
    assert [line for line in lines if line.startswith("topic ")] == [
        f"topic {pattern} both 1" for pattern in BRIDGE_TOPICS
    ]
    assert not any("probe" in pattern for pattern in BRIDGE_TOPICS)
    assert not any(line.startswith("bridge_max_packet_size") for line in settings(
        bridge_config("b", 1884)))  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "two words"}, "invalid bridge name"),
        ({"topics": ("meshfl/#\naddress evil:1",)}, "control character"),
        ({"topics": ()}, "at least one topic"),
        ({"qos": 3}, "QoS must be 0, 1 or 2"),
        ({"protocol": "mqttv31"}, "use one of mqttv311, mqttv50"),
        ({"remote_port": 70000}, "not a TCP port"),
        ({"keepalive_s": 2}, "keepalive_s >= 5"),
        ({"restart_timeout_s": (5, 1)}, "restart base <= cap"),
    ],
)
def test_bridge_config_refuses_what_mosquitto_would_misread(
    kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {"name": "b", "remote_port": 1884, **kwargs}
    with pytest.raises(ConfigError, match=match):
        bridge_config(**args)  # type: ignore[arg-type]


def test_bridged_brokers_refuse_a_count_out_of_range(tmp_path: Path) -> None:
    for count in (0, 9):
        with pytest.raises(ConfigError, match="run 1 to 8 bridged brokers"):
            BridgedBrokers(tmp_path, count)
