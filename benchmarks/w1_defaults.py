"""W1 (digits-8): how `meshfl local`'s defaults were chosen, and what they achieve.

Part 1 sweeps algorithm × codec density × consensus step γ × topology in lockstep (the
agents' own Trainer and gossip code in one process, every message delivered) over
several model seeds. Part 2 runs real fleets (`meshfl local`: embedded broker,
coordinator, 8 agent processes) for the default and the D-PSGD baselines, repeated.

    python benchmarks/w1_defaults.py               # both parts (about 6 minutes on 2 cores)
    python benchmarks/w1_defaults.py --part sweep  # lockstep sweep only
    python benchmarks/w1_defaults.py --part fleet --repeats 3
    python benchmarks/w1_defaults.py --part long   # 300 rounds, keyframes on and off
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from meshfl.app.local.config import DEFAULTS
from meshfl.app.local.lab.lockstep import run_lockstep

SWEEP = [
    ("dpsgd", "identity", 1.0, "ring"),
    *[
        ("choco", f"topk:{d}", g, "ring")
        for d in (0.05, 0.1, 0.15, 0.2)
        for g in (0.5, 0.8, 0.9, 1.0)
    ],
    ("dpsgd", "identity", 1.0, "exponential"),
    *[("choco", f"topk:{d}", g, "exponential") for d in (0.1, 0.15) for g in (0.5, 0.9)],
]
PLAIN = ["--local-momentum", "0"]  # the baselines and the former default: plain SGD
FLEET = [
    ("default (choco sign γ 1, complete, local momentum 0.9)", []),
    ("former default (choco topk:0.15 γ 0.9, ring)",
     ["--codec", "topk:0.15", "--consensus-step", "0.9", "--topology", "ring", *PLAIN]),
    ("dpsgd identity ring",
     ["--algorithm", "dpsgd", "--codec", "identity", "--topology", "ring", *PLAIN]),
    ("dpsgd identity exponential",
     ["--algorithm", "dpsgd", "--codec", "identity", "--topology", "exponential", *PLAIN]),
]  # fmt: skip


def sweep(seeds: list[int]) -> None:
    print(f"## lockstep sweep: W1, 30 rounds, model seeds {seeds} (partition seed 0)")
    print("algorithm codec γ topology | mean final acc | last-3 mean | payload B/round/device")
    for algorithm, codec, gamma, topology in SWEEP:
        config = replace(DEFAULTS, algorithm=algorithm, codec=codec, consensus_step=gamma,
                         topology=topology, local_momentum=0.0)  # fmt: skip
        runs = [run_lockstep(config, model_seed=s) for s in seeds]
        final = statistics.mean(r.final for r in runs)
        last3 = statistics.mean(statistics.mean(r.mean_accuracy[-3:]) for r in runs)
        per_device = runs[0].payload_bytes[-1] / config.agents
        print(f"{algorithm:5} {codec:10} {gamma:4} {topology:11} | {final:.4f} | {last3:.4f}"
              f" | {per_device:,.0f}", flush=True)  # fmt: skip


def fleet(repeats: int) -> None:
    print(f"## fleet: `meshfl local` (8 agent processes, embedded broker), {repeats} runs each")
    print("setting | median final mean acc | median min acc | payload sent MB | median wall s")
    for name, args in FLEET:
        reports = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, "-m", "meshfl", "local", "--out", tmp, *args]
                subprocess.run(cmd, check=True, capture_output=True)
                reports.append(json.loads((Path(tmp) / "report.json").read_text())["final"])
        acc = statistics.median(r["mean_accuracy"] for r in reports)
        low = statistics.median(r["min_accuracy"] for r in reports)
        sent = statistics.median(r["bytes_sent_total"] for r in reports) / 1e6
        wall = statistics.median(r["wall_s"] for r in reports)
        print(f"{name} | {acc:.4f} | {low:.4f} | {sent:.3f} | {wall:.1f}", flush=True)


def long_run(rounds: int) -> None:
    print(f"## long run: lockstep, default settings, {rounds} rounds, model seed 0")
    print("keyframe threshold | acc @30 | @100 | @200 | @last | payload B/round/device")
    for threshold in (0.0, DEFAULTS.keyframe_growth):
        run = run_lockstep(replace(DEFAULTS, rounds=rounds, keyframe_growth=threshold))
        acc = run.mean_accuracy
        per_device = sum(run.payload_bytes) / (rounds * DEFAULTS.agents)
        print(f"{threshold:18} | {acc[29]:.4f} | {acc[99]:.4f} | {acc[199]:.4f} | {acc[-1]:.4f}"
              f" | {per_device:,.0f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["sweep", "fleet", "long", "all"], default="all")
    parser.add_argument("--long-rounds", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("workload: W1 digits-8 (docs/workloads.md)")
    print("command: python benchmarks/w1_defaults.py " + " ".join(sys.argv[1:]))
    print("machine:", describe())
    if args.part in ("sweep", "all"):
        sweep(list(range(args.seeds)))
    if args.part in ("fleet", "all"):
        fleet(args.repeats)
    if args.part in ("long", "all"):
        long_run(args.long_rounds)


if __name__ == "__main__":
    main()
