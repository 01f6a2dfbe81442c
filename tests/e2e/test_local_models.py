"""``meshfl local --model``: a user model by import path, through real agent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NETS = """
from torch import nn

def make_net(input_dim, num_classes, width=16):
    return nn.Sequential(nn.Linear(input_dim, width), nn.Tanh(), nn.Linear(width, num_classes))
"""


def test_a_user_model_trains_on_a_local_fleet_and_a_bad_one_is_refused_first(
    tmp_path: Path,
) -> None:
    package = tmp_path / "lib" / "usernets_e2e"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(NETS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib")}  # the agents import it too
    out = tmp_path / "run"
    common = [sys.executable, "-m", "meshfl", "local", "--agents", "2", "--rounds", "1"]

    proc = subprocess.run(
        [*common, "--out", str(out), "--model", "usernets_e2e.nets:make_net",
         "--model-kwargs", '{"input_dim": 64, "num_classes": 10, "width": 12}'],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    bad = subprocess.run(
        [*common, "--out", str(tmp_path / "bad"), "--model", "usernets_e2e.nets:make_net",
         "--model-kwargs", '{"input_dim": 64, "num_classes": 7}'],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1]
    assert all(d["missing_rounds"] == [] for d in report["devices"])
    assert report["config"]["model"] == "usernets_e2e.nets:make_net"
    # Refused on the operator's machine before any process starts, in one line.
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "expected (2, 10)" in bad.stderr and not (tmp_path / "bad" / "logs").exists()
