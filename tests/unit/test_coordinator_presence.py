"""Device presence from status topics: the online rule, bad messages, the cap, the app."""

from __future__ import annotations

import json
import logging
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator import CoordinatorSettings, create_app
from coordinator.presence import (
    OnlineStatus,
    Presence,
    online_status,
)
from meshfl.app.cli import servers
from meshfl.errors import ConfigError, TransportError
from meshfl.wire import status_filter, status_topic
from meshfl.wire.status import MAX_STATUS_BYTES

MAX_JOB_CHARS = 64  # job ids follow the wire id rule (meshfl.wire.validate_id)

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
LIVE_S = 15.0


class FakeClock:
    """A clock the test moves by hand (unix seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def status(state: str, job: str | None = None, rnd: int | None = None) -> bytes:
    return json.dumps({"state": state, "job": job, "round": rnd}).encode()


def judge(presence: Presence, device: str, last_seen: float, now: float) -> OnlineStatus:
    return presence.online(device, last_seen, now=now, live_within_s=LIVE_S)


# -- the online rule ---------------------------------------------------------------------


def test_without_a_status_the_heartbeat_rule_decides() -> None:
    presence = Presence("lab", clock=FakeClock(0.0))
    assert judge(presence, "a", last_seen=100.0, now=115.0) == (True, "heartbeat")
    assert judge(presence, "a", last_seen=100.0, now=115.5) == (False, "heartbeat")
    assert online_status(None, "a", 100.0, now=200.0, live_within_s=LIVE_S) == (
        False,
        "heartbeat",
    )


def test_a_status_at_or_after_last_seen_decides_and_a_later_heartbeat_wins() -> None:
    clock = FakeClock(100.0)
    presence = Presence("lab", clock=clock)
    presence.on_status(status_topic("lab", "a"), status("offline"))  # the Will, at 100
    assert judge(presence, "a", last_seen=99.0, now=100.0) == (False, "last_will")
    assert judge(presence, "a", last_seen=100.0, now=100.0) == (False, "last_will")  # equal
    assert judge(presence, "a", last_seen=100.5, now=101.0) == (True, "heartbeat")  # back
    clock.now = 500.0
    presence.on_status(status_topic("lab", "a"), status("online", "job-1", 3))
    # Connected to the broker: online although not heard from over REST for long.
    assert judge(presence, "a", last_seen=100.0, now=900.0) == (True, "last_will")
    presence.on_status(status_topic("lab", "a"), status("declined", "job-2"))
    assert judge(presence, "a", last_seen=100.0, now=900.0) == (True, "last_will")


def test_an_offline_will_keeps_the_last_job_and_round() -> None:
    presence = Presence("lab", clock=FakeClock(10.0))
    topic = status_topic("lab", "a")
    presence.on_status(topic, status("online", "job-1", 7))
    presence.on_status(topic, status("offline"))  # the Will carries no job
    record = presence.get("a")
    assert record is not None and not record.online
    assert (record.job, record.round, record.at) == ("job-1", 7, 10.0)
    assert presence.round_of("a") == 7 and presence.round_of("a", "job-1") == 7
    assert presence.round_of("a", "job-2") is None and presence.round_of("b") is None
    presence.on_status(topic, status("online"))  # idle again: no job, no round
    assert presence.round_of("a") is None


def test_an_empty_payload_clears_the_status() -> None:
    presence = Presence("lab", clock=FakeClock(10.0))
    presence.on_status(status_topic("lab", "a"), status("offline"))
    presence.on_status(status_topic("lab", "a"), b"")  # a retained status deleted
    assert presence.get("a") is None and len(presence) == 0 and presence.rejected == 0


# -- bad messages ----------------------------------------------------------------------

BAD = {
    "other fleet": (status_topic("other", "a"), status("offline")),
    "delta topic": ("meshfl/v1/lab/node/a/delta", status("offline")),
    "not meshfl": ("sensors/a/status", status("offline")),
    "wire v2": ("meshfl/v2/lab/node/a/status", status("offline")),
    "not json": (status_topic("lab", "a"), b"offline"),
    "not utf-8": (status_topic("lab", "a"), b"\xff\xfe{}"),
    "json list": (status_topic("lab", "a"), b'["offline"]'),
    "unknown state": (status_topic("lab", "a"), status("sleeping")),
    "state a list": (status_topic("lab", "a"), b'{"state": ["offline"]}'),
    "no state": (status_topic("lab", "a"), b'{"job": null}'),
    "job a number": (status_topic("lab", "a"), b'{"state": "online", "job": 3}'),
    "negative round": (status_topic("lab", "a"), status("online", "j", -1)),
    "round a bool": (status_topic("lab", "a"), b'{"state": "online", "job": "j", "round": true}'),
    "round a str": (status_topic("lab", "a"), b'{"state": "online", "job": "j", "round": "3"}'),
    "too deep": (status_topic("lab", "a"), b"[" * 50_000),
    "job too long": (status_topic("lab", "a"), status("online", "j" * (MAX_JOB_CHARS + 1), 1)),
    "job not an id": (status_topic("lab", "a"), status("online", "job/1", 1)),
    "unknown field": (status_topic("lab", "a"), b'{"state": "online", "extra": 1}'),
    "duplicate key": (status_topic("lab", "a"), b'{"state": "online", "state": "offline"}'),
    "nested need": (
        status_topic("lab", "a"),
        b'{"state": "online", "need": [[[[[[[[["a"]]]]]]]]]}',
    ),
    "bad device id": ("meshfl/v1/lab/node/" + "d" * 65 + "/status", status("online")),
    "too large": (status_topic("lab", "a"), b" " * MAX_STATUS_BYTES + status("offline")),
}


@pytest.mark.parametrize("topic, payload", BAD.values(), ids=BAD.keys())
def test_a_bad_message_is_counted_and_ignored(
    topic: str, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    presence = Presence("lab", clock=FakeClock(10.0))
    presence.on_status(status_topic("lab", "a"), status("online", "job-1", 2))
    with caplog.at_level(logging.DEBUG, logger="coordinator.presence"):
        presence.on_status(topic, payload)  # never raises
    assert presence.rejected == 1
    assert presence.round_of("a", "job-1") == 2
    record = presence.get("a")
    assert record is not None and record.online
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_a_status_carries_a_job_id_of_at_most_max_job_chars() -> None:
    # Anyone on an anonymous broker can publish statuses: a long job string would let
    # each of the MAX_DEVICES records hold up to MAX_STATUS_BYTES.
    presence = Presence("lab", clock=FakeClock(10.0))
    longest = "j" * MAX_JOB_CHARS
    presence.on_status(status_topic("lab", "a"), status("online", longest, 1))
    presence.on_status(status_topic("lab", "b"), status("online", longest + "j", 1))
    assert presence.round_of("a", longest) == 1
    assert presence.get("b") is None and presence.rejected == 1 and len(presence) == 1


# -- the cap -----------------------------------------------------------------------------


def test_the_least_recently_updated_device_is_dropped_past_the_cap() -> None:
    presence = Presence("lab", clock=FakeClock(10.0), max_devices=3)
    for device in ("a", "b", "c"):
        presence.on_status(status_topic("lab", device), status("offline"))
    presence.on_status(status_topic("lab", "a"), status("online"))  # a is the newest now
    presence.on_status(status_topic("lab", "d"), status("offline"))
    assert len(presence) == 3 and presence.dropped == 1
    assert presence.get("b") is None  # falls back to heartbeats
    assert all(presence.get(d) is not None for d in ("a", "c", "d"))
    with pytest.raises(ValueError, match="max_devices must be at least 1"):
        Presence("lab", max_devices=0)


# -- the app -----------------------------------------------------------------------------


class FakeBroker:
    """Records subscriptions; :meth:`deliver` hands a message to the matching handler."""

    def __init__(self, retained: dict[str, bytes] | None = None) -> None:
        self.handlers: dict[str, Callable[[str, bytes], None]] = {}
        self.retained = retained or {}

    def subscribe(self, topic_filter: str, on_message: Callable[[str, bytes], None]) -> None:
        self.handlers[topic_filter] = on_message
        for topic, payload in self.retained.items():  # as a broker does, at subscribe time
            on_message(topic, payload)

    def deliver(self, topic: str, payload: bytes) -> None:
        self.handlers[status_filter("lab")](topic, payload)


def make_settings(tmp_path: Path) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        live_within_s=LIVE_S,
        heartbeat_flush_s=3600.0,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def client(tmp_path: Path, clock: FakeClock, broker: FakeBroker) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path), clock=clock, subscribe=broker.subscribe)
    with TestClient(app) as test_client:
        yield test_client


def enrol(client: TestClient, name: str) -> tuple[str, dict[str, str]]:
    reply = client.post(f"{API}/devices/enrol", json={"token": ENROL, "name": name})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return body["device_id"], {"Authorization": f"Bearer {body['device_token']}"}


def listed(client: TestClient, query: str = "") -> dict[str, tuple[bool, str]]:
    reply = client.get(f"{API}/devices{query}", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    return {d["device_id"]: (d["online"], d["online_source"]) for d in reply.json()}


def online_gauge(client: TestClient, online: str) -> float:
    reply = client.get("/metrics", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    families: dict[str, Any] = {f.name: f for f in text_string_to_metric_families(reply.text)}
    (found,) = [
        s.value
        for s in families["meshfl_devices"].samples
        if s.labels == {"state": "active", "online": online}
    ]
    return float(found)


def test_the_device_list_follows_the_status_topic(
    client: TestClient, clock: FakeClock, broker: FakeBroker
) -> None:
    assert list(broker.handlers) == ["meshfl/v1/lab/node/+/status"]
    a, headers = enrol(client, "a")
    b, _ = enrol(client, "b")
    assert listed(client) == {a: (True, "heartbeat"), b: (True, "heartbeat")}

    clock.now = 1_001.0
    broker.deliver(status_topic("lab", a), status("offline"))  # a's Will
    assert listed(client) == {a: (False, "last_will"), b: (True, "heartbeat")}
    assert listed(client, "?status=offline") == {a: (False, "last_will")}
    assert listed(client, "?status=online") == {b: (True, "heartbeat")}
    assert client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()["online"] is False
    assert (online_gauge(client, "true"), online_gauge(client, "false")) == (1, 1)

    clock.now = 1_002.0
    broker.deliver(status_topic("lab", a), status("online", "job-1", 4))
    assert listed(client)[a] == (True, "last_will")
    assert client.app.state.presence.round_of(a) == 4  # type: ignore[attr-defined]

    clock.now = 1_003.0
    broker.deliver(status_topic("lab", a), status("offline"))
    assert listed(client)[a] == (False, "last_will")
    clock.now = 1_004.0
    beat = client.post(f"{API}/devices/{a}/heartbeat", headers=headers)
    assert beat.status_code == 204, beat.text
    assert listed(client)[a] == (True, "heartbeat")  # heard from since its Will


def test_a_retained_will_delivered_at_subscribe_time_counts(
    tmp_path: Path, clock: FakeClock
) -> None:
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings, clock=clock)) as first:
        a, _ = enrol(first, "a")
        assert first.app.state.presence.get(a) is None  # type: ignore[attr-defined]
    clock.now = 1_005.0  # the coordinator restarts; a died meanwhile
    broker = FakeBroker(retained={status_topic("lab", a): status("offline")})
    with TestClient(create_app(settings, clock=clock, subscribe=broker.subscribe)) as again:
        assert listed(again) == {a: (False, "last_will")}


def test_a_failed_subscription_leaves_heartbeats_only(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(topic_filter: str, on_message: Callable[[str, bytes], None]) -> None:
        raise TransportError(f"the broker refused the subscription to {topic_filter}")

    with caplog.at_level(logging.WARNING, logger="coordinator.app"):
        app = create_app(make_settings(tmp_path), clock=clock, subscribe=refused)
    assert "online follows heartbeats only" in caplog.text
    with TestClient(app) as client:
        a, _ = enrol(client, "a")
        assert listed(client) == {a: (True, "heartbeat")}
        assert len(client.app.state.presence) == 0  # type: ignore[attr-defined]


def test_a_broker_down_at_start_warns_that_push_and_presence_are_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as free:  # a port nothing listens on once closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert servers._control_transport(f"mqtt://127.0.0.1:{port}", "lab") is None
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning: no control-topic push and no Last-Will presence (")
    assert "online follows heartbeats only" in line
    assert line.endswith("Start the broker first, or restart the coordinator once it runs")


def test_a_broker_url_that_does_not_parse_is_an_error_not_a_warning() -> None:
    # A typo is not a broker that is down: the coordinator must not serve without push.
    with pytest.raises(ConfigError, match=r"bad broker URL 'mqtt://\[x'; use mqtt://HOST:PORT"):
        servers._control_transport("mqtt://[x", "lab")
