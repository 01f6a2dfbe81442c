"""Secure-aggregation arithmetic: fixed point modulo 2^b, masks, shared coordinates, packing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy.stats import chisquare

from meshfl.aggregation.secure import (
    FixedPoint,
    add_mod,
    mask,
    pack_words,
    prg_words,
    shared_indices,
    skellam_noise,
    unmask,
    unpack_words,
)
from meshfl.errors import CodecError, ConfigError, WireError

IDS = ["dev0", "dev1", "dev2", "dev3"]
N_COORDS = 1000


def pair_seed(a: str, b: str) -> bytes:
    low, high = sorted((a, b))
    return hashlib.sha256(f"pair {low} {high}".encode()).digest()


def self_seed(a: str) -> bytes:
    return hashlib.sha256(f"self {a}".encode()).digest()


def pairwise_of(sender: str, members: list[str]) -> list[tuple[bytes, int]]:
    """The sender's pairwise seeds with every other member; + towards a larger id."""
    return [(pair_seed(sender, k), 1 if sender < k else -1) for k in members if k != sender]


@pytest.fixture
def neighbourhood() -> tuple[FixedPoint, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Four senders' float inputs and their encodings on a 16-bit grid."""
    fp = FixedPoint.choose(1.0, 16, max_inputs=len(IDS))
    rng = np.random.default_rng(0)
    floats = {d: rng.uniform(-1, 1, N_COORDS) for d in IDS}
    encoded = {d: fp.encode(floats[d], rng) for d in IDS}
    return fp, floats, encoded


def test_masks_cancel_exactly(neighbourhood) -> None:
    fp, floats, encoded = neighbourhood
    b = fp.modulus_bits
    masked = [mask(encoded[d], self_seed(d), pairwise_of(d, IDS), b) for d in IDS]
    total = unmask(add_mod(masked, b), [self_seed(d) for d in IDS], [], b)
    expected = add_mod([encoded[d] for d in IDS], b)
    np.testing.assert_array_equal(total, expected)
    float_sum = np.sum([floats[d] for d in IDS], axis=0)
    # each stochastic rounding errs by < one step
    assert np.max(np.abs(fp.decode(total) - float_sum)) < len(IDS) * fp.step
    # and the masked messages are not the encodings
    assert not any(np.array_equal(m, encoded[d]) for m, d in zip(masked, IDS, strict=True))


def test_unmasking_after_one_dropout(neighbourhood) -> None:
    fp, _, encoded = neighbourhood
    b = fp.modulus_bits
    dropped = "dev2"
    survivors = [d for d in IDS if d != dropped]
    masked = [mask(encoded[d], self_seed(d), pairwise_of(d, IDS), b) for d in survivors]
    recovered = [(pair_seed(k, dropped), 1 if k < dropped else -1) for k in survivors]
    total = unmask(add_mod(masked, b), [self_seed(d) for d in survivors], recovered, b)
    np.testing.assert_array_equal(total, add_mod([encoded[d] for d in survivors], b))
    # without the dropped member's pairwise masks the sum is garbage
    wrong = unmask(add_mod(masked, b), [self_seed(d) for d in survivors], [], b)
    assert not np.array_equal(wrong, total)


def top_byte_chisquare(values: np.ndarray, modulus_bits: int) -> float:
    top = (values >> np.uint64(modulus_bits - 8)).astype(np.int64)
    counts = np.bincount(top, minlength=256)
    return float(chisquare(counts).pvalue)


def test_one_masked_message_looks_uniform() -> None:
    fp = FixedPoint.choose(1.0, 16, max_inputs=8)
    rng = np.random.default_rng(1)
    encoded = fp.encode(rng.normal(0.0, 0.1, 1 << 16), rng)
    others = ["dev1", "dev2", "dev3"]
    b = fp.modulus_bits
    masked = mask(encoded, self_seed("dev0"), pairwise_of("dev0", ["dev0", *others]), b)
    assert top_byte_chisquare(masked, b) > 0.01
    # teeth: the same test rejects the unmasked encoding outright
    assert top_byte_chisquare(encoded, b) < 1e-12


def test_prg_is_deterministic_prefix_consistent_and_reduced() -> None:
    a = prg_words(b"seed", 100, 20)
    np.testing.assert_array_equal(a, prg_words(b"seed", 100, 20))
    np.testing.assert_array_equal(a[:10], prg_words(b"seed", 10, 20))
    assert a.dtype == np.uint64 and int(a.max()) < 1 << 20
    assert not np.array_equal(a, prg_words(b"seee", 100, 20))
    assert prg_words(b"seed", 0, 20).shape == (0,)


def test_capacity_is_refused_before_any_round() -> None:
    fp = FixedPoint.choose(1.0, 16, max_inputs=10)
    assert 10 * fp.level < 2 ** (fp.modulus_bits - 1)
    assert 10 * fp.level >= 2 ** (fp.modulus_bits - 2)  # smallest modulus that fits
    fp.check_capacity(10)
    with pytest.raises(ConfigError, match="overflow the modulus"):
        fp.check_capacity(11 + 2**fp.modulus_bits // (2 * fp.level))
    with pytest.raises(ConfigError, match="overflow the modulus"):
        FixedPoint(1.0, 16, 17).check_capacity(3)  # 3·32767 ≥ 2^16
    with pytest.raises(ConfigError, match="overflow"):
        FixedPoint.choose(1.0, 60, max_inputs=8)
    noisy = FixedPoint.choose(1.0, 16, max_inputs=10, noise_std=1e6)
    assert noisy.modulus_bits > fp.modulus_bits
    with pytest.raises(ConfigError, match="overflow the modulus"):
        fp.check_capacity(10, noise_std=1e6)
    with pytest.raises(ConfigError):
        FixedPoint(1.0, 16, 16)
    with pytest.raises(ConfigError):
        FixedPoint(0.0, 16, 20)


def test_capacity_bound_actually_holds_at_the_limit() -> None:
    fp = FixedPoint.choose(1.0, 8, max_inputs=5)
    worst = [fp.encode(np.full(4, sign * 5.0), np.random.default_rng(0)) for sign in (1, -1)]
    for enc in worst:
        total = add_mod([enc] * 5, fp.modulus_bits)
        np.testing.assert_allclose(fp.decode(total), np.sign(fp.decode(enc)) * 5.0)


def test_stochastic_rounding_is_unbiased_and_on_grid() -> None:
    fp = FixedPoint.choose(1.0, 4, max_inputs=2)  # step 1/7: rounding matters
    rng = np.random.default_rng(2)
    u = np.array([0.05, -0.3, 0.999, -1.0, 0.0, 1.7, -2.0])
    draws = fp.decode(fp.encode(np.tile(u, (20000, 1)), rng))
    assert np.all(np.abs(draws) <= fp.range_ + 1e-12)
    np.testing.assert_allclose(draws.mean(axis=0), np.clip(u, -1, 1), atol=0.005)
    assert np.all(np.isin(np.round(draws[:50] / fp.step), np.arange(-7, 8)))
    with pytest.raises(CodecError):
        fp.encode(np.array([np.nan]), rng)


def test_signed_round_trip_and_dequantize() -> None:
    fp = FixedPoint(2.0, 8, 12)
    v = np.array([-127, -1, 0, 1, 127, 300, -2047], dtype=np.int64)
    stored = fp.from_signed(v)
    assert stored.dtype == np.uint64 and int(stored.max()) < 1 << 12
    np.testing.assert_array_equal(fp.to_signed(stored), v)
    np.testing.assert_allclose(fp.dequantize(stored), v * (2.0 / 127))


def test_skellam_noise_moments() -> None:
    noise = skellam_noise(np.random.default_rng(3), 200_000, 50.0)
    assert noise.dtype == np.int64
    assert abs(noise.mean()) < 0.1
    assert abs(noise.var() - 50.0) < 1.5
    assert not skellam_noise(np.random.default_rng(3), 5, 0.0).any()
    with pytest.raises(ConfigError):
        skellam_noise(np.random.default_rng(3), 5, -1.0)


def test_bad_mask_sign_is_refused() -> None:
    with pytest.raises(ConfigError, match="sign"):
        mask(np.zeros(3, np.uint64), b"s", [(b"p", 2)], 20)


@pytest.mark.parametrize(("n", "k"), [(1000, 100), (1000, 900), (10, 10), (7, 0), (1, 1)])
def test_shared_indices_deterministic_sorted_distinct(n: int, k: int) -> None:
    a = shared_indices(b"round 3 dev1", n, k)
    np.testing.assert_array_equal(a, shared_indices(b"round 3 dev1", n, k))
    assert a.dtype == np.int64 and a.shape == (k,)
    assert np.all(np.diff(a) > 0) and (k == 0 or (a[0] >= 0 and a[-1] < n))


def test_shared_indices_depend_on_seed_and_spread() -> None:
    a = shared_indices(b"seed a", 10_000, 1000)
    assert not np.array_equal(a, shared_indices(b"seed b", 10_000, 1000))
    # roughly uniform: each tenth of the range holds about a tenth of the picks
    counts = np.bincount(a // 1000, minlength=10)
    assert counts.min() > 60 and counts.max() < 140
    with pytest.raises(ConfigError):
        shared_indices(b"s", 10, 11)


@pytest.mark.parametrize("bits", [1, 7, 8, 13, 33, 62, 64])
@pytest.mark.parametrize("n", [0, 1, 9, 70_001])
def test_pack_round_trip(bits: int, n: int) -> None:
    v = prg_words(b"pack", n, bits)
    data = pack_words(v, bits)
    assert len(data) == (n * bits + 7) // 8
    np.testing.assert_array_equal(unpack_words(data, n, bits), v)


def test_pack_rejects_bad_input() -> None:
    data = pack_words(np.array([1, 2, 3], dtype=np.uint64), 13)
    with pytest.raises(WireError, match="bytes"):
        unpack_words(data + b"\0", 3, 13)
    with pytest.raises(WireError, match="bytes"):
        unpack_words(data[:-1], 3, 13)
    with pytest.raises(WireError, match="padding"):
        unpack_words(data[:-1] + bytes([data[-1] | 0x80]), 3, 13)
    with pytest.raises(CodecError):
        pack_words(np.array([1 << 13], dtype=np.uint64), 13)
