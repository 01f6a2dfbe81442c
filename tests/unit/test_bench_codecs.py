"""``meshfl bench codecs`` (W3) on small sizes, and the exactness of the fast kernels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshfl.app.bench import codecs as bench
from meshfl.app.bench.machine import describe
from meshfl.codecs import parse_codec
from meshfl.codecs.sign import abs_sum_and_sign_bits
from meshfl.codecs.topk import _top_indices, _top_indices_sampled
from meshfl.errors import CodecError

FIELDS = {
    "spec", "shape", "bytes", "ratio", "encode_mb_s", "decode_mb_s", "encode_vs_copy",
    "rel_error", "encode_target_met", "decode_faster",
}  # fmt: skip


def test_bench_codecs_writes_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare / Execute
    bench.main(size=10_000, specs=None, repeats=1, out=tmp_path)
    result = json.loads((tmp_path / "codecs.json").read_text())
    printed = capsys.readouterr().out
    # Assert
    assert result["workload"] == "W3" and "meshfl bench codecs --size 10000" in printed
    assert result["machine"] == describe()
    x = np.random.default_rng(0).standard_normal(10_000, dtype=np.float32)
    for label, numel in (("gaussian", 10_000), ("w1-real", 4810)):
        delta = result["deltas"][label]
        assert delta["numel"] == numel and delta["memcopy_mb_s"] > 0
        assert [r["spec"] for r in delta["codecs"]] == bench.DEFAULT_SPECS
        for row in delta["codecs"]:
            assert set(row) == FIELDS
            assert row["ratio"] == pytest.approx(4 * numel / row["bytes"])
    rows = {r["spec"]: r for r in result["deltas"]["gaussian"]["codecs"]}
    assert rows["identity"]["bytes"] == 40_000 and rows["identity"]["rel_error"] == 0.0
    assert rows["sign"]["bytes"] == len(parse_codec("sign").encode(x)) == 4 + 1250
    assert rows["topk:0.01"]["bytes"] == len(parse_codec("topk:0.01").encode(x))
    assert rows["sign"]["encode_target_met"] in (True, False)
    assert rows["int8"]["encode_target_met"] is None


def test_bench_codecs_subset_and_powersgd_shape(tmp_path: Path) -> None:
    bench.main(size=4096, specs=["powersgd:2", "fp16"], repeats=1, out=tmp_path)
    rows = json.loads((tmp_path / "codecs.json").read_text())["deltas"]["gaussian"]["codecs"]
    assert rows[0]["shape"] == [64, 64] and rows[1]["shape"] == [4096]


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 65_537, 200_003, 1_000_000])
def test_abs_sum_and_sign_bits_bit_identical(n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32) * 3
    x[::5] = 0.0
    x[1::7] = -0.0
    total, bits = abs_sum_and_sign_bits(x, block=4096)
    assert np.float32(total) == np.add.reduce(np.abs(x))
    assert bits == np.packbits(x < 0, bitorder="little").tobytes()


@pytest.mark.parametrize("kind", ["normal", "rounded", "sorted", "zeros"])
@pytest.mark.parametrize("density", [1e-6, 0.01, 0.1, 0.25])
def test_sampled_top_indices_equal_partition(kind: str, density: float) -> None:
    n = 300_001
    rng = np.random.default_rng(1)
    x = {
        "normal": rng.standard_normal(n, dtype=np.float32),
        "rounded": np.round(rng.standard_normal(n), 1).astype(np.float32),
        "sorted": np.sort(rng.standard_normal(n)).astype(np.float32),
        "zeros": np.zeros(n, dtype=np.float32),
    }[kind]
    k = max(1, int(density * n))
    np.testing.assert_array_equal(_top_indices_sampled(x, k), _top_indices(x, k))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_sampled_top_indices_refuse_non_finite(bad: float) -> None:
    x = np.ones(100_000, dtype=np.float32)
    x[12_345] = bad
    with pytest.raises(CodecError):
        parse_codec("topk:0.01").encode(x)
