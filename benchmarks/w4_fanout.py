"""W4 broker fan-out: meshfl's delta exchange vs raw paho-mqtt, same bytes, same Mosquitto.

Starts one Mosquitto on a free loopback port with the project's configuration
(:class:`broker.mosquitto.MosquittoProcess`) and, for each agent count N and graph
(``ring``; ``regular4``: a random 4-regular graph, seed 0), runs in this one process:

- **meshfl**: N gossip engines, each over its own MQTT connection, exchanging CHOCO
  messages with the identity codec (the full float32 delta, chunked at 128 KiB) under
  Metropolis–Hastings weights (``w4_meshfl_side.py``). No training: each device adds a
  fixed random vector to its model before each round.
- **raw**: N bare paho clients, configured like meshfl's transport, publishing exactly the
  MQTT payload sizes of one meshfl message per device per round on the same topic layout
  and waiting for their neighbours' payloads (``w4_raw_side.py``).

Both sides run in lock-step rounds (``w4_rounds.py``): round time is from the common
start to the last device holding all its neighbours' messages; delivered goodput is the
MQTT payload bytes that reached subscribers in the round (each message reaches its d
neighbours: N · d · message bytes) divided by the round time, in MB/s (10^6 bytes).
Each repeat runs both sides once, alternating which goes first; figures are medians over
all measured rounds of all repeats, after ``--warmup`` unmeasured rounds per side.

Also reported: CPU seconds of this process per delivered MB over the measured rounds
(both sides live in this one process, so this is where their costs differ), and the
broker's CPU seconds per side (set-up included).

    python benchmarks/w4_fanout.py                          # all of W4: about a minute here
    python benchmarks/w4_fanout.py --agents 8,32 --repeats 3 --json w4.json
    python benchmarks/w4_fanout.py --smoke                  # 4 agents, ring, 3 rounds, 64 KiB
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe
from w4_meshfl_side import chunk_sizes, run_meshfl
from w4_raw_side import run_raw
from w4_rounds import SideResult

from broker.mosquitto import MosquittoProcess
from meshfl.topology import Graph, build_graph

GRAPHS = ("ring", "regular4")  # regular4: build_graph("random-regular", degree=4, seed)
MIB = 1_048_576


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="8,32,128", help="comma-separated N")
    parser.add_argument("--graphs", default="ring,regular4", help="ring and/or regular4")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--repeats", type=int, default=1, help="runs of both sides")
    parser.add_argument("--delta-bytes", type=int, default=MIB, help="float32 bytes a message")
    parser.add_argument("--seed", type=int, default=0, help="graph and data seed")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a round may take")
    parser.add_argument("--smoke", action="store_true", help="4 agents, ring, 3 rounds, 64 KiB")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.agents, args.graphs, args.rounds, args.delta_bytes = "4", "ring", 3, 65_536
        args.timeout = 60.0
    args.agents = [int(a) for a in str(args.agents).split(",")]
    args.graphs = str(args.graphs).split(",")
    unknown = set(args.graphs) - set(GRAPHS)
    if unknown:
        parser.error(f"unknown graphs {sorted(unknown)}; use {', '.join(GRAPHS)}")
    if args.delta_bytes <= 0 or args.delta_bytes % 4:
        parser.error("--delta-bytes must be a positive multiple of 4 (float32)")
    if args.rounds < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--rounds and --repeats must be >= 1, --warmup >= 0")
    return args


def make_graph(name: str, n: int, seed: int) -> Graph:
    if name == "ring":
        return build_graph("ring", n)
    return build_graph("random-regular", n, degree=4, seed=seed)


def run_pair(
    broker: MosquittoProcess, graph_name: str, graph: Graph, repeat: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Both sides on ``graph``, in the order of this repeat; returns their summaries."""
    tag = f"r{repeat}-{graph_name}-n{graph.n}"
    meshfl_fleet, raw_fleet = f"w4m-{tag}", f"w4p-{tag}"  # same length: same topic sizes
    sizes = [chunk_sizes(args.delta_bytes, meshfl_fleet, f"dev-{i}") for i in range(graph.n)]
    common = {"rounds": args.rounds, "warmup": args.warmup, "timeout_s": args.timeout}

    def meshfl() -> SideResult:
        return run_meshfl(broker.url, graph, fleet=meshfl_fleet, delta_bytes=args.delta_bytes,
                          seed=args.seed + repeat, **common)  # fmt: skip

    def raw() -> SideResult:
        return run_raw("127.0.0.1", broker.port, graph, fleet=raw_fleet, sizes=sizes,
                       seed=args.seed + repeat, **common)  # fmt: skip

    mosquitto = psutil.Process(int(broker.pid_path.read_text()))
    pair: dict[str, Any] = {
        "repeat": repeat,
        "first": "meshfl" if repeat % 2 == 0 else "raw",
        "message_bytes": [sum(s) for s in sizes],
        "chunks_per_message": len(sizes[0]),
    }
    for side in (meshfl, raw) if repeat % 2 == 0 else (raw, meshfl):
        before = sum(mosquitto.cpu_times()[:2])
        result = side()
        pair[result.side] = result.summary()
        pair[result.side]["broker_cpu_s"] = sum(mosquitto.cpu_times()[:2]) - before
    return pair


def aggregate(graph_name: str, graph: Graph, pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every measured round of every repeat, and the meshfl/raw ratio."""
    degree = 2 * len(graph.edges) / graph.n
    row: dict[str, Any] = {"agents": graph.n, "graph": graph_name, "degree": degree}
    for side in ("meshfl", "raw"):
        row[side] = {
            "median_round_s": statistics.median(t for p in pairs for t in p[side]["round_s"]),
            "median_goodput_mb_s": statistics.median(
                g for p in pairs for g in p[side]["goodput_mb_s"]
            ),
            "cpu_ms_per_mb": statistics.median(p[side]["cpu_ms_per_mb"] for p in pairs),
        }
    row["goodput_ratio"] = row["meshfl"]["median_goodput_mb_s"] / row["raw"]["median_goodput_mb_s"]
    row["repeats"] = pairs
    return row


def report_row(row: dict[str, Any]) -> str:
    m, r = row["meshfl"], row["raw"]
    return (
        f"{row['agents']} | {row['graph']} | {row['degree']:g} | {m['median_round_s']:.3f} | "
        f"{r['median_round_s']:.3f} | {m['median_goodput_mb_s']:.1f} | "
        f"{r['median_goodput_mb_s']:.1f} | {row['goodput_ratio']:.2f} | "
        f"{m['cpu_ms_per_mb']:.2f} | {r['cpu_ms_per_mb']:.2f}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["python benchmarks/w4_fanout.py", shlex.join(words)]).strip()
    print(
        f"workload: W4 broker fan-out, N {args.agents}, graphs {args.graphs}, "
        f"{args.delta_bytes:,} B float32 deltas ({args.delta_bytes // 4:,} elements), CHOCO +"
        f" identity codec, QoS 1; {args.rounds} measured rounds after {args.warmup} warm-up,"
        f" {args.repeats} repeat(s); no training (a fixed random delta per device)"
    )
    print(f"command: {command}")
    print(f"machine: {describe()}")
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="w4-") as tmp,
        MosquittoProcess(workdir=Path(tmp)) as broker,
    ):
        print(f"broker: Mosquitto on {broker.url} (project config)\n")
        print(
            "N | graph | d | meshfl round s | raw round s | meshfl MB/s | raw MB/s | ratio"
            " | meshfl CPU ms/MB | raw CPU ms/MB"
        )
        for n in args.agents:
            for name in args.graphs:
                graph = make_graph(name, n, args.seed)
                started = time.perf_counter()
                pairs = [run_pair(broker, name, graph, rep, args) for rep in range(args.repeats)]
                row = aggregate(name, graph, pairs)
                row["wall_s"] = time.perf_counter() - started
                rows.append(row)
                print(report_row(row), flush=True)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    result = {
        "workload": "W4",
        "command": command,
        "machine": describe(),
        "settings": settings,
        "rows": rows,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
