"""Per-round overhead of a real fleet: round time minus the slowest device's training.

Issue 24's workload: ``meshfl local`` with 8 agent processes on a real Mosquitto (the
project's config, a free port), the trivial model (``--model logreg --alpha 1000`` on a
400-row, 4-feature, 2-class table), everything else at its defaults. Per run:

- **round time**: the least-squares slope of each round's ``elapsed_s`` (when its last
  report reached the coordinator, ``report.json``) over rounds 2..R, so neither start-up
  nor the batching of round reports (up to 0.2 s) biases it;
- **training**: per round, the slowest device's ``train_s`` (its local steps, from the
  round reports in the run's ``coordinator.db``), averaged over rounds 2..R;
- **overhead** = round time − training, in milliseconds;
- **CPU**: user + system seconds a round of the processes ``meshfl local`` started (by
  role: agents, coordinator, launcher; the broker is not one of them), sampled every
  0.2 s, between the arrivals of the rounds at 10 % and 90 % of the run (steady state:
  no start-up, no end of job).

``--src NAME=PATH`` (repeatable) runs the fleet from another checkout of meshfl (its
folder first on ``PYTHONPATH``), interleaved with the others repeat by repeat (A B, then
B A), so two builds are compared side by side on one machine in one run; the ratio of
each build's round time to the first one's is taken per repeat (this VM's speed drifts by
1.5× within minutes) and its median printed::

    python benchmarks/round_overhead.py --rounds 200 --repeats 3
    git worktree add /tmp/base HEAD~3
    python benchmarks/round_overhead.py --src base=/tmp/base --src new=.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe
from w1_flower import trivial_table

from broker.mosquitto import MosquittoProcess

ROOT = Path(__file__).resolve().parents[1]


def slope_ms(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of ``(round, seconds)`` in milliseconds a round."""
    rounds, seconds = zip(*points, strict=True)
    return 1000 * statistics.linear_regression(rounds, seconds).slope


def slowest_training_ms(db: Path, first: int) -> float:
    """Mean over rounds ≥ ``first`` of the slowest device's ``train_s``, in milliseconds."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT round, metrics FROM round_metrics").fetchall()
    slowest: dict[int, float] = {}
    for round_, metrics in rows:
        if round_ >= first:
            train = float(json.loads(metrics)["train_s"])
            slowest[round_] = max(slowest.get(round_, 0.0), train)
    return 1000 * statistics.mean(slowest.values())


ROLES = (("agent run", "agents"), ("coordinator serve", "coordinator"))


def _role(cmdline: str) -> str:
    return next((role for key, role in ROLES if key in cmdline), "launcher")


def _cpu_between(
    samples: list[tuple[float, dict[int, tuple[str, float]]]], t0: float, t1: float
) -> dict[str, float]:
    """CPU seconds each role used from the last sample before ``t0`` to the first after ``t1``."""
    before = max((s for s in samples if s[0] <= t0), key=lambda s: s[0], default=samples[0])
    after = min((s for s in samples if s[0] >= t1), key=lambda s: s[0], default=samples[-1])
    used: dict[str, float] = {}
    for pid, (cmdline, cpu) in after[1].items():
        start = before[1].get(pid, (cmdline, 0.0))[1]
        used[_role(cmdline)] = used.get(_role(cmdline), 0.0) + cpu - start
    return used


def one_run(
    src: Path, table: Path, broker_url: str, args: argparse.Namespace, out: Path
) -> dict[str, float]:
    """One fleet from ``src``; raises RuntimeError if it did not complete every round."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = ["meshfl", "local", "--agents", str(args.agents), "--rounds", str(args.rounds),
               "--broker", broker_url, "--dataset", str(table), "--model", "logreg",
               "--alpha", "1000", "--out", str(out)]  # fmt: skip
    log = out.with_suffix(".log")
    with open(log, "w") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    root = psutil.Process(process.pid)
    samples: list[tuple[float, dict[int, tuple[str, float]]]] = []  # (unix s, pid → CPU s)
    while process.poll() is None:
        now, cpu = time.time(), {}
        for p in [root, *root.children(recursive=True)]:
            try:
                times = p.cpu_times()
                cpu[p.pid] = (" ".join(p.cmdline()), times.user + times.system)
            except psutil.Error:
                pass
        samples.append((now, cpu))
        time.sleep(0.2)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    rounds = report.get("rounds", [])
    if process.returncode != 0 or [r["round"] for r in rounds] != list(range(1, args.rounds + 1)):
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        raise RuntimeError(f"the run from {src} did not finish every round: {last}")
    round_ms = slope_ms([(r["round"], r["elapsed_s"]) for r in rounds if r["round"] >= 2])
    train_ms = slowest_training_ms(out / "coordinator.db", 2)
    with sqlite3.connect(out / "coordinator.db") as conn:
        (started,) = conn.execute("SELECT started_at FROM jobs").fetchone()
    first, last = rounds[args.rounds // 10], rounds[args.rounds - args.rounds // 10 - 1]
    used = _cpu_between(samples, started + first["elapsed_s"], started + last["elapsed_s"])
    per_round = {
        f"cpu_{role}_ms": 1000 * v / (last["round"] - first["round"]) for role, v in used.items()
    }
    return {"round_ms": round_ms, "train_ms": train_ms, "overhead_ms": round_ms - train_ms,
            "cpu_ms": sum(per_round.values()), **per_round,
            "final_accuracy": rounds[-1]["mean_accuracy"]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Run the repeats and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--src", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--broker", default=None, help="an MQTT URL (default: Mosquitto here)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 10:
        parser.error("--rounds must be at least 10: the slope needs rounds")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    sources = {}
    for item in args.src or [f"this={ROOT}"]:
        name, sep, path = item.partition("=")
        if not sep or not (Path(path) / "edge_agent").is_dir():
            parser.error(f"--src {item!r}: give NAME=PATH, PATH a meshfl checkout")
        sources[name] = Path(path).resolve()
    print("workload: per-round overhead (issue 24), trivial model, "
          f"{args.agents} agents, {args.rounds} rounds, Mosquitto")  # fmt: skip
    print(
        "command: python benchmarks/round_overhead.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print("machine:", describe())
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="round-overhead-")))
        if args.broker is None:
            args.broker = stack.enter_context(MosquittoProcess(workdir=tmp)).url
        print("broker:", args.broker)
        table = Path(trivial_table(tmp / "trivial.csv"))
        for repeat in range(args.repeats):
            order = list(sources.items())
            for name, src in order if repeat % 2 == 0 else order[::-1]:  # A B, B A, ...
                try:
                    run = one_run(src, table, args.broker, args, tmp / f"{name}-{repeat}")
                except RuntimeError as exc:  # a run that did not finish: no figure
                    sys.exit(f"round_overhead: {exc}")
                results[name].append(run)
                cells = ", ".join(f"{k} {v:.4g}" for k, v in run.items())
                print(f"repeat {repeat + 1} {name}: {cells}", flush=True)
    print("\nmedians of", args.repeats)
    print("build | round ms | slowest training ms | overhead ms | CPU ms a round: all, agents,"
          " coordinator | final accuracy")  # fmt: skip
    summary = {}
    for name, runs in results.items():
        keys = dict.fromkeys(k for r in runs for k in r)  # a role may be absent in a run
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
        summary[name] = {"median": med, "runs": runs}
        print(f"{name} | {med['round_ms']:.1f} | {med['train_ms']:.2f} | "
              f"{med['overhead_ms']:.1f} | {med['cpu_ms']:.0f}, {med.get('cpu_agents_ms', 0):.0f}, "
              f"{med.get('cpu_coordinator_ms', 0):.0f} | {med['final_accuracy']:.4f}")  # fmt: skip
    first, *others = results
    for name in others:  # paired by repeat: the machine's speed drifts between repeats
        pairs = zip(results[first], results[name], strict=True)
        ratios = [b["round_ms"] / a["round_ms"] for a, b in pairs]
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"{name} / {first}, round time, median of the {args.repeats} paired repeats: "
              f"{statistics.median(ratios):.3f} (each: {each})")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
