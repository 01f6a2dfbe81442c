"""The coordinator's log lines name the job and device of the request they belong to.

A publisher that always fails makes the coordinator log a warning inside
``POST /jobs/{job_id}/start``; the line, formatted as JSON, carries that job id and a
null device; a line logged outside any request carries nulls.
"""

from __future__ import annotations

import io
import json
import logging
import warnings
from pathlib import Path

from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL, FakeClock, enrol, spec

from coordinator import CoordinatorSettings, create_app
from meshfl.app.cli.logs import log_handler

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def test_a_line_logged_while_serving_a_job_request_names_the_job(tmp_path: Path) -> None:
    def publish(topic: str, payload: bytes) -> None:
        raise OSError("broker down")

    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", enrol_token=ENROL, admin_token=ADMIN
    )
    clock = FakeClock(1_000.0)
    lines = io.StringIO()
    logger = logging.getLogger("coordinator")
    handler = log_handler("json", stream=lines)
    logger.addHandler(handler)
    try:
        with TestClient(create_app(settings, publish, clock=clock)) as client:
            for k in range(2):
                enrol(client, clock, f"pi-{k}")
            job_id = client.post(f"{API}/jobs", json=spec(devices=2), headers=ADMIN_H).json()
            job_id = job_id["job_id"]
            started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
        logging.getLogger("coordinator.test").warning("outside any request")
    finally:
        logger.removeHandler(handler)

    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    published = [r for r in records if "cannot publish job" in r["message"]]
    assert started.status_code == 200
    assert published and all(r["job"] == job_id and r["device"] is None for r in published)
    assert records[-1]["message"] == "outside any request" and records[-1]["job"] is None
