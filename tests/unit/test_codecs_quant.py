"""Quantizers: fp16, bf16, int8, QSGD and sign — error bounds, bias, golden bytes, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshfl.codecs import QSGD, BFloat16, Float16, Int8, Sign, parse_codec
from meshfl.codecs.bitpack import pack_codes, unpack_codes
from meshfl.codecs.qsgd import code_width
from meshfl.errors import CodecError

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
vectors = hnp.arrays(np.float32, st.integers(0, 200), elements=finite_f32)
moderate = hnp.arrays(np.float32, st.integers(1, 200), elements=st.floats(-1e6, 1e6, width=32))


@settings(max_examples=200)
@given(vectors)
def test_fp16_error_bound(x: np.ndarray) -> None:
    payload = Float16().encode(x)
    e = int.from_bytes(payload[:2], "little", signed=True)

    out = Float16.decode(payload, x.shape)

    x64, err = x.astype(np.float64), np.abs(out.astype(np.float64) - x.astype(np.float64))
    bound = 2.0**-11 * np.abs(x64) + max(2.0 ** (e - 25), 2.0**-149)
    assert (err <= bound).all()
    if x.size and np.abs(x).max() > 0:
        assert 2.0**e <= np.abs(x64).max() * 2.0**-14


@settings(max_examples=200)
@given(vectors)
def test_bf16_error_bound_and_saturation(x: np.ndarray) -> None:
    out = BFloat16.decode(BFloat16().encode(x), x.shape)

    x64 = x.astype(np.float64)
    err = np.abs(out.astype(np.float64) - x64)
    assert np.isfinite(out).all()
    normal = np.abs(x64) >= 2.0**-126
    assert (err[normal] <= 2.0**-8 * np.abs(x64[normal])).all()
    assert (err[~normal] <= 2.0**-134).all()


def test_bf16_round_to_nearest_even() -> None:
    # 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to the even mantissa (1.0);
    # 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: goes up to even.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 3.4028235e38], dtype=np.float32)

    out = BFloat16.decode(BFloat16().encode(x), (3,))

    np.testing.assert_array_equal(out[:2], np.array([1.0, 1 + 2**-6], dtype=np.float32))
    assert out[2] == np.float32(3.3895314e38)  # saturates at the largest finite bf16


@settings(max_examples=200)
@given(moderate, st.sampled_from([1, 3, 16, 1024]))
def test_int8_error_at_most_half_a_step(x: np.ndarray, chunk: int) -> None:
    codec = Int8(chunk)

    out = Int8.decode(codec.encode(x), x.shape)

    peaks = np.array(
        [np.abs(x[i : i + chunk]).max() for i in range(0, x.size, chunk)], dtype=np.float64
    )
    scale = np.repeat(peaks / 127.0, chunk)[: x.size]
    err = np.abs(out.astype(np.float64) - x.astype(np.float64))
    assert (err <= scale / 2 * (1 + 1e-5) + 1e-30).all()


def test_int8_payload_size_and_spec() -> None:
    x = np.ones(2500, dtype=np.float32)

    assert len(Int8().encode(x)) == 4 + 4 * 3 + 2500
    assert Int8().estimate_ratio(2500) == pytest.approx(4 * 2500 / (4 + 12 + 2500))
    assert Int8().spec == "int8" and Int8(64).spec == "int8:64"
    assert parse_codec("int8:64") == Int8(64)


@pytest.mark.parametrize(("levels", "bucket"), [(1, 512), (4, 512), (16, 8), (300, 64)])
def test_qsgd_is_unbiased(levels: int, bucket: int) -> None:
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    codec = QSGD(levels, bucket=bucket, seed=1)
    trials = 4000

    mean = np.mean([QSGD.decode(codec.encode(x), x.shape) for _ in range(trials)], axis=0)

    # Per element, Var Q_i <= tau_b^2 / (4 s^2); 5 standard errors of the mean.
    tau = np.concatenate(
        [
            np.full(x[i : i + bucket].size, np.linalg.norm(x[i : i + bucket]))
            for i in range(0, 64, bucket)
        ]
    )
    tolerance = 5 * tau / (2 * levels) / np.sqrt(trials)
    assert (np.abs(mean - x) <= tolerance).all()


@settings(max_examples=100)
@given(moderate, st.sampled_from([1, 2, 7, 16, 255]))
def test_qsgd_levels_and_norm(x: np.ndarray, levels: int) -> None:
    codec = QSGD(levels, bucket=32, seed=0)

    out = QSGD.decode(codec.encode(x), x.shape)

    for i in range(0, x.size, 32):
        v, q = x[i : i + 32].astype(np.float64), out[i : i + 32].astype(np.float64)
        tau = max(np.linalg.norm(v), np.abs(v).max())
        # each output is ±τ·l/s on the grid next to |v_i|
        assert (np.abs(np.abs(q) - np.abs(v)) <= tau / levels * (1 + 1e-5) + 1e-30).all()
        assert (np.sign(q) * np.sign(v) >= 0).all()


def test_qsgd_deterministic_given_seed() -> None:
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)

    assert QSGD(8, seed=3).encode(x) == QSGD(8, seed=3).encode(x)
    assert QSGD(8, seed=3).encode(x) != QSGD(8, seed=4).encode(x)


def test_qsgd_refuses_norms_beyond_float32() -> None:
    with pytest.raises(CodecError, match="norm"):
        QSGD(4, seed=0).encode(np.full(8, 3e38, dtype=np.float32))


@settings(max_examples=200)
@given(vectors)
def test_sign_decodes_to_scale_times_sign(x: np.ndarray) -> None:
    payload = Sign().encode(x)

    out = Sign.decode(payload, x.shape)

    scale = np.frombuffer(payload[:4], dtype="<f4")[0]
    np.testing.assert_array_equal(out, np.where(x < 0, -scale, scale).astype(np.float32))
    mean = float(np.abs(x.astype(np.float64)).mean()) if x.size else 0.0
    assert float(scale) == pytest.approx(mean, rel=1e-5)


@settings(max_examples=100)
@given(hnp.arrays(np.float32, st.integers(1, 200), elements=st.floats(-1e3, 1e3, width=32)))
def test_sign_contraction_identity(x: np.ndarray) -> None:
    out = Sign.decode(Sign().encode(x), x.shape).astype(np.float64)

    x64 = x.astype(np.float64)
    err = np.sum((x64 - out) ** 2)
    expected = np.sum(x64**2) - np.sum(np.abs(x64)) ** 2 / x.size
    assert err == pytest.approx(expected, rel=1e-4, abs=1e-3)


def test_golden_bytes_fp16() -> None:
    # i16 e = -13 (max 2.0 -> 2^14) | f16 8192, -16384, 4096, 0
    payload = Float16().encode(np.array([1.0, -2.0, 0.5, 0.0], dtype=np.float32))

    assert payload == bytes.fromhex("f3ff007000f4006c0000")


def test_golden_bytes_bf16() -> None:
    # u16 0x3f80 (1.0), 0xc000 (-2.0), 0x4049 (pi rounded down), 0x0000
    payload = BFloat16().encode(np.array([1.0, -2.0, 3.14159274, 0.0], dtype=np.float32))

    assert payload == bytes.fromhex("803f00c049400000")


def test_golden_bytes_int8() -> None:
    # u32 chunk 2 | f32 scales 2/127, 0.5/127, 4/127 | i8 64 (63.5 to even), -127, 127, 0, 127
    payload = Int8(2).encode(np.array([1.0, -2.0, 0.5, 0.0, 4.0], dtype=np.float32))

    assert payload == bytes.fromhex("020000000402813c0402813b0402013d40817f007f")


def test_golden_bytes_qsgd() -> None:
    # u16 s=5 | u32 bucket 512 | f32 norm 5.0 | 4-bit codes 3, 4|sign (0xc), 0 -> c3 00
    # |v_i| s / norm is an integer here, so no random rounding happens.
    payload = QSGD(5, seed=0).encode(np.array([3.0, -4.0, 0.0], dtype=np.float32))

    assert payload == bytes.fromhex("0500000200000000a040c300")


def test_golden_bytes_sign() -> None:
    # f32 scale 10/9 | bits of x < 0 at 1, 3, 6 -> 0x4a, and 8 -> 0x01
    x = np.array([1.0, -2.0, 0.0, -1.0, 3.0, 0.5, -0.5, 1.0, -1.0], dtype=np.float32)

    assert Sign().encode(x) == bytes.fromhex("e4388e3f4a01")


@pytest.mark.parametrize(
    ("cls", "payload", "shape", "match"),
    [
        (Float16, bytes.fromhex("00010000"), (1,), "exponent"),
        (Float16, bytes.fromhex("0000007c"), (1,), "NaN or inf"),
        (BFloat16, bytes.fromhex("807f"), (1,), "NaN or inf"),
        (Int8, bytes.fromhex("00000000"), (0,), "chunk size 0"),
        (Int8, bytes.fromhex("01000000000080bf01"), (1,), "negative"),
        (Int8, bytes.fromhex("010000000000803f80"), (1,), "-128"),
        (Int8, bytes.fromhex("01000000ffff7f7f01"), (1,), "overflow"),
        (QSGD, bytes.fromhex("0000000200000000803f00"), (1,), "0 levels"),
        (QSGD, bytes.fromhex("010000020000000080bf00"), (1,), "norm"),
        (QSGD, bytes.fromhex("0200000200000000803f03"), (1,), "level above"),
        (QSGD, bytes.fromhex("0100000200000000803ff1"), (1,), "padding"),
        (Sign, bytes.fromhex("0000c07f00"), (1,), "scale"),
        (Sign, bytes.fromhex("0000803f02"), (1,), "padding"),
    ],
)
def test_malformed_payloads(cls: type, payload: bytes, shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(CodecError, match=match):
        cls.decode(payload, shape)


@settings(max_examples=100)
@given(st.integers(1, 24), st.integers(0, 100), st.integers(0, 2**32 - 1))
def test_bitpack_matches_reference(width: int, n: int, seed: int) -> None:
    codes = np.random.default_rng(seed).integers(0, 2**width, n).astype(np.uint32)

    packed = pack_codes(codes, width)

    bits = ((codes[:, None].astype(np.uint64) >> np.arange(width, dtype=np.uint64)) & 1).astype(
        np.uint8
    )
    assert packed == np.packbits(bits.reshape(-1), bitorder="little").tobytes()
    np.testing.assert_array_equal(unpack_codes(packed, n, width), codes)


@pytest.mark.parametrize(("levels", "width"), [(1, 2), (2, 3), (3, 3), (4, 4), (16, 6), (255, 9)])
def test_qsgd_code_width(levels: int, width: int) -> None:
    assert code_width(levels) == width
    assert QSGD(levels).estimate_ratio(1024) == pytest.approx(
        4 * 1024 / (6 + 8 + (1024 * width + 7) // 8)
    )
