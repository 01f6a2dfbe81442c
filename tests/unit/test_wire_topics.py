# Wire v1 MQTT topic scheme: builders, parser, and the id rule.
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshfl.errors import ConfigError, VersionError, WireError
from meshfl.wire import (
    TopicInfo,
    control_topic,
    delta_topic,
    inbox_topic,
    parse_topic,
    status_filter,
    status_topic,
    validate_id,
)

ids = st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True)


def test_builders_follow_the_scheme() -> None:
    assert delta_topic("lab", "pi-01") == "meshfl/v1/lab/node/pi-01/delta"
    assert status_topic("lab", "pi-01") == "meshfl/v1/lab/node/pi-01/status"
    assert inbox_topic("lab", "pi-02", "pi-01") == "meshfl/v1/lab/node/pi-02/inbox/pi-01"
    assert control_topic("lab") == "meshfl/v1/lab/control"
    assert status_filter("lab") == "meshfl/v1/lab/node/+/status"
    with pytest.raises(ConfigError, match="fleet id"):
        status_filter("lab/+")


@given(fleet=ids, device=ids, peer=ids)
def test_topics_round_trip(fleet: str, device: str, peer: str) -> None:
    assert parse_topic(delta_topic(fleet, device)) == TopicInfo(fleet, device, "delta")
    assert parse_topic(status_topic(fleet, device)) == TopicInfo(fleet, device, "status")
    assert parse_topic(inbox_topic(fleet, device, peer)) == TopicInfo(fleet, device, "inbox", peer)
    assert parse_topic(control_topic(fleet)) == TopicInfo(fleet, None, "control")


@given(ids)
def test_valid_ids_pass_through(value: str) -> None:
    assert validate_id(value) == value


@pytest.mark.parametrize(
    "bad",
    ["", "a/b", "+", "#", "dev+1", "dev#", "a b", "x" * 65, "pi\u00e9", "pi\n", "\u0661", 7, None],
)
def test_bad_ids_raise_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="invalid fleet id"):
        validate_id(bad, "fleet id")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        delta_topic("lab", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        inbox_topic("lab", "pi-01", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        control_topic(bad)  # type: ignore[arg-type]


def test_id_of_64_characters_is_the_longest_allowed() -> None:
    assert validate_id("a" * 64) == "a" * 64


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "meshfl",
        "meshfl/v1",
        "meshfl/v1/lab",
        "other/v1/lab/control",
        "meshfl/v1/lab/control/extra",
        "meshfl/v1/lab/node/pi-01",
        "meshfl/v1/lab/node/pi-01/weights",
        "meshfl/v1/lab/node/pi-01/inbox",
        "meshfl/v1/lab/node/pi-01/inbox/pi-02/x",
        "meshfl/v1/lab/node/+/delta",
        "meshfl/v1/#",
        "meshfl/v1/lab/node//delta",
        "meshfl/v1/lab/device/pi-01/delta",
        "/meshfl/v1/lab/control",
        "meshfl/v1/lab/control/",
    ],
)
def test_parse_rejects_other_topics(topic: str) -> None:
    with pytest.raises(WireError):
        parse_topic(topic)


def test_parse_reports_other_versions() -> None:
    with pytest.raises(VersionError, match="v2"):
        parse_topic("meshfl/v2/lab/control")
    with pytest.raises(WireError):
        parse_topic(b"meshfl/v1/lab/control")  # type: ignore[arg-type]


@given(st.text(max_size=80))
def test_parse_raises_only_wire_error(topic: str) -> None:
    try:
        info = parse_topic(topic)
    except WireError:
        return
    assert info.kind in {"delta", "status", "inbox", "control"}
