"""W2 with 16 devices: rounds and bytes to target per topology, next to its spectral gap.

Lockstep fleets (the agents' own trainer and gossip code, every message delivered) on
W2 — mnist1d, 16 devices, Dirichlet(0.3), the 1-D CNN ``cnn1d`` [25, 25, 25] — with
uncompressed D-PSGD so that only the graph differs. WORKLOADS.md fixes no W2 training
schedule; this one is SGD lr 0.3, batch 32, 3 local epochs per round (W1's lr 0.1 and
one epoch leave W2 near 30 % after 40 rounds). ``one-peer-exponential`` is time-varying:
round r mixes with one matching (Ying et al. 2021) while every device hears the union
graph, as meshfl agents do; its gap is that of the union's Metropolis–Hastings matrix.

Bytes: payload uploaded per device to the target, and through the broker
``(1 + d) · N · M`` a round, where d is the number of devices that *hear* a message
(for one-peer-exponential the union degree: meshfl publishes each message once on the
device's delta topic).

    python benchmarks/w2_topologies.py                 # 80 rounds, about 10 minutes
    python benchmarks/w2_topologies.py --rounds 40 --topologies ring complete
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from meshfl.app.local.config import DEFAULTS
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.topology import build_graph, exponential, metropolis_hastings, spectral_gap

TOPOLOGIES = ["ring", "torus", "exponential", "one-peer-exponential", "complete"]
TARGETS = (0.8, 0.9)
MODEL = {"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25]}
N = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--topologies", nargs="+", default=TOPOLOGIES)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(f"workload: W2 (mnist1d, {N} devices, Dirichlet 0.3, cnn1d), D-PSGD, lr 0.3,"
          f" 3 local epochs, {args.rounds} rounds, one seed")  # fmt: skip
    print(f"command: python benchmarks/w2_topologies.py --rounds {args.rounds}")
    print(f"machine: {describe()}")
    config = replace(DEFAULTS, dataset="mnist1d", agents=N, alpha=0.3, algorithm="dpsgd",
                     codec="identity", learning_rate=0.3, local_epochs=3,
                     rounds=args.rounds)  # fmt: skip
    header = " | ".join(f"round to {t:.0%} | MB/device | broker MB" for t in TARGETS)
    print(f"\ntopology | gap | degree heard | final acc | {header}")
    rows = []
    for kind in args.topologies:
        union = exponential(N) if kind == "one-peer-exponential" else build_graph(kind, N)
        gap = spectral_gap(metropolis_hastings(union))
        heard = 2 * len(union.edges) / N
        result = run_lockstep(replace(config, topology=kind), model_seed=0, model=MODEL)
        row: dict[str, object] = {"topology": kind, "gap": gap, "degree_heard": heard,
                                  "final": result.mean_accuracy[-1],
                                  "mean_accuracy": result.mean_accuracy}  # fmt: skip
        cells = []
        for target in TARGETS:
            hit = next((r for r, a in enumerate(result.mean_accuracy, 1) if a >= target), None)
            if hit is None:
                cells.append("not reached | – | –")
                row[f"to_{target}"] = None
                continue
            uploaded = sum(result.payload_bytes[:hit])
            row[f"to_{target}"] = {"round": hit, "uploaded_bytes": uploaded}
            cells.append(f"{hit} | {uploaded / N / 1e6:.3f} | {(1 + heard) * uploaded / 1e6:.2f}")
        rows.append(row)
        print(f"{kind} | {gap:.4f} | {heard:.1f} | {result.mean_accuracy[-1]:.4f} | "
              + " | ".join(cells), flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
