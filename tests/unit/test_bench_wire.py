"""``meshfl bench wire``: overhead equals the serde sizes; every field is produced."""

from __future__ import annotations

import json
import math
from pathlib import Path

from meshfl.app.bench import wire
from meshfl.wire.serde import CHUNK_OVERHEAD, ENVELOPE_OVERHEAD, TENSOR_OVERHEAD


def test_overhead_matches_serde_header_sizes(tmp_path: Path) -> None:
    # Prepare / Execute
    wire.main(repeats=1, out=tmp_path)
    rows = json.loads((tmp_path / "wire.json").read_text())["sizes"]
    # Assert: 45 + strings + 8 + name + 4 per dim, plus 38 per chunk of 131072 − 38 body bytes
    for row in rows:
        p = row["payload_bytes"]
        message = ENVELOPE_OVERHEAD + len("w3job-1dev-00") + TENSOR_OVERHEAD + len("delta") + 4 + p
        chunks = max(1, math.ceil(message / (131072 - CHUNK_OVERHEAD)))
        assert row["message_bytes"] == message
        assert row["chunks"] == chunks
        assert row["wire_bytes"] == message + chunks * CHUNK_OVERHEAD
        assert row["overhead_pct"] == 100.0 * (row["wire_bytes"] - p) / p
        assert row["pack_mb_s"] > 0 and row["unpack_mb_s"] > 0
    assert [r["payload_bytes"] for r in rows] == [1024, 65536, 1048576]
    assert [r["chunks"] for r in rows] == [1, 1, 9]
    assert [r["target_met"] for r in rows] == [None, True, True]


def test_expected_wire_bytes_agrees_with_packing() -> None:
    for p in (4, 1024, 131072, 200_000):
        assert wire.bench_size(p, repeats=1)["wire_bytes"] == wire.expected_wire_bytes(p)
