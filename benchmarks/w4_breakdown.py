"""Where W4's meshfl side spends its CPU: thread CPU per delivered MB, stage by stage.

Runs W4's meshfl side (``w4_meshfl_side.run_meshfl``) with three engine methods wrapped
to add up the CPU time (``time.thread_time``) of the threads that run them:

- ``receive``: ``Inbox._handle`` on each delivered MQTT message (chunk decode and CRC,
  reassembly, envelope decode and CRC, tensor decode, replica update);
- ``publish``: ``GossipEngine._publish`` (x − x̂, envelope encode and CRC, chunking with a
  CRC per chunk, handing the chunks to paho);
- ``mix``: ``ChocoGossip.mix`` (the consensus step, accumulated in float64);

then the raw paho side on the same graph, and prints each figure in ms of CPU per MB
(10^6 bytes) delivered, beside the whole process's CPU per delivered MB. The wrappers
cost a few microseconds a call.

    python benchmarks/w4_breakdown.py --agents 32 --graph regular4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe
from w4_fanout import MIB, make_graph
from w4_meshfl_side import chunk_sizes, run_meshfl
from w4_raw_side import run_raw

from broker.mosquitto import MosquittoProcess
from edge_agent.engine import GossipEngine
from edge_agent.inbox import Inbox
from meshfl.aggregation import ChocoGossip

STAGES = {"receive": (Inbox, "_handle"), "publish": (GossipEngine, "_publish"),
          "mix": (ChocoGossip, "mix")}  # fmt: skip


def instrument(totals: defaultdict[str, float]) -> None:
    """Wrap each stage's method so that its callers' thread CPU adds up in ``totals``."""
    lock = threading.Lock()
    for stage, (cls, name) in STAGES.items():
        method = getattr(cls, name)

        def timed(*args: Any, _m: Callable[..., Any] = method, _s: str = stage) -> Any:
            started = time.thread_time()
            try:
                return _m(*args)
            finally:
                with lock:
                    totals[_s] += time.thread_time() - started

        setattr(cls, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--graph", default="regular4", choices=("ring", "regular4"))
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print(f"workload: W4 (N {args.agents}, {args.graph}, 1 MiB deltas), CPU by stage")
    print(f"command: python benchmarks/w4_breakdown.py {' '.join(sys.argv[1:])}".strip())
    print(f"machine: {describe()}")
    graph = make_graph(args.graph, args.agents, 0)
    totals: defaultdict[str, float] = defaultdict(float)
    instrument(totals)
    with tempfile.TemporaryDirectory() as tmp, MosquittoProcess(workdir=Path(tmp)) as broker:
        common: dict[str, Any] = {"rounds": args.rounds, "warmup": 1, "seed": 0,
                                  "timeout_s": 300.0}  # fmt: skip
        meshfl = run_meshfl(broker.url, graph, fleet="w4m-b", delta_bytes=MIB, **common)
        during = dict(totals)  # the warm-up round is in it too: scale by its share
        sizes = [chunk_sizes(MIB, "w4m-b", f"dev-{i}") for i in range(graph.n)]
        raw = run_raw("127.0.0.1", broker.port, graph, fleet="w4p-b", sizes=sizes, **common)
    mb = sum(meshfl.delivered_bytes) / 1e6
    share = args.rounds / (args.rounds + 1)
    for stage, seconds in during.items():
        print(f"meshfl {stage}: {seconds * share * 1e3 / mb:.2f} ms CPU per delivered MB")
    for side in (meshfl, raw):
        print(f"{side.side} process: {side.summary()['cpu_ms_per_mb']:.2f} ms CPU per delivered MB")


if __name__ == "__main__":
    main()
