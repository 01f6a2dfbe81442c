"""Lockstep quality benchmark: which algorithm × topology × codec learns best per byte.

Trains the workload's devices in one process (torch, one thread; the agents' batch order),
with the kernel's algorithm objects (:mod:`meshfl.aggregation`) exchanging the real wire
messages, and prints for pooled training, exact averaging (FedAvg, + momentum) and every
candidate: final mean / minimum test accuracy, rounds and upload bytes to 80/85/90 % mean
accuracy, total upload bytes of all devices (signed envelopes, chunked, counted with the
real encoders) and the final consensus distance (1/n) Σ ‖x_i − x̄‖². Medians over seeds.

    python benchmarks/quality.py --workload W1 --seeds 0,1,2
    python benchmarks/quality.py --workload W1 --seeds 0,1,2 --only efavg,choco
    python benchmarks/quality.py --workload W2 --seeds 0 --json out.json

W1's target (issue 22): mean ≥ 0.95, minimum ≥ 0.93, ≤ 237,024 bytes uploaded in all over
30 rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe
from quality_runs import Candidate, Run, run_candidate
from quality_sim import load_workload, pooled_accuracy

TARGETS = (0.80, 0.85, 0.90)
W1_BUDGET = 237_024
HB, QGM = {"local": "hb", "local_beta": 0.9}, {"local": "qgm", "local_beta": 0.9}


def candidates(workload: str) -> list[Candidate]:
    """The default sweep: baselines, then algorithm × topology × codec × local momentum."""
    c = Candidate
    out = [
        c("fedavg"),
        c("fedavg", local="hb", local_beta=0.5, update_beta=0.5),
        c("fedavg", **HB),
        c("choco", "ring", "identity"),
        c("choco", "exponential", "identity"),
    ]
    for codec, gamma in (
        ("identity", 1.0),
        ("sign", 1.0),
        ("topk:0.05", 0.8),
        ("topk:0.02", 0.6),
        ("randk:0.1", 0.6),
    ):
        out += [
            c("choco", "complete", codec, gamma),
            c("choco", "complete", codec, gamma, **HB),
            c("efavg", codec=codec),
            c("efavg", codec=codec, **HB),
        ]
    out += [
        c("choco", "complete", "sign", **QGM),
        c("choco", "ring", "sign", 0.8),
        c("choco", "ring", "sign", 0.8, **HB),
        c("choco", "ring", "sign", 0.8, **QGM),
        c("choco", "exponential", "sign", 1.0, **HB),
        c("choco", "exponential", "sign", 1.0, **QGM),
        c("pga", "ring", "sign", period=4, **HB),
        c("pga", "exponential", "sign", period=4, **HB),
        c("epidemic", codec="identity", peers=2),
        c("epidemic", codec="sign", peers=1, **HB),
        c("epidemic", codec="sign", peers=2, **HB),
        c("tracking", "complete", "identity"),
        c("tracking", "ring", "sign", 0.5),
        c("efavg", codec="sign", weights="samples", **HB),
        c("efavg", codec="sign", local="hb", local_beta=0.8),
        c("efavg", codec="sign", local="hb", local_beta=0.7, update_beta=0.5),
        c("choco", "complete", "sign", keyframe_growth=1.5, **HB),
        c("choco", "exponential", "sign", keyframe_growth=1.5, **HB),
        c("choco", "ring", "sign", 0.8, keyframe_growth=1.5, **HB),
    ]
    if workload == "W2":  # 16 devices, 60 rounds: the informative rows only
        out = [
            c("fedavg", **HB),
            c("efavg", codec="sign", **HB),
            c("choco", "complete", "sign", **HB),
        ]
    return out


def reached(run: Run, target: float) -> tuple[int | None, int | None]:
    """(round, cumulative upload bytes) when the mean accuracy first reaches ``target``."""
    for r, acc in enumerate(run.mean):
        if acc >= target:
            return r + 1, run.upload[r]
    return None, None


def _median(values: list[float | int | None]) -> float | None:
    """Median, or None when any run never got there (a missed target stays missed)."""
    if any(v is None for v in values):
        return None
    return float(statistics.median(v for v in values if v is not None))


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    return "—" if v is None else format(v, spec)


def summarize(label: str, runs: list[Run]) -> dict[str, object]:
    """Medians over seeds of the printed figures (and the per-seed finals)."""
    row: dict[str, object] = {
        "label": label,
        "final_mean": _median([r.mean[-1] for r in runs]),
        "final_min": _median([r.minimum[-1] for r in runs]),
        "per_seed_mean": [round(r.mean[-1], 4) for r in runs],
        "per_seed_min": [round(r.minimum[-1], 4) for r in runs],
        "upload_total": _median([r.upload[-1] for r in runs]),
        "consensus": _median([r.consensus[-1] for r in runs]),
        "keyframes": [r.keyframes for r in runs],
    }
    for t in TARGETS:
        hits = [reached(r, t) for r in runs]
        row[f"round_{t:.2f}"] = _median([h[0] for h in hits])
        row[f"bytes_{t:.2f}"] = _median([h[1] for h in hits])
    return row


def print_row(row: dict[str, object], budget: int | None) -> None:
    """One table row (markdown)."""
    meets = ""
    if budget is not None and row["upload_total"] is not None:
        ok = (
            (row["final_mean"] or 0) >= 0.95
            and (row["final_min"] or 0) >= 0.93
            and row["upload_total"] <= budget
        )  # type: ignore[operator]
        meets = " **yes**" if ok else " no"
    rounds = " / ".join(_fmt(row[f"round_{t:.2f}"], ".0f") for t in TARGETS)  # type: ignore[arg-type]
    kbytes = " / ".join(
        _fmt(
            None
            if row[f"bytes_{t:.2f}"] is None
            # type: ignore[operator]
            else row[f"bytes_{t:.2f}"] / 1e3,
            ",.1f",
        )
        for t in TARGETS
    )
    print(
        f"| {row['label']} | {_fmt(row['final_mean'], '.4f')} | {_fmt(row['final_min'], '.4f')}"
        f" | {rounds} | {kbytes} | {_fmt(row['upload_total'])} |"
        f" {_fmt(row['consensus'], '.3g')} |{meets}",
        flush=True,
    )  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print the table; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1", choices=["W1", "W2"])
    parser.add_argument("--seeds", default="0,1,2", help="model seeds, comma-separated")
    parser.add_argument(
        "--only",
        default="",
        help="algorithms to keep, comma-separated (fedavg, choco, efavg, pga, epidemic, tracking)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"error: --seeds must be integers like 0,1,2 (got {args.seeds!r})", file=sys.stderr)
        return 2
    if not seeds:
        print("error: --seeds is empty; give e.g. 0,1,2", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    workload = load_workload(args.workload)
    sweep = candidates(args.workload)
    if args.only:
        keep = {s.strip() for s in args.only.split(",")}
        sweep = [c for c in sweep if c.algorithm in keep]
    budget = W1_BUDGET if args.workload == "W1" else None
    print(
        f"workload: {args.workload} ({workload.n} devices, {workload.rounds} rounds), "
        f"seeds {seeds}; medians over seeds"
    )
    print(
        f"command: python benchmarks/quality.py --workload {args.workload} --seeds {args.seeds}"
        + (f" --only {args.only}" if args.only else "")
    )
    print(f"machine: {describe()}")
    pooled = [pooled_accuracy(workload, s)[-1] for s in seeds]
    print(
        f"pooled training ({workload.rounds} epochs, same model and SGD): "
        f"{' / '.join(f'{a:.4f}' for a in pooled)} (median {statistics.median(pooled):.4f})"
    )
    print(
        "\n| candidate | mean acc | min acc | round to 80/85/90 % | kB up to 80/85/90 % |"
        " bytes up (all devices) | consensus dist |" + (" meets W1 target |" if budget else "")
    )
    print("|---|---|---|---|---|---|---|" + ("---|" if budget else ""))
    rows = []
    start = time.perf_counter()
    for cand in sweep:
        row = summarize(cand.label, [run_candidate(cand, workload, s) for s in seeds])
        rows.append(row)
        print_row(row, budget)
    print(f"\n{len(sweep)} candidates × {len(seeds)} seeds in {time.perf_counter() - start:.0f} s")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"workload": args.workload, "seeds": seeds, "pooled": pooled, "rows": rows},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
