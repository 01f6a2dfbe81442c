"""The zstd layer, the spec grammar, registry completeness and the per-tensor policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.codecs import (
    CODECS,
    QSGD,
    BFloat16,
    Codec,
    CodecPolicy,
    CodecTag,
    Float16,
    Identity,
    Int8,
    PowerSGD,
    RandK,
    Sign,
    TopK,
    Zstd,
    budget_density,
    decode_tensor,
    parse_codec,
)
from meshfl.errors import CodecError, CodecSpecError, ConfigError

SPECS = [
    ("identity", Identity()),
    ("fp32", Identity()),
    ("fp16", Float16()),
    ("bf16", BFloat16()),
    ("int8", Int8()),
    ("int8:256", Int8(256)),
    ("qsgd:16", QSGD(16)),
    ("qsgd:4:128", QSGD(4, bucket=128)),
    ("topk:0.01", TopK(0.01)),
    ("randk:0.05", RandK(0.05)),
    ("randk:0.05:unbiased", RandK(0.05, unbiased=True)),
    ("sign", Sign()),
    ("powersgd:2", PowerSGD(2)),
    ("topk:0.01+zstd", Zstd(TopK(0.01))),
    ("int8+zstd:9", Zstd(Int8(), 9)),
    (" QSGD:8+ZSTD ", Zstd(QSGD(8))),
]


def test_every_tag_is_registered_once_with_its_enum_value() -> None:
    assert sorted(CODECS) == sorted(int(t) for t in CodecTag)
    assert {cls.tag for cls in CODECS.values()} == set(CodecTag)
    assert len({cls.name for cls in CODECS.values()}) == len(CODECS)
    assert [CODECS[t].tag for t in range(1, 11)] == list(range(1, 11))


@pytest.mark.parametrize(("spec", "codec"), SPECS, ids=[s for s, _ in SPECS])
def test_every_spec_form_parses_and_round_trips(spec: str, codec: Codec) -> None:
    parsed = parse_codec(spec)

    assert parsed == codec
    assert parse_codec(parsed.spec) == parsed
    assert parse_codec(parsed.spec).spec == parsed.spec
    assert type(parsed) in CODECS.values()


def test_every_registered_codec_has_a_spec_form() -> None:
    assert {type(codec) for _, codec in SPECS} == set(CODECS.values())


@pytest.mark.parametrize(
    "spec",
    [
        "fp16:2",
        "sign:1",
        "int8:",
        "int8:0",
        "int8:1.5",
        "qsgd",
        "qsgd:0",
        "qsgd:70000",
        "qsgd:4:0",
        "powersgd",
        "powersgd:0",
        "randk:0",
        "randk:0.1:",
        "topk:0.1+zstd:0",
        "topk:0.1+zstd:23",
        "topk:0.1+zstd:",
        "topk:0.1+zstd+zstd",
        "topk:0.1+gzip",
        "+zstd",
        "zstd",
    ],
)
def test_invalid_specs_list_the_valid_forms(spec: str) -> None:
    with pytest.raises(CodecSpecError) as info:
        parse_codec(spec)

    message = str(info.value)
    assert message.startswith(f"invalid codec spec {spec!r}")
    assert "valid forms: identity|fp32, fp16, bf16, int8[:CHUNK], qsgd:S" in message
    assert "+zstd[:LEVEL]" in message and "\n" not in message


def test_parse_codec_passes_the_seed() -> None:
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)

    for spec in ("qsgd:4", "randk:0.1", "powersgd:1+zstd"):
        y = x.reshape(30, 10)
        assert parse_codec(spec, seed=5).encode(y) == parse_codec(spec, seed=5).encode(y)


@pytest.mark.parametrize(
    "inner", [Identity(), TopK(0.01), Int8(), Sign(), QSGD(8, seed=0), PowerSGD(2, seed=0)]
)
def test_zstd_composition_is_lossless_over_the_inner_codec(inner: Codec) -> None:
    x = np.random.default_rng(1).standard_normal((64, 50)).astype(np.float32)
    deterministic = not isinstance(inner, (QSGD, PowerSGD))
    wrapped = Zstd(inner)

    payload = wrapped.encode(x)

    inner_payload = zstandard.ZstdDecompressor().decompress(payload[1:])
    assert payload[0] == inner.tag
    if deterministic:
        assert inner_payload == inner.encode(x)
    out = decode_tensor(Zstd.tag, payload, x.shape)
    np.testing.assert_array_equal(out, type(inner).decode(inner_payload, x.shape))


def test_zstd_shrinks_sparse_payloads() -> None:
    x = np.random.default_rng(2).standard_normal(100_000).astype(np.float32)

    assert len(Zstd(TopK(0.01)).encode(x)) < len(TopK(0.01).encode(x))
    assert len(Zstd(Int8()).encode(x)) < len(Int8().encode(x))


def test_zstd_rejects_nesting_and_bad_levels() -> None:
    with pytest.raises(CodecSpecError):
        Zstd(Zstd(Identity()))
    with pytest.raises(CodecSpecError):
        Zstd(Identity(), 0)


def test_zstd_malformed_frames() -> None:
    x = np.ones(100, dtype=np.float32)
    good = Zstd(Identity()).encode(x)
    unsized = b"\x01" + zstandard.ZstdCompressor(write_content_size=False).compress(x.tobytes())
    bomb = b"\x01" + zstandard.ZstdCompressor().compress(bytes(8 * 100 + 2000))
    nested = b"\x0a" + good[1:]

    for payload, match in [
        (b"", "empty"),
        (b"\x63" + good[1:], "inner tag"),
        (nested, "inner tag"),
        (good + b"\x00", "trailing|truncated"),
        (good + good[1:], "trailing|truncated"),
        (good[:-1], "zstd"),
        (b"\x01garbage", "zstd"),
        (unsized, "declares -1|zstd"),
        (bomb, "limit"),
    ]:
        with pytest.raises(CodecError, match=match):
            Zstd.decode(payload, x.shape)


def test_policy_chooses_dense_for_small_tensors() -> None:
    policy = CodecPolicy(TopK(0.05))

    assert policy.codec_for("fc.bias", (128,)) == Identity()
    assert policy.codec_for("norm.weight", ()) == Identity()
    assert policy.codec_for("fc.weight", (128, 64)) == TopK(0.05)
    assert CodecPolicy(Sign(), dense_below=10, dense_codec=Float16()).codec_for("b", (9,)) == (
        Float16()
    )
    with pytest.raises(ConfigError):
        CodecPolicy(TopK(0.1), dense_below=-1)


LAYOUT = [
    ("conv.weight", (64, 3, 5, 5)),
    ("conv.bias", (64,)),
    ("fc1.weight", (512, 1600)),
    ("fc1.bias", (512,)),
    ("fc2.weight", (10, 512)),
    ("fc2.bias", (10,)),
]


@settings(max_examples=30, deadline=None)
@given(budget=st.integers(20_000, 3_000_000), sparsifier=st.sampled_from(["topk", "randk"]))
def test_budget_density_meets_the_byte_budget(budget: int, sparsifier: str) -> None:
    policy = CodecPolicy.for_budget(budget, LAYOUT, sparsifier)
    rng = np.random.default_rng(0)

    sent = sum(
        len(policy.codec_for(name, shape).encode(rng.standard_normal(shape).astype(np.float32)))
        for name, shape in LAYOUT
    )

    assert sent <= budget
    assert isinstance(policy.codec, TopK if sparsifier == "topk" else RandK)
    assert policy.codec_for("fc1.bias", (512,)) == policy.codec  # 512 >= 256
    assert policy.codec_for("fc2.bias", (10,)) == Identity()


def test_budget_density_uses_most_of_the_budget_and_rejects_tiny_budgets() -> None:
    numel = sum(math.prod(s) for _, s in LAYOUT if math.prod(s) >= 256)

    density = budget_density(100_000, LAYOUT, index_bits=0)

    assert 0.9 * 100_000 <= 40 + density * numel * 4 + 4 * 12 <= 100_000
    assert budget_density(10**9, LAYOUT) == 1.0
    assert budget_density(10, [("b", (10,))]) == 1.0
    with pytest.raises(ConfigError, match="does not cover"):
        budget_density(100, LAYOUT)
