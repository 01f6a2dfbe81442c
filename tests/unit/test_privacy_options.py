"""The one place that parses and checks a job's privacy options."""

from __future__ import annotations

import pytest

from meshfl.aggregation.privacy import (
    PrivacyOptions,
    RobustRule,
    check_threshold,
    parse_robust,
    secure_quantization_bits,
)
from meshfl.errors import ConfigError

BASE = {"algorithm": "choco", "codec": "int8", "mode": "sync", "topology": "ring"}


def test_robust_rules_parse_to_their_canonical_form() -> None:
    assert parse_robust("median") == RobustRule("median")
    assert parse_robust(" Clipped-Gossip ") == RobustRule("clipped-gossip")
    assert parse_robust("trimmed:0.2") == RobustRule("trimmed", 0.2)
    assert parse_robust("trimmed").spec == "trimmed:0.1"
    for bad in ("mean", "trimmed:0.5", "trimmed:-0.1", "trimmed:x", "median:1"):
        with pytest.raises(ConfigError, match="valid forms"):
            parse_robust(bad)


@pytest.mark.parametrize(
    ("codec", "bits", "density"),
    [("identity", 16, 1.0), ("int8:256", 8, 1.0), ("qsgd:16", 6, 1.0), ("randk:0.25", 16, 0.25)],
)
def test_maskable_codecs_and_their_fixed_point(codec: str, bits: int, density: float) -> None:
    assert secure_quantization_bits(codec) == (bits, density)


@pytest.mark.parametrize(
    ("codec", "why"),
    [("topk:0.1", "randk"), ("sign", "scale"), ("powersgd:2", "factors"), ("fp16", "floating"),
     ("int8+zstd", "uniformly random"), ("randk:0.1:unbiased", "scaling")],
)  # fmt: skip
def test_codecs_that_cannot_be_masked_are_refused_with_the_reason(codec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        PrivacyOptions.from_spec({**BASE, "codec": codec, "secure_aggregation": 2})


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"secure_aggregation": 1}, "threshold 1"),
        ({"secure_aggregation": -2}, ">= 0"),
        ({"secure_aggregation": True}, "integer"),
        ({"secure_aggregation": 2, "algorithm": "dpsgd"}, "choco"),
        ({"secure_aggregation": 2, "mode": "async"}, "sync"),
        ({"secure_aggregation": 2, "elastic": True}, "fixed neighbourhood"),
        ({"secure_aggregation": 2, "topology": "one-peer-exponential"}, "fixed neighbourhood"),
        ({"secure_aggregation": 2, "keyframe_growth": 1.5}, "keyframe"),
        ({"secure_aggregation": 2, "robust": "median"}, "hides"),
        ({"secure_range": 0}, "secure_range"),
        ({"dp_noise_multiplier": 1.0}, "dp_clip"),
        ({"dp_clip": 1.0}, "gives no privacy"),
        ({"dp_noise_multiplier": float("nan"), "dp_clip": 1.0}, "finite"),
        ({"dp_noise_multiplier": 1.0, "dp_clip": 1.0, "dp_delta": 1.0}, "dp_delta"),
        ({"dp_epsilon_budget": 8.0}, "dp_noise_multiplier"),
        ({"dp_noise_multiplier": 1.0, "dp_clip": 1.0, "dp_mode": "central"}, "dp_mode"),
        ({"dp_noise_multiplier": 1.0, "dp_clip": 1.0, "dp_mode": "distributed"},
         "secure_aggregation"),
        ({"dp_noise_multiplier": 1.0, "dp_clip": 1.0, "algorithm": "dpsgd"}, "choco"),
        ({"dp_noise_multiplier": 1.0, "dp_clip": 1.0, "keyframe_growth": 1.5}, "keyframe"),
        ({"robust": "mode"}, "valid forms"),
    ],
)  # fmt: skip
def test_combinations_that_cannot_work_are_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        PrivacyOptions.from_spec({**BASE, **fields})


def test_a_valid_combination_reads_back() -> None:
    options = PrivacyOptions.from_spec(
        {**BASE, "secure_aggregation": 3, "dp_noise_multiplier": 2.0, "dp_clip": 0.5,
         "dp_mode": "distributed", "dp_epsilon_budget": 8.0}
    )  # fmt: skip
    assert options.secure and options.dp and options.threshold == 3
    assert options.delta == 1e-5 and options.robust is None
    assert not PrivacyOptions.from_spec(BASE).secure


def test_degrees_bound_the_threshold_and_the_modulus_must_hold_the_sum() -> None:
    options = PrivacyOptions.from_spec({**BASE, "secure_aggregation": 3})
    options.check_degrees({"a": 3, "b": 4}, "int8")
    with pytest.raises(ConfigError, match="exceeds the 2 neighbours of device b"):
        options.check_degrees({"a": 3, "b": 2}, "int8")
    fp, density = options.fixed_point("int8", 4)
    assert (fp.bits, density) == (8, 1.0) and fp.modulus_bits == 10  # |4·127| < 2^9
    # Distributed DP noise needs headroom; absurd noise cannot fit any modulus.
    noisy = PrivacyOptions.from_spec({**BASE, "secure_aggregation": 3, "dp_noise_multiplier": 5.0,
                                      "dp_clip": 1.0, "dp_mode": "distributed"})  # fmt: skip
    assert noisy.fixed_point("int8", 4)[0].modulus_bits > fp.modulus_bits
    absurd = PrivacyOptions.from_spec({**BASE, "secure_aggregation": 3, "secure_range": 1e-6,
                                       "dp_noise_multiplier": 1e4, "dp_clip": 1e3})  # fmt: skip
    with pytest.raises(ConfigError, match=r"overflow|modulus"):
        absurd.check_degrees({"a": 3}, "identity")
    for sigma in (1e-300, 1e308):  # ε unbounded, or an accountant overflow: refused early
        with pytest.raises(ConfigError, match="dp_noise_multiplier must be in"):
            PrivacyOptions.from_spec({**BASE, "dp_noise_multiplier": sigma, "dp_clip": 1.0})


@pytest.mark.parametrize(
    ("size", "allowed"),
    [(2, {2}), (3, {2, 3}), (4, {3, 4}), (5, {3, 4, 5}), (8, {5, 6, 7, 8})],
)
def test_the_threshold_must_be_above_half_of_each_neighbourhood(
    size: int, allowed: set[int]
) -> None:
    """Issue 23 item 5: t = 2 let an aggregator and one colluder unmask whatever the degree."""
    accepted = set()
    for t in range(2, size + 3):
        try:
            check_threshold(t, size, "dev-x")
            accepted.add(t)
        except ConfigError as exc:
            assert "dev-x" in str(exc) and ("not above half" in str(exc)) == (t <= size)
    assert accepted == allowed
    options = PrivacyOptions.from_spec({**BASE, "secure_aggregation": 2})
    with pytest.raises(ConfigError, match="use a threshold of at least 3"):
        options.check_degrees({"a": 2, "b": 4}, "int8")  # b's neighbourhood of 4
