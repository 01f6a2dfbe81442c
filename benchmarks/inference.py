"""Inference latency and throughput: ONNX Runtime vs torch on W1's and W2's models (issue 8).

Workloads: W1's model (mlp 64 → [64] → 10, 4,810 parameters) and W2's (cnn1d
40 → [25, 25, 25] → 10, 5,210 parameters), weights from seed 0 (speed does not depend on
the values). Each engine takes a float32 numpy batch and returns float32 numpy logits:

- onnxruntime: the model exported by ``models.onnx.export_onnx``, run by
  ``edge_agent.onnx_infer.OnnxModel`` (CPU provider), 1 intra-op thread or onnxruntime's
  default (one per core);
- torch: the same ``nn.Module`` in eval mode under ``torch.no_grad()``,
  ``torch.set_num_threads(1)`` or torch's default (one per core).

Batch 1 measures latency, batch 256 throughput. Every call is timed on its own
(``time.perf_counter_ns``) after 50 warm-up calls, onnxruntime and torch taking turns
call by call; the table gives the median and the 90th percentile in microseconds per
call, and samples/s at the median.

    python benchmarks/inference.py                 # 1000 calls per cell (~30 s on 2 cores)
    python benchmarks/inference.py --repeats 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from edge_agent.onnx_infer import OnnxModel
from models.onnx import export_onnx
from models.zoo import build_model

WORKLOADS = {
    "W1 mlp 64→[64]→10": {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]},
    "W2 cnn1d 40→[25,25,25]→10": {
        "name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25],
    },
}  # fmt: skip
BATCHES = (1, 256)
WARMUP = 50


def timings(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Microseconds of ``repeats`` calls of each engine, after :data:`WARMUP` untimed ones.

    The engines take turns call by call, so a change in the machine's load (it is shared)
    hits them alike.
    """
    for call in calls.values():
        for _ in range(WARMUP):
            call()
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter_ns()
            call()
            out[name].append((time.perf_counter_ns() - start) / 1e3)
    return out


def torch_call(module: torch.nn.Module, x: np.ndarray) -> Callable[[], np.ndarray]:
    def call() -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1000, help="timed calls per cell (≥ 200)")
    args = parser.parse_args()
    if args.repeats < 200:
        parser.error("--repeats must be at least 200")
    default_threads = torch.get_num_threads()
    print("# Inference: ONNX Runtime vs torch (issue 8)")
    print(f"command: python benchmarks/inference.py --repeats {args.repeats}")
    print(f"machine: {describe()}; load average {os.getloadavg()[0]:.1f} at start")
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"numpy {np.__version__}; default threads {default_threads}")  # fmt: skip
    print(f"{args.repeats} timed calls per cell after {WARMUP} warm-up calls; µs per call\n")
    print("| model | batch | engine | threads | median µs | p90 µs | samples/s (median) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, spec in WORKLOADS.items():
            module = build_model(spec, 0).eval()  # type: ignore[arg-type]
            path = export_onnx(module, Path(tmp) / f"{spec['name']}.onnx", spec["input_dim"])
            sessions = {1: OnnxModel(path, threads=1), default_threads: OnnxModel(path)}
            for batch in BATCHES:
                x = np.random.default_rng(0).normal(size=(batch, spec["input_dim"]))
                x = x.astype(np.float32)
                for threads, session in sessions.items():
                    engines = {"onnxruntime": lambda s=session, x=x: s.logits(x)}
                    torch.set_num_threads(threads)
                    engines["torch"] = torch_call(module, x)
                    for engine, t in timings(engines, args.repeats).items():
                        median = statistics.median(t)
                        p90 = float(np.percentile(t, 90))
                        rate = batch / median * 1e6
                        print(f"| {label} | {batch} | {engine} | {threads} | {median:,.1f} | "
                              f"{p90:,.1f} | {rate:,.0f} |", flush=True)  # fmt: skip
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
