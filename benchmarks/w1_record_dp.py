"""W1 (digits-8) with record-level DP (DP-SGD on every device) in lockstep.

Eight :class:`edge_agent.trainer.Trainer` objects — the agents' own trainer, running
DP-SGD (``dp_sgd=(σ, C)``: Poisson sampling at q = 32 / n_i, per-example clipping to C,
noise σC) — train one local epoch a round on W1's Dirichlet partition; after each round
their models are mixed exactly: ``fedavg`` (equal-weight average of all eight, what
CHOCO-SGD on the complete graph converges to) or ``ring`` (one D-PSGD step with
Metropolis–Hastings weights). Mixing is post-processing, so each device's ε is that of
its own DP-SGD steps: 30 rounds × ⌈n_i / 32⌉ Poisson-subsampled Gaussian mechanisms at
q_i (``coordinator.privacy.epsilon``, unit ``record``). With ``--epsilon`` the script
picks the smallest σ whose largest device ε (the smallest device's: the largest q) is
at most that, by bisection.

    python benchmarks/w1_record_dp.py --epsilon 8                 # 3 model seeds, fedavg
    python benchmarks/w1_record_dp.py --epsilon 8 --mixing ring
    python benchmarks/w1_record_dp.py --sigma 1.0 --seeds 0       # a given σ, one seed
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from coordinator.privacy import Spend, epsilon
from edge_agent.trainer import Trainer
from meshfl.app.bench.quality_sim import load_workload

DELTA = 1e-5


def device_epsilons(sigma: float, sizes: list[int], rounds: int, batch: int) -> list[float]:
    """ε of each device's records after ``rounds`` epochs of DP-SGD at noise σ."""
    return [
        epsilon([Spend(sigma, rounds * math.ceil(n / batch), min(1.0, batch / n), "record")],
                DELTA, "record")
        for n in sizes
    ]  # fmt: skip


def sigma_for(target: float, sizes: list[int], rounds: int, batch: int) -> float:
    """The smallest σ (to 0.01) whose largest device ε is at most ``target``."""
    low, high = 0.3, 50.0
    while high - low > 0.01:
        mid = (low + high) / 2
        if max(device_epsilons(mid, sizes, rounds, batch)) > target:
            low = mid
        else:
            high = mid
    return round(high, 2)


def mix(models: list[dict[str, np.ndarray]], how: str) -> list[dict[str, np.ndarray]]:
    """Exact averaging (``fedavg``) or one Metropolis–Hastings ring step (``ring``)."""
    n = len(models)
    if how == "fedavg":
        mean = {k: np.mean([m[k] for m in models], axis=0) for k in models[0]}
        return [{k: v.copy() for k, v in mean.items()} for _ in models]
    # ring: every degree is 2, so Metropolis–Hastings weights are 1/3 each
    return [
        {k: (models[i - 1][k] + models[i][k] + models[(i + 1) % n][k]) / 3 for k in models[i]}
        for i in range(n)
    ]


def run(sigma: float, clip: float, seed: int, how: str, momentum: float) -> list[float]:
    """Mean test accuracy of the eight devices after each round."""
    w = load_workload("W1")
    trainers = [
        Trainer(w.spec, seed=seed, data_seed=seed + 1 + i, learning_rate=w.lr,  # type: ignore[arg-type]
                batch_size=w.batch_size, local_epochs=1, momentum=momentum,
                dp_sgd=(sigma, clip))
        for i in range(w.n)
    ]  # fmt: skip
    curve = []
    for _ in range(w.rounds):
        for t, part in zip(trainers, w.parts, strict=True):
            t.train(w.x_train[part], w.y_train[part])
        for t, params in zip(trainers, mix([t.params() for t in trainers], how), strict=True):
            t.set_params(params)
        curve.append(statistics.fmean(t.evaluate(w.x_test, w.y_test)[0] for t in trainers))
    return curve


def main() -> None:
    """Parse the options, run each seed, print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--sigma", type=float, default=None, help="overrides --epsilon")
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--mixing", choices=["fedavg", "ring"], default="fedavg")
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    w = load_workload("W1")
    sizes = [len(p) for p in w.parts]
    sigma = args.sigma or sigma_for(args.epsilon, sizes, w.rounds, w.batch_size)
    eps = device_epsilons(sigma, sizes, w.rounds, w.batch_size)
    finals = {}
    for seed in args.seeds:
        curve = run(sigma, args.clip, seed, args.mixing, args.momentum)
        finals[seed] = curve[-1]
        print(f"seed {seed}: round 10 {curve[9]:.3f}, round 30 {curve[-1]:.3f}", flush=True)
    result = {
        "workload": "W1", "dp_unit": "record", "sigma": sigma, "clip": args.clip,
        "delta": DELTA, "device_sizes": sizes, "device_epsilons": [round(e, 3) for e in eps],
        "max_epsilon": round(max(eps), 3), "mixing": args.mixing, "momentum": args.momentum,
        "final_mean_accuracy": finals, "median": statistics.median(finals.values()),
    }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
