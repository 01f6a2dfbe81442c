"""``meshfl bench codecs``: the W3 codec micro-benchmark (docs/workloads.md).

Two deltas: ``gaussian``, a float32 vector of ``size`` elements from
``np.random.default_rng(0).standard_normal(size, dtype=np.float32)``; and ``w1-real``,
the change of W1's model (mlp 64-64-10, seed 0) over one epoch of SGD (lr 0.1, batch 32)
on device 0's partition, every tensor flattened and concatenated in ``state_dict`` order
(4 810 elements). PowerSGD sees the gaussian vector as 2500×4000 when ``size`` is 10M,
otherwise (and for the real delta) as its most square ``m×n`` factorization.

Per codec: payload bytes, ratio ``4n / bytes``, encode and decode throughput in MB/s
(10⁶ bytes of float32 input per second; medians over ``repeats`` after one warm-up),
relative error ``‖x − x̃‖ / ‖x‖`` (float64), beside the memory-copy bandwidth
(``np.copyto`` of the same array into a preallocated one, timed the same way). One
thread: BLAS/OpenMP pools are capped at 1 with ``threadpoolctl.threadpool_limits(1)``
and torch with ``set_num_threads(1)``; numpy ufuncs are single-threaded anyway.
Targets (issue 3): top-k and sign encode ≥ 50 % of memory copy; decode faster than
encode for every codec.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from meshfl.app.bench.machine import describe
from meshfl.codecs import parse_codec

__all__ = ["DEFAULT_SPECS", "bench_codec", "main", "memcopy_mb_s", "real_delta"]

DEFAULT_SPECS = [
    "identity",
    "fp16",
    "bf16",
    "int8",
    "qsgd:16",
    "topk:0.01",
    "topk:0.1",
    "randk:0.01",
    "sign",
    "powersgd:4",
    "topk:0.01+zstd",
    "int8+zstd",
]
SPEED_TARGET = 0.5
"""Top-k and sign encode must reach this fraction of memory-copy bandwidth."""


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: page faults, caches, lazy imports
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memcopy_mb_s(x: np.ndarray, repeats: int) -> float:
    """Return ``np.copyto`` bandwidth in MB/s of input (median seconds over ``repeats``)."""
    dst = np.empty_like(x)
    return x.nbytes / 1e6 / _median_seconds(lambda: np.copyto(dst, x), repeats)


def _matrix_shape(n: int) -> tuple[int, int]:
    if n == 10_000_000:
        return (2500, 4000)
    m = max(d for d in range(1, math.isqrt(max(n, 1)) + 1) if n % d == 0)
    return (m, n // m)


def bench_codec(spec: str, x: np.ndarray, repeats: int, copy_mb_s: float) -> dict[str, Any]:
    """Measure one codec on a 1-D float32 delta ``x``; returns one JSON-ready row."""
    codec = parse_codec(spec, seed=0)
    base = spec.split("+", 1)[0].split(":", 1)[0]
    data = x.reshape(_matrix_shape(x.size)) if base == "powersgd" else x
    payload = codec.encode(data)
    decoded = codec.decode(payload, data.shape)
    enc = _median_seconds(lambda: codec.encode(data), repeats)
    dec = _median_seconds(lambda: codec.decode(payload, data.shape), repeats)
    ref = x.astype(np.float64)
    norm = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(ref - decoded.reshape(-1).astype(np.float64)))
    mb = x.nbytes / 1e6
    encode_mb_s, decode_mb_s = mb / enc, mb / dec
    speed_target = base in ("topk", "sign") and "+" not in spec
    return {
        "spec": spec,
        "shape": list(data.shape),
        "bytes": len(payload),
        "ratio": x.nbytes / len(payload),
        "encode_mb_s": encode_mb_s,
        "decode_mb_s": decode_mb_s,
        "encode_vs_copy": encode_mb_s / copy_mb_s,
        "rel_error": err / norm if norm else 0.0,
        "encode_target_met": (encode_mb_s >= SPEED_TARGET * copy_mb_s) if speed_target else None,
        "decode_faster": decode_mb_s > encode_mb_s,
    }


def real_delta() -> tuple[np.ndarray, list[str]]:
    """W1 model change over one local epoch on device 0; returns (flat float32, names)."""
    from edge_agent.trainer import Trainer
    from models.datasets import dirichlet_partition, load_digits_split

    split = load_digits_split()
    part = dirichlet_partition(split.y_train, 8, 0.5, 0)[0]
    spec = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
    trainer = Trainer(spec, seed=0, learning_rate=0.1, batch_size=32, local_epochs=1)  # type: ignore[arg-type]
    before = trainer.params()
    trainer.train(split.x_train[part], split.y_train[part])
    after = trainer.params()
    flat = np.concatenate([(after[k] - before[k]).reshape(-1) for k in before])
    return flat.astype(np.float32), list(before)


def _fmt(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ") if value >= 100 else f"{value:.3g}"


def _mark(flag: bool | None) -> str:
    return "—" if flag is None else ("yes" if flag else "NO")


def table(rows: list[dict[str, Any]], copy_mb_s: float) -> str:
    """Render rows as a Markdown table (memory copy first)."""
    lines = [
        "| spec | bytes | ratio | encode MB/s | decode MB/s | enc/copy | rel. error "
        "| enc ≥ 50 % copy | dec > enc |",
        "|------|------:|------:|------------:|------------:|---------:|-----------:|:---:|:---:|",
        f"| (memory copy) | | | {_fmt(copy_mb_s)} | | 100 % | | | |",
    ]
    for r in rows:
        lines.append(
            f"| {r['spec']} | {r['bytes']} | {r['ratio']:.2f} | {_fmt(r['encode_mb_s'])} | "
            f"{_fmt(r['decode_mb_s'])} | {100 * r['encode_vs_copy']:.0f} % | "
            f"{r['rel_error']:.3g} | {_mark(r['encode_target_met'])} | "
            f"{_mark(r['decode_faster'])} |"
        )
    return "\n".join(lines)


def main(size: int, specs: list[str] | None, repeats: int, out: Path) -> None:
    """Run W3 on both deltas, print the tables and write ``out/codecs.json``."""
    from threadpoolctl import threadpool_limits

    specs = [s.strip() for s in specs] if specs else list(DEFAULT_SPECS)
    command = f"meshfl bench codecs --size {size} --repeats {repeats} --out {out}"
    if specs != DEFAULT_SPECS:
        command += f" --codecs {','.join(specs)}"
    with threadpool_limits(limits=1):
        real, names = real_delta()
        deltas = {
            "gaussian": np.random.default_rng(0).standard_normal(size, dtype=np.float32),
            "w1-real": real,
        }
        result: dict[str, Any] = {
            "workload": "W3",
            "command": command,
            "machine": describe(),
            "threads": 1,
            "repeats": repeats,
            "units": "MB/s = 1e6 bytes of float32 input per second, median",
            "real_delta_tensors": names,
            "deltas": {},
        }
        print("Workload: W3 — codec micro-benchmark")
        print(f"Command:  {command}")
        print(f"Machine:  {result['machine']}; 1 thread (threadpoolctl), medians of {repeats}")
        for label, x in deltas.items():
            copy = memcopy_mb_s(x, repeats)
            rows = [bench_codec(spec, x, repeats, copy) for spec in specs]
            result["deltas"][label] = {"numel": int(x.size), "memcopy_mb_s": copy, "codecs": rows}
            print(f"\n{label}: {x.size} float32 ({x.nbytes / 1e6:.3g} MB)")
            print(table(rows, copy))
    out.mkdir(parents=True, exist_ok=True)
    (out / "codecs.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out / 'codecs.json'}")
