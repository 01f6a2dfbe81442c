"""A coordinator restart loses nothing, on SQLite (a file) and on PostgreSQL (a real server).

One fleet is built through the REST API: API tokens (one revoked, one expiring), enrolment
tokens (a used one-time one, a tagged multi-use one, a revoked one), devices with tags and
labels (one drained, one revoked, one deleted), a DP job with metrics for two rounds and ε
spent, heartbeats still in the coordinator's memory, and the fleet's topology setting.
The app is shut down (lifespan exit: heartbeats flushed, engine disposed) and a new app
is created on the same database with the same clock: every read answers the same, and
every credential is still accepted or refused as before.
"""

from __future__ import annotations

import base64
import secrets
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from postgres import postgres_or_fail

from coordinator import CoordinatorSettings, create_app
from coordinator.db import make_engine

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"

JOB: dict[str, Any] = {
    "name": "restart",
    "model": {"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []},
    "algorithm": "choco",
    "codec": "identity",
    "topology": "complete",
    "rounds": 3,
    "learning_rate": 0.1,
    "batch_size": 8,
    "local_epochs": 1,
    "consensus_step": 1.0,
    "round_deadline_s": 5.0,
    "max_payload_bytes": 4096,
    "seed": 0,
    "devices": 2,
    "test_data": None,
    "sketch_dim": 0,
    "dp_noise_multiplier": 1.0,
    "dp_clip": 1.0,
}


class FakeClock:
    """A clock the test moves by hand (unix seconds), shared by both apps."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def identity_key() -> str:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def metrics(rnd: int, accuracy: float) -> dict[str, Any]:
    return {
        "round": rnd,
        "accuracy": accuracy,
        "loss": 1.0 - accuracy,
        "bytes_sent": 100 * rnd,
        "bytes_received": 200 * rnd,
        "missing": [],
        "sketch": [],
        "train_s": 0.1,
        "round_s": 0.2,
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new schema on the PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'coordinator.db'}"
        return
    url = postgres_or_fail()
    schema = f"meshfl_restart_{secrets.token_hex(4)}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class Coordinator:
    """One coordinator process at a time over ``settings``' database."""

    def __init__(self, settings: CoordinatorSettings, clock: FakeClock) -> None:
        self.settings, self.clock = settings, clock
        self.client = TestClient(create_app(settings, clock=clock)).__enter__()

    def restart(self) -> None:
        """Shut the app down (lifespan exit) and start a new one on the same database."""
        self.client.__exit__(None, None, None)
        self.client = TestClient(create_app(self.settings, clock=self.clock)).__enter__()

    def close(self) -> None:
        self.client.__exit__(None, None, None)

    def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        kwargs.setdefault("headers", ADMIN_H)
        r = self.client.request(method, f"{API}{path}", **kwargs)
        assert r.status_code == status, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def enrol(self, token: str, name: str) -> dict[str, Any]:
        self.clock.now += 1.0
        body = {"token": token, "name": name, "identity_key": identity_key()}
        enrolled: dict[str, Any] = self.ok("POST", "/devices/enrol", json=body, headers={})
        return enrolled


@pytest.fixture
def coordinator(db_url: str, tmp_path: Path) -> Iterator[Coordinator]:
    settings = CoordinatorSettings(
        db_url=db_url,
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        artifacts_dir=tmp_path / "artifacts",
        heartbeat_flush_s=3600.0,  # heartbeats stay in memory until the shutdown flush
    )
    made = Coordinator(settings, FakeClock(1_000_000.0))
    yield made
    made.close()


def snapshot(c: Coordinator, job_id: str, device_ids: list[str]) -> dict[str, Any]:
    """Everything an operator can read about the fleet (admin token)."""
    listed = c.client.get(f"{API}/devices", params={"limit": 1000}, headers=ADMIN_H)
    assert listed.status_code == 200
    views: dict[str, Any] = {
        "devices": listed.json(),
        "devices_total": listed.headers["X-Total-Count"],
        "device_views": {
            d: c.client.get(f"{API}/devices/{d}", headers=ADMIN_H).json() for d in device_ids
        },
        "tokens": c.ok("GET", "/tokens"),
        "enrolment_tokens": c.ok("GET", "/enrolment-tokens"),
        "jobs": c.ok("GET", "/jobs"),
        "job": c.ok("GET", f"/jobs/{job_id}"),
        "rounds": c.ok("GET", f"/jobs/{job_id}/rounds"),
        "job_devices": c.ok("GET", f"/jobs/{job_id}/devices"),
        "reports": c.ok("GET", f"/jobs/{job_id}/reports"),
        "job_topology": c.ok("GET", f"/jobs/{job_id}/topology"),
        "topology": c.ok("GET", "/topology"),
    }
    for d in device_ids:
        views[f"privacy {d}"] = c.client.get(f"{API}/devices/{d}/privacy", headers=ADMIN_H).json()
        views[f"profiles {d}"] = c.client.get(f"{API}/devices/{d}/profiles", headers=ADMIN_H).json()
    return views


def test_a_restart_loses_no_device_token_job_metric_budget_or_setting(
    coordinator: Coordinator,
) -> None:
    c = coordinator
    # Operator credentials: API tokens with roles, one revoked, one that expires later.
    operator = c.ok("POST", "/tokens", 201, json={"role": "operator", "name": "ci"})
    reader = c.ok("POST", "/tokens", 201, json={"role": "read-only", "ttl_s": 86_400.0})
    gone = c.ok("POST", "/tokens", 201, json={"role": "admin"})
    c.ok("DELETE", f"/tokens/{gone['token_id']}", 204)
    # Enrolment tokens: a one-time one (used below), a tagged multi-use one, a revoked one.
    once = c.ok("POST", "/enrolment-tokens", 201, json={"name": "once"})
    lab = c.ok("POST", "/enrolment-tokens", 201, json={"uses": 10, "tags": ["lab", "pi4"]})
    dead = c.ok("POST", "/enrolment-tokens", 201, json={"uses": 5})
    c.ok("DELETE", f"/enrolment-tokens/{dead['token_id']}", 204)
    # Two participants of a DP job, with metrics for two rounds and ε spent.
    a = c.enrol(lab["token"], "pi-a")
    b = c.enrol(once["token"], "pi-b")
    job = c.ok("POST", "/jobs", 201, json=JOB)
    job_id = job["job_id"]
    c.clock.now += 1.0
    assert c.ok("POST", f"/jobs/{job_id}/start")["status"] == "running"
    for device in (a, b):
        h = bearer(device["device_token"])
        for rnd, accuracy in ((1, 0.5), (2, 0.75)):
            c.clock.now += 1.0
            c.ok("POST", f"/jobs/{job_id}/metrics", 204, json=metrics(rnd, accuracy), headers=h)
        spend = {"round": 1, "releases": 1}
        c.ok("POST", f"/jobs/{job_id}/privacy/{device['device_id']}/spend", json=spend, headers=h)
    # Fleet management: labels, a drained device, a revoked one, a deleted one.
    drained, revoked, deleted = (c.enrol(ENROL, n) for n in ("pi-c", "pi-d", "pi-e"))
    patch = {"tags": ["lab", "edge"], "labels": {"room": "B12", "owner": "ops team"}}
    c.ok("PATCH", f"/devices/{a['device_id']}", json=patch)
    c.ok("POST", f"/devices/{drained['device_id']}/drain")
    c.ok("POST", f"/devices/{revoked['device_id']}/revoke")
    c.ok("DELETE", f"/devices/{deleted['device_id']}", 204)
    profile = {"cores": 4, "memory_bytes": 2_000_000_000, "battery_percent": None}
    c.ok(
        "PUT",
        f"/devices/{drained['device_id']}/profile",
        json=profile,
        headers=bearer(drained["device_token"]),
    )
    # The fleet's default topology, and a heartbeat still only in memory.
    c.ok("PUT", "/topology", json={"topology": "small-world", "topology_degree": 2})
    c.clock.now += 5.0
    heartbeat = f"/devices/{drained['device_id']}/heartbeat"
    c.ok("POST", heartbeat, 204, headers=bearer(drained["device_token"]))
    ids = [d["device_id"] for d in (a, b, drained, revoked)]
    before = snapshot(c, job_id, ids)

    c.restart()

    after = snapshot(c, job_id, ids)
    assert after == before
    # What the snapshot holds is what was made (a restart of an empty store would be equal too).
    states = {d["name"]: (d["state"], d["tags"]) for d in after["devices"]}
    assert states == {
        "pi-a": ("active", ["lab", "edge"]),
        "pi-b": ("active", []),
        "pi-c": ("draining", []),
        "pi-d": ("revoked", []),
    }
    assert after["device_views"][a["device_id"]]["labels"] == patch["labels"]
    assert after["device_views"][drained["device_id"]]["last_seen"] == c.clock.now  # flushed
    assert after["job"]["status"] == "running"
    assert [r["round"] for r in after["rounds"]] == [1, 2]
    assert [r["mean_accuracy"] for r in after["rounds"]] == pytest.approx([0.5, 0.75])
    assert after[f"privacy {a['device_id']}"]["releases"] == 1
    assert after[f"privacy {a['device_id']}"]["epsilon_spent"] > 0
    assert after["topology"]["setting"] == {"topology": "small-world", "topology_degree": 2}
    assert after["topology"]["updated_at"] is not None
    token_status = {t["token_id"]: t["status"] for t in after["tokens"]}
    assert token_status == {
        operator["token_id"]: "active",
        reader["token_id"]: "active",
        gone["token_id"]: "revoked",
    }
    uses = {t["token_id"]: (t["uses_left"], t["status"]) for t in after["enrolment_tokens"]}
    assert uses[once["token_id"]][0] == 0 and uses[lab["token_id"]] == (9, "active")
    assert uses[dead["token_id"]][1] == "revoked"
    # Credentials after the restart: still valid, still refused.
    assert c.client.get(f"{API}/devices", headers=bearer(operator["token"])).status_code == 200
    assert c.client.get(f"{API}/jobs", headers=bearer(reader["token"])).status_code == 200
    assert (
        c.client.post(f"{API}/jobs", json=JOB, headers=bearer(reader["token"])).status_code == 403
    )
    assert c.client.get(f"{API}/tokens", headers=bearer(gone["token"])).status_code == 401
    refused = c.client.get(
        f"{API}/devices/{revoked['device_id']}/assignment", headers=bearer(revoked["device_token"])
    )
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert c.client.get(f"{API}/devices/{deleted['device_id']}", headers=ADMIN_H).status_code == 404
    for used in (once, dead):
        again = c.client.post(f"{API}/devices/enrol", json={"token": used["token"], "name": "x"})
        assert again.status_code == 401, again.text
    assert c.enrol(lab["token"], "pi-f")["device_id"] not in ids  # the multi-use one still works
    own = c.client.get(
        f"{API}/devices/{a['device_id']}/assignment", headers=bearer(a["device_token"])
    )
    assert own.status_code == 200 and own.json()["job_id"] == job_id
    # The job goes on where it was: round 3's report and ε spend are accepted, the
    # already-recorded round 1 spend is not recorded twice.
    h = bearer(a["device_token"])
    c.ok("POST", f"/jobs/{job_id}/metrics", 204, json=metrics(3, 0.9), headers=h)
    again = c.ok(
        "POST",
        f"/jobs/{job_id}/privacy/{a['device_id']}/spend",
        json={"round": 1, "releases": 1},
        headers=h,
    )
    assert again == after[f"privacy {a['device_id']}"]
