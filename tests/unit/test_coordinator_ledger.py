"""``GET /jobs/{id}/ledger``: the devices' delivery ledgers, stored, checked and summed."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, metrics, running_job

from coordinator import CoordinatorSettings, create_app
from coordinator.ledger import COUNTS
from meshfl.app.local.report import add_unmixed, ledger_line, ledger_section, unmixed_by_device
from meshfl.contract import RoundLedger

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

Devices = list[tuple[str, dict[str, str]]]


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
    )
    with TestClient(create_app(settings, clock=clock)) as test_client:
        yield test_client


def ledger(**counts: int) -> RoundLedger:
    """A round's ledger: every count 0 unless given."""
    body: dict[str, int] = dict.fromkeys(COUNTS, 0)
    body.update(counts)
    return body  # type: ignore[return-value]


def report(rnd: int, **counts: int) -> dict[str, Any]:
    return {**metrics(rnd, 0.5, []), "ledger": ledger(**counts)}


@pytest.fixture
def job(client: TestClient, clock: FakeClock) -> tuple[str, Devices]:
    return running_job(client, clock, n=3, rounds=3)


def test_rows_round_totals_and_run_totals(client: TestClient, job: tuple[str, Devices]) -> None:
    job_id, devices = job
    url = f"{API}/jobs/{job_id}/metrics"
    (d0, h0), (d1, h1), (_, h2) = devices
    posts = [
        (h0, report(1, sent=1, delivered=2, applied=2, duplicates=3)),
        (h1, report(1, sent=1, delivered=1, applied=1, missing=1, awaiting_keyframe=1,
                    rejected_malformed=2, rejected_signature=1, unrepaired=2)),
        (h1, report(2, sent=1, delivered=2, applied=2, recovered_by_keyframe=2)),
        (h0, report(2, sent=1, delivered=1, applied=0, missing=1, unrepaired=1)),
        (h0, report(3, sent=1, lost=1)),  # its last round: the gap was never repaired
        (h2, metrics(1, 0.5, [])),  # an agent from before the ledger: left out
    ]  # fmt: skip
    for headers, body in posts:
        assert client.post(url, json=body, headers=headers).status_code == 204

    body = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()

    assert [(r["round"], r["device_id"]) for r in body["rows"]] == [
        (1, d0), (1, d1), (2, d0), (2, d1), (3, d0)
    ]  # fmt: skip
    assert body["rows"][1]["rejected"] == 3 and body["rows"][0]["name"] == "pi-0"
    assert [(r["round"], r["devices_reporting"], r["sent"]) for r in body["rounds"]] == [
        (1, 2, 2), (2, 2, 2), (3, 1, 1)
    ]  # fmt: skip
    totals = body["totals"]
    assert (totals["sent"], totals["applied"], totals["duplicates"]) == (5, 5, 3)
    assert (totals["missing"], totals["recovered_by_keyframe"], totals["lost"]) == (2, 2, 1)
    # each device's latest unrepaired: d0 0 (round 3), d1 0 (round 2)
    assert (totals["unrepaired"], totals["unrecovered_losses"]) == (0, 1)
    assert (totals["applied_twice"], totals["corrupted_applied"]) == (0, 0)
    assert (totals["devices_reporting"], totals["rounds_reported"]) == (2, 3)


def test_a_device_that_stopped_reporting_keeps_its_unrepaired_messages(
    client: TestClient, job: tuple[str, Devices]
) -> None:
    job_id, devices = job
    client.post(f"{API}/jobs/{job_id}/metrics", json=report(1, missing=2, unrepaired=2),
                headers=devices[0][1])  # fmt: skip

    totals = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()["totals"]

    assert (totals["lost"], totals["unrepaired"], totals["unrecovered_losses"]) == (0, 2, 2)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sent": -1}, "ledger.sent"),
        ({"lost": 2**60}, "ledger.lost"),
        ({"bogus": 1}, "ledger.bogus: unknown field"),
        ({"applied": "3"}, "ledger.applied"),
    ],
)
def test_an_impossible_ledger_is_a_422_naming_the_field(
    client: TestClient, job: tuple[str, Devices], change: dict[str, Any], field: str
) -> None:
    job_id, devices = job
    body = report(1)
    body["ledger"].update(change)

    r = client.post(f"{API}/jobs/{job_id}/metrics", json=body, headers=devices[0][1])

    assert r.status_code == 422 and field in r.json()["detail"], r.text


def test_an_empty_ledger_and_auth(client: TestClient, job: tuple[str, Devices]) -> None:
    job_id, devices = job

    empty = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H)
    device = client.get(f"{API}/jobs/{job_id}/ledger", headers=devices[0][1])
    unknown = client.get(f"{API}/jobs/job-nope/ledger", headers=ADMIN_H)

    assert empty.status_code == 200
    assert empty.json()["rows"] == empty.json()["rounds"] == []
    assert empty.json()["totals"]["unrecovered_losses"] == 0
    assert (device.status_code, unknown.status_code) == (403, 404)  # a device may not read it
    spec = client.get("/openapi.json").json()["paths"][f"{API}/jobs/{{job_id}}/ledger"]["get"]
    assert {"200", "401", "404"} <= set(spec["responses"])


def test_report_json_carries_the_ledger_and_the_summary_line(
    client: TestClient, job: tuple[str, Devices]
) -> None:
    job_id, devices = job
    url = f"{API}/jobs/{job_id}/metrics"
    client.post(url, json=report(1, sent=1, delivered=2, applied=2, duplicates=4,
                                 rejected_malformed=1, missing=1, unrepaired=1),
                headers=devices[0][1])  # fmt: skip
    client.post(url, json=report(2, sent=1, delivered=2, applied=2, recovered_by_keyframe=1),
                headers=devices[0][1])  # fmt: skip
    answer = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()

    section = json.loads(json.dumps(ledger_section(answer)))  # as report.json holds it

    assert section["totals"] == answer["totals"]
    assert [r["round"] for r in section["rounds"]] == [1, 2]
    assert section["rounds"][0]["rejected"] == 1 and "device_id" not in section["rounds"][0]
    assert ledger_line(section) == (
        "ledger: 2 sent, 4 applied, 0 applied twice, 4 duplicates dropped, 1 rejected,"
        " 0 delivered late, 0 re-sent on request, 1 recovered by keyframe, 0 lost"
    )
    assert ledger_line({"error": "refused (404)"}) == "ledger: not available (refused (404))"


def _peer(high: int, heard: int, **outcomes: int) -> dict[str, int]:
    counts = dict.fromkeys(("applied", "recovered", "lost", "unrepaired", "discarded"), 0)
    counts.update(outcomes)
    return {"high": high, "heard": heard, **counts}


def test_the_coordinator_derives_every_senders_messages_at_every_receiver(
    client: TestClient, job: tuple[str, Devices]
) -> None:
    # Issue 25: d0 used sequence numbers 1-3, d1 1-2. d1 heard of d0's 1-2 (applied 1,
    # recovered 2 by keyframe) and never of 3 (a broker dropped it): unaccounted.
    # d0 applied both of d1's. sent × fan-out = every outcome, exactly.
    job_id, devices = job
    (d0, h0), (d1, h1), _ = devices
    url = f"{API}/jobs/{job_id}/metrics"
    posts = [
        (h0, {**report(1, sent=2), **{}}),
        (h0, report(2, sent=1)),
        (h1, report(1, sent=1)),
        (h1, report(2, sent=1)),
    ]
    posts[1][1]["ledger"].update(sequence=3, peers={d1: _peer(2, 2, applied=2)})
    posts[3][1]["ledger"].update(sequence=2, peers={d0: _peer(2, 2, applied=1, recovered=1)})
    for headers, body in posts:
        assert client.post(url, json=body, headers=headers).status_code == 204

    derived = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()["derived"]

    pairs = {(p["sender"], p["receiver"]): p for p in derived["pairs"]}
    assert pairs[d0, d1]["addressed"] == 3 and pairs[d0, d1]["unaccounted"] == 1
    assert (pairs[d0, d1]["applied"], pairs[d0, d1]["recovered"]) == (1, 1)
    assert pairs[d1, d0]["addressed"] == 2 and pairs[d1, d0]["unaccounted"] == 0
    assert derived["sent"] == 5
    outcomes = ("applied", "recovered", "lost", "unrepaired", "discarded", "unaccounted")
    assert derived["addressed"] == 1 * derived["sent"] == sum(derived[k] for k in outcomes)
    assert derived["unaccounted"] == 1


def test_a_ledger_with_impossible_per_sender_counts_is_refused(
    client: TestClient, job: tuple[str, Devices]
) -> None:
    job_id, devices = job
    body = report(1, sent=1)
    body["ledger"]["peers"] = {"x": {**_peer(1, 1), "heard": -1}}
    answer = client.post(f"{API}/jobs/{job_id}/metrics", json=body, headers=devices[0][1])
    assert answer.status_code in (400, 422) and "heard" in answer.text


def test_deltas_a_neighbour_went_without_show_per_device_and_in_the_summary(
    client: TestClient, job: tuple[str, Devices]
) -> None:
    # Issue 25: a slowed device whose deltas no neighbour mixed showed nothing: its
    # missing_rounds and isolated_rounds were empty and the summary line said nothing.
    job_id, devices = job
    (d0, h0), (d1, h1), (d2, h2) = devices
    url = f"{API}/jobs/{job_id}/metrics"
    for rnd in (1, 2):
        for headers, went_without in ((h0, [d2]), (h1, [d2] if rnd == 1 else []), (h2, [])):
            body = {**metrics(rnd, 0.5, []), "missing": went_without}
            assert client.post(url, json=body, headers=headers).status_code == 204

    body = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()

    shown = {d["device_id"]: d for d in body["devices"]}
    assert shown[d2]["unmixed_rounds"] == [1, 2] and shown[d2]["missing_rounds"] == []
    assert shown[d0]["unmixed_rounds"] == [] == shown[d1]["unmixed_rounds"]
    per_device = unmixed_by_device(
        {d: client.get(f"{API}/jobs/{job_id}/devices/{d}/metrics", headers=ADMIN_H).json()
         for d in (d0, d1, d2)}
    )  # fmt: skip
    report: dict[str, Any] = {"devices": [{"id": d} for d in (d0, d1, d2)]}
    add_unmixed(report, per_device)
    assert [(d["unmixed"], d["unmixed_rounds"]) for d in report["devices"]] == [
        (0, []), (0, []), (3, [1, 2])
    ]  # fmt: skip
    totals = client.get(f"{API}/jobs/{job_id}/ledger", headers=ADMIN_H).json()
    section = {**ledger_section(totals), "unmixed": 3}
    section["totals"]["devices_reporting"] = 3
    assert ledger_line(section).endswith(", 3 not mixed")
