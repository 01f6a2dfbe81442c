"""Device heartbeats: ``POST /devices/{id}/heartbeat`` and the in-memory liveness buffer."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from coordinator import CoordinatorSettings, create_app
from coordinator.db import Device, make_engine, make_sessionmaker
from coordinator.liveness import Liveness

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"


class FakeClock:
    """A clock the test moves by hand (unix seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


def make_settings(tmp_path: Path, flush_s: float = 3600.0) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        enrol_token=ENROL,
        admin_token=ADMIN,
        heartbeat_flush_s=flush_s,
        live_within_s=15,
    )


@pytest.fixture
def client(tmp_path: Path, clock: FakeClock) -> Iterator[TestClient]:
    """An app whose buffer is flushed only at shutdown (the interval is an hour)."""
    with TestClient(create_app(make_settings(tmp_path), clock=clock)) as test_client:
        yield test_client


def enrol(client: TestClient, name: str) -> tuple[str, dict[str, str]]:
    reply = client.post(f"{API}/devices/enrol", json={"token": ENROL, "name": name})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return body["device_id"], {"Authorization": f"Bearer {body['device_token']}"}


def beat(client: TestClient, device_id: str, headers: dict[str, str]) -> int:
    return client.post(f"{API}/devices/{device_id}/heartbeat", headers=headers).status_code


def stored_last_seen(client: TestClient, device_id: str) -> float:
    """``devices.last_seen`` as the database holds it (a session outside the app's)."""
    engine = make_engine(str(client.app.state.settings.db_url))  # type: ignore[attr-defined]
    try:
        with engine.connect() as conn:
            value = conn.execute(select(Device.last_seen).where(Device.id == device_id))
            return float(value.scalar_one())
    finally:
        engine.dispose()


def shown(client: TestClient, device_id: str) -> dict[str, object]:
    reply = client.get(f"{API}/devices/{device_id}", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    body: dict[str, object] = reply.json()
    return body


def test_own_token_204_and_last_seen_advances(client: TestClient, clock: FakeClock) -> None:
    device_id, headers = enrol(client, "a")
    assert shown(client, device_id)["last_seen"] == 1_000.0
    clock.now = 1_042.5

    reply = client.post(f"{API}/devices/{device_id}/heartbeat", headers=headers)

    assert reply.status_code == 204
    assert reply.content == b""
    assert shown(client, device_id)["last_seen"] == 1_042.5
    clock.now = 1_050.0  # a cached token: the second heartbeat skips the database
    assert beat(client, device_id, headers) == 204
    assert shown(client, device_id)["last_seen"] == 1_050.0


def test_other_device_unknown_and_missing_tokens_refused(client: TestClient) -> None:
    a, a_headers = enrol(client, "a")
    b, b_headers = enrol(client, "b")
    assert beat(client, a, a_headers) == 204  # a's token is cached now

    for headers in (a_headers, b_headers):  # cached and uncached token, wrong device
        target = b if headers is a_headers else a
        reply = client.post(f"{API}/devices/{target}/heartbeat", headers=headers)
        assert reply.status_code == 403
        assert "use that device's own token" in reply.json()["detail"]
    unknown = client.post(f"{API}/devices/{a}/heartbeat", headers={"Authorization": "Bearer x"})
    assert unknown.status_code == 403
    assert client.post(f"{API}/devices/{a}/heartbeat").status_code == 401
    assert client.post(f"{API}/devices/{a}/heartbeat", headers=ADMIN_H).status_code == 403


def test_revoked_device_refused_at_once(client: TestClient, clock: FakeClock) -> None:
    device_id, headers = enrol(client, "a")
    assert beat(client, device_id, headers) == 204  # cached

    revoked = client.post(f"{API}/devices/{device_id}/revoke", headers=ADMIN_H)
    assert revoked.status_code == 200, revoked.text

    clock.now += 5
    reply = client.post(f"{API}/devices/{device_id}/heartbeat", headers=headers)
    assert reply.status_code == 401
    assert "revoked" in reply.json()["detail"]
    assert shown(client, device_id)["last_seen"] == 1_000.0


def test_state_change_committed_anywhere_forgets_the_token(
    client: TestClient, clock: FakeClock
) -> None:
    device_id, headers = enrol(client, "a")
    assert beat(client, device_id, headers) == 204
    sessions = client.app.state.sessionmaker  # type: ignore[attr-defined]
    with sessions() as session:  # any code path of the app: a commit of the new state
        session.get(Device, device_id).state = "revoked"
        session.commit()

    assert beat(client, device_id, headers) == 401


def test_flushed_to_the_db_within_the_interval(tmp_path: Path, clock: FakeClock) -> None:
    app = create_app(make_settings(tmp_path, flush_s=0.05), clock=clock)
    with TestClient(app) as client:
        device_id, headers = enrol(client, "a")
        clock.now = 1_100.0
        assert beat(client, device_id, headers) == 204
        deadline = time.monotonic() + 5  # 100 flush intervals: generous on a busy machine
        while stored_last_seen(client, device_id) != 1_100.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stored_last_seen(client, device_id) == 1_100.0


def test_flushed_at_shutdown(tmp_path: Path, clock: FakeClock) -> None:
    app = create_app(make_settings(tmp_path), clock=clock)  # interval: an hour
    with TestClient(app) as client:
        device_id, headers = enrol(client, "a")
        clock.now = 1_200.0
        assert beat(client, device_id, headers) == 204
        assert stored_last_seen(client, device_id) == 1_000.0  # still only in memory
    assert stored_last_seen(client, device_id) == 1_200.0


def test_online_status_uses_the_fresher_value(client: TestClient, clock: FakeClock) -> None:
    device_id, headers = enrol(client, "a")
    clock.now = 1_100.0  # 100 s of silence: offline (live_within_s = 15)
    assert shown(client, device_id)["online"] is False

    assert beat(client, device_id, headers) == 204

    assert stored_last_seen(client, device_id) == 1_000.0  # the DB still says offline
    body = shown(client, device_id)
    assert body["online"] is True
    assert body["last_seen"] == 1_100.0


def test_flush_moves_last_seen_forward_only(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    from coordinator import migrate

    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    liveness = Liveness(sessions)
    with sessions() as session:
        for device_id, seen in (("dev-old", 10.0), ("dev-new", 500.0)):
            session.add(
                Device(
                    id=device_id,
                    name=device_id,
                    fleet="f",
                    token_hash=device_id * 2,
                    profile={},
                    enrolled_at=0.0,
                    last_seen=seen,
                )
            )
        session.commit()
    liveness.seen("dev-old", 100.0)
    liveness.seen("dev-new", 100.0)  # older than what another route wrote meanwhile
    liveness.seen("dev-old", 90.0)  # out of order: the later time stays

    assert liveness.flush() == 2
    assert liveness.flush() == 0

    with sessions() as session:
        stored = {d: t for d, t in session.execute(select(Device.id, Device.last_seen))}
    assert stored == {"dev-old": 100.0, "dev-new": 500.0}
    engine.dispose()


def test_failed_flush_keeps_the_batch(tmp_path: Path) -> None:
    broken = make_engine(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    liveness = Liveness(make_sessionmaker(broken))
    liveness.seen("dev-a", 7.0)

    with pytest.raises(Exception, match="unable to open database"):
        liveness.flush()

    assert liveness.last_seen("dev-a") == 7.0
    broken.dispose()
