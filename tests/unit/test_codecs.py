"""Codec registry, identity codec, and the behaviour every codec shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import meshfl.codecs as codecs
from meshfl.codecs import (
    CODECS,
    QSGD,
    VALID_FORMS,
    BFloat16,
    Codec,
    Float16,
    Identity,
    Int8,
    PowerSGD,
    RandK,
    Sign,
    TopK,
    Zstd,
    decode_tensor,
    parse_codec,
)
from meshfl.codecs.registry import build_registry
from meshfl.errors import CodecError, CodecSpecError, ConfigError

ALL_CODECS: list[Codec] = [
    Identity(),
    TopK(0.1),
    TopK(0.5),
    TopK(1.0),
    Float16(),
    BFloat16(),
    Int8(),
    Int8(4),
    QSGD(4, seed=1),
    QSGD(300, bucket=5, seed=2),
    RandK(0.3, seed=3),
    RandK(0.7, unbiased=True, seed=4),
    Sign(),
    PowerSGD(1, seed=5),
    Zstd(TopK(0.5)),
    Zstd(Int8(), 19),
]

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)
arrays = hnp.arrays(np.float32, shapes, elements=finite_f32)


def test_exported_members() -> None:
    assert sorted(codecs.__all__) == sorted(
        [
            "CODECS",
            "QSGD",
            "VALID_FORMS",
            "BFloat16",
            "Codec",
            "CodecPolicy",
            "CodecTag",
            "Float16",
            "Identity",
            "Int8",
            "PowerSGD",
            "RandK",
            "Sign",
            "TopK",
            "Zstd",
            "budget_density",
            "decode_tensor",
            "parse_codec",
        ]
    )


def test_registry_tags_and_names_unique() -> None:
    tags = list(CODECS)
    names = [cls.name for cls in CODECS.values()]

    assert len(set(tags)) == len(tags)
    assert len(set(names)) == len(names)
    assert all(0 <= t <= 255 and CODECS[t].tag == t for t in tags)
    assert {CODECS[1], CODECS[2]} == {Identity, TopK}


def test_registry_rejects_duplicate_tag_and_name() -> None:
    class Clash(Identity):
        name = "clash"

    class SameName(TopK):
        tag = 99

    with pytest.raises(CodecError, match="duplicate codec tag 1"):
        build_registry((Identity, Clash))
    with pytest.raises(CodecError, match="duplicate codec name 'topk'"):
        build_registry((TopK, SameName))


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        CODECS[7] = Identity  # type: ignore[index]


@pytest.mark.parametrize("spec", ["identity", "fp32", " FP32 ", "topk:0.1", "topk:1", "topk:1e-3"])
def test_parse_codec_round_trips_spec(spec: str) -> None:
    codec = parse_codec(spec)

    again = parse_codec(codec.spec)

    assert again == codec
    assert again.spec == codec.spec
    assert hash(again) == hash(codec)


@given(st.floats(min_value=1e-9, max_value=1.0, exclude_min=False))
def test_parse_codec_round_trips_any_density(density: float) -> None:
    codec = TopK(density)

    assert parse_codec(codec.spec) == codec


def test_parse_codec_spec_values() -> None:
    assert parse_codec("fp32") == Identity()
    assert parse_codec("identity").spec == "identity"
    assert parse_codec("topk:0.1").spec == "topk:0.1"
    topk = parse_codec("topk:0.25")
    assert isinstance(topk, TopK) and topk.density == 0.25


def test_parse_codec_invalid_density_message() -> None:
    with pytest.raises(CodecSpecError) as info:
        parse_codec("topk:2")

    assert str(info.value) == (
        f"invalid codec spec 'topk:2': density must be in (0, 1]; valid forms: {VALID_FORMS}"
    )
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    "spec", ["", "topk", "topk:", "topk:0", "topk:-0.1", "topk:nan", "topk:inf", "topk:x", "zstd"]
)
def test_parse_codec_rejects_invalid(spec: str) -> None:
    with pytest.raises(CodecSpecError, match=r"valid forms: identity\|fp32, fp16"):
        parse_codec(spec)


@pytest.mark.parametrize("density", [0.0, -1.0, 1.5, float("nan"), float("inf")])
def test_topk_constructor_rejects_bad_density(density: float) -> None:
    with pytest.raises(CodecSpecError, match=r"density must be in \(0, 1\]"):
        TopK(density)


def test_decode_tensor_dispatches_and_rejects_unknown_tag() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    out = decode_tensor(Identity.tag, Identity().encode(x), (2, 3))

    np.testing.assert_array_equal(out, x)
    with pytest.raises(CodecError, match="unknown codec tag 200"):
        decode_tensor(200, b"", (0,))


@given(arrays)
def test_identity_round_trip_is_exact(x: np.ndarray) -> None:
    payload = Identity().encode(x)

    out = Identity.decode(payload, x.shape)

    assert len(payload) == 4 * x.size
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_array_equal(out, x)


def test_identity_golden_bytes() -> None:
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)

    payload = Identity().encode(x)

    assert payload == bytes.fromhex("0000803f000000c00000003f")


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,), (5,), (2, 3, 4)])
def test_zeros_and_degenerate_shapes(codec: Codec, shape: tuple[int, ...]) -> None:
    x = np.zeros(shape, dtype=np.float32)

    out = type(codec).decode(codec.encode(x), shape)

    assert out.shape == shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
def test_scalar_round_trip(codec: Codec) -> None:
    x = np.array(-7.25, dtype=np.float32)

    out = type(codec).decode(codec.encode(x), ())

    assert out.shape == ()
    assert float(out) == pytest.approx(-7.25, rel=1e-6)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
@pytest.mark.parametrize("magnitude", [1e30, 1e-30, 1e-40])
def test_huge_and_tiny_magnitudes_stay_finite(codec: Codec, magnitude: float) -> None:
    x = (np.random.default_rng(0).standard_normal((6, 7)) * magnitude).astype(np.float32)
    x[0, 0] = 0.0

    out = type(codec).decode(codec.encode(x), x.shape)

    assert out.shape == x.shape and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert np.abs(out).max() <= np.abs(x).max() * 64  # qsgd/randk may scale up, no further


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
def test_float32_extremes_never_decode_to_inf(codec: Codec) -> None:
    x = np.array([3.4e38, -3.4e38, 1e-45, -1e-40, 0.0, 1.0], dtype=np.float32)

    try:
        payload = codec.encode(x)
    except CodecError as exc:  # qsgd and unbiased random-k refuse what would overflow
        assert "float32" in str(exc) or "1.7e38" in str(exc)
        return
    out = type(codec).decode(payload, x.shape)

    assert np.isfinite(out).all()


@pytest.mark.parametrize("codec", [Identity(), TopK(0.1), TopK(0.5), TopK(1.0)], ids=repr)
def test_huge_and_tiny_magnitudes(codec: Codec) -> None:
    x = np.array([3.4e38, -3.4e38, 1e-45, -1e-40, 0.0, 1.0], dtype=np.float32)

    out = type(codec).decode(codec.encode(x), x.shape)

    assert np.isfinite(out).all()
    kept = out != 0
    np.testing.assert_array_equal(out[kept], x[kept])
    assert np.abs(out[0]) == np.float32(3.4e38)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_rejected(codec: Codec, bad: float) -> None:
    x = np.ones(10, dtype=np.float32)
    x[4] = bad

    with pytest.raises(CodecError, match="NaN or inf"):
        codec.encode(x)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
def test_float64_overflowing_float32_and_integers_are_rejected(codec: Codec) -> None:
    with pytest.raises(CodecError, match="NaN or inf"):
        codec.encode(np.array([1e39]))
    with pytest.raises(CodecError, match="floating"):
        codec.encode(np.arange(3))


def test_float64_input_is_cast_to_float32() -> None:
    x = np.array([0.1, 0.2], dtype=np.float64)

    out = Identity.decode(Identity().encode(x), (2,))

    np.testing.assert_array_equal(out, x.astype(np.float32))


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
def test_truncated_and_extended_payloads_raise_codec_error(codec: Codec) -> None:
    x = np.random.default_rng(1).standard_normal(37).astype(np.float32)
    payload = codec.encode(x)

    for cut in range(len(payload)):
        with pytest.raises(CodecError):
            type(codec).decode(payload[:cut], x.shape)
    with pytest.raises(CodecError):
        type(codec).decode(payload + b"\x00", x.shape)


@pytest.mark.parametrize("cls", list(CODECS.values()), ids=lambda c: c.name)
@pytest.mark.parametrize("shape", [(), (1,), (9,), (3, 5), (200,)])
@settings(max_examples=60)
@given(payload=st.binary(max_size=120))
def test_random_payloads_raise_only_codec_error(
    cls: type[Codec], shape: tuple[int, ...], payload: bytes
) -> None:
    try:
        out = cls.decode(payload, shape)
    except CodecError:
        return
    assert out.shape == shape and out.dtype == np.float32
    assert np.isfinite(out).all()


@pytest.mark.parametrize("cls", list(CODECS.values()), ids=lambda c: c.name)
def test_nan_payload_and_bad_shape_rejected(cls: type[Codec]) -> None:
    with pytest.raises(CodecError):
        cls.decode(b"\x00" * 64, (-1,))
    with pytest.raises(CodecError):
        cls.decode(b"\x00" * 64, [4])  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        cls.decode("text", (1,))  # type: ignore[arg-type]


def test_identity_nan_payload_rejected() -> None:
    with pytest.raises(CodecError, match="NaN or inf"):
        Identity.decode(np.array([np.nan], dtype="<f4").tobytes(), (1,))


def test_estimate_ratio_identity() -> None:
    assert Identity().estimate_ratio(4810) == 1.0
    assert Identity().estimate_ratio(0) == 1.0


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.spec)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mutated_payloads_raise_only_codec_error(codec: Codec, data: st.DataObject) -> None:
    x = np.random.default_rng(5).standard_normal((6, 5)).astype(np.float32)
    payload = bytearray(codec.encode(x))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))

    try:
        out = type(codec).decode(bytes(payload), x.shape)
    except CodecError:
        return
    assert out.shape == x.shape and out.dtype == np.float32
    assert np.isfinite(out).all()
