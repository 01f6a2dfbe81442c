"""``meshfl bench wire``: envelope and chunking overhead, pack/unpack throughput.

A delta of ``P`` payload bytes is one identity-coded float32 tensor ``"delta"`` of
``P/4`` elements (shape ``(P/4,)``) in a DELTA envelope with fleet ``"w3"``, job
``"job-1"`` and sender ``"dev-00"``, chunked at the default 128 KiB max payload.
Overhead = (bytes of all chunks − P) / P: the envelope header, strings, manifest entry
and CRC, plus 38 bytes (header + CRC) per chunk. Pack = ``encode_envelope`` +
``split_message``; unpack = ``Reassembler.feed`` of every chunk + ``decode_envelope``;
MB/s of payload (10⁶ bytes/s), medians over ``repeats`` after one warm-up.
Target (issue 3): overhead ≤ 1 % for deltas ≥ 64 KiB.
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
from meshfl.codecs import CodecTag
from meshfl.errors import WireError
from meshfl.wire import (
    DEFAULT_MAX_PAYLOAD,
    DType,
    Envelope,
    MessageKind,
    Reassembler,
    TensorEntry,
    decode_envelope,
    encode_envelope,
    new_message_id,
    split_message,
)
from meshfl.wire.serde import CHUNK_OVERHEAD, ENVELOPE_OVERHEAD, TENSOR_OVERHEAD

__all__ = ["PAYLOAD_SIZES", "bench_size", "expected_wire_bytes", "main", "make_envelope"]

PAYLOAD_SIZES = (1024, 64 * 1024, 1024 * 1024)
OVERHEAD_TARGET = 0.01
_FLEET, _JOB, _SENDER, _NAME = "w3", "job-1", "dev-00", "delta"


def make_envelope(payload_bytes: int) -> Envelope:
    """Return a DELTA envelope holding one identity-coded float32 tensor of that size."""
    x = np.random.default_rng(0).standard_normal(payload_bytes // 4, dtype=np.float32)
    entry = TensorEntry(_NAME, (x.size,), DType.FLOAT32, int(CodecTag.IDENTITY), x.tobytes())
    return Envelope(
        kind=MessageKind.DELTA,
        fleet=_FLEET,
        job=_JOB,
        round=1,
        sender=_SENDER,
        message_id=new_message_id(),
        sequence=1,
        tensors=(entry,),
    )


def expected_wire_bytes(payload_bytes: int, max_payload: int = DEFAULT_MAX_PAYLOAD) -> int:
    """Total chunk bytes from the serde sizes alone (docs/wire.md), for one 1-D tensor."""
    strings = len(_FLEET) + len(_JOB) + len(_SENDER)
    message = ENVELOPE_OVERHEAD + strings + TENSOR_OVERHEAD + len(_NAME) + 4 + payload_bytes
    chunks = max(1, math.ceil(message / (max_payload - CHUNK_OVERHEAD)))
    return message + chunks * CHUNK_OVERHEAD


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_size(payload_bytes: int, repeats: int) -> dict[str, Any]:
    """Measure one delta size; returns one JSON-ready row."""
    env = make_envelope(payload_bytes)

    def pack() -> list[bytes]:
        return split_message(encode_envelope(env), env.message_id, DEFAULT_MAX_PAYLOAD)

    chunks = pack()

    def unpack() -> Envelope:
        reassembler = Reassembler()
        message = None
        for chunk in chunks:
            message = reassembler.feed(chunk)
        if message is None:
            raise WireError("reassembly did not complete")  # pragma: no cover
        return decode_envelope(message)

    if unpack() != env:
        raise WireError("round trip changed the envelope")  # pragma: no cover
    wire_bytes = sum(len(c) for c in chunks)
    overhead = (wire_bytes - payload_bytes) / payload_bytes
    mb = payload_bytes / 1e6
    return {
        "payload_bytes": payload_bytes,
        "message_bytes": len(encode_envelope(env)),
        "chunks": len(chunks),
        "wire_bytes": wire_bytes,
        "overhead_bytes": wire_bytes - payload_bytes,
        "overhead_pct": 100.0 * overhead,
        "pack_mb_s": mb / _median_seconds(pack, repeats),
        "unpack_mb_s": mb / _median_seconds(unpack, repeats),
        "target_met": (overhead <= OVERHEAD_TARGET) if payload_bytes >= 64 * 1024 else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Render rows as a Markdown table."""
    lines = [
        "| payload | chunks | wire bytes | overhead bytes | overhead % | pack MB/s "
        "| unpack MB/s | ≤ 1 % (≥ 64 KiB) |",
        "|--------:|-------:|-----------:|---------------:|-----------:|----------:"
        "|------------:|:---:|",
    ]
    for r in rows:
        mark = "—" if r["target_met"] is None else ("yes" if r["target_met"] else "NO")
        lines.append(
            f"| {r['payload_bytes'] // 1024} KiB | {r['chunks']} | {r['wire_bytes']} | "
            f"{r['overhead_bytes']} | {r['overhead_pct']:.3f} % | {r['pack_mb_s']:,.0f} | "
            f"{r['unpack_mb_s']:,.0f} | {mark} |"
        )
    return "\n".join(lines)


def main(repeats: int, out: Path) -> None:
    """Measure every size, print the table and write ``out/wire.json``."""
    command = f"meshfl bench wire --repeats {repeats} --out {out}"
    rows = [bench_size(size, repeats) for size in PAYLOAD_SIZES]
    result = {
        "workload": "wire overhead (issue 3)",
        "command": command,
        "machine": describe(),
        "max_payload": DEFAULT_MAX_PAYLOAD,
        "repeats": repeats,
        "units": "MB/s = 1e6 payload bytes per second, median",
        "sizes": rows,
    }
    print("Workload: wire overhead — one identity float32 tensor per DELTA envelope")
    print(f"Command:  {command}")
    print(
        f"Machine:  {result['machine']}; max payload {DEFAULT_MAX_PAYLOAD} B, medians of {repeats}"
    )
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    (out / "wire.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out / 'wire.json'}")
