"""W5's coordinator benchmark in smoke mode: a real server, wrk or locust, 50 devices, 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from postgres import postgres_or_fail

pytestmark = pytest.mark.e2e  # a real server + a load generator: about 15 s a run

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "w5_coordinator.py"


@pytest.mark.parametrize(
    ("db", "generator"), [("sqlite", "wrk"), ("postgresql", "wrk"), ("sqlite", "locust")]
)
def test_smoke_run_sends_every_heartbeat_and_reaches_the_db(
    db: str, generator: str, tmp_path: Path
) -> None:
    if db == "postgresql":
        postgres_or_fail()
    out = tmp_path / "w5.json"

    command = [sys.executable, str(BENCH), "--smoke", "--db", db, "--generator", generator]
    proc = subprocess.run(
        [*command, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "W5 coordinator heartbeats" in proc.stdout and "machine:" in proc.stdout
    (run,) = json.loads(out.read_text())["runs"]
    assert run["db"] == db and run["generator"] == generator
    # 50 devices at 1 heartbeat/s for 5 s: 250 planned; allow a slow start on a busy machine.
    assert run["sent"] >= 200, run
    assert run["errors"] == 0, run
    assert 0 < run["p50_ms"] <= run["p95_ms"] <= run["p99_ms"] <= run["max_ms"]
    # Every device's heartbeat reached devices.last_seen (flushed at the latest at shutdown).
    assert run["devices_seen_in_db"] == 50
    assert run["server_exit"] == 0
    assert set(run["cpu_pct"]) == {"server", "generator", "others"}
