"""The coordinator's REST API, end to end over TestClient on a temporary SQLite file."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator import CoordinatorSettings, create_app
from coordinator.deps import get_now
from coordinator.server import ensure_tokens
from edge_agent.secagg.crypto import IdentityKey
from meshfl.errors import ConfigError
from meshfl.modelspec import layout, layout_hash
from meshfl.topology import build_graph, metropolis_hastings, spectral_gap

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


@pytest.fixture
def settings(tmp_path: Path) -> CoordinatorSettings:
    return CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        broker_url="mqtt://127.0.0.1:1883",
        stale_after_s=120,
    )


@pytest.fixture
def client(settings: CoordinatorSettings, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock=clock)) as test_client:
        yield test_client


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mnist-ring",
        "model": {"name": "mlp", "input_dim": 784, "num_classes": 10, "hidden": [64]},
        "algorithm": "choco",
        "codec": "topk:0.1",
        "topology": "ring",
        "rounds": 5,
        "learning_rate": 0.05,
        "batch_size": 32,
        "local_epochs": 1,
        "consensus_step": 0.5,
        "round_deadline_s": 30.0,
        "max_payload_bytes": 131072,
        "seed": 7,
        "devices": 4,
        "test_data": None,
        "sketch_dim": 8,
    }
    body.update(overrides)
    return body


def enrol(client: TestClient, clock: FakeClock, name: str) -> tuple[str, dict[str, str]]:
    clock.now += 1.0
    body = {"token": ENROL, "name": name, "identity_key": IdentityKey.generate().public_b64}
    r = client.post(f"{API}/devices/enrol", json=body)  # a key, as agents send: signed jobs
    assert r.status_code == 200, r.text
    return r.json()["device_id"], {"Authorization": f"Bearer {r.json()['device_token']}"}


def running_job(
    client: TestClient, clock: FakeClock, n: int = 4, **overrides: Any
) -> tuple[str, list[tuple[str, dict[str, str]]]]:
    devices = [enrol(client, clock, f"pi-{k}") for k in range(n)]
    job_id = client.post(f"{API}/jobs", json=spec(devices=n, **overrides), headers=ADMIN_H).json()[
        "job_id"
    ]
    clock.now += 10.0
    assert client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).status_code == 200
    return job_id, devices


def metrics(rnd: int, accuracy: float, sketch: list[float], sent: int = 100) -> dict[str, Any]:
    return {
        "round": rnd,
        "accuracy": accuracy,
        "loss": 1.0 - accuracy,
        "bytes_sent": sent,
        "bytes_received": 2 * sent,
        "missing": [],
        "sketch": sketch,
        "train_s": 0.5,
        "round_s": 1.0,
    }


DONE = {"final_accuracy": 0.9, "bytes_sent": 1000, "bytes_received": 2000, "model_path": "m.pt"}


# --- health, docs, settings ---------------------------------------------------------------


def test_healthz_and_openapi_list_every_contract_path(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    paths = client.get("/openapi.json").json()["paths"]
    assert client.get("/docs").status_code == 200
    assert {
        f"{API}/devices/enrol",
        f"{API}/devices",
        f"{API}/devices/{{device_id}}",
        f"{API}/devices/{{device_id}}/profile",
        f"{API}/devices/{{device_id}}/profiles",
        f"{API}/devices/profiles",
        f"{API}/devices/{{device_id}}/assignment",
        f"{API}/jobs",
        f"{API}/jobs/{{job_id}}",
        f"{API}/jobs/{{job_id}}/start",
        f"{API}/jobs/{{job_id}}/stop",
        f"{API}/jobs/{{job_id}}/rounds",
        f"{API}/jobs/{{job_id}}/topology",
        f"{API}/jobs/{{job_id}}/metrics",
        f"{API}/jobs/{{job_id}}/done",
    } <= set(paths)


def test_create_app_refuses_missing_tokens_and_ensure_tokens_fills_them(tmp_path: Path) -> None:
    bare = CoordinatorSettings(db_url=f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(ConfigError, match="admin_token"):
        create_app(bare)
    filled, generated = ensure_tokens(bare)
    assert generated == ["admin_token"]  # the fleet enrol token stays off (issue 23)
    assert filled.enrol_token is None and filled.admin_token and len(filled.admin_token) >= 24


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHFL_COORDINATOR_FLEET", "farm")
    monkeypatch.setenv("MESHFL_COORDINATOR_STALE_AFTER_S", "30")
    settings = CoordinatorSettings()
    assert (settings.fleet, settings.stale_after_s, settings.enrol_token) == ("farm", 30.0, None)


# --- devices and auth ----------------------------------------------------------------------


def test_enrol_issues_an_identity_and_renaming_makes_a_new_one(
    client: TestClient, clock: FakeClock
) -> None:
    r = client.post(
        f"{API}/devices/enrol", json={"token": ENROL, "name": "pi", "profile": {"cores": 4}}
    )
    body = r.json()
    again, _ = enrol(client, clock, "pi")
    assert r.status_code == 200
    assert body["device_id"].startswith("dev-") and body["device_token"]
    assert (body["fleet"], body["broker_url"]) == ("lab", "mqtt://127.0.0.1:1883")
    assert again != body["device_id"]
    listed = client.get(f"{API}/devices", headers=ADMIN_H).json()
    assert [d["device_id"] for d in listed] == [body["device_id"], again]
    assert listed[0]["profile"] == {"cores": 4}
    assert "token" not in str(listed)


def test_enrol_with_a_wrong_token_is_401_with_a_one_line_detail(client: TestClient) -> None:
    r = client.post(f"{API}/devices/enrol", json={"token": "guess", "name": "pi"})
    assert r.status_code == 401
    assert "enrolment token" in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_auth_is_401_without_a_token_and_403_with_the_wrong_one(
    client: TestClient, clock: FakeClock
) -> None:
    a, a_h = enrol(client, clock, "a")
    b, _ = enrol(client, clock, "b")
    missing = client.get(f"{API}/devices")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert client.get(f"{API}/devices", headers={"Authorization": "Basic x"}).status_code == 401
    assert client.get(f"{API}/devices", headers=a_h).status_code == 403
    assert client.get(f"{API}/devices/{a}/assignment").status_code == 401
    assert client.get(f"{API}/devices/{a}/assignment", headers=ADMIN_H).status_code == 403
    assert client.get(f"{API}/devices/{b}/assignment", headers=a_h).status_code == 403
    assert client.put(f"{API}/devices/{b}/profile", json={}, headers=a_h).status_code == 403
    assert client.get(f"{API}/devices/{a}/assignment", headers=a_h).status_code == 204


def test_profile_update_and_device_lookup(client: TestClient, clock: FakeClock) -> None:
    a, a_h = enrol(client, clock, "a")
    clock.now = 5_000.0
    r = client.put(
        f"{API}/devices/{a}/profile", json={"cores": 8, "platform": "arm64"}, headers=a_h
    )
    got = client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()
    assert r.status_code == 200 and r.json()["profile"] == {"cores": 8, "platform": "arm64"}
    assert got["last_seen"] == 5_000.0 and got["enrolled_at"] < 5_000.0
    assert client.get(f"{API}/devices/dev-nope", headers=ADMIN_H).status_code == 404


# --- capability profile history and the fleet view -----------------------------------------

FULL_PROFILE = {
    "cores": 4,
    "memory_bytes": 4 * 2**30,
    "accelerator": None,
    "platform": "linux-aarch64",
    "train_samples_per_s": 1200.5,
    "model_hash": "abc",
    "uplink_bytes_per_s": 125_000.0,
    "downlink_bytes_per_s": 1_250_000.0,
    "broker_rtt_s": 0.045,
    "battery_percent": 87.5,
    "charging": False,
    "measured_at": 4_999.0,
}


def put_profile(
    client: TestClient, clock: FakeClock, device: str, headers: dict[str, str], **profile: Any
) -> None:
    clock.now += 10.0
    r = client.put(f"{API}/devices/{device}/profile", json=profile, headers=headers)
    assert r.status_code == 200, r.text


def test_the_new_profile_fields_round_trip(client: TestClient, clock: FakeClock) -> None:
    a, a_h = enrol(client, clock, "a")
    put_profile(client, clock, a, a_h, **FULL_PROFILE)
    got = client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()
    history = client.get(f"{API}/devices/{a}/profiles", headers=ADMIN_H).json()
    assert got["profile"] == FULL_PROFILE
    assert history == [{"profile": FULL_PROFILE, "received_at": clock.now}]


def test_profile_history_grows_newest_first_with_limit_offset_and_since(
    client: TestClient, clock: FakeClock
) -> None:
    a, a_h = enrol(client, clock, "a")
    b, b_h = enrol(client, clock, "b")
    times = []
    for k in range(5):
        put_profile(client, clock, a, a_h, cores=k + 1)
        times.append(clock.now)
    put_profile(client, clock, b, b_h, cores=99)
    url = f"{API}/devices/{a}/profiles"
    history = client.get(url, headers=ADMIN_H).json()
    assert [s["profile"]["cores"] for s in history] == [5, 4, 3, 2, 1]
    assert [s["received_at"] for s in history] == times[::-1]
    current = client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()["profile"]
    assert current == {"cores": 5}
    page = client.get(url, params={"limit": 2, "offset": 1}, headers=ADMIN_H).json()
    assert [s["profile"]["cores"] for s in page] == [4, 3]
    recent = client.get(url, params={"since": times[2]}, headers=ADMIN_H).json()
    assert [s["profile"]["cores"] for s in recent] == [5, 4, 3]
    assert client.get(url, params={"since": clock.now + 1}, headers=ADMIN_H).json() == []
    assert len(client.get(f"{API}/devices/{b}/profiles", headers=ADMIN_H).json()) == 1
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"since": "nan"}):
        r = client.get(url, params=bad, headers=ADMIN_H)
        assert r.status_code == 422 and "\n" not in r.json()["detail"], bad
    missing = client.get(f"{API}/devices/dev-nope/profiles", headers=ADMIN_H)
    assert missing.status_code == 404


def test_a_profile_sent_at_enrolment_starts_the_history(client: TestClient) -> None:
    r = client.post(
        f"{API}/devices/enrol", json={"token": ENROL, "name": "pi", "profile": {"cores": 2}}
    )
    history = client.get(f"{API}/devices/{r.json()['device_id']}/profiles", headers=ADMIN_H)
    assert [s["profile"] for s in history.json()] == [{"cores": 2}]
    bare, _ = enrol(client, FakeClock(0.0), "bare")
    assert client.get(f"{API}/devices/{bare}/profiles", headers=ADMIN_H).json() == []


def test_profile_history_keeps_only_the_latest_samples(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator import store

    monkeypatch.setattr(store, "PROFILE_HISTORY_LIMIT", 3)
    a, a_h = enrol(client, clock, "a")
    b, b_h = enrol(client, clock, "b")
    put_profile(client, clock, b, b_h, cores=1)
    for k in range(7):
        put_profile(client, clock, a, a_h, cores=k)
    history = client.get(f"{API}/devices/{a}/profiles", params={"limit": 1000}, headers=ADMIN_H)
    assert [s["profile"]["cores"] for s in history.json()] == [6, 5, 4]
    other = client.get(f"{API}/devices/{b}/profiles", headers=ADMIN_H).json()
    assert [s["profile"]["cores"] for s in other] == [1]  # pruning is per device


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({"cores": -1}, "cores"),
        ({"memory_bytes": -5}, "memory_bytes"),
        ({"train_samples_per_s": float("nan")}, "train_samples_per_s"),
        ({"uplink_bytes_per_s": float("inf")}, "uplink_bytes_per_s"),
        ({"downlink_bytes_per_s": -0.5}, "downlink_bytes_per_s"),
        ({"broker_rtt_s": -0.001}, "broker_rtt_s"),
        ({"battery_percent": 100.5}, "battery_percent"),
        ({"battery_percent": -1}, "battery_percent"),
        ({"measured_at": float("-inf")}, "measured_at"),
        ({"charging": "maybe"}, "charging"),
    ],
)
def test_impossible_profiles_are_refused(
    client: TestClient, clock: FakeClock, profile: dict[str, Any], field: str
) -> None:
    a, a_h = enrol(client, clock, "a")
    put_profile(client, clock, a, a_h, cores=4)
    as_json = {**a_h, "Content-Type": "application/json"}  # NaN/Infinity as Python writes them
    r = client.put(f"{API}/devices/{a}/profile", content=json.dumps(profile), headers=as_json)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"] and "\n" not in r.json()["detail"]
    history = client.get(f"{API}/devices/{a}/profiles", headers=ADMIN_H).json()
    assert [s["profile"] for s in history] == [{"cores": 4}]  # nothing stored
    body = {"token": ENROL, "name": "b", "profile": profile}
    plain = {"Content-Type": "application/json"}
    enrolled = client.post(f"{API}/devices/enrol", content=json.dumps(body), headers=plain)
    assert enrolled.status_code == 422 and field in enrolled.json()["detail"]
    assert len(client.get(f"{API}/devices", headers=ADMIN_H).json()) == 1


def test_no_battery_is_accepted_and_unknown_fields_are_dropped(
    client: TestClient, clock: FakeClock
) -> None:
    a, a_h = enrol(client, clock, "a")
    put_profile(client, clock, a, a_h, battery_percent=None, charging=None, battery_rtt=1)
    profile = client.get(f"{API}/devices/{a}", headers=ADMIN_H).json()["profile"]
    assert profile == {"battery_percent": None, "charging": None}


def test_profile_auth_device_writes_its_own_admin_reads(
    client: TestClient, clock: FakeClock
) -> None:
    a, a_h = enrol(client, clock, "a")
    b, _ = enrol(client, clock, "b")
    assert client.put(f"{API}/devices/{b}/profile", json={}, headers=a_h).status_code == 403
    assert client.put(f"{API}/devices/{a}/profile", json={}, headers=ADMIN_H).status_code == 403
    assert client.put(f"{API}/devices/{a}/profile", json={}).status_code == 401
    for url in (f"{API}/devices/{a}/profiles", f"{API}/devices/profiles"):
        assert client.get(url).status_code == 401
        assert client.get(url, headers=a_h).status_code == 403
        assert client.get(url, headers=ADMIN_H).status_code == 200


def test_fleet_view_lists_latest_profiles_with_filters_and_paging(
    client: TestClient, clock: FakeClock
) -> None:
    pi, pi_h = enrol(client, clock, "pi")
    jetson, jetson_h = enrol(client, clock, "jetson")
    quiet, _ = enrol(client, clock, "quiet")  # never reported a profile
    put_profile(client, clock, pi, pi_h, cores=2, uplink_bytes_per_s=1e5)
    put_profile(client, clock, pi, pi_h, cores=4, train_samples_per_s=300.0, uplink_bytes_per_s=1e5)
    put_profile(
        client, clock, jetson, jetson_h, cores=8, train_samples_per_s=5000.0, uplink_bytes_per_s=1e7
    )
    url = f"{API}/devices/profiles"

    def names(**params: Any) -> list[str]:
        r = client.get(url, params=params, headers=ADMIN_H)
        assert r.status_code == 200, r.text
        return [d["name"] for d in r.json()]

    fleet = client.get(url, headers=ADMIN_H).json()
    assert [(d["device_id"], d["name"]) for d in fleet] == [
        (pi, "pi"), (jetson, "jetson"), (quiet, "quiet")
    ]  # fmt: skip
    assert fleet[0]["profile"] == {
        "cores": 4,
        "train_samples_per_s": 300.0,
        "uplink_bytes_per_s": 1e5,
    }
    assert names(min_cores=4) == ["pi", "jetson"]
    assert names(min_cores=5) == ["jetson"]
    assert names(min_train_samples_per_s=1000) == ["jetson"]
    assert names(min_uplink_bytes_per_s=1e5, min_cores=8) == ["jetson"]
    assert names(min_uplink_bytes_per_s=0) == ["pi", "jetson"]  # "quiet" reported none
    assert names(limit=1, offset=1) == ["jetson"]
    assert names(min_cores=1, offset=1) == ["jetson"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"min_cores": -1}):
        assert client.get(url, params=bad, headers=ADMIN_H).status_code == 422, bad


# --- job validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"rounds": 0}, "rounds"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"batch_size": 0}, "batch_size"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"consensus_step": 0.0}, "consensus_step"),
        ({"consensus_step": 1.5}, "consensus_step"),
        ({"round_deadline_s": 0.0}, "round_deadline_s"),
        ({"max_payload_bytes": 1000}, "max_payload_bytes"),
        ({"algorithm": "fedavg"}, "algorithm"),
        ({"codec": "zip:9"}, "codec"),
        ({"topology": "hypercube"}, "topology"),
        ({"algorithm": "dpsgd", "codec": "topk:0.1"}, "codec"),
        ({"rounds": "many"}, "rounds"),
        ({"test_data": "test\u0000.npz"}, "test_data"),  # every agent would fail on it
        ({"name": "x" * 200_000}, "name"),
        ({"name": "a\nb"}, "name"),
    ],
)
def test_invalid_job_specs_are_422_naming_the_field(
    client: TestClient, override: dict[str, Any], field: str
) -> None:
    r = client.post(f"{API}/jobs", json=spec(**override), headers=ADMIN_H)
    detail = r.json()["detail"]
    assert r.status_code == 422
    assert isinstance(detail, str) and field in detail and "\n" not in detail


def test_a_missing_field_is_a_one_line_422(client: TestClient) -> None:
    body = spec()
    del body["seed"]
    r = client.post(f"{API}/jobs", json=body, headers=ADMIN_H)
    assert r.status_code == 422 and "seed" in r.json()["detail"]


def test_valid_jobs_are_created(client: TestClient) -> None:
    r = client.post(f"{API}/jobs", json=spec(algorithm="dpsgd", codec="fp32"), headers=ADMIN_H)
    job = r.json()
    assert r.status_code == 201
    assert (job["status"], job["started_at"], job["devices"]) == ("created", None, [])
    posted = spec(algorithm="dpsgd", codec="fp32")
    model_hash = layout_hash(layout(posted["model"]))  # filled in at creation (issue 8)
    assert job["spec"] == {**posted, "model": {**posted["model"], "hash": model_hash}}
    listed = client.get(f"{API}/jobs", headers=ADMIN_H).json()
    assert [j["job_id"] for j in listed] == [job["job_id"]]
    assert client.get(f"{API}/jobs/job-nope", headers=ADMIN_H).status_code == 404


# --- start, topology, assignment -----------------------------------------------------------


def test_start_builds_a_ring_of_the_first_enrolled_devices(
    client: TestClient, clock: FakeClock
) -> None:
    devices = [enrol(client, clock, f"pi-{k}")[0] for k in range(5)]
    job_id = client.post(f"{API}/jobs", json=spec(devices=4), headers=ADMIN_H).json()["job_id"]
    clock.now += 10.0
    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    topo = client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).json()
    w = np.array(topo["mixing_matrix"])
    expected = metropolis_hastings(build_graph("ring", 4))
    assert started.status_code == 200
    assert (started.json()["status"], started.json()["started_at"]) == ("running", clock.now)
    assert [d["device_id"] for d in started.json()["devices"]] == devices[:4]
    assert topo["kind"] == "ring" and topo["devices"] == devices[:4]
    assert sorted(map(tuple, topo["edges"])) == sorted(build_graph("ring", 4).edges)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(axis=1), np.ones(4))
    np.testing.assert_allclose(w, expected)
    assert topo["spectral_gap"] == pytest.approx(spectral_gap(expected))
    assert 0.0 < topo["spectral_gap"] <= 1.0
    again = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert again.status_code == 409 and "already running" in again.json()["detail"]


def test_start_skips_devices_not_heard_from_recently(client: TestClient, clock: FakeClock) -> None:
    silent = enrol(client, clock, "pi-silent")[0]
    clock.now += 500.0  # longer than stale_after_s: pi-silent stopped polling
    live = [enrol(client, clock, f"pi-{k}")[0] for k in range(2)]
    job_id = client.post(f"{API}/jobs", json=spec(devices=0), headers=ADMIN_H).json()["job_id"]

    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).json()

    assert [d["device_id"] for d in started["devices"]] == live
    assert silent not in [d["device_id"] for d in started["devices"]]


def test_start_skips_devices_busy_in_another_running_job(
    client: TestClient, clock: FakeClock
) -> None:
    running_job(client, clock, n=2)  # both of its devices are now busy
    idle = [enrol(client, clock, f"pi-idle-{k}")[0] for k in range(2)]
    job_id = client.post(f"{API}/jobs", json=spec(devices=0), headers=ADMIN_H).json()["job_id"]

    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).json()

    assert sorted(d["device_id"] for d in started["devices"]) == sorted(idle)


def test_a_declining_device_counts_as_done_with_its_reason(
    client: TestClient, clock: FakeClock
) -> None:
    (a, a_h), (b, b_h) = enrol(client, clock, "pi-a"), enrol(client, clock, "pi-b")
    job_id = client.post(f"{API}/jobs", json=spec(devices=2), headers=ADMIN_H).json()["job_id"]
    client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)

    r = client.post(f"{API}/jobs/{job_id}/decline", json={"reason": "4 features, needs 64"},
                    headers=b_h)  # fmt: skip
    client.post(f"{API}/jobs/{job_id}/done", headers=a_h,
                json={"final_accuracy": 0.5, "bytes_sent": 1, "bytes_received": 2,
                      "model_path": "/m"})  # fmt: skip

    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    assert r.status_code == 204
    assert job["status"] == "completed"
    declined = next(d for d in job["devices"] if d["device_id"] == b)
    assert declined["error"] == "4 features, needs 64" and declined["final_accuracy"] is None
    assert next(d for d in job["devices"] if d["device_id"] == a)["error"] is None


def test_a_job_every_device_declined_ends_failed(client: TestClient, clock: FakeClock) -> None:
    (_, a_h), (_, b_h) = enrol(client, clock, "pi-a"), enrol(client, clock, "pi-b")
    job_id = client.post(f"{API}/jobs", json=spec(devices=2), headers=ADMIN_H).json()["job_id"]
    client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)

    for headers in (a_h, b_h):
        client.post(f"{API}/jobs/{job_id}/decline", json={"reason": "768 features, needs 64"},
                    headers=headers)  # fmt: skip

    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["status"] == "failed"
    assert all(d["error"] == "768 features, needs 64" for d in job["devices"])


def test_start_needs_enough_devices_and_topology_needs_a_start(
    client: TestClient, clock: FakeClock
) -> None:
    enrol(client, clock, "only")
    job_id = client.post(f"{API}/jobs", json=spec(devices=3), headers=ADMIN_H).json()["job_id"]
    r = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert r.status_code == 409 and "start more agents" in r.json()["detail"]
    assert client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).status_code == 409


def test_devices_zero_takes_every_enrolled_device(client: TestClient, clock: FakeClock) -> None:
    for k in range(3):
        enrol(client, clock, f"pi-{k}")
    job_id = client.post(f"{API}/jobs", json=spec(devices=0), headers=ADMIN_H).json()["job_id"]
    r = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert len(r.json()["devices"]) == 3


def test_assignment_is_the_devices_row_of_w(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock)
    outsider, outsider_h = enrol(client, clock, "late")
    w = np.array(
        client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).json()["mixing_matrix"]
    )
    ids = [d for d, _ in devices]
    clock.now = 3_000.0
    for i, (device_id, headers) in enumerate(devices):
        a = client.get(f"{API}/devices/{device_id}/assignment", headers=headers).json()
        neighbours = {n["device_id"]: n["weight"] for n in a["neighbours"]}
        expected = {ids[j]: w[i, j] for j in build_graph("ring", 4).neighbours(i)}
        assert (a["job_id"], a["fleet"], a["status"], a["index"]) == (job_id, "lab", "running", i)
        assert a["self_weight"] == pytest.approx(w[i, i])
        assert neighbours == pytest.approx(expected)
        assert a["spec"]["topology"] == "ring"
    assert client.get(f"{API}/devices/{outsider}/assignment", headers=outsider_h).status_code == 204
    seen = client.get(f"{API}/devices/{ids[0]}", headers=ADMIN_H).json()["last_seen"]
    assert seen == 3_000.0


# --- metrics and round summaries -----------------------------------------------------------


def test_metrics_are_idempotent_per_round_and_bounded(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock, rounds=3)
    (_, h0), (_, h1) = devices[0], devices[1]
    outsider_h = enrol(client, clock, "late")[1]
    url = f"{API}/jobs/{job_id}/metrics"
    first = client.post(url, json=metrics(1, 0.5, []), headers=h0)
    repeat = client.post(url, json=metrics(1, 0.9, []), headers=h0)
    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    assert (first.status_code, repeat.status_code) == (204, 204)
    assert len(rounds) == 1 and rounds[0]["mean_accuracy"] == 0.5
    assert rounds[0]["devices_reporting"] == 1
    for bad in (0, 4):
        r = client.post(url, json=metrics(bad, 0.5, []), headers=h1)
        assert r.status_code == 422 and "rounds 1..3" in r.json()["detail"]
    assert client.post(url, json=metrics(1, 0.5, []), headers=outsider_h).status_code == 403
    assert client.post(url, json=metrics(1, 0.5, []), headers=ADMIN_H).status_code == 403
    missing = client.post(f"{API}/jobs/job-nope/metrics", json=metrics(1, 0.5, []), headers=h0)
    assert missing.status_code == 404


def test_a_batch_of_reports_is_stored_in_order_like_single_posts(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock, rounds=4)
    (d0, h0), (_, h1) = devices[0], devices[1]
    url = f"{API}/jobs/{job_id}/metrics/batch"
    client.post(f"{API}/jobs/{job_id}/metrics", json=metrics(1, 0.5, []), headers=h0)
    batch = [metrics(1, 0.9, []), metrics(2, 0.6, []), metrics(2, 0.1, []), metrics(3, 0.7, [])]
    stored = client.post(url, json=batch, headers=h0)
    one_bad = client.post(url, json=[metrics(4, 0.5, []), metrics(5, 0.5, [])], headers=h1)
    empty = client.post(url, json=[], headers=h1)
    too_many = client.post(url, json=[metrics(1, 0.5, [])] * 65, headers=h1)
    not_mine = client.post(url, json=[metrics(1, 0.5, [])], headers=ADMIN_H)

    assert stored.status_code == 204
    assert (one_bad.status_code, empty.status_code, too_many.status_code) == (422, 422, 422)
    assert "rounds 1..4" in one_bad.json()["detail"]
    assert not_mine.status_code == 403
    reports = client.get(f"{API}/jobs/{job_id}/devices/{d0}/metrics", headers=ADMIN_H).json()
    assert [(r["round"], r["accuracy"]) for r in reports] == [(1, 0.5), (2, 0.6), (3, 0.7)]
    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    assert [r["devices_reporting"] for r in rounds] == [1, 1, 1]  # nothing of the bad batch


def test_round_summaries_aggregate_the_reports(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock)
    ids = [d for d, _ in devices]
    started = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()["started_at"]
    rng = np.random.default_rng(0)
    sketches = rng.normal(size=(4, 8))
    acc1, acc2 = rng.uniform(size=4), rng.uniform(size=3)
    url = f"{API}/jobs/{job_id}/metrics"
    for i, (_, h) in enumerate(devices):  # round 1: everyone, at t = start + 5 + i
        clock.now = started + 5 + i
        client.post(
            url, json=metrics(1, acc1[i], sketches[i].tolist(), sent=10 * (i + 1)), headers=h
        )
    for i in range(3):  # round 2: device 3 missing, device 2 without a sketch
        clock.now = started + 20 + i
        sketch = sketches[i].tolist() if i < 2 else []
        client.post(url, json=metrics(2, acc2[i], sketch, sent=7), headers=devices[i][1])
    clock.now = started + 40
    client.post(url, json=metrics(3, 0.7, sketches[0].tolist()), headers=devices[0][1])

    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()

    def distance(s: np.ndarray) -> float:
        return float(np.mean(np.sum((s - s.mean(axis=0)) ** 2, axis=1)))

    assert [r["round"] for r in rounds] == [1, 2, 3]
    r1, r2, r3 = rounds
    assert r1["mean_accuracy"] == pytest.approx(acc1.mean())
    assert r1["min_accuracy"] == pytest.approx(acc1.min())
    assert r1["consensus_distance"] == pytest.approx(distance(sketches))
    assert (r1["bytes_sent"], r1["bytes_received"]) == (100, 200)
    assert r1["elapsed_s"] == pytest.approx(8.0)
    assert (r1["devices_reporting"], r1["missing_devices"]) == (4, [])
    assert r2["mean_accuracy"] == pytest.approx(acc2.mean())
    assert r2["consensus_distance"] == pytest.approx(distance(sketches[:2]))
    assert (r2["bytes_sent"], r2["elapsed_s"], r2["missing_devices"]) == (21, 22.0, [ids[3]])
    assert r3["consensus_distance"] is None and r3["missing_devices"] == ids[1:]
    since_2 = client.get(f"{API}/jobs/{job_id}/rounds?since=2", headers=ADMIN_H).json()
    assert since_2 == rounds[1:]
    assert client.get(f"{API}/jobs/{job_id}/rounds?since=4", headers=ADMIN_H).json() == []
    refused = client.get(f"{API}/jobs/{job_id}/rounds?since=0", headers=ADMIN_H)
    assert refused.status_code == 422

    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    by_id = {d["device_id"]: d for d in job["devices"]}
    assert by_id[ids[0]]["rounds_reported"] == 3 and by_id[ids[0]]["missing_rounds"] == []
    assert by_id[ids[3]]["missing_rounds"] == [2, 3]
    assert (by_id[ids[1]]["bytes_sent"], by_id[ids[1]]["bytes_received"]) == (27, 54)
    assert by_id[ids[1]]["final_accuracy"] is None and not by_id[ids[1]]["done"]
    assert [d["index"] for d in job["devices"]] == [0, 1, 2, 3]
    assert by_id[ids[2]]["name"] == "pi-2"


def test_impossible_round_reports_are_refused(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock, n=2, sketch_dim=2)
    url, headers = f"{API}/jobs/{job_id}/metrics", devices[0][1]
    bad = [
        {**metrics(1, 2.0, [])},  # accuracy above 1
        {**metrics(1, 0.5, [1.0, 2.0, 3.0])},  # sketch longer than the job's sketch_dim
        {**metrics(1, 0.5, []), "bytes_sent": -1},
        {**metrics(1, 0.5, []), "loss": 1e300},
    ]

    statuses = [client.post(url, json=body, headers=headers).status_code for body in bad]

    assert statuses == [422, 422, 422, 422]
    assert client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json() == []


def test_bad_job_specs_name_the_field(client: TestClient) -> None:
    cases = {
        "rounds": spec(rounds=2**64),
        "seed": spec(seed=-1),
        "max_payload_bytes": spec(max_payload_bytes=2**40),
        "spec.model": spec(model={"name": "mlp", "input_dim": 64, "num_classes": 10**12,
                                  "hidden": [64]}),
        "spec.model.name": spec(model={"name": "foo", "input_dim": 64, "num_classes": 10,
                                       "hidden": [64]}),
        "spec.byte_budget": spec(codec="sign", byte_budget=1000),
        "spec.keyframe_growth": spec(keyframe_growth=0.5),
    }  # fmt: skip
    for field, body in cases.items():
        r = client.post(f"{API}/jobs", json=body, headers=ADMIN_H)
        assert r.status_code == 422 and field in r.json()["detail"], (field, r.text)


def test_enrolment_refuses_a_bad_name_and_a_huge_body(client: TestClient) -> None:
    bad = client.post(f"{API}/devices/enrol", json={"token": ENROL, "name": "a/b#"})
    huge = client.post(
        f"{API}/devices/enrol",
        json={"token": ENROL, "name": "ok", "profile": {"platform": "x" * 2**21}},
    )

    assert bad.status_code == 422 and "device name" in bad.json()["detail"]
    assert huge.status_code == 413


# --- completion and stop -------------------------------------------------------------------


def test_job_completes_when_every_participant_is_done(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock, n=2)
    (d0, h0), (_, h1) = devices
    assert client.post(f"{API}/jobs/{job_id}/done", json=DONE, headers=h0).status_code == 204
    halfway = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    clock.now = 9_000.0
    client.post(f"{API}/jobs/{job_id}/done", json=DONE, headers=h1)
    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    assert halfway["status"] == "running"
    assert (job["status"], job["finished_at"]) == ("completed", 9_000.0)
    assert job["devices"][0]["final_accuracy"] == 0.9 and job["devices"][0]["done"]
    assert (job["devices"][0]["bytes_sent"], job["devices"][0]["bytes_received"]) == (1000, 2000)
    assert client.get(f"{API}/devices/{d0}/assignment", headers=h0).status_code == 204


def test_a_silent_device_leaves_once_the_others_finished(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock, n=3, rounds=2)
    url = f"{API}/jobs/{job_id}"
    for _, h in devices:
        client.post(f"{url}/metrics", json=metrics(1, 0.5, []), headers=h)
    for _, h in devices[:2]:
        client.post(f"{url}/metrics", json=metrics(2, 0.6, []), headers=h)
        client.post(f"{url}/done", json=DONE, headers=h)
    last_heard = clock.now
    app = client.app
    app.dependency_overrides[get_now] = lambda: last_heard + 9.0  # type: ignore[attr-defined]
    before = client.get(url, headers=ADMIN_H).json()
    app.dependency_overrides[get_now] = lambda: last_heard + 11.0  # type: ignore[attr-defined]
    after = client.get(url, headers=ADMIN_H).json()
    lost_id, lost_h = devices[2]
    told = client.get(f"{API}/devices/{lost_id}/assignment", headers=lost_h)
    assert before["status"] == "running"
    assert (after["status"], after["finished_at"]) == ("completed", last_heard + 11.0)
    lost = after["devices"][2]
    assert lost["missing_rounds"] == [2] and lost["done"] and lost["left_round"] == 3
    assert lost["error"].startswith(
        "left at the job's end (its last report: round 1): silent for 11 s after the others"
    )
    assert told.status_code == 204  # it left: an ended job has nothing more for it


def test_stop_ends_a_job_and_tells_its_devices(client: TestClient, clock: FakeClock) -> None:
    job_id, devices = running_job(client, clock, n=2)
    clock.now = 4_000.0
    stopped = client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H).json()
    told = client.get(f"{API}/devices/{devices[0][0]}/assignment", headers=devices[0][1]).json()
    again = client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H)
    assert (stopped["status"], stopped["finished_at"]) == ("stopped", 4_000.0)
    assert told["status"] == "stopped"
    assert again.status_code == 409


def test_api_docs_load_nothing_from_a_cdn(client: TestClient) -> None:
    page = client.get("/docs")
    script = client.get("/static-offline-docs/swagger-ui-bundle.js")

    assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "http" not in page.text.split("<title>")[0].lower()
    assert script.status_code == 200 and len(script.content) > 100_000


def test_rounds_a_device_spent_without_any_neighbour_are_named(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock, n=4)  # a ring: two neighbours each
    (d0, h0), (d1, _), (d3, _) = devices[0], devices[1], devices[3]
    url = f"{API}/jobs/{job_id}/metrics"
    client.post(url, json={**metrics(1, 0.5, []), "missing": [d1, d3]}, headers=h0)
    client.post(url, json={**metrics(2, 0.5, []), "missing": [d1]}, headers=h0)

    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()

    mine = next(d for d in job["devices"] if d["device_id"] == d0)
    assert mine["isolated_rounds"] == [1]


@pytest.mark.parametrize(
    "missing,named",
    [
        (lambda me, peer: ["pi-x"], lambda me, peer: "'pi-x'"),  # enrolled nowhere
        (lambda me, peer: ["a" * 10_000], lambda me, peer: "'aaaa"),
        (lambda me, peer: [me], lambda me, peer: me),  # itself
        (lambda me, peer: [peer, peer], lambda me, peer: "twice"),
    ],
    ids=["unknown", "huge", "itself", "twice"],
)
def test_a_missing_list_naming_anything_but_other_participants_once_is_refused(
    client: TestClient,
    clock: FakeClock,
    missing: Callable[[str, str], list[str]],
    named: Callable[[str, str], str],
) -> None:
    job_id, devices = running_job(client, clock, n=4)
    (d0, h0), (d1, _) = devices[0], devices[1]
    url = f"{API}/jobs/{job_id}/metrics"

    bad = {**metrics(1, 0.5, []), "missing": missing(d0, d1)}
    refused = client.post(url, json=bad, headers=h0)
    kept = client.post(url, json={**metrics(2, 0.5, []), "missing": [d1]}, headers=h0)

    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert named(d0, d1) in detail and "\n" not in detail and len(detail) < 300
    stored = client.get(f"{API}/jobs/{job_id}/devices/{d0}/metrics", headers=ADMIN_H).json()
    assert kept.status_code == 204
    assert [(m["round"], m["missing"]) for m in stored] == [(2, [d1])]


def test_absurd_profiles_and_offsets_are_refused_not_crashed_on(
    client: TestClient, clock: FakeClock
) -> None:
    device, headers = enrol(client, clock, "pi-odd")
    url = f"{API}/devices/{device}/profile"

    huge = client.put(url, json={"cores": 10**400}, headers=headers)
    long_text = client.put(url, json={"platform": "A" * 500}, headers=headers)
    control = client.put(url, json={"model_hash": "\u0000x"}, headers=headers)
    offset = client.get(f"{API}/devices/{device}/profiles?offset={2**63}", headers=ADMIN_H)

    assert [huge.status_code, long_text.status_code, control.status_code] == [422, 422, 422]
    assert offset.status_code == 422
    assert "profile.cores" in huge.json()["detail"]


@pytest.mark.parametrize(
    "field,value",
    [("rounds", True), ("rounds", "5"), ("learning_rate", "0.1"), ("codec", 1)],
)
def test_json_types_are_strict(client: TestClient, field: str, value: Any) -> None:
    r = client.post(f"{API}/jobs", json=spec(**{field: value}), headers=ADMIN_H)

    assert r.status_code == 422, r.text


def test_a_boolean_model_width_is_refused_not_read_as_1(client: TestClient) -> None:
    body = spec()
    body["model"]["input_dim"] = True

    r = client.post(f"{API}/jobs", json=body, headers=ADMIN_H)

    assert r.status_code == 422 and "input_dim" in r.text


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e31])
def test_a_sketch_with_a_non_finite_or_absurd_value_is_refused(
    client: TestClient, clock: FakeClock, bad: float
) -> None:
    job_id, devices = running_job(client, clock, n=2, rounds=2)
    (_, h0), (_, h1) = devices
    dim = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()["spec"]["sketch_dim"]
    url = f"{API}/jobs/{job_id}/metrics"

    body = json.dumps(metrics(1, 0.5, [0.0] * (dim - 1) + [bad]))  # NaN, Infinity: as sent
    refused = client.post(url, content=body, headers={**h0, "content-type": "application/json"})
    kept = client.post(url, json=metrics(1, 0.5, [1e29] * dim), headers=h1)

    assert refused.status_code == 422
    assert "sketch holds non-finite or absurd values" in refused.text
    assert kept.status_code in (200, 201, 204)
    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    assert [r["devices_reporting"] for r in rounds] == [1]  # the refused report left no row
