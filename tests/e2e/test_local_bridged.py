"""``meshfl local --brokers 2``: half the agents on each of two bridged Mosquitto brokers.

The job is the synchronous, fault-free one of ``test_local.py``, so the fleet must compute
exactly what the lockstep reference computes, although every delta between the two halves
crossed the bridge.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.run import LocalConfig, run_local
from meshfl.errors import ConfigError

pytestmark = pytest.mark.e2e


def devices_in_log(log: Path) -> set[str]:
    """Device client ids (``dev-...``) Mosquitto logged as connected."""
    return set(re.findall(r"New client connected from \S+ as (dev-\S+) ", log.read_text()))


def test_a_fleet_on_two_bridged_brokers_computes_what_lockstep_computes(tmp_path: Path) -> None:
    config = LocalConfig(agents=4, rounds=10, topology="ring", seed=0, brokers=2,
                         out=tmp_path / "run")  # fmt: skip

    result = run_local(config)

    report = result.report
    assert [r["round"] for r in report["rounds"]] == list(range(1, 11))
    lockstep = run_lockstep(LocalConfig(agents=4, rounds=10, topology="ring", seed=0))
    np.testing.assert_allclose([r["mean_accuracy"] for r in report["rounds"]],
                               lockstep.mean_accuracy, atol=1e-9)  # fmt: skip
    # two agents really ran on each broker, as the report says
    brokers = report["brokers"]
    hub, leaf = brokers["urls"]
    assert brokers["agents"] == {"device-0": hub, "device-1": leaf, "device-2": hub,
                                 "device-3": leaf}  # fmt: skip
    ids = {d["name"]: d["id"] for d in report["devices"]}
    directory = Path(brokers["directory"])
    on_hub = devices_in_log(directory / "broker-0" / "mosquitto.log")
    on_leaf = devices_in_log(directory / "broker-1" / "mosquitto.log")
    assert on_hub == {ids["device-0"], ids["device-2"]}
    assert on_leaf == {ids["device-1"], ids["device-3"]}
    # on a ring of 4 every agent has a neighbour on the other broker; nothing was lost
    totals = report["ledger"]["totals"]
    received = 2 * len(report["topology"]["edges"]) * 10
    assert (totals["sent"], totals["applied"], totals["delivered"]) == (40, received, received)
    assert totals["applied_twice"] == totals["unrecovered_losses"] == 0
    # each broker's $SYS byte counters were read after the job
    assert [b["url"] for b in brokers["bytes"]] == [hub, leaf]
    assert all(b["received"] > 0 and b["sent"] > 0 for b in brokers["bytes"])


def test_the_cli_refuses_bridged_brokers_with_a_given_broker(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meshfl", "local", "--brokers", "2", "--broker",
         "mqtt://127.0.0.1:1883", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert proc.returncode != 0
    assert (
        "--brokers 2 starts its own bridged Mosquitto brokers and does not combine with"
        " --broker" in proc.stdout + proc.stderr
    )
    with pytest.raises(ConfigError, match="--brokers must be between 1 and 8"):
        run_local(LocalConfig(brokers=9, out=tmp_path))
