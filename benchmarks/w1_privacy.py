"""W1 (digits-8) with privacy on: secure aggregation, and DP at ε = 8 and ε = 2.

Each setting is a real fleet (`meshfl local`: embedded broker, coordinator, 8 agent
processes, ring, 30 rounds) against the same run without the protection. Reported:
final mean/min accuracy, payload bytes sent, wall seconds from fleet start to the job's
end and per round, and — for DP — the ε the coordinator's RDP accountant recorded.

    python benchmarks/w1_privacy.py                 # every setting, once (about 8 minutes)
    python benchmarks/w1_privacy.py --only secure   # settings whose name contains "secure"
    python benchmarks/w1_privacy.py --smoke         # 3 agents, 2 rounds: the script still works

σ for a target ε (δ = 1e-5, sampling rate 1): 30 releases (plain gossip, one a round)
σ = 3.49 for ε = 8 and 11.8 for ε = 2; 60 releases (secure aggregation on a ring: one per
neighbour a round) σ = 4.94 for ε = 8 (docs/privacy.md).
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

SETTINGS: list[tuple[str, list[str]]] = [
    ("plain int8", ["--codec", "int8", "--keyframe-growth", "0"]),
    ("secure int8 (t=2)", ["--secure-aggregation", "2"]),
    ("plain identity", ["--codec", "identity", "--keyframe-growth", "0"]),
    ("secure identity (t=2)", ["--secure-aggregation", "2", "--codec", "identity"]),
    ("plain topk:0.15 (default)", []),
    ("DP local ε=8 (σ 3.49, C 1)", ["--dp-noise-multiplier", "3.49", "--dp-clip", "1.0"]),
    ("DP local ε=2 (σ 11.8, C 1)", ["--dp-noise-multiplier", "11.8", "--dp-clip", "1.0"]),
    ("secure + DP distributed ε=8 (σ 4.94, C 1)",
     ["--secure-aggregation", "2", "--dp-mode", "distributed", "--dp-noise-multiplier", "4.94",
      "--dp-clip", "1.0"]),
]  # fmt: skip


def run(args: list[str], smoke: bool) -> dict[str, object]:
    extra = ["--agents", "3", "--rounds", "2"] if smoke else []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "meshfl", "local", "--out", tmp, *extra, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        report: dict[str, object] = json.loads((Path(tmp) / "report.json").read_text())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the settings whose name contains this")
    parser.add_argument("--smoke", action="store_true", help="tiny fleet (tests)")
    options = parser.parse_args()
    print("# W1 with privacy: `meshfl local`, 8 agents, ring, 30 rounds (docs/workloads.md)")
    print(f"command: python benchmarks/w1_privacy.py{' --smoke' if options.smoke else ''}")
    print(f"machine: {describe()}")
    print("setting | final mean acc | min acc | payload MB sent | wall s | s/round | ε spent")
    for name, args in SETTINGS:
        if options.only not in name:
            continue
        report = run(args, options.smoke)
        final = report["final"]  # type: ignore[index]
        rounds = max(1, final["rounds_completed"])  # type: ignore[index]
        eps = [d["epsilon_spent"] for d in report["devices"] if d.get("epsilon_spent")]  # type: ignore[index, union-attr]
        spent = f"{statistics.median(eps):.2f}" if eps else "-"
        print(
            f"{name} | {final['mean_accuracy']:.4f} | {final['min_accuracy']:.4f}"  # type: ignore[index]
            f" | {final['bytes_sent_total'] / 1e6:.3f} | {final['wall_s']:.1f}"  # type: ignore[index]
            f" | {final['wall_s'] / rounds:.2f} | {spent}",  # type: ignore[index]
            flush=True,
        )


if __name__ == "__main__":
    main()
