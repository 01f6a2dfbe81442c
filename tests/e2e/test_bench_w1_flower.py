"""The W1-vs-Flower benchmark in smoke mode: Flower's gRPC engine and meshfl, 2 × 2 rounds,
from the repository alone (W1's partition is benchmarks/data/).

The script creates Flower's own venv (``.venv-flower``: flwr, with this venv's torch
seen after its own packages; Ray only when the simulation engine is asked for, which this
smoke run does not) if it is missing: about 40 s the first time on a loaded 2-core
machine (about a minute more with its own copy of torch); the run itself about 50 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "w1_flower.py"


def test_smoke_runs_flower_grpc_and_meshfl_to_the_end(tmp_path: Path) -> None:
    out, plot = tmp_path / "w1.json", tmp_path / "w1.png"

    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(out), "--out", str(plot)],
        capture_output=True,
        text=True,
        timeout=900,  # the first run installs flwr into .venv-flower
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workload: W1" in proc.stdout and "machine:" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["engines"]) == {"grpc", "meshfl"}, result["unavailable"]
    assert result["unavailable"] == {}
    flower, meshfl = result["engines"]["grpc"][0], result["engines"]["meshfl"][0]
    for run in (flower, meshfl):
        assert [r["round"] for r in run["rounds"]] == [1, 2]
        for r in run["rounds"]:
            assert 0.0 < r["accuracy"] <= 1.0
            assert r["bytes_up"] > 0 and r["bytes_down"] > 0
            assert 0.0 < r["run_s"] < r["wall_s"]
    # Flower sends the whole MLP (4,810 float32 + 4 npy headers) to and from each client.
    for run in (flower,):
        assert all(r["bytes_up"] == r["bytes_down"] == 2 * 19_752 for r in run["rounds"])
        assert all(r["clients"] == 2 for r in run["rounds"])
        assert run["rounds"][0]["accuracy"] != run["rounds"][1]["accuracy"]  # it trained
    assert flower["rss"]["flower client"]["processes"] == 2
    assert flower["rss"]["flower server"]["max_mib"] > 0
    # Two agents, forked from the zygote; each one's ONNX export runs in a short fork of it
    # with the same command line, so it may be sampled as one more agent process.
    assert meshfl["rss"]["meshfl agent"]["processes"] >= 2
    assert meshfl["rss"]["meshfl coordinator"]["max_mib"] > 0
    assert plot.stat().st_size > 0
