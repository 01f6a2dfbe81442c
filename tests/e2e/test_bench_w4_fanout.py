"""W4's fan-out benchmark in smoke mode: meshfl engines and raw paho on one Mosquitto.

4 agents on a ring, 3 measured rounds (after 1 warm-up), 64 KiB deltas: about a second.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a Mosquitto process, 8 MQTT clients: about 1 s

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "w4_fanout.py"
AGENTS, DEGREE, ROUNDS, DELTA_BYTES = 4, 2, 3, 65_536


def test_smoke_delivers_every_message_on_both_sides_with_the_same_bytes(tmp_path: Path) -> None:
    out = tmp_path / "w4.json"

    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workload: W4" in proc.stdout and "machine:" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["agents"], row["graph"], row["degree"]) == (AGENTS, "ring", DEGREE)
    (run,) = row["repeats"]
    message_bytes = run["message_bytes"]
    assert len(message_bytes) == AGENTS and run["chunks_per_message"] == 1
    # A message is the float32 delta plus the envelope and one chunk header: < 1 % more.
    assert all(DELTA_BYTES < b < DELTA_BYTES * 1.01 for b in message_bytes), message_bytes
    per_round = DEGREE * sum(message_bytes)  # on a ring every message reaches 2 neighbours
    for side in ("meshfl", "raw"):
        figures = run[side]
        assert figures["messages_sent"] == AGENTS * ROUNDS
        assert figures["deliveries"] == figures["deliveries_expected"] == AGENTS * ROUNDS * DEGREE
        assert figures["chunks_delivered"] == AGENTS * ROUNDS * DEGREE
        assert figures["delivered_bytes"] == [per_round] * ROUNDS, side
        assert len(figures["round_s"]) == ROUNDS and all(t > 0 for t in figures["round_s"])
    meshfl = run["meshfl"]
    assert meshfl["missing"] == 0 and meshfl["rejected"] == 0 and meshfl["model_finite"]
    assert meshfl["resent"] == 0 and meshfl["inbox_bytes"] == 0  # nothing needed a repair
    ratio = row["goodput_ratio"]
    assert math.isfinite(ratio) and ratio > 0
    expected = row["meshfl"]["median_goodput_mb_s"] / row["raw"]["median_goodput_mb_s"]
    assert ratio == pytest.approx(expected)
