"""The coordinator's per-job ``/metrics`` counters agree with ``meshfl local``'s report.json.

Devices post round reports over TestClient (SQLite, and PostgreSQL where one answers);
``/metrics`` is parsed with
prometheus-client's parser and compared with :func:`meshfl.app.local.report.build_report`
fed by the same coordinator's REST answers (as ``meshfl local`` does).
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import postgres_or_fail
from prometheus_client.parser import text_string_to_metric_families
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, metrics, running_job

from coordinator import CoordinatorSettings, create_app
from coordinator.db import make_engine
from coordinator.job_metrics import watched_jobs
from meshfl.app.local.report import build_report
from meshfl.app.local.run import LocalConfig

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

DP: dict[str, Any] = {"codec": "identity", "dp_noise_multiplier": 1.0, "dp_clip": 1.0}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database: the sums run in SQL over JSON, which each dialect spells its way."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'c.db'}"
        return
    url = postgres_or_fail()
    schema = f"meshfl_jobmetrics_{secrets.token_hex(4)}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def client(db_url: str, clock: FakeClock) -> Iterator[TestClient]:
    settings = CoordinatorSettings(db_url=db_url, enrol_token=ENROL, admin_token=ADMIN)
    app = create_app(settings, clock=clock)
    with TestClient(app) as c:
        yield c


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ``meshfl_job_*`` sample as ``{(name, sorted labels): value}``."""
    reply = client.get("/metrics", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
        if s.name.startswith("meshfl_job_")
    }


def report(client: TestClient, job_id: str) -> dict[str, Any]:
    job = client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    rounds = client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    return build_report(LocalConfig(), job, rounds, 1.0, {})


def post(client: TestClient, job_id: str, headers: dict[str, str], body: dict[str, Any]) -> None:
    r = client.post(f"{API}/jobs/{job_id}/metrics", json=body, headers=headers)
    assert r.status_code == 204, r.text


def test_job_counters_equal_the_local_report_of_the_same_run(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock, n=3, rounds=4, **DP)
    sent = {0: 100, 1: 250, 2: 40}
    for rnd in (1, 2, 3):
        for k, (device, headers) in enumerate(devices):
            if rnd <= k + 1:  # device k spends in rounds 1..k+1: their ε differ
                url = f"{API}/jobs/{job_id}/privacy/{device}/spend"
                spend = {"round": rnd, "releases": 1}
                assert client.post(url, json=spend, headers=headers).status_code == 200
            if rnd == 3 and k == 2:
                continue  # device 2 misses round 3: the round still has a summary
            body = metrics(rnd, 0.5 + 0.1 * rnd, [], sent=sent[k] * rnd)
            body.update(rejected_unsigned=k, rejected_signature=rnd, rejected_replayed=0)
            post(client, job_id, headers, body)
    clock.now += 1.0

    samples = scrape(client)
    expected = report(client, job_id)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"job": job_id, **labels}.items())))]

    final = expected["final"]
    assert value("meshfl_job_rounds_completed") == final["rounds_completed"] == 3
    assert value("meshfl_job_bytes_sent_total") == final["bytes_sent_total"]
    assert value("meshfl_job_bytes_received_total") == final["bytes_received_total"]
    assert final["bytes_sent_total"] == (1 + 2 + 3) * (sent[0] + sent[1]) + (1 + 2) * sent[2]
    spent = [d["epsilon_spent"] for d in expected["devices"]]
    assert value("meshfl_job_epsilon_spent") == pytest.approx(max(spent))
    assert max(spent) > min(spent) > 0
    # unsigned: device k reports k per round (device 2 twice); signature: rnd per report
    assert value("meshfl_job_deltas_rejected_total", reason="unsigned") == 0 + 3 + 2 * 2
    assert value("meshfl_job_deltas_rejected_total", reason="signature") == 3 * (1 + 2) + 2 * 3
    assert value("meshfl_job_deltas_rejected_total", reason="replayed") == 0


def test_a_plain_job_has_no_epsilon_and_zero_rejections(
    client: TestClient, clock: FakeClock
) -> None:
    job_id, devices = running_job(client, clock, n=2)
    post(client, job_id, devices[0][1], metrics(1, 0.5, [], sent=10))

    samples = scrape(client)

    labels = (("job", job_id),)
    assert samples[("meshfl_job_rounds_completed", labels)] == 1
    assert samples[("meshfl_job_bytes_sent_total", labels)] == 10
    assert ("meshfl_job_epsilon_spent", labels) not in samples
    rejected = {k: v for k, v in samples.items() if k[0] == "meshfl_job_deltas_rejected_total"}
    assert sorted(dict(k[1])["reason"] for k in rejected) == ["replayed", "signature", "unsigned"]
    assert set(rejected.values()) == {0}


def test_only_live_jobs_and_the_latest_finished_ones_are_exported(
    client: TestClient, clock: FakeClock
) -> None:
    created = client.post(f"{API}/jobs", json=_spec(), headers=ADMIN_H).json()["job_id"]
    finished = []
    for _ in range(3):
        job_id, _devices = running_job(client, clock, n=2)
        clock.now += 5.0
        assert client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H).status_code == 200
        finished.append(job_id)
    live, _devices = running_job(client, clock, n=2)

    sessions = client.app.state.sessionmaker  # type: ignore[attr-defined]
    with sessions() as session:
        watched = [j.id for j in watched_jobs(session, recent=2)]
    exported = {dict(k[1])["job"] for k in scrape(client)}

    assert watched == [live, finished[2], finished[1]]
    assert exported == {live, *finished}  # the default keeps the 20 latest finished
    assert created not in exported


def _spec() -> dict[str, Any]:
    from test_coordinator_api import spec

    return spec(devices=2)
