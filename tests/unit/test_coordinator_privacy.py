"""The coordinator's privacy endpoints: key directory, signed declarations, DP budgets.

Over TestClient on a temporary SQLite file; a restart is a new app on the same file.
Bundles are signed here with ``cryptography`` exactly as ``docs/privacy.md`` specifies.
"""

from __future__ import annotations

import base64
import json
import secrets
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, spec

from coordinator import CoordinatorSettings, create_app
from coordinator.privacy import epsilon, sampled_gaussian_epsilon
from coordinator.secagg import bundle_message

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

SECURE: dict[str, Any] = {"codec": "int8", "secure_aggregation": 2, "rounds": 3}
DP: dict[str, Any] = {"codec": "identity", "dp_noise_multiplier": 1.0, "dp_clip": 1.0}
# σ = 2 is a Gaussian mechanism of noise multiplier 1 at sensitivity 2C (replacement):
DP2: dict[str, Any] = {**DP, "dp_noise_multiplier": 2.0}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class Fleet:
    """A coordinator app over one SQLite file, devices with identity keys, a fake clock."""

    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings, self.clock = settings, FakeClock(1_000.0)
        self.client = TestClient(create_app(settings, clock=self.clock))
        self.keys: dict[str, Ed25519PrivateKey] = {}
        self.headers: dict[str, dict[str, str]] = {}

    def restart(self) -> None:
        self.client.__exit__(None, None, None)
        self.client = TestClient(create_app(self.settings, clock=self.clock))
        self.client.__enter__()

    def enrol(self, name: str, *, identity: bool = True) -> str:
        key = Ed25519PrivateKey.generate()
        body: dict[str, Any] = {"token": ENROL, "name": name}
        if identity:
            body["identity_key"] = b64(
                key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            )
        self.clock.now += 1.0
        r = self.client.post(f"{API}/devices/enrol", json=body)
        assert r.status_code == 200, r.text
        device: str = r.json()["device_id"]
        self.keys[device] = key
        self.headers[device] = {"Authorization": f"Bearer {r.json()['device_token']}"}
        return device

    def create(self, **overrides: Any) -> str:
        r = self.client.post(f"{API}/jobs", json=spec(**overrides), headers=ADMIN_H)
        assert r.status_code == 201, r.text
        job_id: str = r.json()["job_id"]
        return job_id

    def start(self, job_id: str) -> Any:
        self.clock.now += 1.0
        return self.client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)

    def running(
        self, n: int = 4, *, identity: bool = True, **overrides: Any
    ) -> tuple[str, list[str]]:
        ids = [self.enrol(f"pi-{k}", identity=identity) for k in range(n)]
        job_id = self.create(devices=n, **overrides)
        assert self.start(job_id).status_code == 200
        return job_id, self.positions(job_id, ids)

    def positions(self, job_id: str, ids: list[str]) -> list[str]:
        """The job's devices in graph-position order (``ids`` in name order, if not secure)."""
        topology = self.client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).json()
        assert sorted(topology["devices"]) == sorted(ids)
        return list(topology["devices"])

    def bundle(
        self, job_id: str, device: str, rounds: int, slots: int = 2, **changes: Any
    ) -> dict[str, str]:
        """A signed bundle: one masking key per round and neighbour (a ring: 2)."""
        c_pk, s_pks = secrets.token_bytes(32), secrets.token_bytes(32 * rounds * slots)
        signature = self.keys[device].sign(bundle_message(job_id, device, c_pk, s_pks))
        body = {"device": device, "job": job_id, "c_pk": b64(c_pk), "s_pks": b64(s_pks),
                "signature": b64(signature)}  # fmt: skip
        body.update(changes)
        return body

    def put_keys(self, job_id: str, device: str, body: dict[str, str], as_: str = "") -> Any:
        url = f"{API}/jobs/{job_id}/secagg/keys/{device}"
        return self.client.put(url, json=body, headers=self.headers[as_ or device])

    def declare(self, job_id: str, device: str, body: dict[str, Any], as_: str = "") -> Any:
        url = f"{API}/jobs/{job_id}/secagg/declarations"
        return self.client.post(
            url, json={"job": job_id, **body}, headers=self.headers[as_ or device]
        )

    def spend(self, job_id: str, device: str, rnd: int, releases: int = 1) -> Any:
        url = f"{API}/jobs/{job_id}/privacy/{device}/spend"
        body = {"round": rnd, "releases": releases}
        return self.client.post(url, json=body, headers=self.headers[device])

    def privacy(self, device: str) -> Any:
        return self.client.get(f"{API}/devices/{device}/privacy", headers=ADMIN_H)

    def directory(self, job_id: str, headers: dict[str, str] = ADMIN_H) -> Any:
        return self.client.get(f"{API}/jobs/{job_id}/secagg/directory", headers=headers)


@pytest.fixture
def fleet(tmp_path: Any) -> Iterator[Fleet]:
    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
    )
    made = Fleet(settings)
    made.client.__enter__()
    yield made
    made.client.__exit__(None, None, None)  # the latest app's (after a restart)


def verify(directory: dict[str, Any], signed: dict[str, Any]) -> None:
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(directory["coordinator_key"]))
    body = json.dumps(signed["declaration"], sort_keys=True, separators=(",", ":")).encode()
    key.verify(base64.b64decode(signed["signature"]), body)  # raises InvalidSignature


# --- enrolment and job validation ------------------------------------------------------------


def test_enrolment_refuses_an_identity_key_that_is_not_32_base64_bytes(fleet: Fleet) -> None:
    for key in ["not base64!", b64(b"\x01" * 31), b64(b"\x01" * 33), "", b64(b"\x01" * 32)[:-1]]:
        r = fleet.client.post(
            f"{API}/devices/enrol", json={"token": ENROL, "name": "pi", "identity_key": key}
        )
        assert r.status_code == 422 and "identity_key" in r.json()["detail"], key
    assert fleet.client.get(f"{API}/devices", headers=ADMIN_H).json() == []


def test_enrolment_refuses_32_bytes_that_are_not_a_point_on_ed25519(fleet: Fleet) -> None:
    # y = 2 has no x on the curve (RFC 8032, 5.1.3 step 3); OpenSSL loads it anyway.
    off_curve = b64((2).to_bytes(32, "little"))
    Ed25519PublicKey.from_public_bytes(base64.b64decode(off_curve))  # no check there
    r = fleet.client.post(
        f"{API}/devices/enrol", json={"token": ENROL, "name": "pi", "identity_key": off_curve}
    )
    assert r.status_code == 422
    assert r.json()["detail"] == "identity_key is not a valid Ed25519 public key"
    assert fleet.client.get(f"{API}/devices", headers=ADMIN_H).json() == []


PRIVACY_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"codec": "topk:0.1", "secure_aggregation": 2}, "cannot be used with secure aggregation"),
    ({"dp_noise_multiplier": 1.0}, "needs dp_clip > 0"),
    ({"secure_aggregation": 1, "codec": "int8"}, "threshold 1"),
    ({"secure_aggregation": 2, "codec": "int8", "robust": "median"}, "robust rule"),
    ({"secure_aggregation": 2, "codec": "int8", "rounds": 20_001}, "at most 20000"),
]


def test_job_creation_refuses_privacy_options_that_cannot_work(fleet: Fleet) -> None:
    for overrides, words in PRIVACY_REFUSALS:
        r = fleet.client.post(f"{API}/jobs", json=spec(**overrides), headers=ADMIN_H)
        assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert fleet.client.get(f"{API}/jobs", headers=ADMIN_H).json() == []


def test_start_refuses_a_threshold_above_a_devices_degree(fleet: Fleet) -> None:
    for k in range(4):
        fleet.enrol(f"pi-{k}")
    job_id = fleet.create(devices=0, **{**SECURE, "secure_aggregation": 3})  # ring: degree 2
    r = fleet.start(job_id)
    assert r.status_code == 409 and "exceeds the 2 neighbours" in r.json()["detail"]
    assert fleet.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()["status"] == "created"


def test_a_threshold_at_or_below_half_the_neighbourhood_is_refused_at_creation_and_start(
    fleet: Fleet,
) -> None:
    """Issue 23 item 5: t = 2 in a neighbourhood of 4 lets an aggregator + 1 colluder unmask."""
    regular = {**SECURE, "topology": "complete"}  # 5 devices: every neighbourhood is 4
    r = fleet.client.post(f"{API}/jobs", json=spec(devices=5, **regular), headers=ADMIN_H)
    assert r.status_code == 422, r.text
    assert "not above half" in r.json()["detail"] and "at least 3" in r.json()["detail"]
    for k in range(5):
        fleet.enrol(f"pi-{k}")
    job_id = fleet.create(devices=0, **regular)  # 0: all devices, the graph is unknown yet
    started = fleet.start(job_id)
    assert started.status_code == 409 and "not above half" in started.json()["detail"]
    assert fleet.create(devices=5, **{**regular, "secure_aggregation": 3})  # 3 > 4/2: fine


def test_a_secure_jobs_placement_ignores_the_names_devices_chose(fleet: Fleet) -> None:
    """Names no longer fix graph positions: a salted hash of the coordinator's ids does."""
    from coordinator.secagg import placement

    orders: set[tuple[int, ...]] = set()
    ids = [fleet.enrol(f"a-{k}") for k in range(4)]  # names sort as enrolled
    for _ in range(4):
        job_id = fleet.create(devices=4, **SECURE)
        assert fleet.start(job_id).status_code == 200
        devices = fleet.positions(job_id, ids)
        orders.add(tuple(ids.index(d) for d in devices))
        fleet.client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H)
        with fleet.client.app.state.sessionmaker() as session:  # type: ignore[attr-defined]
            from coordinator.db import Device, Job

            salt = session.get(Job, job_id).topology["placement_salt"]
            rows = [session.get(Device, d) for d in ids]
        assert len(salt) == 32 and [d.id for d in placement(rows, salt)[1]] == devices
    assert orders != {(0, 1, 2, 3)}  # by name every start would be 0, 1, 2, 3


# --- key directory ---------------------------------------------------------------------------


def test_bundles_fill_the_directory_and_repeat_or_change_as_the_protocol_says(
    fleet: Fleet,
) -> None:
    job_id, ids = fleet.running(**SECURE)
    before = fleet.directory(job_id).json()
    first = fleet.bundle(job_id, ids[0], 3)
    created = fleet.put_keys(job_id, ids[0], first)
    again = fleet.put_keys(job_id, ids[0], first)
    changed = fleet.put_keys(job_id, ids[0], fleet.bundle(job_id, ids[0], 3))
    for device in ids[1:]:
        assert fleet.put_keys(job_id, device, fleet.bundle(job_id, device, 3)).status_code == 201
    after = fleet.directory(job_id, fleet.headers[ids[2]]).json()  # a fleet device may read it

    assert (created.status_code, again.status_code, changed.status_code) == (201, 204, 409)
    assert before["complete"] is False and before["bundles"] == {}
    assert after["complete"] is True and after["threshold"] == 2
    assert after["bundles"][ids[0]] == first
    assert after["neighbourhoods"] == {
        ids[0]: sorted([ids[1], ids[3]]),
        ids[1]: sorted([ids[0], ids[2]]),
        ids[2]: sorted([ids[1], ids[3]]),
        ids[3]: sorted([ids[0], ids[2]]),
    }
    assert set(after["identity_keys"]) == set(ids)
    assert len(base64.b64decode(after["coordinator_key"])) == 32


def test_bad_bundles_are_422_with_the_reason(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**SECURE)
    other = fleet.bundle(job_id, ids[1], 3)
    cases = {
        "does not verify": {**fleet.bundle(job_id, ids[0], 3), "signature": other["signature"]},
        "one 32-byte masking key per round": fleet.bundle(job_id, ids[0], 2),
        "c_pk must be 32": fleet.bundle(job_id, ids[0], 3, c_pk=b64(b"x" * 16)),
        "not valid base64": fleet.bundle(job_id, ids[0], 3, s_pks="%%%"),
        "but was sent for": other,
    }
    for words, body in cases.items():
        r = fleet.put_keys(job_id, ids[0], body)
        assert r.status_code == 422 and words in r.json()["detail"], (words, r.text)
    assert fleet.directory(job_id).json()["bundles"] == {}


def test_keys_need_the_own_token_a_secure_running_job_and_an_identity_key(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**SECURE)
    stranger = fleet.enrol("stranger")
    wrong_token = fleet.put_keys(job_id, ids[0], fleet.bundle(job_id, ids[0], 3), as_=ids[1])
    not_member = fleet.put_keys(job_id, stranger, fleet.bundle(job_id, stranger, 3))
    plain_job = fleet.create(devices=4)
    not_secure = fleet.put_keys(plain_job, ids[0], fleet.bundle(plain_job, ids[0], 5))
    fleet.client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H)
    stopped = fleet.put_keys(job_id, ids[0], fleet.bundle(job_id, ids[0], 3))
    no_directory = fleet.directory(plain_job)
    unknown = fleet.directory(job_id, {"Authorization": "Bearer nope"})

    assert (wrong_token.status_code, not_member.status_code) == (403, 403)
    assert not_secure.status_code == 409 and "secure aggregation" in not_secure.json()["detail"]
    assert stopped.status_code == 409 and "not running" in stopped.json()["detail"]
    assert (no_directory.status_code, unknown.status_code) == (409, 403)


def test_a_device_enrolled_without_an_identity_key_cannot_publish_keys(fleet: Fleet) -> None:
    job_id, ids = fleet.running(identity=False, signed_deltas=False, **SECURE)
    r = fleet.put_keys(job_id, ids[0], fleet.bundle(job_id, ids[0], 3))
    assert r.status_code == 422 and "without an identity_key" in r.json()["detail"]


# --- declarations ----------------------------------------------------------------------------


def test_a_declaration_is_signed_once_and_the_first_one_stands(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**SECURE)
    agg, (a, b) = ids[0], sorted([ids[1], ids[3]])
    body = {"round": 1, "aggregator": agg, "survivors": [b, a], "dropped": [], "aborted": False}
    first = fleet.declare(job_id, agg, body)
    again = fleet.declare(job_id, agg, body)
    other = fleet.declare(job_id, agg, {**body, "survivors": [a], "dropped": [b], "aborted": True})
    aborted = fleet.declare(
        job_id, agg, {**body, "round": 2, "survivors": [a], "dropped": [b], "aborted": True}
    )

    assert first.status_code == 200 and again.json() == first.json()
    assert first.json()["declaration"] == {"job": job_id, "round": 1, "aggregator": agg,
                                           "survivors": [a, b], "dropped": [],
                                           "aborted": False}  # fmt: skip
    verify(fleet.directory(job_id).json(), first.json())
    assert other.status_code == 409 and "first declaration stands" in other.json()["detail"]
    assert aborted.status_code == 200 and aborted.json()["declaration"]["aborted"] is True


def test_declarations_that_do_not_match_the_directory_are_refused(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**SECURE)
    agg, (a, b) = ids[0], sorted([ids[1], ids[3]])
    good = {"round": 1, "aggregator": agg, "survivors": [a, b], "dropped": [], "aborted": False}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"survivors": [a]}, 422, "aborted must be true"),
        ({"survivors": [a, b], "dropped": [b]}, 422, "disjoint lists"),
        ({"survivors": [a, b, ids[2]]}, 422, "disjoint lists"),
        ({"survivors": [a, a, b]}, 422, "twice"),
        ({"survivors": [a], "dropped": [b]}, 422, "aborted must be true"),
        ({"round": 4}, 422, "not in 1..3"),
        ({"aggregator": ids[1]}, 403, "only its own neighbourhood"),
    ]
    for change, code, words in cases:
        r = fleet.declare(job_id, agg, {**good, **change})
        assert r.status_code == code and words in r.json()["detail"], (change, r.text)
    # An aggregator may abort above the threshold (one-sided masks), and may list only
    # the absent members some survivor masked with.
    voluntary = fleet.declare(job_id, agg, {**good, "round": 2, "aborted": True})
    partial = fleet.declare(job_id, agg, {**good, "round": 3, "survivors": [a, b]})
    assert voluntary.status_code == 200 and partial.status_code == 200
    wrong_job = fleet.client.post(
        f"{API}/jobs/{job_id}/secagg/declarations",
        json={**good, "job": "job-other"},
        headers=fleet.headers[agg],
    )
    assert wrong_job.status_code == 422


# --- DP budgets ------------------------------------------------------------------------------


def test_spends_are_idempotent_and_shown_per_job_and_per_device(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**DP, rounds=5)
    first = fleet.spend(job_id, ids[0], 1)
    again = fleet.spend(job_id, ids[0], 1)
    changed = fleet.spend(job_id, ids[0], 1, releases=2)
    fleet.spend(job_id, ids[0], 2)
    status = fleet.privacy(ids[0]).json()
    job = fleet.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    shown = {d["device_id"]: d["epsilon_spent"] for d in job["devices"]}

    assert first.status_code == 200 and again.json() == first.json()
    assert first.json()["releases"] == 1 and first.json()["epsilon_budget"] is None
    assert first.json()["epsilon_spent"] == pytest.approx(epsilon([(1.0, 1)], 1e-5))
    assert changed.status_code == 409 and "already recorded" in changed.json()["detail"]
    two = pytest.approx(epsilon([(1.0, 2)], 1e-5))
    assert status == {"device_id": ids[0], "epsilon_spent": two, "delta": 1e-5,
                      "epsilon_budget": None, "releases": 2, "unit": "device"}  # fmt: skip
    assert shown[ids[0]] == pytest.approx(status["epsilon_spent"]) and shown[ids[1]] == 0.0
    assert fleet.privacy(ids[1]).json()["epsilon_spent"] == 0.0


def test_a_plain_job_shows_no_epsilon_and_refuses_spends(fleet: Fleet) -> None:
    job_id, ids = fleet.running()
    job = fleet.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    r = fleet.spend(job_id, ids[0], 1)
    assert all(d["epsilon_spent"] is None for d in job["devices"])
    assert r.status_code == 409 and "adds no DP noise" in r.json()["detail"]


def test_bad_spends_are_refused(fleet: Fleet) -> None:
    job_id, ids = fleet.running(**DP, rounds=5)
    out_of_range = fleet.spend(job_id, ids[0], 6)
    zero = fleet.spend(job_id, ids[0], 1, releases=0)
    too_many = fleet.spend(job_id, ids[0], 1, releases=4)  # 4 devices: at most 3 neighbours
    other = fleet.client.post(
        f"{API}/jobs/{job_id}/privacy/{ids[0]}/spend",
        json={"round": 1, "releases": 1},
        headers=fleet.headers[ids[1]],
    )
    admin_only = fleet.client.get(f"{API}/devices/{ids[0]}/privacy", headers=fleet.headers[ids[0]])
    assert (out_of_range.status_code, zero.status_code, too_many.status_code) == (422, 422, 422)
    assert (other.status_code, admin_only.status_code) == (403, 403)
    assert fleet.privacy(ids[0]).json()["releases"] == 0


def test_a_release_past_the_budget_is_refused_and_not_recorded(fleet: Fleet) -> None:
    # σ = 2 (σ/2 = 1 per 2C): 5 releases cost ε = 12.3 (start allowed), 6 cost 13.8 > 13.
    job_id, ids = fleet.running(**DP2, rounds=5, dp_epsilon_budget=13.0)
    assert fleet.spend(job_id, ids[0], 1, releases=3).status_code == 200
    refused = fleet.spend(job_id, ids[0], 2, releases=3)
    status = fleet.privacy(ids[0]).json()
    fits = fleet.spend(job_id, ids[0], 2, releases=1)

    assert refused.status_code == 409
    assert refused.json()["detail"].startswith("privacy budget exhausted")
    assert status["releases"] == 3 and status["epsilon_budget"] == 13.0
    assert fits.status_code == 200 and fits.json()["epsilon_spent"] <= 13.0


def test_start_refuses_a_job_that_would_push_a_device_past_its_budget(fleet: Fleet) -> None:
    first, ids = fleet.running(**DP2, rounds=5)  # no budget
    assert fleet.spend(first, ids[0], 1).status_code == 200
    fleet.client.post(f"{API}/jobs/{first}/stop", headers=ADMIN_H)
    tight = fleet.create(devices=4, **DP2, rounds=5, dp_epsilon_budget=13.0)  # 1 + 5 > 13.0
    refused = fleet.start(tight)
    roomy = fleet.create(devices=4, **DP2, rounds=5, dp_epsilon_budget=14.0)

    assert refused.status_code == 409, refused.text
    assert f"device {ids[0]!r}" in refused.json()["detail"]
    assert "past its ε budget 13" in refused.json()["detail"]
    assert fleet.start(roomy).status_code == 200


def test_a_later_job_cannot_raise_a_devices_budget(fleet: Fleet) -> None:
    capped, ids = fleet.running(**DP2, rounds=5, dp_epsilon_budget=13.0)
    assert fleet.spend(capped, ids[0], 1, releases=3).status_code == 200
    fleet.client.post(f"{API}/jobs/{capped}/stop", headers=ADMIN_H)
    generous = fleet.create(devices=4, **DP2, rounds=5, dp_epsilon_budget=100.0)
    refused = fleet.start(generous)  # 3 spent + 5 planned > 13, whatever this job says

    assert refused.status_code == 409, refused.text
    assert "past its ε budget 13" in refused.json()["detail"]
    assert fleet.privacy(ids[0]).json()["epsilon_budget"] == 13.0


def test_secure_dp_jobs_project_one_release_per_neighbour(fleet: Fleet) -> None:
    # Ring: degree 2, so 3 rounds are 6 releases (ε = 13.8), not 3 (ε = 9.0).
    for k in range(4):
        fleet.enrol(f"pi-{k}")
    job_id = fleet.create(devices=4, **SECURE, dp_noise_multiplier=2.0, dp_clip=1.0,
                          dp_epsilon_budget=12.0)  # fmt: skip
    assert fleet.start(job_id).status_code == 409


# --- restart ---------------------------------------------------------------------------------


def test_a_restart_keeps_spent_epsilon_bundles_declarations_and_the_signing_key(
    fleet: Fleet,
) -> None:
    job_id, ids = fleet.running(
        **SECURE, dp_noise_multiplier=1.0, dp_clip=1.0, dp_mode="distributed"
    )
    for device in ids:
        assert fleet.put_keys(job_id, device, fleet.bundle(job_id, device, 3)).status_code == 201
    assert fleet.spend(job_id, ids[0], 1, releases=2).status_code == 200
    agg, members = ids[0], sorted([ids[1], ids[3]])
    body = {"round": 1, "aggregator": agg, "survivors": members, "dropped": [], "aborted": False}
    signed = fleet.declare(job_id, agg, body).json()
    directory, spent = fleet.directory(job_id).json(), fleet.privacy(ids[0]).json()

    fleet.restart()

    assert fleet.directory(job_id).json() == directory
    assert fleet.privacy(ids[0]).json() == spent and spent["releases"] == 2
    assert fleet.declare(job_id, agg, body).json() == signed
    changed = {**body, "survivors": members[:1], "dropped": members[1:], "aborted": True}
    assert fleet.declare(job_id, agg, changed).status_code == 409
    verify(fleet.directory(job_id).json(), signed)


# --- the accountant --------------------------------------------------------------------------


def test_the_accountant_gives_the_textbook_epsilon_and_agrees_with_opacus() -> None:
    from opacus.accountants import RDPAccountant

    ours = sampled_gaussian_epsilon(0.01, 1.0, 1000, 1e-5)
    theirs = RDPAccountant()
    theirs.history = [(1.0, 0.01, 1000)]
    full = RDPAccountant()  # σ/2: each release has sensitivity 2C (replacement adjacency)
    full.history = [(0.5, 1.0, 10), (1.0, 1.0, 5)]

    assert ours == pytest.approx(2.1, abs=0.05)
    assert ours == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-3)
    assert epsilon([(1.0, 10), (2.0, 5)], 1e-5) == pytest.approx(full.get_epsilon(1e-5), rel=1e-2)


def test_the_accountant_composes_and_refuses_bad_input() -> None:
    assert epsilon([], 1e-5) == 0.0 and epsilon([(1.0, 0)], 1e-5) == 0.0
    assert epsilon([(1.0, 4)], 1e-5) == pytest.approx(epsilon([(1.0, 1)] * 4, 1e-5))
    assert epsilon([(1.0, 2)], 1e-5) < epsilon([(1.0, 3)], 1e-5)
    assert epsilon([(2.0, 3)], 1e-5) < epsilon([(1.0, 3)], 1e-5)
    assert epsilon([(0.0, 1)], 1e-5) == float("inf")
    with pytest.raises(ValueError):
        epsilon([(1.0, 1)], 1.5)
    with pytest.raises(ValueError):
        epsilon([(-1.0, 1)], 1e-5)
