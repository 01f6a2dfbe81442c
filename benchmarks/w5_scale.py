"""W5 scale: 256 in-process agents, a tiny model, a random 4-regular graph, one Mosquitto.

The fleet is ``meshfl local --in-process K`` (meshfl/app/local/inprocess.py): a coordinator
and K ``meshfl agent fleet`` processes, each running its share of the agents as threads
(every agent with its own identity, REST client and MQTT session), on one Mosquitto
started here with the project's config and ``$SYS`` statistics every second. The model
is W5's "tiny model": the zoo's default MLP (one hidden layer of 64) on MNIST-1D (3,274
parameters; MNIST-1D's 4,000 training samples give each of 256 agents 5 or more under
Dirichlet α = 1), CHOCO-SGD with top-k 15 %, synchronous rounds.

Broker bytes. A recorder subscribes to ``$SYS/broker/bytes/+`` and
``$SYS/broker/publish/messages/+`` for the whole run and keeps every update with its
time. The *job window* runs from the first update after every agent enrolled and measured its
link through the broker (start-up traffic, reported apart; the job is created only after
that update, through ``run_local``'s ``on_enrolled`` hook) to the first update after every
agent process had ended. Everything in it is
counted: the job's rounds, its keyframes, the job's statuses and the agents' ``offline``
statuses at the end, MQTT headers and PUBACKs. Bytes per round = window bytes / rounds.
The target compares them with (1 + d) × N × M: d the graph's mean degree, N the agents,
M the mean bytes an agent published per round as the agents report them (the rounds'
``bytes_sent``, MQTT payload bytes: deltas, keyframes, statuses). The broker receives
each delta once and sends it to d neighbours. A message re-sent on a neighbour's request
(a repair: it was late, not necessarily lost) goes to that neighbour's inbox only, so a
second ratio counts each message at its own fan-out: published ones 1 + d times, re-sent
ones twice, at the mean message size (the ledger counts messages, not their bytes).

    python benchmarks/w5_scale.py            # W5: 256 agents in 2 processes, 20 rounds
    python benchmarks/w5_scale.py --smoke    # 16 agents in 2 processes, 3 rounds

K = 2 by default: one fleet process per core of the 2-core machine the figures were
measured on. A process runs Python on one core at a time (the GIL) and torch with one
intra-op thread, so more processes than cores add torch copies (about 300 MiB each) and
no CPU; fewer leave a core to the coordinator and Mosquitto alone.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from broker.bridge import BridgedBrokers
from meshfl.app.local.config import DEFAULTS, LocalConfig
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.processes import Supervisor
from meshfl.app.local.run import run_local
from meshfl.contract import RoundSummary

SYS_TOPICS = ("$SYS/broker/bytes/+", "$SYS/broker/publish/messages/+")
LOCKSTEP_MAX = 10
"""The lockstep reference numbers devices 0..N-1; the coordinator orders them by name, so
past device-9 ("device-10" < "device-2") the two give devices different graph positions
and seeds, and the accuracies differ although both are right."""
KEYS = ("bytes/received", "bytes/sent", "messages/received", "messages/sent")


class SysRecorder:
    """Every ``$SYS`` byte and PUBLISH counter update of one Mosquitto, with its time.

    ``snapshots`` holds ``(time.monotonic(), {key: value})`` with all of :data:`KEYS`,
    one per live update. The recorder's own ``$SYS`` traffic (a few hundred bytes a
    second) is in the counters too.
    """

    def __init__(self, url: str):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        from edge_agent.transport.address import parse_broker_address

        self.snapshots: list[tuple[float, dict[str, int]]] = []
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()
        address = parse_broker_address(url)
        host, port = address.host, address.port
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        self._client.on_message = self._on_message
        self._client.connect(host, port)
        for topic in SYS_TOPICS:
            self._client.subscribe(topic)
        self._client.loop_start()

    def _on_message(self, _c: object, _u: object, message: Any) -> None:
        key = "/".join(message.topic.split("/")[-2:])
        with self._lock:
            self._latest[key] = int(message.payload)
            # Mosquitto republishes a counter only when it changed: the retained value
            # stands until then. A snapshot is taken at each live (non-retained) update.
            if not message.retain and all(k in self._latest for k in KEYS):
                self.snapshots.append((time.monotonic(), dict(self._latest)))

    def before(self, t: float) -> dict[str, int]:
        """The last complete snapshot taken at or before ``t`` (monotonic seconds)."""
        with self._lock:
            found = [s for when, s in self.snapshots if when <= t]
        if not found:
            raise RuntimeError("no $SYS update before the job started")
        return found[-1]

    def wait_update(self, timeout_s: float = 5.0) -> float:
        """Wait for the next snapshot (about 2 s with ``sys_interval 1``); return its time."""
        count = len(self.snapshots)
        deadline = time.monotonic() + timeout_s
        while len(self.snapshots) == count and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(self.snapshots) == count:
            raise RuntimeError(f"no $SYS update within {timeout_s} s")
        return self.snapshots[-1][0]

    def after(self, t: float, timeout_s: float = 5.0) -> dict[str, int]:
        """The first complete snapshot taken after ``t``, waiting for it if need be."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                found = [s for when, s in self.snapshots if when > t]
            if found:
                return found[0]
            time.sleep(0.1)
        raise RuntimeError(f"no $SYS update within {timeout_s} s after the job")

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()


def peak_rss_mib(pid: int) -> float | None:
    """``VmHWM`` of a live process (MiB), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def fleet_peaks(logs: Path) -> dict[str, float]:
    """Each fleet process's own peak RSS (MiB), from the line it logs at its end."""
    peaks = {}
    for log in sorted(logs.glob("fleet-*.log")):
        found = re.findall(r"peak RSS ([\d.]+) MiB", log.read_text(errors="replace"))
        if found:
            peaks[log.stem] = float(found[-1])
    return peaks


def measure(config: LocalConfig, tmp: Path) -> dict[str, Any]:
    """Run the job on a fresh Mosquitto; return the report and the broker's figures."""
    events: dict[str, float] = {}
    settled: list[float] = []
    peaks: dict[str, float] = {}

    def notify(line: str) -> None:
        print("  " + line, flush=True)

    def on_round(summary: RoundSummary, supervisor: Supervisor) -> None:
        settled.append(time.monotonic())
        for child in supervisor.children:  # sampled while they run (the coordinator's peak)
            peak = peak_rss_mib(child.process.pid)
            if peak is not None:
                peaks[child.name] = max(peaks.get(child.name, 0.0), peak)
        print(f"  round {summary['round']}: mean accuracy {summary['mean_accuracy']:.4f},"
              f" {summary['devices_reporting']} devices", flush=True)  # fmt: skip

    with BridgedBrokers(tmp / "broker", 1, sys_interval_s=1, start_timeout_s=30.0) as single:
        url = single.urls[0]
        recorder = SysRecorder(url)
        try:
            began = time.monotonic()

            def enrolled() -> None:  # start-up traffic is over: a $SYS update, then the job
                events["enrolled"] = recorder.wait_update()

            run = run_local(replace(config, broker=url, out=tmp / "run"), on_round,
                            notify=notify, on_enrolled=enrolled)  # fmt: skip
            ended = time.monotonic()  # every agent process has ended (run_local stopped them)
            start = recorder.before(events["enrolled"])
            end = recorder.after(ended)
            mosquitto_peak = peak_rss_mib(int(single.hub.pid_path.read_text()))
        finally:
            recorder.close()
    peaks.update(fleet_peaks(tmp / "run" / "logs"))  # a fleet's own figure covers its end
    if mosquitto_peak is not None:
        peaks["mosquitto"] = mosquitto_peak
    return {"report": run.report, "failed": run.failed_agents, "start": start, "end": end,
            "total_s": ended - began, "peaks": peaks}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="16 agents, 2 processes, 3 rounds")
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2, help="fleet processes (K)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--deadline", type=float, default=120.0, help="round deadline, s")
    parser.add_argument("--no-lockstep", action="store_true", help="skip the lockstep check")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs)")
    args = parser.parse_args()
    agents, rounds = (16, 3) if args.smoke else (args.agents, args.rounds)
    config = replace(
        DEFAULTS, agents=agents, rounds=rounds, in_process=args.processes, dataset="mnist1d",
        alpha=1.0, topology="random-regular", topology_degree=4,
        round_deadline_s=args.deadline,
    )  # fmt: skip
    print("workload: W5 scale (docs/workloads.md)" + (" smoke" if args.smoke else ""))
    print("command: python benchmarks/w5_scale.py " + " ".join(sys.argv[1:]))
    print("machine:", describe())
    print(f"{agents} agents in {args.processes} processes, {rounds} rounds, mnist1d mlp [64],"
          f" {config.algorithm} {config.codec}, random 4-regular graph, one Mosquitto")  # fmt: skip
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        got = measure(config, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            got = measure(config, Path(tmp))
    report, start, end = got["report"], got["start"], got["end"]
    done = report["rounds"]
    n_rounds = len(done)
    edges = report["topology"]["edges"]
    degree = 2 * len(edges) / agents
    payload = sum(r["bytes_sent"] for r in done)
    m = payload / (agents * n_rounds) if n_rounds else 0.0
    received = end["bytes/received"] - start["bytes/received"]
    sent = end["bytes/sent"] - start["bytes/sent"]
    per_round = (received + sent) / max(n_rounds, 1)
    expected = (1 + degree) * agents * m
    ratio = per_round / expected if expected else float("nan")
    elapsed = [r["elapsed_s"] for r in done]
    # Agents send queued round reports as one batch, so rounds' arrival times bunch up:
    # the mean over rounds 2..N, not the median of per-round steps.
    mean_round = (
        (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1) if len(elapsed) > 1 else float("nan")
    )
    # Repairs: a message re-sent on a neighbour's request goes to that one inbox, so the
    # broker moves it twice, not 1 + d times; counted at the mean message size.
    totals = (report.get("ledger") or {}).get("totals") or {}
    first, resent = int(totals.get("sent", 0)), int(totals.get("retransmitted", 0))
    size = payload / (first + resent) if first + resent else 0.0
    fanout_aware = ((1 + degree) * size * first + 2 * size * resent) / max(n_rounds, 1)
    publishes = (end["messages/received"] - start["messages/received"],
                 end["messages/sent"] - start["messages/sent"])  # fmt: skip
    print("quantity | value")
    print(f"completed rounds | {n_rounds} of {rounds}")
    print(f"failed agents | {len(got['failed'])} {sorted(got['failed'])[:5]}")
    print(f"final mean accuracy | {report['final']['mean_accuracy']:.4f}")
    print(f"mean round time s (rounds 2..N) | {mean_round:.3f}")
    print(f"round 1 (from job start) s | {elapsed[0] if elapsed else float('nan'):.3f}")
    print(f"job wall s | {report['final']['wall_s']:.1f}")
    print(f"total s (start-up and teardown included) | {got['total_s']:.1f}")
    print(f"mean degree d | {degree:.3f}")
    print(f"M: mean bytes an agent published per round | {m:.1f}")
    print(f"start-up broker bytes (before the job: enrolment, link probes) |"
          f" {start['bytes/received'] + start['bytes/sent']}")  # fmt: skip
    print(f"broker bytes received in the job window | {received} (N x M x rounds ="
          f" {agents * m * n_rounds:.0f})")  # fmt: skip
    print(f"broker bytes sent in the job window | {sent} (d x N x M x rounds ="
          f" {degree * agents * m * n_rounds:.0f})")  # fmt: skip
    print(f"PUBLISH packets in / out in the job window | {publishes[0]} / {publishes[1]}")
    print(f"broker bytes per round | {per_round:.0f}")
    print(f"(1 + d) x N x M | {expected:.0f}")
    print(f"broker bytes / ((1 + d) x N x M) | {ratio:.4f}")
    print(f"messages published / re-sent on a neighbour's request | {first} / {resent}")
    print(f"broker bytes / (payload at each message's fan-out: 1 + d, re-sent 2) |"
          f" {per_round / fanout_aware if fanout_aware else float('nan'):.4f}")  # fmt: skip
    for name, peak in sorted(got["peaks"].items()):
        print(f"peak RSS MiB {name} | {peak:.1f}")
    if agents > LOCKSTEP_MAX:
        print(f"= lockstep reference (every round) | not checked: more than {LOCKSTEP_MAX} agents")
    elif not args.no_lockstep:
        reference = run_lockstep(replace(config, in_process=0)).mean_accuracy
        same = n_rounds == rounds and all(
            abs(r["mean_accuracy"] - ref) <= 1e-9 for r, ref in zip(done, reference, strict=True)
        )
        print(f"= lockstep reference (every round) | {same}")
    target = n_rounds == rounds and not got["failed"] and abs(ratio - 1) <= 0.05
    if args.json is not None:
        figures = {
            "agents": agents, "processes": args.processes, "rounds": rounds,
            "completed_rounds": n_rounds, "failed_agents": got["failed"],
            "final_mean_accuracy": report["final"]["mean_accuracy"],
            "mean_round_s": mean_round, "job_wall_s": report["final"]["wall_s"],
            "degree": degree, "m_bytes": m, "startup_bytes": start["bytes/received"]
            + start["bytes/sent"], "window_received": received, "window_sent": sent,
            "publishes_in": publishes[0], "publishes_out": publishes[1],
            "bytes_per_round": per_round, "expected_per_round": expected, "ratio": ratio,
            "messages_sent": first, "messages_resent": resent,
            "fanout_aware_per_round": fanout_aware,
            "peak_rss_mib": got["peaks"], "target_met": target,
        }  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=1))
    print(f"W5 target ({agents} agents complete {rounds} rounds; broker bytes within 5 % of"
          f" (1 + d) x N x M) | {'met' if target else 'missed'} ({ratio - 1:+.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
