"""``meshfl local --in-process 2``: 8 agents as threads of 2 processes, on Mosquitto.

The job is the synchronous, fault-free one of ``test_local.py``, so the fleet must compute
exactly what the lockstep reference computes, although its agents share two processes
(and their torch) instead of having one each.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from broker.mosquitto import MosquittoProcess
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.run import LocalConfig, run_local

pytestmark = pytest.mark.e2e


def test_eight_agents_in_two_processes_compute_what_lockstep_computes(
    tmp_path: Path, mosquitto_process: MosquittoProcess
) -> None:
    config = LocalConfig(agents=8, rounds=4, topology="ring", seed=0, in_process=2,
                         broker=mosquitto_process.url, out=tmp_path / "run")  # fmt: skip

    result = run_local(config)

    report = result.report
    assert result.failed_agents == {}
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4]
    assert all(r["devices_reporting"] == 8 for r in report["rounds"])
    lockstep = run_lockstep(LocalConfig(agents=8, rounds=4, topology="ring", seed=0))
    np.testing.assert_allclose([r["mean_accuracy"] for r in report["rounds"]],
                               lockstep.mean_accuracy, atol=1e-9)  # fmt: skip
    # two agent processes ran, four agents each, each agent its own MQTT client/session
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.glob("fleet-*.log")) == ["fleet-0.log", "fleet-1.log"]
    assert not list(logs.glob("device-*.log"))
    for k, names in ((0, range(4)), (1, range(4, 8))):
        text = (logs / f"fleet-{k}.log").read_text()
        assert {f"device-{i}" for i in names} <= set(re.findall(r"\[(device-\d+)\]", text))
        assert "fleet of 4 agents ended: 0 failed; peak RSS" in text
    ids = {d["name"]: d["id"] for d in report["devices"]}
    connected = set(
        re.findall(
            r"New client connected from \S+ as (dev-\S+) ", mosquitto_process.log_path.read_text()
        )
    )
    assert connected == set(ids.values()) and len(connected) == 8
    totals = report["ledger"]["totals"]
    assert totals["unrecovered_losses"] == totals["applied_twice"] == 0
