"""W5's scale benchmark in smoke mode: 16 in-process agents in 2 processes, 3 rounds.

The figures come from a real run on a Mosquitto with ``$SYS`` statistics: every round
completes, and the broker's counters over the job window hold at least what the agents
say they published, once in and d times out.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a Mosquitto, a coordinator, 2 agent processes: about 10 s

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "w5_scale.py"
AGENTS, ROUNDS, DEGREE = 16, 3, 4


def test_smoke_completes_every_round_and_reads_the_broker_bytes(tmp_path: Path) -> None:
    out = tmp_path / "w5.json"

    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workload: W5" in proc.stdout and "machine:" in proc.stdout
    assert "command: python benchmarks/w5_scale.py --smoke" in proc.stdout
    got = json.loads(out.read_text())
    assert (got["agents"], got["processes"]) == (AGENTS, 2)
    assert got["completed_rounds"] == ROUNDS and got["failed_agents"] == {}
    assert got["degree"] == DEGREE  # a random 4-regular graph
    payload = got["m_bytes"] * AGENTS * ROUNDS  # what the agents published in the rounds
    assert payload > 0
    # the broker received each delta once and sent it to every neighbour, headers on top
    assert got["window_received"] >= payload
    assert got["window_sent"] >= DEGREE * payload
    assert got["publishes_in"] >= AGENTS * ROUNDS
    assert got["bytes_per_round"] == pytest.approx(
        (got["window_received"] + got["window_sent"]) / ROUNDS
    )
    assert got["ratio"] == pytest.approx(got["bytes_per_round"] / got["expected_per_round"])
    assert 1.0 <= got["ratio"] < 2.0  # framing and the job's statuses, not another fan-out
    # start-up (enrolment, each agent's link probe through the broker) is counted apart
    assert got["startup_bytes"] > got["window_received"]
    peaks = got["peak_rss_mib"]
    assert {"fleet-0", "fleet-1", "coordinator", "mosquitto"} <= set(peaks)
    assert all(math.isfinite(v) and v > 0 for v in peaks.values())
    assert f"completed rounds | {ROUNDS} of {ROUNDS}" in proc.stdout
