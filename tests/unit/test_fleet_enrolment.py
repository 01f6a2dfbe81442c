"""The fleet enrolment token can be turned off, disabled, rotated, expired and counted;
a revoked device cannot enrol again; re-enrolment retires the old broker login (issue 23
item 8). Over TestClient on temporary SQLite files, and the migration on PostgreSQL too."""

from __future__ import annotations

import base64
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import scratch_schema

from coordinator import CoordinatorSettings, create_app
from coordinator.db import make_engine
from coordinator.migrate import downgrade, upgrade
from edge_agent.secagg.crypto import IdentityKey
from meshfl.contract import enrol_proof_message

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ADMIN = "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
FLEET = f"{API}/enrolment-tokens/fleet"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Logins:
    """A broker login table that records what the coordinator did."""

    def __init__(self) -> None:
        self.users: dict[str, str] = {}

    def add(self, username: str, password: str) -> None:
        self.users[username] = password

    def remove(self, username: str) -> None:
        self.users.pop(username, None)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_client(tmp_path: Path, clock: Clock) -> Iterator[Callable[..., TestClient]]:
    """Apps on one SQLite file (a second call is a restart); ``**overrides`` settings."""
    opened: list[TestClient] = []

    def make(accounts: Logins | None = None, **overrides: Any) -> TestClient:
        settings = CoordinatorSettings(
            db_url=f"sqlite:///{tmp_path / 'c.db'}", fleet="lab", admin_token=ADMIN, **overrides
        )
        client = TestClient(create_app(settings, clock=clock, broker_accounts=accounts))
        opened.append(client.__enter__())
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def enrol(client: TestClient, token: str, name: str = "pi", **extra: Any) -> Any:
    return client.post(f"{API}/devices/enrol", json={"token": token, "name": name, **extra})


def signed(key: IdentityKey, token: str, name: str) -> dict[str, str]:
    proof = key.sign(enrol_proof_message(token, name, key.public_b64))
    return {"identity_key": key.public_b64, "identity_proof": base64.b64encode(proof).decode()}


def test_the_fleet_token_is_off_unless_asked_for(make_client: Callable[..., TestClient]) -> None:
    client = make_client()  # no enrol_token: main generated and accepted one
    assert client.get(FLEET, headers=ADMIN_H).json()["status"] == "off"
    assert enrol(client, "anything").status_code == 401
    rotated = client.post(f"{FLEET}/rotate", json={}, headers=ADMIN_H).json()
    assert rotated["status"] == "active" and rotated["token"].startswith("mfe_")
    assert enrol(client, rotated["token"]).status_code == 200


def test_an_operator_disables_and_rotates_it_and_a_restart_keeps_that(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(enrol_token="fleet-secret")
    assert enrol(client, "fleet-secret", "a").status_code == 200
    assert client.post(f"{FLEET}/disable", headers=ADMIN_H).json()["status"] == "disabled"
    refused = enrol(client, "fleet-secret", "b")
    assert refused.status_code == 403 and "disabled" in refused.json()["detail"]
    restarted = make_client(enrol_token="fleet-secret")  # the same setting: still disabled
    assert enrol(restarted, "fleet-secret", "b").status_code == 403
    new = restarted.post(f"{FLEET}/rotate", json={"uses": 1}, headers=ADMIN_H).json()["token"]
    assert enrol(restarted, "fleet-secret", "b").status_code == 401  # the old secret: unknown
    assert enrol(restarted, new, "b").status_code == 200
    used = enrol(restarted, new, "c")
    assert used.status_code == 403 and "used up" in used.json()["detail"]
    again = make_client(enrol_token="fleet-secret")  # a restart keeps the rotation
    assert enrol(again, "fleet-secret", "c").status_code == 401
    changed = make_client(enrol_token="another-secret")  # a new setting replaces it
    assert enrol(changed, "another-secret", "c").status_code == 200
    off = make_client()  # started without it: the setting's token is off
    assert enrol(off, "another-secret", "d").status_code == 403
    assert off.get(FLEET, headers=ADMIN_H).json()["status"] == "disabled"


def test_it_can_carry_an_expiry_and_a_quota(
    make_client: Callable[..., TestClient], clock: Clock
) -> None:
    client = make_client(enrol_token="fleet-secret", enrol_token_ttl_s=60, enrol_token_uses=2)
    state = client.get(FLEET, headers=ADMIN_H).json()
    assert (state["uses"], state["uses_left"], state["expires_at"]) == (2, 2, 1_060.0)
    assert enrol(client, "fleet-secret", "a").status_code == 200
    clock.now += 61
    expired = enrol(client, "fleet-secret", "b")
    assert expired.status_code == 403 and "expired" in expired.json()["detail"]
    bad = client.post(f"{FLEET}/rotate", json={"uses": 0}, headers=ADMIN_H)
    assert bad.status_code == 422 and "uses" in bad.json()["detail"]
    device = enrol(make_client(enrol_token="x"), "x", "dev").json()["device_token"]
    assert client.get(FLEET, headers={"Authorization": f"Bearer {device}"}).status_code == 403


def test_a_revoked_device_cannot_enrol_again_with_the_fleet_token(
    make_client: Callable[..., TestClient],
) -> None:
    logins = Logins()
    client = make_client(logins, enrol_token="fleet-secret")
    key = IdentityKey.generate()
    first = enrol(client, "fleet-secret", "pi", **signed(key, "fleet-secret", "pi")).json()
    client.post(f"{API}/devices/{first['device_id']}/revoke", headers=ADMIN_H)
    again = enrol(client, "fleet-secret", "pi", **signed(key, "fleet-secret", "pi"))
    assert again.status_code == 403 and "revoked" in again.json()["detail"]
    assert logins.users == {}


def test_re_enrolment_revokes_the_old_identity_and_its_broker_login(
    make_client: Callable[..., TestClient],
) -> None:
    logins = Logins()
    client = make_client(logins, enrol_token="fleet-secret")
    key = IdentityKey.generate()
    old = enrol(client, "fleet-secret", "pi", **signed(key, "fleet-secret", "pi")).json()
    assert set(logins.users) == {old["device_id"]}
    bare = enrol(client, "fleet-secret", "pi", identity_key=key.public_b64)  # no proof
    assert bare.status_code == 409 and "identity_proof" in bare.json()["detail"]
    thief = IdentityKey.generate()  # a proof by another key does not count
    forged = signed(thief, "fleet-secret", "pi") | {"identity_key": key.public_b64}
    assert enrol(client, "fleet-secret", "pi", **forged).status_code == 409
    new = enrol(client, "fleet-secret", "pi", **signed(key, "fleet-secret", "pi")).json()
    assert set(logins.users) == {new["device_id"]}  # the old login is gone
    old_token = {"Authorization": f"Bearer {old['device_token']}"}
    assert client.put(f"{API}/devices/{old['device_id']}/profile", json={},
                      headers=old_token).status_code == 401  # fmt: skip
    third = enrol(client, "fleet-secret", "pi", **signed(key, "fleet-secret", "pi"))
    assert third.status_code == 200  # a replaced identity is not a revoked one


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_migration_0009_upgrades_and_downgrades(tmp_path: Path, database: str) -> None:
    def check(url: str) -> None:
        engine = make_engine(url)
        try:
            upgrade(engine, "0008")
            assert "fleet_enrolment" not in _tables(url)
            upgrade(engine)
            assert "fleet_enrolment" in _tables(url)
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO fleet_enrolment (fleet, token_hash, created_at)"
                        " VALUES ('lab', 'ab', 1.0)"
                    )
                )
            downgrade(engine, "0008")
            assert "fleet_enrolment" not in _tables(url)
            upgrade(engine)
        finally:
            engine.dispose()

    if database == "sqlite":
        check(f"sqlite:///{tmp_path / 'c.db'}")
    else:
        with scratch_schema() as url:
            check(url)


def test_the_agents_client_proves_its_key_so_it_can_enrol_again(
    make_client: Callable[..., TestClient],
) -> None:
    import httpx

    from edge_agent.rest import CoordinatorClient

    logins = Logins()
    app = make_client(logins, enrol_token="fleet-secret")

    def forward(request: httpx.Request) -> httpx.Response:
        reply = app.request(request.method, request.url.raw_path.decode(),
                            content=request.content, headers=dict(request.headers))  # fmt: skip
        return httpx.Response(reply.status_code, content=reply.content, headers=reply.headers)

    key = IdentityKey.generate()
    agent = CoordinatorClient("http://c", retry_s=0.0, transport=httpx.MockTransport(forward))
    first = agent.enrol("fleet-secret", "pi", {}, key.public_b64, sign=key.sign)
    second = agent.enrol("fleet-secret", "pi", {}, key.public_b64, sign=key.sign)  # lost state
    assert first["device_id"] != second["device_id"]
    assert set(logins.users) == {second["device_id"]}
    states = {d["device_id"]: d["state"] for d in app.get(f"{API}/devices", headers=ADMIN_H).json()}
    assert states == {first["device_id"]: "revoked", second["device_id"]: "active"}
