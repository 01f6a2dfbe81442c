"""``meshfl bench frontier``: accuracy against payload bytes per codec on W1 and W2.

Every run is a lockstep fleet (:func:`meshfl.app.local.lab.lockstep.run_lockstep`: the agents'
own trainer and gossip classes, every message delivered). The identity codec runs as
D-PSGD (Lian et al. 2017), the baseline; every other codec runs CHOCO-SGD (Koloskova et
al. 2019) with shared start and keyframes off, for each consensus step γ of
:data:`GAMMAS`; the γ reported per codec is the one that first reaches the workload's
reference accuracy (fewest rounds), else the one with the best final accuracy.

References: W1 — D-PSGD's mean accuracy after 30 rounds on the same topology (the
issue's target: reach it with ≥ 20× fewer payload bytes); W2 — identity's final accuracy
minus one point (target: final accuracy within 1 point of identity's). The pooled
(centralised) accuracy of the same model after the same number of epochs is the parity
reference. Results go to ``OUT/frontier-W?.json`` and ``OUT/frontier-W?.png``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from meshfl.app.local.run import LocalConfig
from meshfl.contract import ModelSpec
from meshfl.errors import ConfigError

__all__ = ["DEFAULT_SPECS", "GAMMAS", "WORKLOADS", "Workload", "main", "pooled_accuracy"]

GAMMAS: tuple[float, ...] = (0.3, 0.6, 0.9, 1.0)
"""Consensus steps tried for each compressed codec."""

DEFAULT_SPECS: tuple[str, ...] = (
    "identity", "topk:0.01", "topk:0.05", "topk:0.15", "randk:0.1", "sign", "int8",
    "fp16", "qsgd:16", "powersgd:2", "powersgd:4", "sign+zstd",
)  # fmt: skip
"""The default sweep (``identity`` is D-PSGD, the rest CHOCO-SGD)."""


@dataclass(frozen=True)
class Workload:
    """A frontier workload: the fleet, the model, rounds and the accuracy targets.

    ``reference_round`` (W1) makes D-PSGD's accuracy after that round the reference;
    ``None`` (W2) makes it identity's final accuracy minus ``reference_slack``.
    """

    name: str
    config: LocalConfig
    model: ModelSpec
    targets: tuple[float, ...]
    reference_round: int | None = None
    reference_slack: float = 0.0


WORKLOADS: dict[str, Workload] = {
    "W1": Workload(
        "W1 digits-8",
        LocalConfig(rounds=60, keyframe_growth=0.0),
        {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]},
        (0.80, 0.85, 0.90),
        reference_round=30,
    ),
    "W2": Workload(
        "W2 mnist1d-16",
        LocalConfig(agents=16, alpha=0.3, dataset="mnist1d", rounds=40, keyframe_growth=0.0),
        {"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25]},
        (0.80, 0.90),
        reference_slack=0.01,
    ),
}
"""W1 and W2 of ``docs/workloads.md`` (ring, lr 0.1, batch 32, one local epoch)."""


@dataclass
class Curve:
    """One setting's per-round mean/min accuracy and payload bytes (averaged over seeds)."""

    spec: str
    gossip: str
    gamma: float
    mean_accuracy: list[float]
    min_accuracy: list[float]
    payload_bytes: list[float]
    seconds: float

    def cumulative(self) -> list[float]:
        """Cumulative payload bytes after each round."""
        return [float(b) for b in np.cumsum(self.payload_bytes)]

    def reach(self, target: float) -> dict[str, float] | None:
        """First round (1-based) whose mean accuracy ≥ ``target``, and bytes sent by then."""
        for r, acc in enumerate(self.mean_accuracy):
            if acc >= target - 1e-12:
                return {"round": r + 1, "bytes": self.cumulative()[r]}
        return None


def _run(workload: Workload, spec: str, gamma: float, rounds: int, seeds: int) -> Curve | None:
    """Average ``seeds`` lockstep runs; None when one diverged (a model went NaN/inf)."""
    from meshfl.app.local.lab.lockstep import run_lockstep
    from meshfl.errors import CodecError

    gossip = "dpsgd" if spec == "identity" else "choco"
    config = replace(workload.config, rounds=rounds, codec=spec, consensus_step=gamma)
    start = time.perf_counter()
    try:
        runs = [run_lockstep(config, s, model=workload.model, gossip=gossip) for s in range(seeds)]
    except CodecError:  # the codecs refuse NaN/inf: the models diverged
        return None
    return Curve(
        spec, gossip, gamma,
        [float(v) for v in np.mean([r.mean_accuracy for r in runs], axis=0)],
        [float(v) for v in np.mean([r.min_accuracy for r in runs], axis=0)],
        [float(v) for v in np.mean([r.payload_bytes for r in runs], axis=0)],
        time.perf_counter() - start,
    )  # fmt: skip


def pooled_accuracy(workload: Workload, epochs: int, seed: int = 0) -> float:
    """Test accuracy of the workload's model trained centrally on all training data.

    Same model, learning rate and batch size, ``epochs`` epochs (the fleet passes over
    the whole training set once per round, so ``epochs`` = rounds is parity).
    """
    from edge_agent.trainer import Trainer
    from meshfl.app.local.lab.lockstep import load_split

    split = load_split(workload.config.dataset, workload.config.seed)
    c = workload.config
    trainer = Trainer(workload.model, seed=seed, learning_rate=c.learning_rate,
                      batch_size=c.batch_size, local_epochs=epochs)  # fmt: skip
    trainer.train(split.x_train, split.y_train)
    return trainer.evaluate(split.x_test, split.y_test)[0]


def _row(
    curve: Curve, workload: Workload, ref: float, ref_bytes: float, ref_round: int | None
) -> dict[str, Any]:
    reached = curve.reach(ref)
    agents = workload.config.agents
    return {
        "spec": curve.spec,
        "gossip": curve.gossip,
        "gamma": curve.gamma,
        "final_mean_accuracy": curve.mean_accuracy[-1],
        "final_min_accuracy": curve.min_accuracy[-1],
        "accuracy_at_reference_round": None
        if ref_round is None
        else curve.mean_accuracy[ref_round - 1],
        "payload_bytes_total": curve.cumulative()[-1],
        "payload_bytes_per_device_round": curve.cumulative()[-1]
        / agents
        / len(curve.payload_bytes),
        "targets": {f"{t:.2f}": curve.reach(t) for t in workload.targets},
        "reference": reached,
        "bytes_vs_reference": ref_bytes / reached["bytes"] if reached else None,
        "seconds": curve.seconds,
        "mean_accuracy": curve.mean_accuracy,
        "min_accuracy": curve.min_accuracy,
        "payload_bytes": curve.payload_bytes,
    }


def _choose(curves: list[Curve], ref: float) -> Curve:
    def key(c: Curve) -> tuple[float, float]:
        hit = c.reach(ref)
        return (hit["round"] if hit else math.inf, -c.mean_accuracy[-1])

    return min(curves, key=key)


def _fmt_reach(hit: dict[str, float] | None) -> str:
    return "–" if hit is None else f"{int(hit['round'])} ({hit['bytes'] / 1e6:.3f} MB)"


def _fmt_ratio(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.1f}×"


def _table(rows: list[dict[str, Any]], workload: Workload, ref_round: int | None) -> str:
    targets = [f"{t:.2f}" for t in workload.targets]
    at = None if ref_round is None else f"acc @{ref_round}"
    head = ["codec", "gossip", "γ", "final mean", "final min", *([at] if at else []),
            "payload MB", "B/device/round", *[f"round (MB) to {t}" for t in targets],
            "round (MB) to ref", "× fewer bytes than ref"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["spec"], r["gossip"], "–" if r["gossip"] == "dpsgd" else f"{r['gamma']:.1f}",
                 f"{r['final_mean_accuracy']:.4f}", f"{r['final_min_accuracy']:.4f}",
                 *([f"{r['accuracy_at_reference_round']:.4f}"] if at else []),
                 f"{r['payload_bytes_total'] / 1e6:.3f}",
                 f"{r['payload_bytes_per_device_round']:,.0f}",
                 *[_fmt_reach(r["targets"][t]) for t in targets], _fmt_reach(r["reference"]),
                 _fmt_ratio(r["bytes_vs_reference"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], ref: float, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.get_cmap("tab10")
    for i, r in enumerate(rows):
        label = r["spec"] + (" (D-PSGD)" if r["gossip"] == "dpsgd" else f", γ {r['gamma']:.1f}")
        ax.plot(np.cumsum(r["payload_bytes"]), r["mean_accuracy"], label=label, linewidth=1.3,
                color=colours(i % 10), linestyle=("-", "--", ":")[i // 10 % 3])  # fmt: skip
    ax.axhline(ref, color="grey", linestyle="--", linewidth=0.8, label=f"reference {ref:.4f}")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative payload bytes (all devices)")
    ax.set_ylabel("mean test accuracy")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(workload: str, specs: list[str] | None, rounds: int | None, seeds: int, out: Path) -> None:
    """Run the frontier sweep of ``workload`` and write JSON, PNG and a printed table.

    Raises
    ------
    ConfigError
        Unknown workload, bad codec spec, or ``rounds``/``seeds`` < 1.

    """
    from meshfl.codecs import parse_codec

    key = workload.upper()
    if key not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    w = WORKLOADS[key]
    n_rounds = w.config.rounds if rounds is None else rounds
    if n_rounds < 1 or seeds < 1:
        raise ConfigError(f"--rounds and --seeds must be at least 1 (got {n_rounds}, {seeds})")
    wanted = [parse_codec(s).spec for s in (specs or DEFAULT_SPECS)]
    wanted = ["identity"] + [s for s in dict.fromkeys(wanted) if s != "identity"]
    started = time.perf_counter()
    baseline = _run(w, "identity", 1.0, n_rounds, seeds)
    if baseline is None:
        raise ConfigError("D-PSGD diverged on this workload; lower the learning rate")
    ref_round = None if w.reference_round is None else min(w.reference_round, n_rounds)
    if ref_round is not None:
        ref, ref_bytes = baseline.mean_accuracy[ref_round - 1], baseline.cumulative()[ref_round - 1]
    else:
        ref = baseline.mean_accuracy[-1] - w.reference_slack
        hit = baseline.reach(ref)
        ref_bytes = hit["bytes"] if hit else baseline.cumulative()[-1]
    chosen: list[Curve] = [baseline]
    tried: list[dict[str, Any]] = []
    for spec in wanted[1:]:
        curves = []
        for gamma in GAMMAS:
            curve = _run(w, spec, gamma, n_rounds, seeds)
            if curve is None:
                print(f"  {spec} γ {gamma}: diverged (NaN/inf)", file=sys.stderr, flush=True)
                tried.append({"spec": spec, "gamma": gamma, "diverged": True})
                continue
            print(f"  {spec} γ {gamma}: final {curve.mean_accuracy[-1]:.4f}"
                  f" ({curve.seconds:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
            curves.append(curve)
            tried.append({"spec": spec, "gamma": gamma, "diverged": False,
                          "final_mean_accuracy": curve.mean_accuracy[-1],
                          "reference": curve.reach(ref)})  # fmt: skip
        if curves:
            chosen.append(_choose(curves, ref))
        else:
            print(f"  {spec}: diverged at every γ; left out of the table", file=sys.stderr)
    rows = [_row(c, w, ref, ref_bytes, ref_round) for c in chosen]
    pooled = pooled_accuracy(w, n_rounds)
    out.mkdir(parents=True, exist_ok=True)
    command = f"meshfl bench frontier --workload {key} --seeds {seeds} --out {out}"
    command += "" if specs is None else f" --codecs {','.join(specs)}"
    command += "" if rounds is None else f" --rounds {rounds}"
    try:
        from meshfl.app.bench.machine import describe

        machine = describe()
    except ImportError:
        import os

        machine = f"{os.cpu_count()} cores"
    wall_s = time.perf_counter() - started
    rule = (f"D-PSGD mean accuracy after round {ref_round}" if ref_round
            else f"identity final accuracy − {w.reference_slack}")  # fmt: skip
    document = {
        "workload": w.name, "command": command, "machine": machine, "rounds": n_rounds,
        "seeds": seeds, "config": {k: str(v) for k, v in asdict(w.config).items()},
        "model": dict(w.model), "gammas": list(GAMMAS),
        "reference": {"accuracy": ref, "bytes": ref_bytes, "rule": rule},
        "pooled_accuracy": pooled, "wall_s": wall_s,
        "results": rows, "all_gammas": tried,
    }  # fmt: skip
    json_path = out / f"frontier-{key}.json"
    json_path.write_text(json.dumps(document, indent=1))
    png_path = out / f"frontier-{key}.png"
    _plot(rows, ref, f"{w.name}: accuracy vs payload bytes ({n_rounds} rounds)", png_path)
    print(f"workload: {w.name} ({w.config.agents} devices, α {w.config.alpha}, "
          f"{w.config.topology}, model {w.model['name']} {w.model['hidden']}, "
          f"{n_rounds} rounds, {seeds} seed(s), keyframes off)")  # fmt: skip
    print(f"command:  {command}")
    print(f"machine:  {machine}")
    print(f"reference: {rule} = {ref:.4f} "
          f"({ref_bytes / 1e6:.3f} MB); pooled {n_rounds}-epoch accuracy {pooled:.4f}")  # fmt: skip
    print(_table(rows, w, ref_round))
    print(f"wrote {json_path} and {png_path} ({wall_s:.0f} s)")
