"""The web dashboard (/ui): login sessions, the snapshot against the store, the event
stream, the static assets (no CDN, no markup injection) and the concurrency limit."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, enrol, metrics, spec

from coordinator import CoordinatorSettings, create_app
from coordinator.app import ConcurrencyLimit
from coordinator.dashboard import router as dashboard_router
from coordinator.dashboard import snapshot as dashboard_snapshot
from coordinator.dashboard.session import (
    MAX_SESSIONS_PER_TOKEN,
    SESSION_COOKIE,
    SESSION_TTL_S,
    Sessions,
)
from coordinator.db import Device
from meshfl.wire import status_topic

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

PROBLEM = "application/problem+json"
JSON_H = {"content-type": "application/json"}
XSS = "<img src=x onerror=alert(1)>"
STATIC = Path(dashboard_router.__file__).parent / "static"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def client(tmp_path: Path, clock: FakeClock) -> Iterator[TestClient]:
    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        live_within_s=15,
    )
    with TestClient(create_app(settings, clock=clock)) as test_client:
        yield test_client


def api_token(client: TestClient, role: str) -> tuple[str, str]:
    r = client.post(f"{API}/tokens", json={"role": role}, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    return r.json()["token_id"], r.json()["token"]


def log_in(client: TestClient, token: str) -> None:
    r = client.post("/ui/session", json={"token": token})
    assert r.status_code == 204, r.text
    assert client.cookies.get(SESSION_COOKIE)


def assert_problem(r: Any, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["status"] == status


def snapshot(client: TestClient, **params: str) -> dict[str, Any]:
    r = client.get("/ui/api/snapshot", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def started_job(client: TestClient, clock: FakeClock, n: int = 4) -> tuple[str, list[Any]]:
    devices = [enrol(client, clock, f"pi-{k}") for k in range(n)]
    r = client.post(f"{API}/jobs", json=spec(devices=n, rounds=3), headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    clock.now += 1.0
    assert client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).status_code == 200
    return job_id, devices


def report(client: TestClient, job_id: str, headers: dict[str, str], rnd: int, acc: float) -> None:
    sketch = [acc + 0.01 * k for k in range(8)]
    body = metrics(rnd, acc, sketch, sent=1000 * rnd)
    r = client.post(f"{API}/jobs/{job_id}/metrics", json=body, headers=headers)
    assert r.status_code == 204, r.text


# --- login and sessions -------------------------------------------------------------------


def test_without_a_session_ui_is_the_login_page_and_the_data_routes_are_401(
    client: TestClient,
) -> None:
    page = client.get("/ui")
    assert page.status_code == 401
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="login-form"' in page.text and "API token" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert_problem(client.get("/ui/api/snapshot"), 401)
    assert_problem(client.get("/ui/api/events"), 401)
    client.cookies.set(SESSION_COOKIE, "made-up", path="/ui")
    assert client.get("/ui").status_code == 401
    assert_problem(client.get("/ui/api/snapshot"), 401)


def test_login_refuses_unknown_device_and_enrolment_tokens(
    client: TestClient, clock: FakeClock
) -> None:
    _, device_h = enrol(client, clock, "pi-0")
    device_token = device_h["Authorization"].removeprefix("Bearer ")
    r = client.post(f"{API}/enrolment-tokens", json={}, headers=ADMIN_H)
    enrolment = r.json()["token"]
    for token in ("wrong", "mfa_not-a-token", device_token, ENROL, enrolment):
        assert_problem(client.post("/ui/session", json={"token": token}), 401)
        assert SESSION_COOKIE not in client.cookies
    assert_problem(client.post("/ui/session", json={}), 422)
    assert_problem(client.post("/ui/session", content=b"not json", headers=JSON_H), 422)


def test_a_deeply_nested_login_body_is_a_422_not_a_crash(client: TestClient) -> None:
    deep = b"[" * 100_000  # under the 1 MiB body cap; json.loads raises RecursionError
    r = client.post("/ui/session", content=deep, headers=JSON_H)
    assert_problem(r, 422)
    assert "token" in r.json()["detail"]


@pytest.mark.parametrize("kind", ["text/plain", "multipart/form-data; boundary=x", None])
def test_login_takes_only_json_or_a_form(client: TestClient, kind: str | None) -> None:
    # text/plain (and multipart) needs no CORS preflight: another site could post it.
    headers = {"content-type": kind} if kind else {}
    r = client.post("/ui/session", content=json.dumps({"token": ADMIN}), headers=headers)
    assert_problem(r, 415)
    detail = r.json()["detail"]
    assert "application/json" in detail and "\n" not in detail
    assert SESSION_COOKIE not in client.cookies


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "http://testserver:8080", "https://testserver", "null"]
)
def test_a_cross_site_login_or_logout_is_refused(client: TestClient, origin: str) -> None:
    r = client.post("/ui/session", json={"token": ADMIN}, headers={"Origin": origin})
    assert_problem(r, 403)
    assert "cross-site request refused" in r.json()["detail"]
    assert SESSION_COOKIE not in client.cookies
    log_in(client, ADMIN)
    assert_problem(client.post("/ui/logout", headers={"Origin": origin}), 403)
    assert client.get("/ui").status_code == 200  # still logged in


def test_a_same_origin_login_and_logout_pass(client: TestClient) -> None:
    for origin in ("http://testserver", "HTTP://TestServer:80"):
        r = client.post("/ui/session", data={"token": ADMIN}, headers={"Origin": origin})
        assert r.status_code == 204, r.text
        assert client.post("/ui/logout", headers={"Origin": origin}).status_code == 204
        assert client.get("/ui").status_code == 401


def test_one_token_cannot_log_out_another_tokens_viewers(client: TestClient) -> None:
    client.app.state.dashboard_sessions = Sessions(max_sessions=30)  # type: ignore[attr-defined]
    _, other = api_token(client, "read-only")
    log_in(client, other)
    victim = client.cookies[SESSION_COOKIE]
    ids = []
    for _ in range(MAX_SESSIONS_PER_TOKEN + 15):  # more than the global cap of 30 allows
        r = client.post("/ui/session", json={"token": ADMIN})
        assert r.status_code == 204, r.text
        ids.append(r.cookies[SESSION_COOKIE])
    sessions = client.app.state.dashboard_sessions  # type: ignore[attr-defined]
    assert len(sessions) == MAX_SESSIONS_PER_TOKEN + 1
    assert sessions.token_of(victim, 0.0) == other
    assert [sessions.token_of(i, 0.0) for i in ids[:15]] == [None] * 15  # the oldest went
    assert all(sessions.token_of(i, 0.0) == ADMIN for i in ids[15:])


def test_the_global_cap_still_drops_the_oldest_session_of_any_token() -> None:
    sessions = Sessions(max_sessions=3, max_per_token=2)
    a1, b1, c1 = (sessions.open(token, 0.0) for token in ("a", "b", "c"))
    d1 = sessions.open("d", 0.0)
    assert sessions.token_of(a1, 0.0) is None and len(sessions) == 3
    assert [sessions.token_of(i, 0.0) for i in (b1, c1, d1)] == ["b", "c", "d"]
    sessions.drop(b1)
    sessions.drop(c1)
    d2 = sessions.open("d", 0.0)
    d3 = sessions.open("d", 0.0)  # d's third: its first goes, not another token's
    assert sessions.token_of(d1, 0.0) is None and len(sessions) == 2
    assert [sessions.token_of(i, 0.0) for i in (d2, d3)] == ["d", "d"]
    with pytest.raises(ValueError, match="max_per_token must be at least 1"):
        Sessions(max_per_token=0)


@pytest.mark.parametrize("role", ["admin-token", "admin", "read-only"])
def test_an_api_token_of_any_role_opens_the_dashboard(client: TestClient, role: str) -> None:
    token = ADMIN if role == "admin-token" else api_token(client, role)[1]
    r = client.post("/ui/session", json={"token": token})
    assert r.status_code == 204, r.text
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain http here; https requests get Secure
    assert token not in cookie  # a random session id, never the token
    page = client.get("/ui")
    assert page.status_code == 200
    assert '<table id="fleet">' in page.text and 'data-live="connecting"' in page.text
    assert snapshot(client)["fleet"] == "lab"


def test_a_form_post_opens_a_session_too(client: TestClient) -> None:
    r = client.post("/ui/session", data={"token": ADMIN})
    assert r.status_code == 204, r.text
    assert client.get("/ui").status_code == 200


def test_revoking_the_api_token_ends_its_sessions(client: TestClient) -> None:
    token_id, token = api_token(client, "read-only")
    log_in(client, token)
    sessions = client.app.state.dashboard_sessions  # type: ignore[attr-defined]
    assert len(sessions) == 1
    assert client.get("/ui/api/snapshot").status_code == 200
    r = client.delete(f"{API}/tokens/{token_id}", headers=ADMIN_H)
    assert r.status_code == 204, r.text
    assert_problem(client.get("/ui/api/snapshot"), 401)
    assert len(sessions) == 0
    assert client.get("/ui").status_code == 401
    assert_problem(client.post("/ui/session", json={"token": token}), 401)


def test_a_session_ends_after_12_hours_and_at_logout(client: TestClient, clock: FakeClock) -> None:
    log_in(client, ADMIN)
    clock.now += SESSION_TTL_S - 1
    assert client.get("/ui/api/snapshot").status_code == 200
    clock.now += 1
    assert_problem(client.get("/ui/api/snapshot"), 401)

    log_in(client, ADMIN)
    session_id = client.cookies[SESSION_COOKIE]
    r = client.post("/ui/logout")
    assert r.status_code == 204
    assert SESSION_COOKIE not in client.cookies
    client.cookies.set(SESSION_COOKIE, session_id, path="/ui")  # replaying the old id
    assert_problem(client.get("/ui/api/snapshot"), 401)


# --- the snapshot -------------------------------------------------------------------------


def test_the_snapshot_shows_what_the_api_shows(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = started_job(client, clock)
    for rnd, acc in ((1, 0.5), (2, 0.7)):
        clock.now += 2.0
        for k, (_, headers) in enumerate(devices[:3] if rnd == 2 else devices):
            report(client, job_id, headers, rnd, acc + 0.01 * k)
    log_in(client, ADMIN)
    body = snapshot(client)
    assert body["generated_at"] == clock.now

    api_devices = client.get(f"{API}/devices", headers=ADMIN_H).json()
    assert body["devices_total"] == len(api_devices) == 4
    by_id = {d["device_id"]: d for d in body["devices"]}
    for d in api_devices:
        mine = by_id[d["device_id"]]
        for key in ("name", "state", "online", "tags", "profile", "last_seen"):
            assert mine[key] == d[key], key
        assert mine["online_source"] == "heartbeat"
    per_device = client.get(f"{API}/jobs/{job_id}/devices", headers=ADMIN_H).json()
    for d in per_device:
        mine = by_id[d["device_id"]]
        assert mine["round"] == d["latest_round"]
        assert mine["bytes_sent"] == d["bytes_sent"]
        assert mine["epsilon_spent"] == d["epsilon_spent"]  # None: not a DP job
    assert sorted(m["round"] for m in body["devices"]) == [1, 2, 2, 2]
    assert by_id[devices[0][0]]["bytes_sent"] == 1000 + 2000

    job = body["job"]
    assert (job["job_id"], job["status"], job["rounds"], job["rounds_done"]) == (
        job_id,
        "running",
        3,
        2,
    )
    assert (job["algorithm"], job["codec"], job["ledger"]) == ("choco", "topk:0.1", None)
    assert job["privacy"] == {"dp_unit": None, "noise_multiplier": 0.0, "clipping_norm": None,
                              "secure_aggregation": 0}  # fmt: skip
    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    assert len(job["curves"]) == 2
    for curve, summary in zip(job["curves"], rounds, strict=True):
        assert curve == {k: summary[k] for k in curve}
    assert job["curves"][1]["mean_accuracy"] == pytest.approx(0.71)
    assert job["curves"][1]["min_accuracy"] == pytest.approx(0.7)
    assert job["curves"][0]["consensus_distance"] > 0

    topo = client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).json()
    graph = job["topology"]
    assert graph["devices"] == topo["devices"] and graph["version"] == topo["version"]
    assert len(graph["edges"]) == len(topo["edges"]) == 4  # a ring of four
    w = topo["mixing_matrix"]
    assert graph["weights"] == [w[i][j] for i, j in graph["edges"]]
    assert graph["spectral_gap"] == topo["spectral_gap"]
    assert job["accuracy_by_device"] == {d["device_id"]: d["latest_accuracy"] for d in per_device}
    assert body["jobs"] == [
        {"job_id": job_id, "name": "mnist-ring", "status": "running", "rounds": 3,
         "created_at": job["created_at"]}
    ]  # fmt: skip


def test_the_default_job_is_the_running_one_and_jobs_come_newest_first(
    client: TestClient, clock: FakeClock
) -> None:
    log_in(client, ADMIN)
    assert snapshot(client)["job"] is None
    running, _ = started_job(client, clock, n=2)
    clock.now += 1.0
    created = client.post(f"{API}/jobs", json=spec(devices=2), headers=ADMIN_H).json()["job_id"]
    body = snapshot(client)
    assert [j["job_id"] for j in body["jobs"]] == [created, running]
    assert body["job"]["job_id"] == running
    other = snapshot(client, job=created)["job"]
    assert (other["job_id"], other["topology"], other["curves"]) == (created, None, [])
    assert all(d["round"] is None and d["bytes_sent"] == 0 for d in snapshot(client)["devices"])
    client.post(f"{API}/jobs/{running}/stop", headers=ADMIN_H)
    assert snapshot(client)["job"]["job_id"] == created
    assert_problem(client.get("/ui/api/snapshot", params={"job": "job-nope"}), 404)


def test_devices_are_capped_with_the_jobs_devices_first_and_presence_decides(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = dict(enrol(client, clock, f"pi-{k}") for k in range(3))
    job_id = client.post(f"{API}/jobs", json=spec(devices=2), headers=ADMIN_H).json()["job_id"]
    assert client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).status_code == 200
    rows = client.get(f"{API}/jobs/{job_id}/devices", headers=ADMIN_H).json()
    first, second = (r["device_id"] for r in rows)
    (spare,) = set(headers) - {first, second}
    report(client, job_id, headers[first], 1, 0.5)
    monkeypatch.setattr(dashboard_snapshot, "MAX_DEVICES", 2)
    log_in(client, ADMIN)
    body = snapshot(client)
    assert body["devices_total"] == 3
    assert {d["device_id"] for d in body["devices"]} == {first, second}

    presence = client.app.state.presence  # type: ignore[attr-defined]
    status = {"state": "online", "job": job_id, "round": 7}
    presence.on_status(status_topic("lab", second), json.dumps(status).encode())
    announced = {"state": "online", "job": job_id, "round": 0}  # stale: it reported round 1
    presence.on_status(status_topic("lab", first), json.dumps(announced).encode())
    clock.now += 1.0  # the Will arrives after the device was last heard from
    presence.on_status(status_topic("lab", first), b'{"state": "offline"}')
    shown = {d["device_id"]: d for d in snapshot(client)["devices"]}
    assert {d: shown[d]["round"] for d in shown} == {first: 1, second: 7}
    assert (shown[first]["online"], shown[first]["online_source"]) == (False, "last_will")
    assert (shown[second]["online"], shown[second]["online_source"]) == (True, "last_will")
    assert spare not in shown


def test_user_text_reaches_the_page_raw_as_data_never_as_markup(
    client: TestClient, clock: FakeClock
) -> None:
    body = {"token": ENROL, "name": "pi-x", "profile": {"accelerator": XSS, "cores": 4}}
    device_id = client.post(f"{API}/devices/enrol", json=body).json()["device_id"]
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        session.get(Device, device_id).name = XSS  # names are validated; say one slipped in
        session.commit()
    log_in(client, ADMIN)
    (device,) = snapshot(client)["devices"]
    assert device["name"] == XSS and device["profile"]["accelerator"] == XSS
    scripts = {p.name: p.read_text() for p in STATIC.glob("*.js")}
    for name, text in scripts.items():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (name, sink)


# --- static files and the page ------------------------------------------------------------


def test_static_assets_are_served_and_load_nothing_from_elsewhere(client: TestClient) -> None:
    names = sorted(p.name for p in STATIC.iterdir())
    assert {"index.html", "login.html", "app.js", "style.css"} <= set(names)
    for name in names:
        r = client.get(f"/ui/static/{name}")  # public: no session needed, no data in them
        assert r.status_code == 200, name
        urls = set(re.findall(r"https?://[^\s\"'`)]+", r.text))
        # The SVG namespace name is an identifier the DOM needs, never fetched.
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)
    for page in ("index.html", "login.html"):
        text = (STATIC / page).read_text()
        assert "<script>" not in text and "style=" not in text  # the CSP allows 'self' only
        for ref in re.findall(r'(?:src|href)="([^"]+)"', text):
            assert ref.startswith("/ui/static/"), (page, ref)
    assert client.get("/ui/static/../router.py").status_code == 404


def test_the_snapshot_ledger_is_the_apis_per_round_totals(
    client: TestClient, clock: FakeClock
) -> None:
    from coordinator.ledger import COUNTS

    job_id, devices = started_job(client, clock)
    for k, (_, headers) in enumerate(devices[:2]):
        body = metrics(1, 0.5, [0.5] * 8)
        body["ledger"] = {**dict.fromkeys(COUNTS, 0), "sent": 1, "applied": 2, "lost": k}
        r = client.post(f"{API}/jobs/{job_id}/metrics", json=body, headers=headers)
        assert r.status_code == 204, r.text
    log_in(client, ADMIN)

    ledger = snapshot(client)["job"]["ledger"]

    api = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()
    assert ledger == api["rounds"]
    assert [(r["round"], r["sent"], r["applied"], r["lost"]) for r in ledger] == [(1, 2, 4, 1)]


def test_both_pages_link_the_svg_favicon(client: TestClient) -> None:
    # Without the link browsers ask for /favicon.ico and log a 404 on every visit.
    icon = '<link rel="icon" type="image/svg+xml" href="/ui/static/favicon.svg">'
    for page in ("index.html", "login.html"):
        assert icon in (STATIC / page).read_text(), page
    r = client.get("/ui/static/favicon.svg")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("image/svg+xml")


def test_the_page_carries_the_contract_ids(client: TestClient) -> None:
    log_in(client, ADMIN)
    page = client.get("/ui").text
    for anchor in (
        'id="fleet"',
        'id="job-select"',
        'id="job-status"',
        'id="graph"',
        'id="color-by"',
        'id="spectral-gap"',
        'id="topology-version"',
        'id="chart-accuracy"',
        'id="chart-consensus"',
        'id="chart-bytes"',
        'id="ledger"',
        "delivery ledger: not available yet",
    ):
        assert anchor in page, anchor


def test_the_ui_routes_stay_out_of_the_openapi(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]


# --- the event stream ---------------------------------------------------------------------


def read_event(lines: Iterator[str], limit: int = 200) -> tuple[str, str]:
    """The next event's (name, data) from an SSE line iterator (comments skipped)."""
    name, data = "", ""
    for _ in range(limit):
        line = next(lines)
        if line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data += line.removeprefix("data:").strip()
        elif not line and name:
            return name, data
    raise AssertionError(f"no event in {limit} lines")


@pytest.mark.timeout(60)
def test_the_event_stream_sends_a_snapshot_at_connect_and_on_change(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_router, "CHECK_EVERY_S", 0.05)
    job_id, devices = started_job(client, clock, n=2)
    log_in(client, ADMIN)
    with client.stream("GET", "/ui/api/events", timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        name, data = read_event(lines)
        first = json.loads(data)
        assert name == "snapshot"
        assert first["job"]["job_id"] == job_id and first["job"]["curves"] == []
        report(client, job_id, devices[0][1], 1, 0.5)  # a change: the next event has it
        name, data = read_event(lines)
        assert name == "snapshot"
        assert [c["round"] for c in json.loads(data)["job"]["curves"]] == [1]


@pytest.mark.timeout(60)
def test_the_event_stream_ends_when_the_token_is_revoked(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_router, "CHECK_EVERY_S", 0.05)
    token_id, token = api_token(client, "read-only")
    log_in(client, token)
    with client.stream("GET", "/ui/api/events", timeout=10) as r:
        lines = r.iter_lines()
        assert read_event(lines)[0] == "snapshot"
        assert client.delete(f"{API}/tokens/{token_id}", headers=ADMIN_H).status_code == 204
        rest = list(lines)  # the server closes the stream at its next check
    assert not any(line.startswith("event:") for line in rest)
    assert_problem(client.get("/ui/api/events"), 401)


def test_the_concurrency_limit_does_not_count_event_streams() -> None:
    async def scenario() -> list[str]:
        release = asyncio.Event()
        served: list[str] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == dashboard_router.EVENTS_PATH:
                await release.wait()  # a stream stays open
            served.append(scope["path"])

        limited = ConcurrencyLimit(app, limit=1)
        streams = [
            asyncio.create_task(limited({"type": "http", "path": "/ui/api/events"}, None, None))
            for _ in range(3)
        ]
        await asyncio.sleep(0)
        await asyncio.wait_for(limited({"type": "http", "path": "/healthz"}, None, None), 5)
        release.set()
        await asyncio.wait_for(asyncio.gather(*streams), 5)
        return served

    served = asyncio.run(scenario())
    assert served[0] == "/healthz" and served.count(dashboard_router.EVENTS_PATH) == 3


@pytest.mark.parametrize(
    ("spec", "privacy"),
    [
        ({"dp_noise_multiplier": 1.1, "dp_clip": 1.0},
         {"dp_unit": "device", "noise_multiplier": 1.1, "clipping_norm": 1.0,
          "secure_aggregation": 0}),
        ({"dp_noise_multiplier": 0.9, "dp_clip": 2.0, "dp_unit": "record"},
         {"dp_unit": "record", "noise_multiplier": 0.9, "clipping_norm": 2.0,
          "secure_aggregation": 0}),
        ({"secure_aggregation": 4, "dp_clip": 1.0},
         {"dp_unit": None, "noise_multiplier": 0.0, "clipping_norm": None,
          "secure_aggregation": 4}),
    ],
)  # fmt: skip
def test_the_job_view_names_the_privacy_unit_and_secure_aggregation(
    spec: dict[str, Any], privacy: dict[str, Any]
) -> None:
    from coordinator.dashboard.snapshot import _privacy

    assert _privacy(spec) == privacy
