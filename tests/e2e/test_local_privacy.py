"""``meshfl local`` with privacy on: real agent processes, the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_errors import assert_one_line_error, meshfl

pytestmark = pytest.mark.e2e


def test_secure_aggregation_with_distributed_dp_runs_and_accounts_epsilon(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "meshfl", "local", "--agents", "4", "--rounds", "3",
         "--topology", "ring", "--secure-aggregation", "2", "--dp-mode", "distributed",
         "--dp-noise-multiplier", "1.0", "--dp-clip", "1.0", "--dp-epsilon-budget", "200",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "secure aggregation: codec int8" in proc.stdout
    assert "ε spent per device" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert all(d["missing_rounds"] == [] for d in report["devices"])
    # Ring: two releases a round (one per aggregator), σ = 1 (σ/2 per 2C), 3 rounds: ε ≈ 34.
    spent = [d["epsilon_spent"] for d in report["devices"]]
    assert all(s is not None and 5 < s < 200 for s in spent), spent
    assert report["config"]["secure_aggregation"] == 2
    # A private job publishes no model and reports no sketch (issue 23 item 3).
    assert report["onnx"]["consensus"]["error"].startswith("not built: in a private job")
    assert report["artifacts"].get("consensus") is None or not report["artifacts"]["devices"]
    assert not (out / "consensus.onnx").exists()
    logs = "".join(p.read_text() for p in (out / "logs").glob("device-*.log"))
    assert "secure aggregation: threshold 2" in logs
    assert "could not unmask" not in logs and "aborted" not in logs


def test_privacy_options_that_cannot_work_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    out = str(tmp_path / "run")
    assert_one_line_error(
        meshfl("local", "--secure-aggregation", "2", "--codec", "topk:0.1", "--out", out),
        "topk",
        "randk",
    )
    assert_one_line_error(
        meshfl("local", "--secure-aggregation", "2", "--robust", "median", "--out", out),
        "median",
        "secure aggregation",
    )
    assert_one_line_error(
        meshfl("local", "--dp-mode", "distributed", "--dp-noise-multiplier", "1",
               "--dp-clip", "1", "--out", out),
        "distributed", "--secure-aggregation",
    )  # fmt: skip
    assert_one_line_error(meshfl("local", "--robust", "trimmed:0.7", "--out", out), "trimmed")
    assert not (tmp_path / "run" / "report.json").exists()


def test_a_job_past_the_privacy_budget_is_refused_at_the_start(tmp_path: Path) -> None:
    proc = meshfl("local", "--agents", "3", "--rounds", "30", "--dp-noise-multiplier", "1",
                  "--dp-clip", "1", "--dp-epsilon-budget", "2", "--out", str(tmp_path / "r"),
                  timeout=240)  # fmt: skip

    assert_one_line_error(proc, "--dp-epsilon-budget 2", "ε =")


def test_a_threshold_above_the_degree_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = meshfl("local", "--agents", "3", "--secure-aggregation", "3",
                  "--out", str(tmp_path / "r"))  # fmt: skip

    assert_one_line_error(proc, "threshold 3 exceeds the 2 neighbours")
