"""The devices resource: enrolment credentials, the filtered fleet view, tags and labels,
drain, revoke, delete, and the agent stopping once revoked."""

from __future__ import annotations

import base64
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import func, select
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, metrics, spec

from coordinator import CoordinatorSettings, create_app, tokens
from coordinator.db import Device, DeviceProfile, Job, PrivacySpendRecord
from edge_agent import daemon
from edge_agent.rest import CoordinatorClient, DeviceRevoked
from meshfl.errors import ConfigError, TransportError

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


class FakeAccounts:
    """A broker login table recording its calls; ``fail`` makes them raise ConfigError."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail = False

    def add(self, username: str, password: str) -> None:
        if self.fail:
            raise ConfigError("the broker's password file is read-only")
        self.calls.append(("add", username, password))

    def remove(self, username: str) -> None:
        if self.fail:
            raise ConfigError("the broker's password file is read-only")
        self.calls.append(("remove", username))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def accounts() -> FakeAccounts:
    return FakeAccounts()


@pytest.fixture
def settings(tmp_path: Path) -> CoordinatorSettings:
    (tmp_path / "ca.pem").write_text(CA_PEM)
    return CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        broker_url="mqtts://broker:8883",
        broker_ca_file=tmp_path / "ca.pem",
        live_within_s=15,
    )


@pytest.fixture
def client(
    settings: CoordinatorSettings, clock: FakeClock, accounts: FakeAccounts
) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock=clock, broker_accounts=accounts)) as test_client:
        yield test_client


def identity_key() -> str:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def enrol(
    client: TestClient, clock: FakeClock, name: str, token: str = ENROL, **profile: Any
) -> tuple[str, dict[str, str]]:
    clock.now += 1.0
    body: dict[str, Any] = {"token": token, "name": name, "identity_key": identity_key()}
    if profile:
        body["profile"] = profile
    r = client.post(f"{API}/devices/enrol", json=body)
    assert r.status_code == 200, r.text
    return r.json()["device_id"], {"Authorization": f"Bearer {r.json()['device_token']}"}


def enrolment_token(client: TestClient, clock: FakeClock, **kw: Any) -> str:
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        _, secret = tokens.create_enrolment_token(session, now=clock.now, **kw)
    return secret


def running_job(
    client: TestClient, clock: FakeClock, n: int = 4, **overrides: Any
) -> tuple[str, list[tuple[str, dict[str, str]]]]:
    devices = [enrol(client, clock, f"pi-{k}") for k in range(n)]
    r = client.post(f"{API}/jobs", json=spec(devices=n, **overrides), headers=ADMIN_H)
    assert r.is_success, r.text
    job_id = r.json()["job_id"]
    clock.now += 1.0
    r = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert r.status_code == 200, r.text
    for device_id, headers in devices:  # everybody reports round 1: changes apply from 3
        sent = client.post(
            f"{API}/jobs/{job_id}/metrics", json=metrics(1, 0.5, []), headers=headers
        )
        assert sent.status_code == 204, (device_id, sent.text)
    return job_id, devices


def topology(client: TestClient, job_id: str) -> dict[str, Any]:
    r = client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H)
    assert r.status_code == 200, r.text
    return dict(r.json())


# --- enrolment --------------------------------------------------------------------------


def test_enrol_returns_broker_credentials_once_and_the_ca(
    client: TestClient,
    clock: FakeClock,
    accounts: FakeAccounts,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    r = client.post(
        f"{API}/devices/enrol",
        json={"token": ENROL, "name": "pi", "identity_key": identity_key()},
    )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["broker_username"] == body["device_id"]
    assert len(body["broker_password"]) >= 32 and body["broker_ca"] == CA_PEM
    assert accounts.calls == [("add", body["device_id"], body["broker_password"])]
    listed = client.get(f"{API}/devices/{body['device_id']}", headers=ADMIN_H).json()
    assert body["broker_password"] not in str(listed)
    assert body["broker_password"] not in caplog.text and ENROL not in caplog.text


def test_enrol_without_broker_accounts_returns_no_password(
    settings: CoordinatorSettings, clock: FakeClock
) -> None:
    settings.broker_ca_file = None
    with TestClient(create_app(settings, clock=clock)) as plain:
        r = plain.post(f"{API}/devices/enrol", json={"token": ENROL, "name": "pi"})
    assert r.status_code == 200, r.text
    assert not {"broker_username", "broker_password", "broker_ca"} & set(r.json())


def test_enrol_gets_the_tokens_tags_and_a_broker_failure_spends_no_use(
    client: TestClient, clock: FakeClock, accounts: FakeAccounts
) -> None:
    secret = enrolment_token(client, clock, uses=1, tags=["lab", "arm64"])
    accounts.fail = True
    refused = client.post(f"{API}/devices/enrol", json={"token": secret, "name": "pi"})
    assert refused.status_code == 503 and "broker login" in refused.json()["detail"]
    assert client.get(f"{API}/devices", headers=ADMIN_H).headers["x-total-count"] == "0"
    accounts.fail = False
    device_id, _ = enrol(client, clock, "pi", token=secret)  # the one use is still there
    got = client.get(f"{API}/devices/{device_id}", headers=ADMIN_H).json()
    assert got["tags"] == ["lab", "arm64"] and got["state"] == "active" and got["labels"] == {}
    again = client.post(f"{API}/devices/enrol", json={"token": secret, "name": "pi2"})
    assert again.status_code == 401


def test_enrol_with_an_unreadable_ca_file_is_503_before_the_token_is_spent(
    client: TestClient, clock: FakeClock, settings: CoordinatorSettings
) -> None:
    assert settings.broker_ca_file is not None
    settings.broker_ca_file.unlink()
    secret = enrolment_token(client, clock, uses=1)
    r = client.post(f"{API}/devices/enrol", json={"token": secret, "name": "pi"})
    assert r.status_code == 503 and "CA file" in r.json()["detail"]
    settings.broker_ca_file.write_text(CA_PEM)
    enrol(client, clock, "pi", token=secret)


# --- the fleet view -----------------------------------------------------------------------


def test_list_filters_by_tag_state_status_and_capabilities_with_paging(
    client: TestClient, clock: FakeClock
) -> None:
    c, _ = enrol(client, clock, "c")  # no tags, no profile; drained, then silent
    tagged = enrolment_token(client, clock, uses=2, tags=["lab", "arm"])
    enrol(client, clock, "a", token=tagged, cores=4, memory_bytes=4 << 30,
          train_samples_per_s=300.0, uplink_bytes_per_s=1e5)  # fmt: skip
    b, b_h = enrol(client, clock, "b", token=tagged, cores=8, memory_bytes=16 << 30,
                   train_samples_per_s=5000.0, uplink_bytes_per_s=1e7)  # fmt: skip
    assert client.patch(f"{API}/devices/{b}", json={"tags": ["lab"]}, headers=ADMIN_H).is_success
    assert client.post(f"{API}/devices/{c}/drain", headers=ADMIN_H).status_code == 200
    clock.now += 14.0  # c was last heard 16 s ago, a 15 s ago (still online)

    def names(path: str = "", **params: Any) -> tuple[list[str], int]:
        r = client.get(f"{API}/devices{path}", params=params, headers=ADMIN_H)
        assert r.status_code == 200, r.text
        return [d["name"] for d in r.json()], int(r.headers["x-total-count"])

    assert names() == (["c", "a", "b"], 3)
    assert names(tag="lab") == (["a", "b"], 2)
    assert names(tag=["lab", "arm"]) == (["a"], 1)
    assert names(state="draining") == (["c"], 1)
    assert names(state="active") == (["a", "b"], 2)
    assert names(status="offline") == (["c"], 1)
    assert names(status="online") == (["a", "b"], 2)
    assert names(min_cores=5) == (["b"], 1)
    assert names(max_cores=4) == (["a"], 1)
    assert names(min_cores=4, max_cores=8) == (["a", "b"], 2)
    assert names(min_memory_bytes=8 << 30) == (["b"], 1)
    assert names(max_memory_bytes=8 << 30) == (["a"], 1)
    assert names(min_train_samples_per_s=1000) == (["b"], 1)
    assert names(min_uplink_bytes_per_s=0) == (["a", "b"], 2)  # c reported none
    assert names(limit=1, offset=1) == (["a"], 3)
    assert names(tag="lab", limit=1, offset=1) == (["b"], 2)
    assert names(offset=5) == ([], 3)
    assert names("/profiles", tag="lab", min_cores=5) == (["b"], 1)  # the older alias
    first = client.get(f"{API}/devices", headers=ADMIN_H).json()[2]
    assert (first["tags"], first["state"], first["online"], first["revoked_at"]) == (
        ["lab"], "active", True, None
    )  # fmt: skip
    for bad in (
        {"tag": "bad tag"},
        {"tag": "x" * 65},
        {"state": "gone"},
        {"status": "asleep"},
        {"min_cores": 8, "max_cores": 4},
        {"max_cores": -1},
        {"limit": 0},
    ):
        r = client.get(f"{API}/devices", params=bad, headers=ADMIN_H)
        assert r.status_code == 422, (bad, r.text)
    assert client.get(f"{API}/devices", headers=b_h).status_code == 403


# --- patch --------------------------------------------------------------------------------


def test_patch_replaces_tags_and_labels_and_validates_them(
    client: TestClient, clock: FakeClock
) -> None:
    a, _ = enrol(client, clock, "a")
    url = f"{API}/devices/{a}"
    r = client.patch(
        url,
        json={"tags": ["site:berlin", "gpu", "site:berlin"], "labels": {"rack": "r-1 (top)"}},
        headers=ADMIN_H,
    )
    assert r.status_code == 200, r.text
    assert (r.json()["tags"], r.json()["labels"]) == (["site:berlin", "gpu"], {"rack": "r-1 (top)"})
    r = client.patch(url, json={"labels": {}}, headers=ADMIN_H)
    assert (r.json()["tags"], r.json()["labels"]) == (["site:berlin", "gpu"], {})
    for bad in (
        {"tags": ["no spaces"]},
        {"tags": [""]},
        {"tags": [f"t{k}" for k in range(33)]},
        {"tags": "gpu"},
        {"labels": {"bad key": "v"}},
        {"labels": {"k": "v" * 257}},
        {"labels": {"k": "line\nbreak"}},
        {"labels": {f"k{k}": "v" for k in range(33)}},
        {"labels": {"k": 1}},
    ):
        r = client.patch(url, json=bad, headers=ADMIN_H)
        assert r.status_code == 422, (bad, r.text)
    assert client.get(url, headers=ADMIN_H).json()["tags"] == ["site:berlin", "gpu"]
    assert client.patch(f"{API}/devices/dev-nope", json={}, headers=ADMIN_H).status_code == 404


# --- drain --------------------------------------------------------------------------------


def test_drain_leaves_the_running_job_after_the_round_in_progress(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock)
    (d0, d0_h), (d1, _) = devices[0], devices[1]
    r = client.post(f"{API}/devices/{d0}/drain", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["state"] == "draining"
    topo = topology(client, job_id)
    assert topo["version"] == 2 and topo["from_round"] == 3 and d0 not in topo["devices"]
    assert topo["events"][-1]["kind"] == "leave" and "drained" in topo["events"][-1]["reason"]
    # It still runs round 2 (version 1) and learns it is out from round 3.
    mine = client.get(f"{API}/devices/{d0}/assignment", headers=d0_h).json()
    assert (mine["position"], mine["topology_version"], mine["from_round"]) == (-1, 2, 3)
    assert (
        client.post(
            f"{API}/jobs/{job_id}/metrics", json=metrics(2, 0.6, []), headers=d0_h
        ).status_code
        == 204
    )
    again = client.post(f"{API}/devices/{d0}/drain", headers=ADMIN_H)  # idempotent
    assert again.status_code == 200 and topology(client, job_id)["version"] == 2
    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    assert {d["device_id"]: d["left_round"] for d in job["devices"]}[d0] == 3
    assert job["status"] == "running" and d1 in topology(client, job_id)["devices"]


def test_a_draining_device_is_neither_started_nor_admitted_until_undrained(
    client: TestClient, clock: FakeClock
) -> None:
    devices = [enrol(client, clock, f"pi-{k}") for k in range(3)]
    idle, idle_h = devices[2]
    assert client.post(f"{API}/devices/{idle}/drain", headers=ADMIN_H).status_code == 200
    r = client.post(f"{API}/jobs", json=spec(devices=0, elastic=True), headers=ADMIN_H)
    job_id = r.json()["job_id"]
    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert started.status_code == 200, started.text
    assert idle not in [d["device_id"] for d in started.json()["devices"]]
    assert client.get(f"{API}/devices/{idle}/assignment", headers=idle_h).status_code == 204
    undrained = client.post(f"{API}/devices/{idle}/undrain", headers=ADMIN_H)
    assert undrained.status_code == 200 and undrained.json()["state"] == "active"
    joined = client.get(f"{API}/devices/{idle}/assignment", headers=idle_h)
    assert joined.status_code == 200 and joined.json()["job_id"] == job_id
    assert idle in topology(client, job_id)["devices"]


# --- revoke -------------------------------------------------------------------------------


def test_revoke_refuses_the_token_removes_the_login_and_leaves_the_job(
    client: TestClient, clock: FakeClock, accounts: FakeAccounts
) -> None:
    job_id, devices = running_job(client, clock)
    d1, d1_h = devices[1]
    clock.now += 5.0
    r = client.post(f"{API}/devices/{d1}/revoke", headers=ADMIN_H)
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["revoked_at"]) == ("revoked", clock.now)
    assert ("remove", d1) in accounts.calls
    topo = topology(client, job_id)
    assert topo["version"] == 2 and d1 not in topo["devices"]
    assert "revoked" in topo["events"][-1]["reason"]
    for method, url, body in (
        ("GET", f"{API}/devices/{d1}/assignment", None),
        ("PUT", f"{API}/devices/{d1}/profile", {"cores": 2}),
        ("POST", f"{API}/jobs/{job_id}/metrics", metrics(2, 0.6, [])),
        ("GET", f"{API}/jobs/latest/artifacts/consensus.onnx", None),
    ):
        refused = client.request(method, url, json=body, headers=d1_h)
        assert refused.status_code == 401, (url, refused.text)
        assert "device revoked" in refused.headers["www-authenticate"]
        assert "revoked" in refused.json()["detail"] and "\n" not in refused.json()["detail"]
    first = r.json()["revoked_at"]
    clock.now += 5.0
    again = client.post(f"{API}/devices/{d1}/revoke", headers=ADMIN_H)
    assert again.status_code == 200 and again.json()["revoked_at"] == first
    assert topology(client, job_id)["version"] == 2
    for action in ("drain", "undrain"):
        conflict = client.post(f"{API}/devices/{d1}/{action}", headers=ADMIN_H)
        assert conflict.status_code == 409 and "revoked" in conflict.json()["detail"]
    listed = client.get(f"{API}/devices", params={"state": "revoked"}, headers=ADMIN_H).json()
    assert [d["device_id"] for d in listed] == [d1]


def test_revoke_during_a_pause_takes_the_device_out_of_the_paused_job(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock)
    paused = client.post(f"{API}/jobs/{job_id}/pause", headers=ADMIN_H)
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    d0 = devices[0][0]
    assert client.post(f"{API}/devices/{d0}/revoke", headers=ADMIN_H).status_code == 200
    topo = topology(client, job_id)
    assert topo["version"] == 2 and d0 not in topo["devices"]


def test_revoke_with_the_broker_down_is_503_but_the_token_is_refused_already(
    client: TestClient, clock: FakeClock, accounts: FakeAccounts
) -> None:
    a, a_h = enrol(client, clock, "a")
    accounts.fail = True
    r = client.post(f"{API}/devices/{a}/revoke", headers=ADMIN_H)
    assert r.status_code == 503 and "broker login" in r.json()["detail"]
    assert client.get(f"{API}/devices/{a}/assignment", headers=a_h).status_code == 401
    accounts.fail = False
    assert client.post(f"{API}/devices/{a}/revoke", headers=ADMIN_H).status_code == 200
    assert accounts.calls[-1] == ("remove", a)


# --- delete -------------------------------------------------------------------------------


def profile_rows(client: TestClient, device_id: str) -> int:
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        query = select(func.count()).where(DeviceProfile.device_id == device_id)
        return int(session.scalar(query) or 0)


def test_delete_of_a_device_without_job_history_removes_it_and_its_profiles(
    client: TestClient, clock: FakeClock, accounts: FakeAccounts
) -> None:
    a, a_h = enrol(client, clock, "a", cores=2)
    b, _ = enrol(client, clock, "b")
    assert profile_rows(client, a) == 1
    assert client.delete(f"{API}/devices/{a}", headers=ADMIN_H).status_code == 204
    assert client.get(f"{API}/devices/{a}", headers=ADMIN_H).status_code == 404
    listed = client.get(f"{API}/devices", headers=ADMIN_H)
    assert [d["device_id"] for d in listed.json()] == [b] and listed.headers["x-total-count"] == "1"
    assert profile_rows(client, a) == 0 and ("remove", a) in accounts.calls
    assert client.delete(f"{API}/devices/{a}", headers=ADMIN_H).status_code == 404
    assert client.get(f"{API}/devices/{a}/assignment", headers=a_h).status_code == 403
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        assert session.get(Device, a) is None


def test_delete_of_a_device_with_job_history_keeps_an_anonymous_tombstone(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock)
    d2, d2_h = devices[2]
    assert client.delete(f"{API}/devices/{d2}", headers=ADMIN_H).status_code == 204
    assert client.get(f"{API}/devices/{d2}", headers=ADMIN_H).status_code == 404
    assert d2 not in [d["device_id"] for d in client.get(f"{API}/devices", headers=ADMIN_H).json()]
    assert d2 not in topology(client, job_id)["devices"]
    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    kept = next(d for d in job["devices"] if d["device_id"] == d2)
    assert kept["name"] == "(deleted)" and kept["rounds_reported"] == 1
    refused = client.get(f"{API}/devices/{d2}/assignment", headers=d2_h)
    assert refused.status_code == 401 and "device revoked" in refused.headers["www-authenticate"]
    assert profile_rows(client, d2) == 0
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        row = session.get(Device, d2)
        assert row is not None and row.state == "deleted" and row.identity_key is None
    assert client.delete(f"{API}/devices/{d2}", headers=ADMIN_H).status_code == 404


def test_delete_falls_back_to_a_tombstone_when_other_rows_reference_the_device(
    client: TestClient, clock: FakeClock
) -> None:
    a, _ = enrol(client, clock, "a")
    job_id = client.post(f"{API}/jobs", json=spec(), headers=ADMIN_H).json()["job_id"]
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        assert session.get(Job, job_id) is not None
        session.add(PrivacySpendRecord(job_id=job_id, device_id=a, round=1, releases=1,
                                       noise_multiplier=1.0, delta=1e-5, at=clock.now))  # fmt: skip
        session.commit()
    assert client.delete(f"{API}/devices/{a}", headers=ADMIN_H).status_code == 204
    assert client.get(f"{API}/devices/{a}", headers=ADMIN_H).status_code == 404
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        row = session.get(Device, a)
        assert row is not None and row.state == "deleted"


def test_device_management_needs_an_operator_token(client: TestClient, clock: FakeClock) -> None:
    a, a_h = enrol(client, clock, "a")
    with client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
        _, reader = tokens.create_api_token(session, role="read-only", now=clock.now)
        _, operator = tokens.create_api_token(session, role="operator", now=clock.now)
    read_h, operate_h = ({"Authorization": f"Bearer {t}"} for t in (reader, operator))
    assert client.get(f"{API}/devices", headers=read_h).status_code == 200
    assert client.post(f"{API}/devices/{a}/drain", headers=read_h).status_code == 403
    assert client.post(f"{API}/devices/{a}/drain", headers=operate_h).status_code == 200
    assert client.post(f"{API}/devices/{a}/undrain", headers=operate_h).status_code == 200
    for method, path in (
        ("PATCH", ""), ("POST", "/drain"), ("POST", "/undrain"), ("POST", "/revoke"),
        ("DELETE", ""),
    ):  # fmt: skip
        url = f"{API}/devices/{a}{path}"
        body = {} if method == "PATCH" else None
        assert client.request(method, url, json=body).status_code == 401
        assert client.request(method, url, json=body, headers=a_h).status_code == 403
    assert client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()["state"] == "active"


# --- the agent side -----------------------------------------------------------------------


def agent_client(app_client: TestClient) -> CoordinatorClient:
    """A device's REST client whose requests go to the app under test."""

    def forward(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        return app_client.request(
            request.method, path, content=request.content, headers=dict(request.headers)
        )

    return CoordinatorClient(
        "http://coordinator", retry_s=0.0, transport=httpx.MockTransport(forward)
    )


def test_the_agent_stops_with_one_line_once_revoked(client: TestClient, clock: FakeClock) -> None:
    agent = agent_client(client)
    device_id = agent.enrol(ENROL, "pi", {"cores": 2}, identity_key())["device_id"]
    assert agent.assignment(device_id) is None
    assert client.post(f"{API}/devices/{device_id}/revoke", headers=ADMIN_H).status_code == 200
    with pytest.raises(DeviceRevoked) as caught:
        agent.assignment(device_id)
    message = str(caught.value)
    assert caught.value.status == 401 and caught.value.exit_code == 3
    assert "revoked" in message and device_id in message and "\n" not in message

    # The daemon's idle loop ends on it at once instead of polling on.
    config = daemon.AgentConfig(coordinator="http://coordinator", token=ENROL,
                                data=Path("unused.npz"), name="pi", poll_s=0.01)  # fmt: skip
    outcome: list[BaseException] = []

    def serve() -> None:
        try:
            idle = SimpleNamespace(flush=lambda timeout: None)  # a transport with nothing queued
            daemon._serve(config, agent, idle, device_id, "lab", None, None, {}, None)  # type: ignore[arg-type]
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(10.0)
    assert not thread.is_alive() and isinstance(outcome[0], DeviceRevoked)


class BrokenTransport:
    """A transport whose broker login is gone: publishing fails."""

    closed = False

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        raise TransportError("the broker refused this device's login")

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def test_the_agent_shutdown_keeps_the_first_error_and_still_disconnects() -> None:
    quiet = BrokenTransport()
    daemon._say_offline(quiet, "lab", "dev-1", quiet=True)  # type: ignore[arg-type]
    assert quiet.closed
    loud = BrokenTransport()
    with pytest.raises(TransportError):
        daemon._say_offline(loud, "lab", "dev-1", quiet=False)  # type: ignore[arg-type]
    assert loud.closed


def test_a_revoked_device_cannot_be_patched(client: TestClient, clock: FakeClock) -> None:
    device_id, _ = enrol(client, clock, "pi")
    assert client.post(f"{API}/devices/{device_id}/revoke", headers=ADMIN_H).status_code == 200
    r = client.patch(f"{API}/devices/{device_id}", json={"tags": ["x"]}, headers=ADMIN_H)
    assert r.status_code == 409 and "revoked" in r.json()["detail"]
    assert client.get(f"{API}/devices/{device_id}", headers=ADMIN_H).json()["tags"] == []
