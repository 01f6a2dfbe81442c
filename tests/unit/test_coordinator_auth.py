"""REST auth: API token roles, enrolment tokens, problem details, rate limits, strict bodies."""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import sqlalchemy as sa
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter
from postgres import PG_URL, postgres_or_fail

from coordinator import CoordinatorSettings, create_app, store, tokens
from coordinator.db import ApiToken, EnrolmentToken, make_engine, make_sessionmaker
from coordinator.errors import Unauthorized
from coordinator.migrate import upgrade
from coordinator.problems import database_busy
from coordinator.ratelimit import SweptMemoryStorage

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
PROBLEM = "application/problem+json"


class FakeClock:
    """A clock the test moves by hand (unix seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def make_client(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., TestClient]]:
    """Open apps on a temporary SQLite file; ``**overrides`` change the settings."""
    opened: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        settings = CoordinatorSettings(
            db_url=f"sqlite:///{tmp_path / f'c{len(opened)}.db'}",
            fleet="lab",
            enrol_token=ENROL,
            admin_token=ADMIN,
            **overrides,
        )
        client = TestClient(create_app(settings, clock=clock))
        opened.append(client.__enter__())
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def api_token(client: TestClient, role: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"{API}/tokens", json={"role": role, **body}, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


def enrolment_token(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post(f"{API}/enrolment-tokens", json=body, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


def enrol(client: TestClient, token: str, name: str = "pi") -> Any:
    return client.post(f"{API}/devices/enrol", json={"token": token, "name": name})


JOB = {
    "name": "j",
    "model": {"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []},
    "algorithm": "choco",
    "codec": "identity",
    "topology": "ring",
    "rounds": 1,
    "learning_rate": 0.1,
    "batch_size": 8,
    "local_epochs": 1,
    "consensus_step": 1.0,
    "round_deadline_s": 5.0,
    "max_payload_bytes": 4096,
    "seed": 0,
    "devices": 0,
    "test_data": None,
    "sketch_dim": 0,
}


def assert_problem(r: Any, status: int, path: str, says: str = "") -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert set(body) == {"type", "title", "status", "detail", "instance"}
    assert body["type"] == "about:blank" and body["status"] == status
    assert body["instance"] == path and body["title"]
    assert "\n" not in body["detail"] and says in body["detail"]


def test_roles_read_only_reads_operator_operates_admin_manages_tokens(
    client: TestClient,
) -> None:
    reader = bearer(api_token(client, "read-only", name="dashboard")["token"])
    operator = bearer(api_token(client, "operator")["token"])
    admin = bearer(api_token(client, "admin")["token"])

    assert client.get(f"{API}/devices", headers=reader).status_code == 200
    assert client.get(f"{API}/jobs", headers=reader).status_code == 200
    refused = client.post(f"{API}/jobs", json=JOB, headers=reader)
    assert_problem(refused, 403, f"{API}/jobs", "'read-only'")
    assert client.post(f"{API}/enrolment-tokens", json={}, headers=reader).status_code == 403

    created = client.post(f"{API}/jobs", json=JOB, headers=operator)
    assert created.status_code == 201
    job = created.json()["job_id"]
    assert client.post(f"{API}/jobs/{job}/stop", headers=operator).status_code == 200
    assert client.post(f"{API}/enrolment-tokens", json={}, headers=operator).status_code == 201
    assert client.get(f"{API}/tokens", headers=operator).status_code == 403
    no_tokens = client.post(f"{API}/tokens", json={"role": "admin"}, headers=operator)
    assert_problem(no_tokens, 403, f"{API}/tokens", "admin token")

    listed = client.get(f"{API}/tokens", headers=admin)
    assert listed.status_code == 200
    assert sorted(t["role"] for t in listed.json()) == ["admin", "operator", "read-only"]
    assert all("token" not in t and t["status"] == "active" for t in listed.json())


def test_device_tokens_pass_no_operator_route(client: TestClient) -> None:
    device = bearer(enrol(client, ENROL).json()["device_token"])
    for method, path in [
        ("GET", f"{API}/devices"),
        ("GET", f"{API}/jobs"),
        ("GET", f"{API}/tokens"),
        ("GET", f"{API}/enrolment-tokens"),
        ("POST", f"{API}/enrolment-tokens"),
    ]:
        r = client.request(method, path, headers=device, json={} if method == "POST" else None)
        assert_problem(r, 403, path, "API token")


def test_secrets_are_prefixed_shown_once_and_stored_only_as_digests(
    client: TestClient,
) -> None:
    created = api_token(client, "operator", name="ci")
    enrolment = enrolment_token(client, name="rack-1")
    assert created["token"].startswith(tokens.API_TOKEN_PREFIX)
    assert enrolment["token"].startswith(tokens.ENROLMENT_TOKEN_PREFIX)
    assert len(created["token"]) > 40 and created["token_id"].startswith("tok-")
    listings = [
        client.get(f"{API}/tokens", headers=ADMIN_H).text,
        client.get(f"{API}/enrolment-tokens", headers=ADMIN_H).text,
    ]
    sessions = make_sessionmaker(client.app.state.engine)  # type: ignore[attr-defined]
    with sessions() as session:
        rows = [*session.scalars(sa.select(ApiToken)), *session.scalars(sa.select(EnrolmentToken))]
        stored = [str(vars(row)) for row in rows]
    for secret in (created["token"], enrolment["token"]):
        assert not any(secret in text for text in [*listings, *stored])
    assert {r.token_hash for r in rows} == {
        store.hash_token(created["token"]),
        store.hash_token(enrolment["token"]),
    }


def test_an_api_token_expires_by_the_app_clock(client: TestClient, clock: FakeClock) -> None:
    created = api_token(client, "read-only", ttl_s=60)
    assert created["expires_at"] == clock.now + 60
    assert client.get(f"{API}/devices", headers=bearer(created["token"])).status_code == 200
    clock.now += 60
    r = client.get(f"{API}/devices", headers=bearer(created["token"]))
    assert_problem(r, 401, f"{API}/devices", f"API token {created['token_id']!r} expired")
    assert r.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    listed = client.get(f"{API}/tokens", headers=ADMIN_H).json()
    assert [t["status"] for t in listed] == ["expired"]


def test_a_revoked_api_token_is_refused_at_once(client: TestClient, clock: FakeClock) -> None:
    created = api_token(client, "admin")
    own = bearer(created["token"])
    assert client.get(f"{API}/tokens", headers=own).status_code == 200
    clock.now += 5
    gone = client.delete(f"{API}/tokens/{created['token_id']}", headers=own)
    assert gone.status_code == 204
    assert_problem(client.get(f"{API}/jobs", headers=own), 401, f"{API}/jobs", "revoked")
    again = client.delete(f"{API}/tokens/{created['token_id']}", headers=ADMIN_H)
    assert again.status_code == 204
    listed = client.get(f"{API}/tokens", headers=ADMIN_H).json()
    assert [(t["status"], t["revoked_at"]) for t in listed] == [("revoked", clock.now)]
    missing = client.delete(f"{API}/tokens/tok-nope", headers=ADMIN_H)
    assert_problem(missing, 404, f"{API}/tokens/tok-nope", "'tok-nope' does not exist")


def test_a_tampered_token_is_refused(client: TestClient) -> None:
    def tamper(token: str) -> str:
        last = token[-1]
        return token[:-1] + ("A" if last != "A" else "B")

    api = api_token(client, "admin")["token"]
    r = client.get(f"{API}/devices", headers=bearer(tamper(api)))
    assert_problem(r, 403, f"{API}/devices", "needs an API token")
    one_time = enrolment_token(client)["token"]
    assert_problem(enrol(client, tamper(one_time)), 401, f"{API}/devices/enrol", "unknown")
    assert_problem(enrol(client, tamper(ENROL)), 401, f"{API}/devices/enrol", "unknown")
    assert enrol(client, one_time).status_code == 200  # the untampered one still works


def test_a_one_time_enrolment_token_enrols_once_and_tags_the_device(
    client: TestClient,
) -> None:
    created = enrolment_token(client, tags=["lab", "rack-1", "lab"], name="bench")
    assert (created["uses"], created["uses_left"], created["status"]) == (1, 1, "active")
    assert created["tags"] == ["lab", "rack-1"]  # duplicates dropped
    first = enrol(client, created["token"], "pi-1")
    assert first.status_code == 200
    device = client.get(f"{API}/devices/{first.json()['device_id']}", headers=ADMIN_H).json()
    assert device["tags"] == ["lab", "rack-1"]
    reuse = enrol(client, created["token"], "pi-2")
    assert_problem(reuse, 401, f"{API}/devices/enrol", "enrolment token used up")
    assert "ask an operator for a new one" in reuse.json()["detail"]
    listed = client.get(f"{API}/enrolment-tokens", headers=ADMIN_H).json()
    assert [(t["uses_left"], t["status"]) for t in listed] == [(0, "used up")]
    assert len(client.get(f"{API}/devices", headers=ADMIN_H).json()) == 1


def test_a_quota_expiry_and_revocation_each_refuse_enrolment(
    client: TestClient, clock: FakeClock
) -> None:
    quota = enrolment_token(client, uses=2, name="quota")["token"]
    short = enrolment_token(client, ttl_s=30, uses=5, name="short")["token"]
    revoked = enrolment_token(client, uses=5, name="revoked")
    assert [enrol(client, quota, f"q-{k}").status_code for k in range(3)] == [200, 200, 401]
    assert enrol(client, short, "s-0").status_code == 200
    gone = client.delete(f"{API}/enrolment-tokens/{revoked['token_id']}", headers=ADMIN_H)
    assert gone.status_code == 204
    assert "revoked" in enrol(client, revoked["token"]).json()["detail"]
    clock.now += 30
    assert "expired" in enrol(client, short, "s-1").json()["detail"]
    assert enrol(client, ENROL, "fleet-1").status_code == 200  # the fleet token: no quota
    assert enrol(client, ENROL, "fleet-2").status_code == 200
    listed = client.get(f"{API}/enrolment-tokens", headers=ADMIN_H).json()
    assert {t["name"]: (t["uses_left"], t["status"]) for t in listed} == {
        "quota": (0, "used up"),
        "short": (4, "expired"),
        "revoked": (5, "revoked"),
    }


def test_invalid_enrolment_tokens_are_422(client: TestClient) -> None:
    for body, says in [
        ({"ttl_s": 30 * 86_400 + 1}, "ttl_s"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"uses": 0}, "uses"),
        ({"uses": 10_001}, "uses"),
        ({"tags": ["has space"]}, "tag"),
        ({"tags": [f"t{k}" for k in range(33)]}, "tags"),
        ({"uses": 1, "quota": 3}, "quota: unknown field"),
        ({"uses": True}, "uses"),
    ]:
        r = client.post(f"{API}/enrolment-tokens", json=body, headers=ADMIN_H)
        assert_problem(r, 422, f"{API}/enrolment-tokens", says)
    assert client.get(f"{API}/enrolment-tokens", headers=ADMIN_H).json() == []


def test_api_token_bodies_are_checked(client: TestClient) -> None:
    for body, says in [
        ({"role": "root"}, "role"),
        ({"role": "admin", "ttl_s": -1}, "ttl_s"),
        ({"role": "admin", "scope": "all"}, "scope: unknown field"),
        ({}, "role"),
    ]:
        r = client.post(f"{API}/tokens", json=body, headers=ADMIN_H)
        assert_problem(r, 422, f"{API}/tokens", says)


def _consume_race(url: str, rounds: int) -> list[int]:
    """Two threads spend the same 1-use token at once, ``rounds`` times; successes each."""
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    wins: list[int] = []
    try:
        for _ in range(rounds):
            with sessions() as session:
                _, secret = tokens.create_enrolment_token(session, now=0.0)
            start = threading.Barrier(2)
            won: list[str] = []

            def spend(
                secret: str = secret, start: threading.Barrier = start, won: list[str] = won
            ) -> None:
                with sessions() as session:
                    start.wait()
                    try:
                        grant = tokens.consume_enrolment_token(session, secret, 1.0)
                    except Unauthorized:
                        return
                    session.commit()
                    won.append(str(grant.token_id))

            threads = [threading.Thread(target=spend) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            wins.append(len(won))
    finally:
        engine.dispose()
    return wins


def test_two_threads_cannot_both_spend_a_one_use_token_on_sqlite(tmp_path: Path) -> None:
    assert _consume_race(f"sqlite:///{tmp_path / 'race.db'}", rounds=8) == [1] * 8


def test_two_threads_cannot_both_spend_a_one_use_token_on_postgresql() -> None:
    admin = make_engine(postgres_or_fail())
    schema = f"meshfl_race_{secrets.token_hex(4)}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        wins = _consume_race(f"{PG_URL}?options=-csearch_path%3D{schema}", rounds=8)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    assert wins == [1] * 8


def test_the_fleet_token_is_multi_use_and_a_rolled_back_enrolment_spends_nothing(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        row, secret = tokens.create_enrolment_token(session, now=0.0, tags=["a"])
        grants = [tokens.consume_enrolment_token(session, "fleet", 1.0, fleet_token="fleet")]
        grants.append(tokens.consume_enrolment_token(session, "fleet", 1.0, fleet_token="fleet"))
        assert grants == [tokens.EnrolmentGrant(None, [])] * 2
        assert tokens.consume_enrolment_token(session, secret, 1.0).tags == ["a"]
        session.rollback()  # the enrolment failed after taking the use
        assert tokens.consume_enrolment_token(session, secret, 1.0).token_id == row.id
        session.commit()
        with pytest.raises(Unauthorized, match="used up"):
            tokens.consume_enrolment_token(session, secret, 1.0)
        with pytest.raises(Unauthorized, match="unknown"):
            tokens.consume_enrolment_token(session, "fleet", 1.0)  # no fleet token given
    engine.dispose()


def test_every_error_is_a_problem_document(client: TestClient) -> None:
    assert_problem(client.get(f"{API}/devices"), 401, f"{API}/devices", "missing bearer")
    device = bearer(enrol(client, ENROL).json()["device_token"])
    assert_problem(client.get(f"{API}/jobs", headers=device), 403, f"{API}/jobs")
    assert_problem(
        client.get(f"{API}/jobs/job-x", headers=ADMIN_H), 404, f"{API}/jobs/job-x", "job-x"
    )
    assert_problem(client.get(f"{API}/nowhere"), 404, f"{API}/nowhere")
    not_allowed = client.put(f"{API}/jobs", headers=ADMIN_H)
    assert_problem(not_allowed, 405, f"{API}/jobs")
    assert not_allowed.headers["allow"]
    big = client.post(f"{API}/devices/enrol", content=b"x" * (2 << 20))
    assert_problem(big, 413, f"{API}/devices/enrol", "request body over")
    bad = client.post(f"{API}/jobs", json={**JOB, "rounds": "5"}, headers=ADMIN_H)
    assert_problem(bad, 422, f"{API}/jobs", "rounds")


def test_unknown_body_fields_are_422_but_unknown_profile_fields_are_dropped(
    client: TestClient,
) -> None:
    typo = client.post(f"{API}/jobs", json={**JOB, "dp_noise_multipler": 1.0}, headers=ADMIN_H)
    assert_problem(typo, 422, f"{API}/jobs", "body.dp_noise_multipler: unknown field")
    nested = {**JOB, "model": {**JOB["model"], "width": 3}}  # type: ignore[dict-item]
    assert_problem(client.post(f"{API}/jobs", json=nested, headers=ADMIN_H), 422, f"{API}/jobs")
    extra = client.post(f"{API}/devices/enrol", json={"token": ENROL, "name": "a", "x": 1})
    assert_problem(extra, 422, f"{API}/devices/enrol", "body.x: unknown field")
    body = {"token": ENROL, "name": "b", "profile": {"cores": 2, "future_sensor": 1}}
    enrolled = client.post(f"{API}/devices/enrol", json=body)
    assert enrolled.status_code == 200
    device = client.get(f"{API}/devices/{enrolled.json()['device_id']}", headers=ADMIN_H)
    assert device.json()["profile"] == {"cores": 2}


def test_a_locked_database_answers_503_and_writes_nothing(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    client = make_client()
    assert client.get(f"{API}/jobs", headers=ADMIN_H).json() == []
    holder = sqlite3.connect(tmp_path / "c0.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
    try:
        busy = client.post(f"{API}/jobs", json=JOB, headers=ADMIN_H)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert_problem(busy, 503, f"{API}/jobs", "database is busy (database is locked)")
    assert busy.headers["retry-after"] == "1"
    assert client.get(f"{API}/jobs", headers=ADMIN_H).json() == []  # nothing half-written
    assert client.post(f"{API}/jobs", json=JOB, headers=ADMIN_H).status_code == 201


def test_a_database_fault_is_a_500_not_a_retry(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("disk I/O error"))

    monkeypatch.setattr(store, "list_jobs", broken)
    assert_problem(client.get(f"{API}/jobs", headers=ADMIN_H), 500, f"{API}/jobs", "logged")


def test_pool_timeouts_and_postgres_lock_codes_count_as_busy(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client()

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.TimeoutError("QueuePool limit of size 10 overflow 30 reached")

    monkeypatch.setattr(store, "list_jobs", exhausted)
    assert_problem(client.get(f"{API}/jobs", headers=ADMIN_H), 503, f"{API}/jobs", "QueuePool")

    class Psycopg2Error(Exception):
        pgcode = "40P01"  # deadlock detected (psycopg2 names it pgcode, psycopg 3 sqlstate)

    assert database_busy(sa.exc.OperationalError("UPDATE", {}, Psycopg2Error("deadlock")))
    assert not database_busy(sa.exc.OperationalError("UPDATE", {}, Exception("disk full")))


def test_rate_limits_are_per_identity_with_retry_after(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(
        rate_limit_operator="3/minute", rate_limit_device="2/minute", rate_limit_enrol="2/minute"
    )
    device = bearer(enrol(client, ENROL, "a").json()["device_token"])  # 1 of 2 for this address
    reader = bearer(api_token(client, "read-only")["token"])  # the admin token's first
    assert [client.get(f"{API}/jobs", headers=ADMIN_H).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    limited = client.get(f"{API}/jobs", headers=ADMIN_H)
    assert_problem(limited, 429, f"{API}/jobs", "rate limit of 3 per 1 minute")
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert client.get(f"{API}/jobs", headers=reader).status_code == 200  # another identity
    device_id = client.get(f"{API}/devices", headers=reader).json()[0]["device_id"]
    polls = [client.get(f"{API}/devices/{device_id}/assignment", headers=device) for _ in range(3)]
    assert [r.status_code for r in polls] == [204, 204, 429]
    beats = [client.post(f"{API}/devices/{device_id}/heartbeat", headers=device) for _ in range(3)]
    assert {r.status_code for r in beats} == {204}  # a budget of its own, >= 10/s
    assert enrol(client, ENROL, "b").status_code == 200
    assert_problem(enrol(client, ENROL, "c"), 429, f"{API}/devices/enrol", "without a token")
    assert client.get("/healthz").status_code == 200  # outside /api/v1: never limited


def test_empty_limits_switch_rate_limiting_off_and_slow_heartbeats_are_refused(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(rate_limit_operator="", rate_limit_enrol="0")
    assert {client.get(f"{API}/jobs", headers=ADMIN_H).status_code for _ in range(40)} == {200}
    assert {enrol(client, ENROL, f"d-{k}").status_code for k in range(35)} == {200}
    with pytest.raises(pydantic.ValidationError, match="under 10 heartbeats/s"):
        CoordinatorSettings(rate_limit_heartbeat="5/second")
    with pytest.raises(pydantic.ValidationError, match="not a rate limit"):
        CoordinatorSettings(rate_limit_device="lots")


def test_the_rate_limit_memory_is_swept_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # limits' MemoryStorage starts a sweeping Timer thread 10 ms after any hit; the
    # coordinator's storage starts one per sweep_s at most (W5: a third of a heartbeat's CPU).
    assert hasattr(MemoryStorage, "_MemoryStorage__schedule_expiry")  # the hook overridden
    started: list[threading.Timer] = []

    class CountedTimer(threading.Timer):
        def start(self) -> None:
            started.append(self)
            super().start()

    monkeypatch.setattr(threading, "Timer", CountedTimer)
    storage = SweptMemoryStorage(sweep_s=0.3)
    limiter = FixedWindowRateLimiter(storage)
    item = parse("2/second")
    deadline = time.monotonic() + 0.2  # 20 of the library's 10 ms sweep periods
    identities = 0
    while time.monotonic() < deadline:
        assert limiter.hit(item, "heartbeat", f"device-{identities}")
        identities += 1
        time.sleep(0.001)
    assert len(started) <= 2  # the library's first timer, one sweep
    assert [limiter.hit(item, "heartbeat", "one") for _ in range(3)] == [True, True, False]
    time.sleep(1.1)  # every window has ended: the next sweep frees them
    assert limiter.hit(item, "heartbeat", "one")  # an expired window counts afresh
    for timer in started:
        timer.join(timeout=5)
    assert set(storage.storage) == {"LIMITER/heartbeat/one/2/1/second"}


def test_openapi_documents_problem_statuses_and_closed_bodies(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        if not path.startswith(API):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            where = f"{method.upper()} {path}"
            assert {"401", "429", "503"} <= set(responses), where
            if "{" in path:
                assert "404" in responses, where
            for code, response in responses.items():
                if code in ("401", "403", "404", "409", "413", "422", "429", "503"):
                    assert list(response["content"]) == [PROBLEM], (where, code)
            ref = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema", {})
                .get("$ref", "")
            )
            name = ref.rsplit("/", 1)[-1]
            if name and name != "CapabilityProfile":
                assert schemas[name].get("additionalProperties") is False, (where, name)
    for code in ("429", "503"):
        assert "Retry-After" in spec["paths"][f"{API}/jobs"]["get"]["responses"][code]["headers"]


def test_a_made_up_bearer_token_buys_no_rate_limit_budget(
    make_client: Callable[..., TestClient],
) -> None:
    """Issue 23 item 7: a fresh random bearer per request was a fresh identity each time."""
    client = make_client(rate_limit_enrol="3/minute", rate_limit_device="100/minute")
    statuses = [
        client.post(
            f"{API}/devices/enrol",
            json={"token": ENROL, "name": f"d-{k}"},
            headers=bearer(secrets.token_urlsafe(16)),
        ).status_code
        for k in range(5)
    ]
    assert statuses == [200, 200, 200, 429, 429]
    api_like = bearer("mfa_" + secrets.token_urlsafe(16))  # an API token's prefix, unknown
    assert_problem(client.get(f"{API}/jobs", headers=api_like), 429, f"{API}/jobs", "address")


def test_a_known_device_token_is_counted_as_itself_not_by_address(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(rate_limit_enrol="2/minute", rate_limit_device="4/minute")
    token = enrol(client, ENROL, "a").json()["device_token"]  # 1 of 2 for this address
    device_id = client.get(f"{API}/devices", headers=ADMIN_H).json()[0]["device_id"]
    polls = [
        client.get(f"{API}/devices/{device_id}/assignment", headers=bearer(token)).status_code
        for _ in range(5)
    ]
    assert polls == [204, 204, 204, 204, 429]  # its own budget, not the address's 2
    assert enrol(client, ENROL, "b").status_code == 200  # the address kept its second
