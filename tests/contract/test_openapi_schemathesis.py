"""The coordinator against its own OpenAPI: schemathesis fuzzing and stateful device CRUD.

Everything runs in process over ASGI (no server, no network):

- ``test_every_operation_answers_only_documented_statuses``: schemathesis generates up to
  ``MESHFL_SCHEMATHESIS_EXAMPLES`` (default 150) valid and invalid requests per operation
  (``mode: all``; a fixed seed and ``derandomize`` make CI reproducible) and checks that
  none is a 5xx, that every status, content type, body and header is the documented one.
  Operator routes get the admin token; device routes the token of a real enrolled device.
  A drawn flag swaps the generated path ids for real ones (a running DP job and that
  device), so the handlers behind the look-ups are fuzzed too; a swapped id is never
  handed to a route that would end the shared fixtures (revoke, delete, stop, done,
  decline). Rate limits are off: 429 is documented but would hide everything after it.
- ``test_device_crud_keeps_its_invariants``: a Hypothesis rule-based state machine that
  enrols, reads, patches, drains, undrains, revokes and deletes devices and uses their
  tokens, against a model: the listing is the enrolled minus the deleted devices in
  enrolment order with their states, tags and labels; a revoked or deleted device's token
  is refused (also after the heartbeat route has cached it); transitions follow
  docs/fleet.md.

The fuzzing takes about 8 minutes on 2 shared cores at 400 examples per operation (48
operations, 5-25 s each; about two thirds of it is schemathesis/Hypothesis generating
requests, one third the requests themselves), so CI runs 150 per operation (about 3
minutes) to keep the whole suite near 15 minutes, and the test is marked ``slow`` and
``fuzz``: scripts/test.sh runs it on both cores after the rest (``pytest -n 2 -m fuzz``).
``MESHFL_SCHEMATHESIS_EXAMPLES=400`` (or more) is the longer run before a release;
``MESHFL_SCHEMATHESIS_EXAMPLES=50`` a quick local one.
"""

from __future__ import annotations

import base64
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import schemathesis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from coordinator import CoordinatorSettings, create_app

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
EXAMPLES = int(os.environ.get("MESHFL_SCHEMATHESIS_EXAMPLES", "150"))
SEED = 20260601
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

JOB: dict[str, Any] = {
    "name": "fuzz",
    "model": {"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []},
    "algorithm": "choco",
    "codec": "identity",
    "topology": "complete",
    "rounds": 5,
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
    "publish_model": False,  # a DP job must not upload un-noised models (refused)
}


def coordinator_settings(db_url: str, tmp: Path | None = None) -> CoordinatorSettings:
    """Settings of an app under test: fleet ``lab``, fixed tokens, no rate limits."""
    return CoordinatorSettings(
        db_url=db_url,
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        artifacts_dir=None if tmp is None else tmp / "artifacts",
        rate_limit_operator="",
        rate_limit_device="",
        rate_limit_heartbeat="",
        rate_limit_enrol="",
    )


def identity_key() -> str:
    """Base64 of a fresh Ed25519 public key (devices need one for signed-delta jobs)."""
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@dataclass
class Fleet:
    """An app under test and the real resources the generated requests may name."""

    app: Any
    device_id: str
    device_token: str
    job_id: str


def seed_fleet(tmp: Path) -> Fleet:
    """A coordinator on a SQLite file with four devices and a running DP job on two.

    The app's lifespan is not entered here: schemathesis starts it on the first request.
    """
    app = create_app(coordinator_settings(f"sqlite:///{tmp / 'coordinator.db'}", tmp))
    client = TestClient(app)
    enrolled = []
    for k in range(2):
        body = {"token": ENROL, "name": f"pi-{k}", "identity_key": identity_key()}
        r = client.post(f"{API}/devices/enrol", json=body)
        assert r.status_code == 200, r.text
        enrolled.append(r.json())
    job = client.post(f"{API}/jobs", json=JOB, headers=ADMIN_H)
    assert job.status_code == 201, job.text
    job_id = job.json()["job_id"]
    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
    assert started.status_code == 200, started.text
    for k in range(2, 4):  # idle ones, for the state machine's drains and deletes
        body = {"token": ENROL, "name": f"pi-{k}", "identity_key": identity_key()}
        assert client.post(f"{API}/devices/enrol", json=body).status_code == 200
    first = enrolled[0]
    return Fleet(app, first["device_id"], first["device_token"], job_id)


def _openapi() -> dict[str, Any]:
    """The coordinator's OpenAPI document, from a throwaway app over in-memory SQLite."""
    app = create_app(coordinator_settings("sqlite://"))
    document: dict[str, Any] = app.openapi()
    app.state.engine.dispose()
    return document


schema = schemathesis.openapi.from_dict(
    _openapi(),
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "base-url": "http://testserver",
            "generation": {"mode": "all", "max-examples": EXAMPLES},
        }
    ),
)


# --- fuzzing every operation ----------------------------------------------------------------

DEVICE_ROUTES = {
    ("PUT", "/api/v1/devices/{device_id}/profile"),
    ("GET", "/api/v1/devices/{device_id}/assignment"),
    ("POST", "/api/v1/devices/{device_id}/heartbeat"),
    ("POST", "/api/v1/jobs/{job_id}/metrics"),
    ("POST", "/api/v1/jobs/{job_id}/metrics/batch"),
    ("POST", "/api/v1/jobs/{job_id}/done"),
    ("POST", "/api/v1/jobs/{job_id}/decline"),
    ("PUT", "/api/v1/jobs/{job_id}/devices/{device_id}/model"),
    ("PUT", "/api/v1/jobs/{job_id}/secagg/keys/{device_id}"),
    ("POST", "/api/v1/jobs/{job_id}/secagg/declarations"),
    ("POST", "/api/v1/jobs/{job_id}/privacy/{device_id}/spend"),
}
"""Operations that take a device's own token (every other one: an operator token)."""

ENDS_FIXTURES = {
    ("DELETE", "/api/v1/devices/{device_id}"),
    ("POST", "/api/v1/devices/{device_id}/revoke"),
    ("POST", "/api/v1/jobs/{job_id}/stop"),
    ("POST", "/api/v1/jobs/{job_id}/done"),
    ("POST", "/api/v1/jobs/{job_id}/decline"),
}
"""Operations never given the real ids: they would end the device or job all others use."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return seed_fleet(tmp_path_factory.mktemp("schemathesis"))


@pytest.mark.slow
@pytest.mark.fuzz
@schema.parametrize()
@schema.given(real_ids=st.booleans())
@settings(SETTINGS, max_examples=EXAMPLES)
def test_every_operation_answers_only_documented_statuses(
    case: Any, real_ids: bool, fleet: Fleet
) -> None:
    key = (case.method.upper(), case.path)
    device_route = key in DEVICE_ROUTES
    token = fleet.device_token if device_route else ADMIN
    if (real_ids or device_route) and key not in ENDS_FIXTURES and case.path_parameters:
        if "device_id" in case.path_parameters:
            case.path_parameters["device_id"] = fleet.device_id
        if "job_id" in case.path_parameters:
            case.path_parameters["job_id"] = fleet.job_id
    case.call_and_validate(
        app=fleet.app, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
    )


# --- stateful: device CRUD against a model --------------------------------------------------

TAG = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
tags = st.one_of(st.from_regex(TAG, fullmatch=True), st.sampled_from(["", "a b", "x" * 65]))
label_values = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12), st.just("a\nb")
)


@dataclass
class Model:
    """What the test expects of one device."""

    token: str
    state: str = "active"
    tags: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


class DeviceCrud(RuleBasedStateMachine):
    """Enrol, read, patch, drain, undrain, revoke, delete and use devices of a fresh fleet."""

    devices = Bundle("devices")

    def __init__(self) -> None:
        super().__init__()
        self.app = create_app(coordinator_settings("sqlite://"))
        self.client = TestClient(self.app)
        self.model: dict[str, Model] = {}
        self.order: list[str] = []

    def teardown(self) -> None:
        self.client.close()
        self.app.state.engine.dispose()

    def call(self, method: str, path: str, headers: dict[str, str] = ADMIN_H, **kw: Any) -> Any:
        return self.client.request(method, f"{API}{path}", headers=headers, **kw)

    @rule(target=devices, name=st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True))
    def enrol(self, name: str) -> str:
        r = self.call("POST", "/devices/enrol", {}, json={"token": ENROL, "name": name})
        assert r.status_code == 200, r.text
        device: str = r.json()["device_id"]
        assert device not in self.model
        self.model[device] = Model(r.json()["device_token"])
        self.order.append(device)
        return device

    def gone(self, device: str, r: Any) -> bool:
        """``True`` (and ``r`` is a 404) when ``device`` was deleted."""
        if self.model[device].state == "deleted":
            assert r.status_code == 404, r.text
            return True
        return False

    @rule(device=devices)
    def get(self, device: str) -> None:
        r = self.call("GET", f"/devices/{device}")
        if not self.gone(device, r):
            assert r.status_code == 200, r.text
            self.check_view(device, r.json())

    @rule(
        device=devices,
        new_tags=st.none() | st.lists(tags, max_size=5),
        labels=st.none()
        | st.dictionaries(st.from_regex(TAG, fullmatch=True), label_values, max_size=3),
    )
    def patch(self, device: str, new_tags: list[str] | None, labels: dict[str, str] | None) -> None:
        body: dict[str, Any] = {}
        if new_tags is not None:
            body["tags"] = new_tags
        if labels is not None:
            body["labels"] = labels
        r = self.call("PATCH", f"/devices/{device}", json=body)
        if self.gone(device, r):
            return
        if self.model[device].state == "revoked":  # a revoked device cannot be changed
            assert r.status_code == 409, r.text
            return
        valid = all(TAG.fullmatch(t) for t in new_tags or []) and all(
            v.isprintable() for v in (labels or {}).values()
        )
        if not valid:
            assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
            return
        assert r.status_code == 200, r.text
        if new_tags is not None:
            self.model[device].tags = list(dict.fromkeys(new_tags))
        if labels is not None:
            self.model[device].labels = labels
        self.check_view(device, r.json())

    @rule(device=devices, action=st.sampled_from(["drain", "undrain"]))
    def drain_or_undrain(self, device: str, action: str) -> None:
        r = self.call("POST", f"/devices/{device}/{action}")
        if self.gone(device, r):
            return
        if self.model[device].state == "revoked":
            assert r.status_code == 409, r.text
            return
        assert r.status_code == 200, r.text
        self.model[device].state = "draining" if action == "drain" else "active"
        self.check_view(device, r.json())

    @rule(device=devices)
    def revoke(self, device: str) -> None:
        r = self.call("POST", f"/devices/{device}/revoke")
        if not self.gone(device, r):
            assert r.status_code == 200, r.text
            self.model[device].state = "revoked"
            self.check_view(device, r.json())

    @rule(device=devices)
    def delete(self, device: str) -> None:
        r = self.call("DELETE", f"/devices/{device}")
        if not self.gone(device, r):
            assert r.status_code == 204, r.text
            self.model[device].state = "deleted"

    @rule(device=devices, route=st.sampled_from(["heartbeat", "assignment"]))
    def use_own_token(self, device: str, route: str) -> None:
        own = {"Authorization": f"Bearer {self.model[device].token}"}
        method = "POST" if route == "heartbeat" else "GET"
        r = self.call(method, f"/devices/{device}/{route}", own)
        state = self.model[device].state
        if state in ("active", "draining"):
            assert r.status_code == 204, r.text  # no job for it: assignment is 204 too
        elif state == "revoked":
            assert r.status_code == 401 and "revoked" in r.json()["detail"], r.text
        else:  # deleted without job history: the token is unknown
            assert r.status_code in (401, 403), r.text

    def check_view(self, device: str, view: dict[str, Any]) -> None:
        want = self.model[device]
        assert (view["device_id"], view["state"]) == (device, want.state)
        assert (view["tags"], view["labels"]) == (want.tags, want.labels)

    @invariant()
    def listing_is_enrolled_minus_deleted(self) -> None:
        r = self.call("GET", "/devices", params={"limit": 1000})
        assert r.status_code == 200, r.text
        kept = [d for d in self.order if self.model[d].state != "deleted"]
        assert [d["device_id"] for d in r.json()] == kept
        assert r.headers["X-Total-Count"] == str(len(kept))
        for view in r.json():
            self.check_view(view["device_id"], view)


def test_device_crud_keeps_its_invariants() -> None:
    run_state_machine_as_test(
        DeviceCrud, settings=settings(SETTINGS, max_examples=25, stateful_step_count=15)
    )


# --- bodies the schema cannot describe ------------------------------------------------------


def assert_problem(r: Any, status: int, says: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["status"] == status and says in r.json()["detail"], r.json()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"token": "enrol-secret", "name": ', "JSON decode error"),  # cut short
        (b"{'token': 'enrol-secret'}", "JSON decode error"),  # not JSON
        (b'{"token": "enrol-secret", "name": "pi"}\xff', "not UTF-8 JSON"),
        (b"\xc3\x28", "not UTF-8 JSON"),  # an invalid UTF-8 sequence
        (b"[]", "body"),  # JSON, but not an object
        (b'{"token": 5, "name": ["pi"]}', "body.token"),  # wrong types
        (b"", "body: Field required"),  # no body at all
    ],
)
def test_malformed_bodies_are_422_problems(body: bytes, says: str) -> None:
    app = create_app(coordinator_settings("sqlite://"))
    headers = {"content-type": "application/json"}
    with TestClient(app) as client:
        r = client.post(f"{API}/devices/enrol", content=body, headers=headers)
        listed = client.get(f"{API}/devices", headers=ADMIN_H).json()
    assert_problem(r, 422, says)
    assert listed == []


def test_an_oversized_body_is_413_whether_declared_or_streamed() -> None:
    app = create_app(coordinator_settings("sqlite://"))
    big = b'{"token": "' + b"x" * (1 << 20) + b'", "name": "pi"}'

    def chunks() -> Any:  # no Content-Length: the limit counts what streams in
        for start in range(0, len(big), 64 << 10):
            yield big[start : start + (64 << 10)]

    with TestClient(app) as client:
        declared = client.post(f"{API}/devices/enrol", content=big)
        streamed = client.post(f"{API}/devices/enrol", content=chunks())
        patched = client.patch(
            f"{API}/devices/dev-1",
            content=big,
            headers={**ADMIN_H, "content-type": "application/json"},
        )
        listed = client.get(f"{API}/devices", headers=ADMIN_H).json()
    assert "content-length" not in {k.lower() for k in streamed.request.headers}
    for r in (declared, streamed, patched):
        assert_problem(r, 413, "request body over 1048576 bytes")
    assert listed == []
