"""Top-k sparsification: selection, error bound, index packing, golden bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshfl.codecs import TopK
from meshfl.codecs.topk import FORMAT_BITMAP, FORMAT_VARINT
from meshfl.codecs.varint import varint_decode, varint_encode
from meshfl.errors import CodecError

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
vectors = hnp.arrays(np.float32, st.integers(0, 300), elements=finite_f32)
densities = st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.5, 0.99, 1.0])


def reference_topk(x: np.ndarray, k: int) -> np.ndarray:
    """k largest |x|, ties to the lower index, by a full stable sort."""
    flat = x.reshape(-1)
    order = np.lexsort((np.arange(flat.size), -np.abs(flat).astype(np.float64)))
    out = np.zeros_like(flat)
    out[order[:k]] = flat[order[:k]]
    return out.reshape(x.shape)


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize(
    ("density", "n", "k"),
    [(0.1, 30, 3), (0.1, 10, 1), (0.1, 5, 1), (0.5, 5, 3), (1.0, 7, 7), (1e-3, 10, 1), (0.3, 0, 0)],
)
def test_k_formula(density: float, n: int, k: int) -> None:
    assert TopK(density).k_for(n) == k


@settings(max_examples=200)
@given(vectors, densities)
def test_keeps_exactly_the_k_largest(x: np.ndarray, density: float) -> None:
    codec = TopK(density)
    k = codec.k_for(x.size)

    out = TopK.decode(codec.encode(x), x.shape)

    np.testing.assert_array_equal(out, reference_topk(x, k))
    assert k == (0 if x.size == 0 else max(1, math.ceil(density * x.size - 1e-9)))


@settings(max_examples=200)
@given(
    hnp.arrays(np.float32, st.integers(1, 300), elements=st.floats(-1e6, 1e6, width=32)), densities
)
def test_contraction_bound(x: np.ndarray, density: float) -> None:
    codec = TopK(density)
    k = codec.k_for(x.size)

    out = TopK.decode(codec.encode(x), x.shape)

    err = float(np.sum((x.astype(np.float64) - out) ** 2))
    norm = float(np.sum(x.astype(np.float64) ** 2))
    assert err <= (1 - k / x.size) * norm * (1 + 1e-9) + 1e-30


def test_ties_go_to_lower_index() -> None:
    x = np.array([1.0, -2.0, 2.0, 0.5, -2.0, 2.0], dtype=np.float32)

    out = TopK.decode(TopK(0.5).encode(x), x.shape)

    np.testing.assert_array_equal(out, [0.0, -2.0, 2.0, 0.0, -2.0, 0.0])


def test_golden_bytes_bitmap() -> None:
    # u8 format=0 (bitmap) | u32 k=2 | f32 -3.0, 2.0 | bitmap 0b00001010 (indices 1 and 3)
    x = np.array([0.0, -3.0, 1.0, 2.0], dtype=np.float32)

    payload = TopK(0.5).encode(x)

    assert payload == bytes.fromhex("0002000000000040c0000000400a")


def test_golden_bytes_varint() -> None:
    # u8 format=1 (varint) | u32 k=2 | f32 1.0, -1.0 | gaps 3 -> 03, 296 -> a8 02
    x = np.zeros(1000, dtype=np.float32)
    x[3], x[300] = 1.0, -1.0

    payload = TopK(0.002).encode(x)

    assert payload == bytes.fromhex("01020000000000803f000080bf03a802")


@settings(max_examples=150)
@given(n=st.integers(1, 2000), density=st.floats(0.0005, 1.0), seed=st.integers(0, 2**32 - 1))
def test_index_format_is_the_smaller(n: int, density: float, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    codec = TopK(density)
    k = codec.k_for(n)
    idx = np.flatnonzero(reference_topk(x, k))
    gaps = np.diff(idx, prepend=-1) - 1
    varint_size = sum(len(leb128(int(g))) for g in gaps)
    bitmap_size = (n + 7) // 8

    payload = codec.encode(x)

    assert len(payload) == 5 + 4 * k + min(varint_size, bitmap_size)
    assert payload[0] == (FORMAT_VARINT if varint_size < bitmap_size else FORMAT_BITMAP)
    np.testing.assert_array_equal(TopK.decode(payload, (n,)), reference_topk(x, k))


@given(st.lists(st.integers(0, 2**35 - 1), max_size=50))
def test_varint_matches_reference_leb128(values: list[int]) -> None:
    arr = np.array(values, dtype=np.int64)

    encoded = varint_encode(arr)

    assert encoded == b"".join(leb128(v) for v in values)
    decoded = varint_decode(np.frombuffer(encoded, dtype=np.uint8), len(values))
    np.testing.assert_array_equal(decoded, arr)


@pytest.mark.parametrize(
    ("data", "count", "match"),
    [
        (b"", 1, "empty"),
        (b"\x80", 1, "complete varints"),
        (b"\x01\x02", 1, "complete varints"),
        (b"\x01\x81", 1, "ends inside"),
        (b"\x81\x00", 1, "overlong"),
        (b"\x80\x80\x80\x80\x80\x01", 1, "longer than 5"),
    ],
)
def test_varint_decode_rejects_malformed(data: bytes, count: int, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        varint_decode(np.frombuffer(data, dtype=np.uint8), count)


def test_varint_encode_rejects_out_of_range() -> None:
    with pytest.raises(CodecError):
        varint_encode(np.array([-1], dtype=np.int64))


@pytest.mark.parametrize(
    ("payload", "shape", "match"),
    [
        (bytes.fromhex("0005000000"), (4,), "keeps 5 entries"),
        (bytes.fromhex("02010000000000803f"), (4,), "unknown top-k index format"),
        (bytes.fromhex("00010000000000803ff0"), (4,), "past the end"),
        (bytes.fromhex("00010000000000803f03"), (4,), "marks 2 entries"),
        (bytes.fromhex("00010000000000803f0100"), (4,), "bitmap is 2 bytes"),
        (bytes.fromhex("01010000000000803f04"), (4,), "out of range"),
        (bytes.fromhex("01020000000000803f0000803f0202"), (4,), "out of range"),
        (bytes.fromhex("00010000000000c07f01"), (4,), "NaN or inf"),
    ],
)
def test_malformed_payloads(payload: bytes, shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(CodecError, match=match):
        TopK.decode(payload, shape)


@pytest.mark.parametrize("density", [0.05, 0.1, 0.2])
def test_estimate_ratio_close_to_actual(density: float) -> None:
    x = np.random.default_rng(0).standard_normal(4810).astype(np.float32)
    codec = TopK(density)

    actual = 4 * x.size / len(codec.encode(x))

    assert codec.estimate_ratio(x.size) == pytest.approx(actual, rel=0.05)
    assert TopK(density).estimate_ratio(0) == 0.0


def test_payload_sizes_for_4810_elements() -> None:
    x = np.random.default_rng(0).standard_normal(4810).astype(np.float32)

    sizes = {d: len(TopK(d).encode(x)) for d in (0.05, 0.1, 0.2)}

    # k = 241, 481, 962; varint for 0.05 and 0.1 (≈1 byte/index), bitmap (602 B) for 0.2
    assert sizes[0.2] == 5 + 4 * 962 + 602
    assert 5 + 4 * 241 + 241 <= sizes[0.05] < 5 + 4 * 241 + 602
    assert 5 + 4 * 481 + 481 <= sizes[0.1] < 5 + 4 * 481 + 602


def test_large_tensor_round_trip_is_vectorized() -> None:
    x = np.random.default_rng(3).standard_normal((1000, 1000)).astype(np.float32)
    codec = TopK(0.01)

    out = TopK.decode(codec.encode(x), x.shape)

    assert np.count_nonzero(out) == 10_000
    threshold = np.sort(np.abs(x).ravel())[-10_000]
    np.testing.assert_array_equal(out != 0, np.abs(x) >= threshold)
