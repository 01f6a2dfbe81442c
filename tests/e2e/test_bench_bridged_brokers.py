"""The bridged-broker benchmark in smoke mode: 4 agents, 3 rounds, on one and on two brokers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # two meshfl local fleets on Mosquitto: about 15 s

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bridged_brokers.py"


def test_smoke_runs_both_layouts_to_the_lockstep_result() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"], capture_output=True, text=True, timeout=300
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workload: W1" in proc.stdout and "machine:" in proc.stdout
    rows = {
        cells[0]: cells[1:]
        for line in proc.stdout.splitlines()
        if len(cells := [c.strip() for c in line.split("|")]) == 8 and cells[2] in ("True", "False")
    }
    one, two = rows["one Mosquitto"], rows["two bridged Mosquitto"]
    assert one[0] == two[0] and one[1] == two[1] == "True"  # same accuracy, = lockstep
    assert one[4] == two[4]  # the same payload published
    # Every delta crosses the bridge once more: more bytes into and out of the brokers.
    assert float(two[5]) > float(one[5]) > 0 and float(two[6]) > float(one[6]) > 0
