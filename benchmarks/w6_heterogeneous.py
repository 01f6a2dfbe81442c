"""W6 (heterogeneous fleet): time to W1's 85 % target, with and without planning, and async.

W1 (8 agent processes, embedded broker, coordinator) on emulated edge devices (docs/
workloads.md): every training step takes at least 50 ms (``--step-time 0.05``, the agent
sleeping the difference, so that eight agents on two cores are not what decides), 200 ms
on devices 1 and 5 (``--slow 4``), and device 3 on a 1 Mbit/s,
200 ms round-trip link (a shaping proxy between it and the broker: ``--link``). Three
schedules, each ``--repeats`` times, interleaved so that machine noise hits all alike:

(a) ``sync``  — synchronous rounds, no planning (every round waits for every neighbour);
(b) ``plan``  — capability-aware planning: local work cut only where training would hold
    a round, the slow link a sparser codec, one edge, and a neighbour that mixes its
    latest state instead of waiting for it;
(c) ``async`` — AD-PSGD-style gossip with bounded staleness τ = 3 (Hop-style skipping);

and, as the ceiling any schedule could reach, ``ideal``: the same job with no slowed
device and no slow link.

The time to the target is the first moment (coordinator clock, since the job started)
the mean of the eight devices' latest reported test accuracies reached it
(``report.json``'s ``time_to_accuracy_live``): rounds need not align when a slow link
lags. The round-aligned figure (the first round whose summary over all devices reached
it, which waits for the slowest device's report of that round) is printed too.

    python benchmarks/w6_heterogeneous.py                  # 3 repeats, 30 rounds, ~12 min
    python benchmarks/w6_heterogeneous.py --repeats 1 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

EMULATED = ["--step-time", "0.05"]
"""Every device's emulated step time: 50 ms a batch (WORKLOADS.md's W6)."""
HETEROGENEITY = ["--slow", "device-1:4", "--slow", "device-5:4", "--link", "device-3:1mbit:200ms"]
SCHEDULES = {
    "ideal": [],  # the same job with no slowed device and no slow link: the ceiling
    "sync": [],
    "plan": ["--plan"],
    "async": ["--mode", "async", "--staleness", "3"],
}
TARGET = 0.85


def run(name: str, rounds: int, out: Path) -> dict[str, object]:
    """One `meshfl local` run; returns its time to target, final accuracy and wall time."""
    heterogeneity = [] if name == "ideal" else HETEROGENEITY
    command = [sys.executable, "-m", "meshfl", "local", "--rounds", str(rounds),
               *EMULATED, *heterogeneity, *SCHEDULES[name], "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    rounds_ = report["rounds"]
    hit = next((r for r in rounds_ if r["mean_accuracy"] >= TARGET), None)
    live = report["time_to_accuracy_live"][f"{TARGET:.2f}"]
    live_90 = report["time_to_accuracy_live"]["0.90"]
    tail = rounds_[-3:]
    return {
        "seconds_to_target": None if live is None else live["elapsed_s"],
        "seconds_to_90": None if live_90 is None else live_90["elapsed_s"],
        "round_summary_seconds": None if hit is None else hit["elapsed_s"],
        "round_to_target": None if hit is None else hit["round"],
        "final_mean_accuracy": report["final"]["mean_accuracy"],
        "last3_mean_accuracy": statistics.mean(r["mean_accuracy"] for r in tail),
        "wall_s": report["final"]["wall_s"],
        "bytes_sent_total": report["final"]["bytes_sent_total"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="Write all results here.")
    args = parser.parse_args()
    print(f"workload: W6 (W1 on emulated devices: 50 ms a step, 200 ms on devices 1 and 5;"
          f" device 3 on 1 Mbit/s 200 ms RTT),"
          f" {args.rounds} rounds, target {TARGET:.0%}")  # fmt: skip
    print(f"command: python benchmarks/w6_heterogeneous.py --repeats {args.repeats}"
          f" --rounds {args.rounds}")  # fmt: skip
    print(f"machine: {describe()}")
    results: dict[str, list[dict[str, object]]] = {name: [] for name in SCHEDULES}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in SCHEDULES:
                result = run(name, args.rounds, Path(tmp) / f"{name}-{repeat}")
                results[name].append(result)
                print(f"  {name:5} run {repeat + 1}: {result}", flush=True)
    print(
        f"\nschedule | median s to {TARGET:.0%} | s to 90% | round-aligned s | median round"
        " | final mean acc (median) | median wall s | speed-up vs sync"
    )
    base = _median(results["sync"], "seconds_to_target")
    for name, runs in results.items():
        seconds = _median(runs, "seconds_to_target")
        speedup = f"{base / seconds:.2f}x" if base and seconds else "n/a"
        print(f"{name:5} | {_fmt(seconds)} | {_fmt(_median(runs, 'seconds_to_90'))}"
              f" | {_fmt(_median(runs, 'round_summary_seconds'))}"
              f" | {_fmt(_median(runs, 'round_to_target'))}"
              f" | {_fmt(_median(runs, 'final_mean_accuracy'), 4)}"
              f" | {_fmt(_median(runs, 'wall_s'))} | {speedup}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


def _median(runs: list[dict[str, object]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if r[key] is not None]  # type: ignore[arg-type]
    if len(values) < len(runs):  # a run that never reached it: no median time
        return None
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "not reached" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
