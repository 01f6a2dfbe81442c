"""The coordinator's store: Alembic migrations vs the ORM, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import secrets
import warnings
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from postgres import PG_URL, postgres_or_fail, scratch_schema

from coordinator import CoordinatorSettings, create_app, store
from coordinator.db import Base, Job, make_engine, make_sessionmaker
from coordinator.migrate import downgrade, upgrade
from coordinator.planning import weights
from coordinator.reports import sketch_distance

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def schema_diff(engine: sa.Engine) -> list[object]:
    with engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def test_migrated_sqlite_schema_matches_the_orm(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine)
    upgrade(engine)  # idempotent
    diff = schema_diff(engine)
    tables = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    assert diff == []
    assert {
        "devices",
        "device_profiles",
        "jobs",
        "job_devices",
        "round_metrics",
        "model_artifacts",
        "secagg_bundles",
        "secagg_declarations",
        "privacy_spend",
        "coordinator_keys",
        "api_tokens",
        "enrolment_tokens",
        "fleet_enrolment",
        "fleet_settings",
        "alembic_version",
    } == tables


def test_a_0001_store_upgrades_to_profile_history_keeping_its_devices(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO devices (id, name, fleet, token_hash, profile, enrolled_at, last_seen)"
                " VALUES ('dev-1', 'pi', 'lab', 'x', '{\"cores\": 4}', 1.0, 2.0)"
            )
        )
    upgrade(engine)
    diff = schema_diff(engine)
    with engine.connect() as conn:
        names = list(conn.execute(sa.text("SELECT name FROM devices")).scalars())
        samples = conn.execute(sa.text("SELECT count(*) FROM device_profiles")).scalar_one()
    engine.dispose()
    assert diff == [] and names == ["pi"] and samples == 0


def test_a_0002_store_upgrades_to_churn_keeping_its_participations(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    upgrade(engine, "0002")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO devices (id, name, fleet, token_hash, profile, enrolled_at, last_seen)"
                " VALUES ('dev-1', 'pi', 'lab', 'x', '{}', 1.0, 2.0)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, spec, status, created_at, topology)"
                " VALUES ('job-1', '{}', 'completed', 1.0, '{\"kind\": \"ring\"}')"
            )
        )
        conn.execute(
            sa.text(
                'INSERT INTO job_devices (job_id, device_id, "index", done, last_activity)'
                " VALUES ('job-1', 'dev-1', 0, 1, 3.0)"
            )
        )
    upgrade(engine)
    diff = schema_diff(engine)
    with engine.connect() as conn:
        rows = list(conn.execute(sa.text("SELECT joined_round, left_round FROM job_devices")))
    engine.dispose()
    assert diff == [] and [tuple(r) for r in rows] == [(1, None)]


REPORT = (  # a NUL escape, which PostgreSQL's json keeps and its jsonb refuses
    '{"round": 1, "accuracy": 0.5, "bytes_sent": 10, "missing": ["pi\\u0000"],'
    ' "sketch": [0.5, -1.0]}'
)
TOPOLOGY = {  # as stored since W is derived: a 4-ring, no "W"
    "kind": "ring", "params": {"mixing": "max-degree"}, "devices": ["a", "b", "c", "d"],
    "edges": [[0, 1], [1, 2], [2, 3], [0, 3]], "version": 1,
}  # fmt: skip


def _store_at_0007(url: str) -> sa.Engine:
    """A store at revision 0007 holding one job with one round report (sketch inside)."""
    engine = make_engine(url)
    upgrade(engine, "0007")
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO devices (id, name, fleet, token_hash, profile, enrolled_at, last_seen)"
            " VALUES ('dev-1', 'pi', 'lab', 'x', '{}', 1.0, 2.0)"
        ))  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO jobs (id, spec, status, created_at) VALUES ('job-1', '{}', 'running', 1.0)"
        ))  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO round_metrics (job_id, device_id, round, metrics, received_at)"
            f" VALUES ('job-1', 'dev-1', 1, '{REPORT}', 3.0)"
        ))  # fmt: skip
    return engine


def _report(engine: sa.Engine, columns: str) -> list[object]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT {columns} FROM round_metrics")).one())


def check_sketches_move_out_and_back(engine: sa.Engine) -> None:
    """0008 moves the sketch into its column, the rest stays; a downgrade moves it back.

    The downgrade also stores each job's dense W again, which releases before 0008 read.
    """
    upgrade(engine)
    assert schema_diff(engine) == []
    metrics, sketch = (_loads(v) for v in _report(engine, "metrics, sketch"))
    assert sketch == [0.5, -1.0]
    assert metrics == {"round": 1, "accuracy": 0.5, "bytes_sent": 10, "missing": ["pi\x00"]}
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET topology = :t WHERE id = 'job-1'"),
            {"t": json.dumps(TOPOLOGY)},
        )
    with make_sessionmaker(engine)() as session:
        job = session.get(Job, "job-1")
        assert job is not None
        (plain,) = store.round_metrics(session, job)
        with pytest.raises(sa.exc.InvalidRequestError):  # not loaded: no query per row
            _ = plain.sketch
        session.expunge_all()
        (loaded,) = store.round_metrics(session, job, sketches=True)
        assert loaded.sketch == [0.5, -1.0]
    downgrade(engine, "0007")
    assert _loads(_report(engine, "metrics")[0]) == _loads(REPORT)
    with engine.connect() as conn:
        stored = _loads(conn.execute(sa.text("SELECT topology FROM jobs")).scalar_one())
    assert stored == {**TOPOLOGY, "W": weights(TOPOLOGY).tolist()}  # type: ignore[dict-item]
    assert stored["W"][0] == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])  # type: ignore[index]


def _loads(value: object) -> object:
    return json.loads(value) if isinstance(value, str) else value


def test_a_0007_store_moves_its_sketches_to_their_column_and_back(tmp_path: Path) -> None:
    engine = _store_at_0007(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        check_sketches_move_out_and_back(engine)
    finally:
        engine.dispose()


def test_round_reports_store_the_sketch_apart(tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", enrol_token="e", admin_token="a"
    )
    auth = {"Authorization": "Bearer a"}
    with TestClient(create_app(settings)) as client:
        device, _ = (
            client.post("/api/v1/devices/enrol", json={"token": "e", "name": f"pi-{k}"}).json()
            for k in range(2)
        )
        spec = {
            "name": "sketch", "signed_deltas": False, "algorithm": "choco",
            "model": {"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []},
            "codec": "identity", "topology": "complete", "rounds": 2, "learning_rate": 0.1,
            "batch_size": 8, "local_epochs": 1, "consensus_step": 1.0,
            "round_deadline_s": 5.0, "max_payload_bytes": 4096, "seed": 0, "devices": 2,
            "test_data": None, "sketch_dim": 2,
        }  # fmt: skip
        job_id = client.post("/api/v1/jobs", json=spec, headers=auth).json()["job_id"]
        assert client.post(f"/api/v1/jobs/{job_id}/start", headers=auth).status_code == 200
        report = {
            "round": 1, "accuracy": 0.5, "loss": 0.5, "bytes_sent": 1, "bytes_received": 1,
            "missing": [], "sketch": [1.0, 2.0], "train_s": 0.1, "round_s": 0.2,
        }  # fmt: skip
        device_auth = {"Authorization": f"Bearer {device['device_token']}"}
        posted = client.post(f"/api/v1/jobs/{job_id}/metrics", json=report, headers=device_auth)
        assert posted.status_code in (200, 202, 204), posted.text
        rounds = client.get(f"/api/v1/jobs/{job_id}/rounds", headers=auth).json()
        shown = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
    engine = make_engine(settings.db_url)
    metrics, sketch = (_loads(v) for v in _report(engine, "metrics, sketch"))
    engine.dispose()
    assert sketch == [1.0, 2.0] and "sketch" not in metrics  # type: ignore[operator]
    assert [r["round"] for r in rounds] == [1] and shown.status_code == 200


def test_in_memory_sqlite_works_for_a_whole_app() -> None:
    settings = CoordinatorSettings(db_url="sqlite://", enrol_token="e", admin_token="a")
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/v1/devices/enrol", json={"token": "e", "name": "pi"})
        listed = client.get("/api/v1/devices", headers={"Authorization": "Bearer a"}).json()
    assert r.status_code == 200 and [d["name"] for d in listed] == ["pi"]


def test_sketch_distance_ignores_empty_and_non_finite_sketches() -> None:
    assert sketch_distance([[1.0, 2.0], []]) is None
    assert sketch_distance([[1.0, float("nan")], [1.0, 2.0]]) is None
    assert sketch_distance([[0.0, 0.0], [2.0, 0.0]]) == pytest.approx(1.0)


def test_postgresql_migrates_and_runs_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    postgres_or_fail()
    monkeypatch.setattr(store, "PROFILE_HISTORY_LIMIT", 2)
    schema = f"meshfl_test_{secrets.token_hex(4)}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{PG_URL}?options=-csearch_path%3D{schema}"
    try:
        settings = CoordinatorSettings(db_url=url, enrol_token="e", admin_token="a")
        app = create_app(settings)
        diff = schema_diff(app.state.engine)
        auth = {"Authorization": "Bearer a"}
        with TestClient(app) as client:
            devices = [
                client.post("/api/v1/devices/enrol", json={"token": "e", "name": f"pi-{k}"}).json()
                for k in range(3)
            ]
            spec = {
                "name": "pg",
                "signed_deltas": False,  # devices enrolled without identity keys
                "model": {"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []},
                "algorithm": "choco",
                "codec": "identity",
                "topology": "complete",
                "rounds": 1,
                "learning_rate": 0.1,
                "batch_size": 8,
                "local_epochs": 1,
                "consensus_step": 1.0,
                "round_deadline_s": 5.0,
                "max_payload_bytes": 4096,
                "seed": 0,
                "devices": 3,
                "test_data": None,
                "sketch_dim": 0,
            }
            job_id = client.post("/api/v1/jobs", json=spec, headers=auth).json()["job_id"]
            client.post(f"/api/v1/jobs/{job_id}/start", headers=auth)
            body = {
                "round": 1,
                "accuracy": 0.5,
                "loss": 0.5,
                "bytes_sent": 1,
                "bytes_received": 2,
                "missing": [],
                "sketch": [],
                "train_s": 0.1,
                "round_s": 0.2,
            }
            for d in devices:
                h = {"Authorization": f"Bearer {d['device_token']}"}
                client.post(f"/api/v1/jobs/{job_id}/metrics", json=body, headers=h)
                client.post(f"/api/v1/jobs/{job_id}/metrics", json=body, headers=h)
                done = {
                    "final_accuracy": 0.5,
                    "bytes_sent": 1,
                    "bytes_received": 2,
                    "model_path": "m",
                }
                client.post(f"/api/v1/jobs/{job_id}/done", json=done, headers=h)
            first = devices[0]
            own = {"Authorization": f"Bearer {first['device_token']}"}
            for cores in (1, 2, 3):
                client.put(
                    f"/api/v1/devices/{first['device_id']}/profile",
                    json={"cores": cores, "battery_percent": None},
                    headers=own,
                )
            history = client.get(
                f"/api/v1/devices/{first['device_id']}/profiles", headers=auth
            ).json()
            fleet = client.get("/api/v1/devices/profiles?min_cores=3", headers=auth).json()
            job = client.get(f"/api/v1/jobs/{job_id}", headers=auth).json()
            rounds = client.get(f"/api/v1/jobs/{job_id}/rounds", headers=auth).json()
            # Churn on PostgreSQL: a device low on battery leaves (the job row is locked).
            churn_spec = {**spec, "rounds": 5, "min_battery_percent": 20.0, "elastic": True}
            churn_id = client.post("/api/v1/jobs", json=churn_spec, headers=auth).json()["job_id"]
            client.post(f"/api/v1/jobs/{churn_id}/start", headers=auth)
            client.put(
                f"/api/v1/devices/{first['device_id']}/profile",
                json={"battery_percent": 5.0, "charging": False},
                headers=own,
            )
            churned = client.get(f"/api/v1/jobs/{churn_id}/topology", headers=auth).json()
            left = client.get(f"/api/v1/jobs/{churn_id}", headers=auth).json()
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    assert diff == []
    assert job["status"] == "completed"
    assert [r["devices_reporting"] for r in rounds] == [3]
    assert [h["profile"]["cores"] for h in history] == [3, 2]  # pruned to the latest 2
    assert [d["device_id"] for d in fleet] == [first["device_id"]]
    assert churned["version"] == 2 and first["device_id"] not in churned["devices"]
    gone = next(d for d in left["devices"] if d["device_id"] == first["device_id"])
    assert gone["left_round"] == 2 and gone["joined_round"] == 1


def test_more_concurrent_requests_than_pooled_connections_all_succeed(tmp_path: Path) -> None:
    """100 concurrent sync requests: every thread gets a connection, none times out."""
    import asyncio

    import httpx

    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", enrol_token="e", admin_token="a",
        rate_limit_operator="",
    )  # fmt: skip
    app = create_app(settings)

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            auth = {"Authorization": "Bearer a"}
            replies = await asyncio.gather(
                *(client.get("/api/v1/devices", headers=auth) for _ in range(100))
            )
        return [r.status_code for r in replies]

    assert asyncio.run(burst()) == [200] * 100
    assert app.state.engine.pool.size() + app.state.engine.pool._max_overflow >= 40


def test_postgresql_moves_sketches_to_their_column_and_back() -> None:
    with scratch_schema() as url:
        engine = _store_at_0007(url)
        try:
            check_sketches_move_out_and_back(engine)
        finally:
            engine.dispose()
