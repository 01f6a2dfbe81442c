"""Agent crypto of secure aggregation: identity, key bundles, sealing, mask seeds, Shamir."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import httpx
import pytest

from edge_agent.rest import CoordinatorClient
from edge_agent.secagg.crypto import (
    IdentityKey,
    JobKeys,
    bundle_signed_bytes,
    identity_key_path,
    mask_seed,
    open_sealed,
    seal,
    seal_aad,
    share_key,
    verify_bundle,
    verify_signature,
)
from edge_agent.secagg.shamir import combine_shares, split_secret
from meshfl.errors import ConfigError, SecurityError, WireError


def _flip(text: str, at: int = 0) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[at] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


# -- identity -----------------------------------------------------------------------------


def test_identity_key_is_persisted_0600_and_reused(tmp_path: Path) -> None:
    path = identity_key_path(tmp_path, "pi-1")
    first = IdentityKey.load_or_create(path)
    assert path == tmp_path / "pi-1.identity.key"
    assert path.stat().st_size == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = IdentityKey.load_or_create(path)
    assert again.public_b64 == first.public_b64
    assert len(base64.b64decode(first.public_b64)) == 32
    signature = again.sign(b"hello")
    verify_signature(first.public_b64, b"hello", signature)  # same key pair
    other = IdentityKey.load_or_create(identity_key_path(tmp_path, "pi-2"))
    assert other.public_b64 != first.public_b64


def test_corrupt_identity_key_is_a_config_error_naming_path_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "x.identity.key"
    path.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match=r"x\.identity\.key.*corrupt.*delete it"):
        IdentityKey.load_or_create(path)


def test_verify_signature_rejects_wrong_data_key_and_garbage() -> None:
    key = IdentityKey.generate()
    signature = key.sign(b"data")
    with pytest.raises(SecurityError):
        verify_signature(key.public_b64, b"datA", signature)
    with pytest.raises(SecurityError):
        verify_signature(IdentityKey.generate().public_b64, b"data", signature)
    with pytest.raises(SecurityError):
        verify_signature("not base64!", b"data", signature)
    with pytest.raises(SecurityError):
        verify_signature(key.public_b64, b"data", signature[:10])


def test_enrol_sends_the_identity_public_key() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={"device_id": "d1", "device_token": "t", "fleet": "f", "broker_url": ""},
        )

    key = IdentityKey.generate()
    client = CoordinatorClient("http://c.invalid", transport=httpx.MockTransport(handler))
    try:
        client.enrol("tok", "pi", {}, key.public_b64)
        client.enrol("tok", "pi", {})
    finally:
        client.close()
    assert seen[0]["identity_key"] == key.public_b64
    assert "identity_key" not in seen[1]


# -- key bundles --------------------------------------------------------------------------


def test_bundle_signs_and_verifies_with_the_documented_bytes() -> None:
    identity = IdentityKey.generate()
    keys = JobKeys.create("job-1", "dev-a", rounds=5)
    bundle = keys.bundle(identity)
    assert set(bundle) == {"device", "job", "c_pk", "s_pks", "signature"}
    parsed = verify_bundle(bundle, identity.public_b64, rounds=5)
    assert parsed.device == "dev-a" and parsed.job == "job-1"
    assert parsed.c_pk == keys.c_public_raw
    assert list(parsed.s_pks) == [keys.s_public_raw(r) for r in range(1, 6)]
    # The signature covers exactly the canonical bytes of secagg.md.
    raw_s = base64.b64decode(bundle["s_pks"])
    signed = b"meshfl-keybundle-v1\0job-1\0dev-a\0" + keys.c_public_raw + raw_s
    assert signed == bundle_signed_bytes("job-1", "dev-a", keys.c_public_raw, raw_s)
    verify_signature(identity.public_b64, signed, base64.b64decode(bundle["signature"]))


@pytest.mark.parametrize("field", ["c_pk", "s_pks", "signature"])
def test_tampered_bundle_is_rejected(field: str) -> None:
    identity = IdentityKey.generate()
    bundle = JobKeys.create("job-1", "dev-a", rounds=3).bundle(identity)
    bundle[field] = _flip(bundle[field], at=5)
    with pytest.raises(SecurityError):
        verify_bundle(bundle, identity.public_b64, rounds=3)


def test_bundle_with_other_ids_wrong_signer_or_length_is_rejected() -> None:
    identity = IdentityKey.generate()
    bundle = JobKeys.create("job-1", "dev-a", rounds=3).bundle(identity)
    with pytest.raises(SecurityError):
        verify_bundle({**bundle, "device": "dev-b"}, identity.public_b64, rounds=3)
    with pytest.raises(SecurityError):
        verify_bundle({**bundle, "job": "job-2"}, identity.public_b64, rounds=3)
    with pytest.raises(SecurityError):
        verify_bundle(bundle, IdentityKey.generate().public_b64, rounds=3)
    with pytest.raises(SecurityError, match="128 bytes, got 96"):
        verify_bundle(bundle, identity.public_b64, rounds=4)
    with pytest.raises(SecurityError):
        verify_bundle({k: v for k, v in bundle.items() if k != "c_pk"}, identity.public_b64, 3)


def test_s_keys_are_per_round_deterministic_and_bounded() -> None:
    keys = JobKeys.create("job-1", "dev-a", rounds=3)
    assert keys.s_public_raw(2) == keys.s_public_raw(2)
    assert len({keys.s_public_raw(r) for r in (1, 2, 3)}) == 3
    assert keys.s_private_raw(1) != keys.s_private_raw(2)
    with pytest.raises(ConfigError):
        keys.s_private(0)
    with pytest.raises(ConfigError):
        keys.s_private(4)
    with pytest.raises(ConfigError):
        JobKeys.create("job-1", "bad/id", rounds=3)


# -- sealing and masks --------------------------------------------------------------------


def test_share_key_agrees_and_seal_opens_only_untampered() -> None:
    j, k = JobKeys.create("job", "a", 1), JobKeys.create("job", "b", 1)
    key_j = share_key(j.c_private, k.c_public_raw)
    assert key_j == share_key(k.c_private, j.c_public_raw) and len(key_j) == 32
    aad = seal_aad("job", 3, "a", "b")
    assert aad == b"job|3|a|b"
    sealed = seal(key_j, b"secret shares", aad)
    assert b"secret shares" not in sealed
    assert open_sealed(key_j, sealed, aad) == b"secret shares"
    tampered = bytearray(sealed)
    tampered[20] ^= 1
    with pytest.raises(SecurityError):
        open_sealed(key_j, bytes(tampered), aad)
    with pytest.raises(SecurityError):
        open_sealed(key_j, sealed, seal_aad("job", 3, "b", "a"))  # other direction
    with pytest.raises(SecurityError):
        open_sealed(key_j, sealed[:20], aad)


def test_mask_seeds_agree_between_both_ends() -> None:
    j, k, x = (JobKeys.create("job", d, 4) for d in ("dev-j", "dev-k", "dev-x"))
    r = 2
    seed_j = mask_seed(j.s_private(r), k.s_public_raw(r), "job", r, "agg", "dev-j", "dev-k")
    seed_k = mask_seed(k.s_private(r), j.s_public_raw(r), "job", r, "agg", "dev-k", "dev-j")
    assert seed_j == seed_k and len(seed_j) == 32
    # The aggregator recomputes it from a reconstructed raw s key (dropout recovery).
    raw = k.s_private_raw(r)
    assert mask_seed(raw, j.s_public_raw(r), "job", r, "agg", "dev-j", "dev-k") == seed_j
    # Bound to the instance, the round and the pair.
    assert seed_j != mask_seed(
        j.s_private(r), k.s_public_raw(r), "job", r, "agg2", "dev-j", "dev-k"
    )
    assert seed_j != mask_seed(j.s_private(3), k.s_public_raw(3), "job", 3, "agg", "dev-j", "dev-k")
    assert seed_j != mask_seed(j.s_private(r), x.s_public_raw(r), "job", r, "agg", "dev-j", "dev-x")
    with pytest.raises(SecurityError):
        mask_seed(j.s_private(r), bytes(32), "job", r, "agg", "dev-j", "dev-k")  # low order


# -- Shamir -------------------------------------------------------------------------------


def test_shamir_recovers_with_exactly_t_shares_and_not_with_fewer() -> None:
    secret = bytes(range(32))
    shares = split_secret(secret, threshold=3, n=5)
    assert [i for i, _ in shares] == [1, 2, 3, 4, 5]
    assert all(len(s) == 32 for _, s in shares)
    assert combine_shares(shares[:3]) == secret
    assert combine_shares([shares[4], shares[1], shares[2]]) == secret
    assert combine_shares(shares) == secret
    assert combine_shares(shares[:2]) != secret


def test_shamir_rejects_bad_threshold_and_bad_shares() -> None:
    with pytest.raises(ConfigError):
        split_secret(bytes(32), threshold=1, n=3)
    with pytest.raises(ConfigError):
        split_secret(bytes(32), threshold=4, n=3)
    with pytest.raises(ConfigError):
        split_secret(bytes(16), threshold=2, n=3)
    shares = split_secret(bytes(32), threshold=2, n=3)
    with pytest.raises(WireError):
        combine_shares([shares[0], shares[0]])
    with pytest.raises(WireError):
        combine_shares([shares[0], (2, b"short")])
    with pytest.raises(WireError):
        combine_shares(shares[:1])
