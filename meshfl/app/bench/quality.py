"""``meshfl bench quality``: which algorithm × topology × codec learns best per byte.

Trains the workload's devices in one process (torch, one thread; the agents' batch order),
with the kernel's algorithm objects (:mod:`meshfl.aggregation`) exchanging the real wire
messages, and prints for pooled training, exact averaging (FedAvg, + momentum) and every
candidate: final mean / minimum test accuracy, rounds and upload bytes to 80/85/90 % mean
accuracy, total upload bytes of all devices (signed envelopes, chunked, counted with the
real encoders) and the final consensus distance (1/n) Σ ‖x_i − x̄‖². Medians over seeds.

    meshfl bench quality --workload W1 --seeds 0,1,2
    meshfl bench quality --workload W1 --seeds 0,1,2 --only efavg,choco
    meshfl bench quality --workload W2 --seeds 0
    meshfl bench quality --workload W1 --seeds 0 --full     # 201 candidates

The default sweep is a curated subset of the full grid (the rows that decide something);
``--full`` runs every combination. The rows also go to ``OUT/quality-W?.json``.

W1's target (issue 22): mean ≥ 0.95, minimum ≥ 0.93, ≤ 237,024 bytes uploaded in all over
30 rounds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from meshfl.app.bench.machine import describe
from meshfl.app.bench.quality_runs import Candidate, Run, run_candidate
from meshfl.app.bench.quality_sim import load_workload, pooled_accuracy
from meshfl.errors import ConfigError

TARGETS = (0.80, 0.85, 0.90)
W1_BUDGET = 237_024


def _hb(c: Candidate) -> Candidate:
    """``c`` with heavy-ball local momentum β 0.9."""
    return replace(c, local="hb", local_beta=0.9)


def _qgm(c: Candidate) -> Candidate:
    """``c`` with quasi-global momentum β 0.9."""
    return replace(c, local="qgm", local_beta=0.9)


def candidates(workload: str) -> list[Candidate]:
    """The default sweep: baselines, then algorithm × topology × codec × local momentum."""
    c = Candidate
    out = [
        c("fedavg"),
        c("fedavg", local="hb", local_beta=0.5, update_beta=0.5),
        _hb(c("fedavg")),
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
            _hb(c("choco", "complete", codec, gamma)),
            c("efavg", codec=codec),
            _hb(c("efavg", codec=codec)),
        ]
    out += [
        _qgm(c("choco", "complete", "sign")),
        c("choco", "ring", "sign", 0.8),
        _hb(c("choco", "ring", "sign", 0.8)),
        _qgm(c("choco", "ring", "sign", 0.8)),
        _hb(c("choco", "exponential", "sign", 1.0)),
        _qgm(c("choco", "exponential", "sign", 1.0)),
        _hb(c("pga", "ring", "sign", period=4)),
        _hb(c("pga", "exponential", "sign", period=4)),
        c("epidemic", codec="identity", peers=2),
        _hb(c("epidemic", codec="sign", peers=1)),
        _hb(c("epidemic", codec="sign", peers=2)),
        c("tracking", "complete", "identity"),
        c("tracking", "ring", "sign", 0.5),
        _hb(c("efavg", codec="sign", weights="samples")),
        c("efavg", codec="sign", local="hb", local_beta=0.8),
        c("efavg", codec="sign", local="hb", local_beta=0.7, update_beta=0.5),
        _hb(c("choco", "complete", "sign", keyframe_growth=1.5)),
        _hb(c("choco", "exponential", "sign", keyframe_growth=1.5)),
        _hb(c("choco", "ring", "sign", 0.8, keyframe_growth=1.5)),
    ]
    if workload == "W2":  # 16 devices, 60 rounds: the informative rows only
        out = [
            _hb(c("fedavg")),
            _hb(c("efavg", codec="sign")),
            _hb(c("choco", "complete", "sign")),
        ]
    return out


CODECS = ("identity", "sign", "topk:0.1", "topk:0.05", "topk:0.02", "randk:0.1")
LOCALS: tuple[Callable[[Candidate], Candidate], ...] = (lambda c: c, _hb, _qgm)


def full_grid() -> list[Candidate]:
    """Every algorithm × topology × codec × local momentum (``--full``; hours on 2 cores).

    γ is 1 for lossless and sign, 0.6 for sparsifiers (CHOCO's replicas drift above it).
    """
    c = Candidate
    out = [m(c("fedavg")) for m in LOCALS]
    for codec in CODECS:
        gamma = 1.0 if codec in ("identity", "sign") else 0.6
        for m in LOCALS:
            out.append(m(c("efavg", codec=codec)))
            out += [m(c("epidemic", codec=codec, peers=s)) for s in (1, 2)]
            for topology in ("ring", "exponential", "complete"):
                out += [m(c(algo, topology, codec, gamma)) for algo in ("choco", "tracking")]
                if topology != "complete":
                    out.append(m(c("pga", topology, codec, gamma, period=4)))
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


def summarize(label: str, runs: list[Run]) -> dict[str, Any]:
    """Medians over seeds of the printed figures (and the per-seed finals)."""
    row: dict[str, Any] = {
        "label": label,
        "final_mean": _median([r.mean[-1] for r in runs]),
        "final_min": _median([r.minimum[-1] for r in runs]),
        "per_seed_mean": [round(r.mean[-1], 4) for r in runs],
        "per_seed_min": [round(r.minimum[-1], 4) for r in runs],
        "upload_total": _median([r.upload[-1] for r in runs]),
        "consensus": _median([r.consensus[-1] for r in runs]),
        "keyframes": [r.keyframes for r in runs],
        "diverged_at": [r.diverged_at for r in runs],
    }
    for t in TARGETS:
        hits = [reached(r, t) for r in runs]
        row[f"round_{t:.2f}"] = _median([h[0] for h in hits])
        row[f"bytes_{t:.2f}"] = _median([h[1] for h in hits])
    return row


def print_row(row: dict[str, Any], budget: int | None) -> None:
    """One table row (markdown); a run whose models went to NaN counts as accuracy 0."""
    meets = ""
    diverged = [r for r in row["diverged_at"] if r is not None]
    if diverged:
        row = {**row, "label": f"{row['label']} (diverged at round {min(diverged)})"}
    if budget is not None and row["upload_total"] is not None:
        ok = (
            (row["final_mean"] or 0) >= 0.95
            and (row["final_min"] or 0) >= 0.93
            and row["upload_total"] <= budget
        )
        meets = " **yes** |" if ok else " no |"
    rounds = " / ".join(_fmt(row[f"round_{t:.2f}"], ".0f") for t in TARGETS)
    kbytes = " / ".join(
        _fmt(
            None if row[f"bytes_{t:.2f}"] is None else row[f"bytes_{t:.2f}"] / 1e3,
            ",.1f",
        )
        for t in TARGETS
    )
    print(
        f"| {row['label']} | {_fmt(row['final_mean'], '.4f')} | {_fmt(row['final_min'], '.4f')}"
        f" | {rounds} | {kbytes} | {_fmt(row['upload_total'])} |"
        f" {_fmt(row['consensus'], '.3g')} |{meets}",
        flush=True,
    )


ALGORITHMS = ("fedavg", "choco", "efavg", "pga", "epidemic", "tracking")
MAX_ROUNDS = 10_000
"""Most rounds a sweep runs (W1 30, W2 60; 10,000 W1 rounds take hours per candidate)."""

LEGEND = (
    "labels: algorithm, topology (epidemic: s= peers a round), codec, γ consensus step;"
    " H= global-averaging period (pga); hbβ heavy-ball and qgmβ quasi-global local"
    " momentum β; umβ momentum on the mixed update (SlowMo), αX its outer step;"
    " samples: weights by sample count"
)
"""The table's abbreviations, printed above it."""


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``; ConfigError (one line) for anything else or nothing."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be integers like 0,1,2 (got {text!r})") from None
    if not seeds:
        raise ConfigError("--seeds is empty; give e.g. 0,1,2")
    bad = [s for s in seeds if not 0 <= s < 2**32]
    if bad:
        raise ConfigError(f"--seeds {bad[0]} is out of range; a model seed is in [0, 2^32)")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"--seeds repeats {repeated[0]}; give distinct seeds, e.g. 0,1,2")
    return seeds


def parse_only(text: str) -> list[str]:
    """The algorithms ``--only`` keeps, in the order given, once each.

    Raises
    ------
    ConfigError
        Naming each algorithm that is not one of :data:`ALGORITHMS`.

    """
    keep = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if text and not keep:
        raise ConfigError(f"--only {text!r} names no algorithm; give e.g. choco,efavg or drop it")
    unknown = [a for a in keep if a not in ALGORITHMS]
    if unknown:
        raise ConfigError(
            f"--only {', '.join(unknown)} is not an algorithm; "
            f"use some of {', '.join(sorted(ALGORITHMS))}"
        )
    return keep


def main(
    workload_name: str,
    seeds: list[int],
    only: list[str],
    full: bool,
    rounds: int | None,
    out: Path,
) -> Path:
    """Run the sweep, print the table, write ``OUT/quality-<workload>.json``; return its path.

    Raises
    ------
    ConfigError
        For an unknown workload, or ``rounds`` outside [1, :data:`MAX_ROUNDS`].

    """
    if rounds is not None and not 1 <= rounds <= MAX_ROUNDS:
        raise ConfigError(f"--rounds must be in [1, {MAX_ROUNDS:,}] (got {rounds})")
    workload = load_workload(workload_name)
    torch.set_num_threads(1)
    if rounds is not None:
        workload = replace(workload, rounds=rounds)
    sweep = full_grid() if full else candidates(workload_name)
    if only:
        sweep = [c for c in sweep if c.algorithm in only]
    budget = W1_BUDGET if workload_name == "W1" else None
    print(
        f"workload: {workload_name} ({workload.n} devices, {workload.rounds} rounds), "
        f"seeds {seeds}; medians over seeds"
    )
    print(
        f"command: meshfl bench quality --workload {workload_name}"
        f" --seeds {','.join(map(str, seeds))}"
        + (f" --rounds {rounds}" if rounds is not None else "")
        + (f" --only {','.join(only)}" if only else "")
        + (" --full" if full else "")
    )
    print(f"machine: {describe()}")
    pooled = [pooled_accuracy(workload, s)[-1] for s in seeds]
    median = f" (median {statistics.median(pooled):.4f})" if len(pooled) > 1 else ""
    print(
        f"pooled training ({workload.rounds} epochs, same model and SGD): "
        f"{' / '.join(f'{a:.4f}' for a in pooled)}{median}"
    )
    print(LEGEND)
    target = " meets W1 target (mean ≥ 0.95, min ≥ 0.93, ≤ 237,024 B) |"
    print(
        "\n| candidate | mean acc | min acc | round to 80/85/90 % | kB up to 80/85/90 % |"
        " bytes up (all devices) | consensus dist |" + (target if budget else "")
    )
    print("|---|---|---|---|---|---|---|" + ("---|" if budget else ""))
    rows = []
    start = time.perf_counter()
    for cand in sweep:
        row = summarize(cand.label, [run_candidate(cand, workload, s) for s in seeds])
        rows.append(row)
        print_row(row, budget)
    seconds = time.perf_counter() - start
    plural = "s" if len(seeds) > 1 else ""
    print(f"\n{len(sweep)} candidates × {len(seeds)} seed{plural} in {seconds:.0f} s")
    path = out / f"quality-{workload_name}.json"
    path.write_text(
        json.dumps(
            {"workload": workload_name, "seeds": seeds, "pooled": pooled, "rows": rows}, indent=1
        )
    )
    print(f"rows: {path}")
    return path
