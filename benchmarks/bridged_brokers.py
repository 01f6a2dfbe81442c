"""Bridged brokers: W1 on one Mosquitto, then on two bridged ones (half the agents on each).

Both runs are `meshfl local` fleets (coordinator, agent processes) on Mosquitto with the
project's config and ``$SYS`` statistics every second; the bridged run is
``meshfl local --brokers 2`` (broker/bridge.py, docs/scaling.md). A synchronous,
fault-free job computes exactly what the lockstep reference computes, so both final
accuracies are checked against it. Broker bytes are Mosquitto's ``$SYS/broker/bytes/
received`` and ``/sent`` after the job, summed over the brokers: everything on the wire
to and from them (MQTT headers, the agents' link probes, statuses, control, the bridge).

    python benchmarks/bridged_brokers.py             # W1: 8 agents, 30 rounds (about 1 min)
    python benchmarks/bridged_brokers.py --smoke     # 4 agents, 3 rounds
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from broker.bridge import BridgedBrokers
from edge_agent.transport.mqtt_utils import sys_bytes
from meshfl.app.local.bridged import SYS_INTERVAL_S
from meshfl.app.local.config import DEFAULTS, LocalConfig
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.run import run_local


def one_broker(
    config: LocalConfig, tmp: Path
) -> tuple[dict[str, Any], float, list[dict[str, Any]]]:
    """The job on one Mosquitto (started here with $SYS on); (report, seconds, bytes)."""
    with BridgedBrokers(tmp / "broker", 1, sys_interval_s=SYS_INTERVAL_S) as single:
        began = time.monotonic()
        report = run_local(replace(config, broker=single.urls[0], out=tmp / "run")).report
        elapsed = time.monotonic() - began
        moved = [{"url": single.urls[0], **(sys_bytes(single.urls[0]) or {})}]
    return report, elapsed, moved


def bridged(config: LocalConfig, tmp: Path) -> tuple[dict[str, Any], float, list[dict[str, Any]]]:
    """The job with ``--brokers 2``; (report, seconds, bytes read by the run itself)."""
    began = time.monotonic()
    report = run_local(replace(config, brokers=2, out=tmp / "run")).report
    return report, time.monotonic() - began, report["brokers"]["bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="4 agents, 3 rounds")
    args = parser.parse_args()
    config = replace(DEFAULTS, agents=4, rounds=3) if args.smoke else DEFAULTS
    print("workload: W1 digits-8 (docs/workloads.md)" + (" smoke" if args.smoke else ""))
    print("command: python benchmarks/bridged_brokers.py " + " ".join(sys.argv[1:]))
    print("machine:", describe())
    reference = run_lockstep(config).mean_accuracy[-1]
    job = f"{config.agents} agents, {config.rounds} rounds, {config.algorithm} {config.codec}"
    print(f"{job}, {config.topology}; lockstep reference final mean accuracy {reference:.4f}")
    print("layout | final mean acc | = lockstep | job wall s | total s | payload MB |"
          " broker MB in | broker MB out")  # fmt: skip
    for name, run in (("one Mosquitto", one_broker), ("two bridged Mosquitto", bridged)):
        with tempfile.TemporaryDirectory() as tmp:
            report, elapsed, moved = run(config, Path(tmp))
        final = report["final"]
        received = sum(m.get("received") or 0 for m in moved) / 1e6
        sent = sum(m.get("sent") or 0 for m in moved) / 1e6
        same = abs(final["mean_accuracy"] - reference) <= 1e-9
        print(f"{name} | {final['mean_accuracy']:.4f} | {same} | {final['wall_s']:.1f} |"
              f" {elapsed:.1f} | {final['bytes_sent_total'] / 1e6:.3f} | {received:.3f} |"
              f" {sent:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
