"""The agent's health file and `meshfl agent health`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from edge_agent.health import HealthWriter, check_health, health_path
from meshfl.app.cli import app


def test_a_running_connected_agent_is_healthy_and_a_stopped_one_is_not(tmp_path: Path) -> None:
    connected = [True]
    writer = HealthWriter(tmp_path, "dev-1", "agent-0", lambda: connected[0], interval_s=0.05)
    writer.start()
    try:
        assert check_health(tmp_path, "agent-0") is None
        connected[0] = False
        deadline = time.monotonic() + 5
        while check_health(tmp_path, "agent-0") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "not connected" in (check_health(tmp_path, "agent-0") or "")
    finally:
        writer.stop()
    assert "does not exist" in (check_health(tmp_path, "agent-0") or "")


def test_agents_sharing_an_out_directory_have_their_own_files(tmp_path: Path) -> None:
    a = HealthWriter(tmp_path, "dev-1", "agent-0", lambda: True)
    b = HealthWriter(tmp_path, "dev-2", "agent-1", lambda: False)
    a.write()
    b.write()

    assert check_health(tmp_path, "agent-0") is None
    assert "not connected" in (check_health(tmp_path, "agent-1") or "")
    assert json.loads(health_path(tmp_path, "agent-0").read_text())["device_id"] == "dev-1"


def test_a_silent_agent_becomes_unhealthy(tmp_path: Path) -> None:
    HealthWriter(tmp_path, "dev-1", "agent-0", lambda: True).write()

    later = time.time() + 61
    assert "old" in (check_health(tmp_path, "agent-0", max_age_s=60, now=later) or "")
    health_path(tmp_path, "agent-0").write_text("{not json")
    assert "unreadable" in (check_health(tmp_path, "agent-0") or "")


def test_the_cli_exit_code_follows_the_health(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["agent", "health", "--out", str(tmp_path), "--name", "agent-0"]

    missing = runner.invoke(app, args)
    HealthWriter(tmp_path, "dev-1", "agent-0", lambda: True).write()
    present = runner.invoke(app, args)

    assert missing.exit_code == 1 and "unhealthy" in missing.output
    assert present.exit_code == 0 and "healthy" in present.output


def test_records_not_written_by_an_agent_are_unhealthy(tmp_path: Path) -> None:
    path = health_path(tmp_path, "agent-0")
    now = time.time()
    cases = {
        "future updated_at": {"updated_at": now + 1e9, "connected": True},
        "no numeric": {"updated_at": "soon", "connected": True},
        "true/false": {"updated_at": now, "connected": "no"},
    }
    for words, record in cases.items():
        path.write_text(json.dumps(record))
        assert words in (check_health(tmp_path, "agent-0") or ""), record
    path.write_text('{"updated_at": NaN, "connected": true}')
    assert check_health(tmp_path, "agent-0") is not None
    path.write_text("{}")
    assert "updated_at" in (check_health(tmp_path, "agent-0") or "")
    path.write_text("[1, 2]")
    assert check_health(tmp_path, "agent-0") is not None
