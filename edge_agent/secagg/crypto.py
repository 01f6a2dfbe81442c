r"""Key material and primitives of secure aggregation (Bonawitz et al., CCS 2017).

With :mod:`edge_agent.secagg.shamir`, the only agent code that calls ``cryptography``
and pycryptodome; their
exceptions become :class:`~meshfl.errors.SecurityError` (a signature, key or sealed
message that does not verify) or :class:`~meshfl.errors.ConfigError` (a bad argument)
here. The protocol and its byte formats are those of ``docs``' secure-aggregation
description (issue 5):

- identity: an Ed25519 key pair per device (:class:`IdentityKey`), raw 32-byte keys,
  public key in standard base64 (``EnrolRequest.identity_key``);
- per job (:class:`JobKeys`): an X25519 pair ``c`` for sealing shares, and one X25519
  masking pair ``s_r`` per round r = 1..rounds, ``s_sk_r`` derived as
  ``HKDF-SHA256(job_secret, info=b"meshfl s" + job + r.to_bytes(4, "big"))``;
- KeyBundle ``{"device", "job", "c_pk", "s_pks", "signature"}``, the signature an Ed25519
  signature over ``b"meshfl-keybundle-v1\0" + job + b"\0" + device + b"\0" + c_pk +
  s_pks`` (raw bytes; :func:`bundle_signed_bytes`);
- share key ``HKDF(X25519(c_sk_j, c_pk_k), info=b"meshfl share key")``, sealed messages
  AES-256-GCM ``nonce (12 bytes) ‖ ciphertext ‖ tag`` with AAD
  ``f"{job}|{round}|{sender}|{recipient}"`` (:func:`seal_aad`);
- pairwise mask seed ``m_jk = HKDF(X25519(s_sk_j, s_pk_k), info=b"meshfl mask" +
  f"{job}|{round}|{aggregator}|{min(j,k)}|{max(j,k)}")`` (:func:`mask_seed`);
- Shamir shares of the 32-byte seeds: :mod:`edge_agent.secagg.shamir`.

In every context string, ids are meshfl ids (``A-Z a-z 0-9 _ . -``, never ``|``) and
rounds are decimal ASCII, so the encoding is unambiguous. All HKDFs are HKDF-SHA256
(RFC 5869) without salt, 32 bytes of output.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from meshfl.errors import ConfigError, MeshflError, SecurityError, WireError
from meshfl.files import atomic_write
from meshfl.wire import validate_id
from meshfl.wire.jsonbody import b64, need_b64

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "SIGNATURE_BYTES",
    "IdentityKey",
    "JobKeys",
    "ParsedBundle",
    "bundle_signed_bytes",
    "hkdf",
    "identity_key_path",
    "mask_seed",
    "open_sealed",
    "seal",
    "seal_aad",
    "share_key",
    "verify_bundle",
    "verify_signature",
]

log = logging.getLogger("meshfl.agent.secagg")

KEY_BYTES = 32
"""Raw length (bytes) of every Ed25519/X25519 key, job secret, seed and Shamir share."""
SIGNATURE_BYTES = 64
"""Length (bytes) of an Ed25519 signature."""
NONCE_BYTES = 12
"""Length (bytes) of an AES-GCM nonce, the prefix of a sealed message."""
_TAG_BYTES = 16
_BUNDLE_MAGIC = b"meshfl-keybundle-v1\0"


# -- encodings ----------------------------------------------------------------------------


def hkdf(key_material: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``key_material`` with ``info``, no salt; ``length`` bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key_material)


# -- identity -----------------------------------------------------------------------------


def identity_key_path(out: Path, name: str) -> Path:
    """Where agent ``name`` writing into ``out`` keeps its identity key.

    ``out/<name>.identity.key``: per agent name, like its health file, since several
    agents may share one ``--out``.
    """
    return Path(out) / f"{name}.identity.key"


class IdentityKey:
    """A device's Ed25519 identity key pair (RFC 8032), created once at enrolment.

    Its public key goes to the coordinator in ``EnrolRequest.identity_key``; it signs
    the device's per-job key bundles. Persisted as the raw 32-byte private key in a file
    of mode 0600 (:meth:`load_or_create`).
    """

    __slots__ = ("_private", "public_raw")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_raw: bytes = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def generate(cls) -> IdentityKey:
        """A fresh random key pair (not persisted)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> IdentityKey:
        """Load the key stored at ``path``, or create, store (mode 0600) and return a new one.

        Raises
        ------
        ConfigError
            ``path`` exists but does not hold a raw 32-byte Ed25519 private key, or
            cannot be read or written.

        """
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            key = cls.generate()
            raw = key._private.private_bytes_raw()
            try:
                atomic_write(path, lambda handle: handle.write(raw), mode=0o600)
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the identity key {path} ({exc.strerror or exc});"
                    " make its folder (--out) writable"
                ) from None
            log.info("created identity key %s", path)
            return key
        except OSError as exc:
            raise ConfigError(
                f"cannot read the identity key {path} ({exc.strerror or exc}); fix its permissions"
            ) from None
        if len(raw) != KEY_BYTES:
            raise ConfigError(
                f"identity key {path} is corrupt ({len(raw)} bytes, expected {KEY_BYTES});"
                " delete it to create a new identity, then re-enrol this device"
            )
        if path.stat().st_mode & 0o077:
            log.warning("identity key %s is readable by others; chmod 600 it", path)
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    @property
    def public_b64(self) -> str:
        """The raw 32-byte public key in standard base64 (``EnrolRequest.identity_key``)."""
        return b64(self.public_raw)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._private.sign(data)


def verify_signature(public_b64: str, data: bytes, signature: bytes) -> None:
    """Check an Ed25519 ``signature`` of ``data`` by the key ``public_b64`` (raw, base64).

    Raises
    ------
    SecurityError
        The key is not base64 of 32 bytes, or the signature does not verify.

    """
    try:
        raw = need_b64(public_b64, "identity key", KEY_BYTES)
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, data)
    except (WireError, InvalidSignature, ValueError, TypeError) as exc:
        reason = str(exc) if isinstance(exc, MeshflError) else "the signature does not verify"
        raise SecurityError(f"bad Ed25519 signature: {reason}") from None


# -- per-job keys -------------------------------------------------------------------------


def bundle_signed_bytes(job: str, device: str, c_pk: bytes, s_pks: bytes) -> bytes:
    r"""The canonical bytes a KeyBundle's signature covers.

    ``b"meshfl-keybundle-v1\0" + job + b"\0" + device + b"\0" + c_pk + s_pks``, ids as
    ASCII, keys raw (``s_pks``: rounds × 32 bytes, round 1 first).
    """
    return _BUNDLE_MAGIC + job.encode() + b"\0" + device.encode() + b"\0" + c_pk + s_pks


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


class JobKeys:
    """One device's secret key material for one secure-aggregation job.

    ``c``: an X25519 pair for sealing shares (never revealed). ``s_{r,a}``: one X25519
    masking pair per round r in 1..``rounds`` and per aggregator *slot* a in
    0..``slots``−1 (the position of the aggregator among this device's sorted
    neighbours), the private key derived from the random 32-byte ``job_secret``. A
    dropout declared by one aggregator in round r reveals only that instance's key, so
    the device's b-shares of the same round at its other aggregators stay safe to reveal.

    Create with :meth:`create`; publish :meth:`bundle`.
    """

    __slots__ = (
        "_job_secret", "_s_pks", "c_private", "c_public_raw", "device", "job", "rounds", "slots",
    )  # fmt: skip

    def __init__(
        self,
        job: str,
        device: str,
        rounds: int,
        c_private: X25519PrivateKey,
        job_secret: bytes,
        slots: int = 1,
    ) -> None:
        validate_id(job, "job id")
        validate_id(device, "device id")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
        if len(job_secret) != KEY_BYTES:
            raise ConfigError(f"job_secret must be {KEY_BYTES} bytes, got {len(job_secret)}")
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 65535:
            raise ConfigError(f"slots must be an integer in 1..65535, got {slots!r}")
        self.job = job
        self.device = device
        self.rounds = rounds
        self.slots = slots
        self.c_private = c_private
        self.c_public_raw = _raw_public(c_private)
        self._job_secret = job_secret
        self._s_pks: bytes | None = None  # computed once by bundle(): ~70 µs per round

    @classmethod
    def create(cls, job: str, device: str, rounds: int, slots: int = 1) -> JobKeys:
        """Fresh random keys for ``device`` in ``job`` of ``rounds`` rounds, ``slots`` aggregators.

        Raises
        ------
        ConfigError
            A bad id or ``rounds`` < 1.

        """
        return cls(job, device, rounds, X25519PrivateKey.generate(), os.urandom(KEY_BYTES), slots)

    def s_private(self, round_: int, slot: int = 0) -> X25519PrivateKey:
        """The masking private key s_sk of round ``round_`` (1-based) and aggregator ``slot``.

        Derived as X25519 private key from ``HKDF-SHA256(job_secret, info=b"meshfl s" +
        job + round.to_bytes(4, "big") + slot.to_bytes(2, "big"))``.

        Raises
        ------
        ConfigError
            ``round_`` is not in 1..rounds or ``slot`` not in 0..slots−1.

        """
        return X25519PrivateKey.from_private_bytes(self.s_private_raw(round_, slot))

    def s_private_raw(self, round_: int, slot: int = 0) -> bytes:
        """The raw 32 bytes of :meth:`s_private` (what is Shamir-shared for that instance)."""
        if (
            isinstance(round_, bool)
            or not isinstance(round_, int)
            or not 1 <= round_ <= self.rounds
        ):
            raise ConfigError(f"round must be in 1..{self.rounds}, got {round_!r}")
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.slots:
            raise ConfigError(f"slot must be in 0..{self.slots - 1}, got {slot!r}")
        info = b"meshfl s" + self.job.encode() + round_.to_bytes(4, "big") + slot.to_bytes(2, "big")
        return hkdf(self._job_secret, info)

    def s_public_raw(self, round_: int, slot: int = 0) -> bytes:
        """The raw 32-byte masking public key s_pk of round ``round_`` and ``slot``."""
        return _raw_public(self.s_private(round_, slot))

    def bundle(self, identity: IdentityKey) -> dict[str, str]:
        """The signed KeyBundle ``{"device", "job", "c_pk", "s_pks", "signature"}``.

        Keys and the signature in standard base64; ``s_pks`` is the concatenation of the
        raw public keys of rounds 1..rounds, each round's slots 0..slots−1 in order (32
        bytes each), computed once per instance (one X25519 base-point multiplication per
        key: under a second for 10,000 keys).
        """
        if self._s_pks is None:
            self._s_pks = b"".join(
                self.s_public_raw(r, a)
                for r in range(1, self.rounds + 1)
                for a in range(self.slots)
            )
        s_pks = self._s_pks
        signature = identity.sign(
            bundle_signed_bytes(self.job, self.device, self.c_public_raw, s_pks)
        )
        return {
            "device": self.device,
            "job": self.job,
            "c_pk": b64(self.c_public_raw),
            "s_pks": b64(s_pks),
            "signature": b64(signature),
        }


@dataclass(frozen=True)
class ParsedBundle:
    """A verified KeyBundle: raw c public key and one raw s public key per (round, slot).

    ``s_pks[(r - 1) * slots + a]`` is the key of round r, aggregator slot a.
    """

    device: str
    job: str
    c_pk: bytes
    s_pks: tuple[bytes, ...]
    slots: int = 1

    def s_pk(self, round_: int, slot: int = 0) -> bytes:
        """The raw masking public key of (``round_``, ``slot``); SecurityError when absent."""
        index = (round_ - 1) * self.slots + slot
        if not (0 <= slot < self.slots and 0 <= index < len(self.s_pks)):
            raise SecurityError(
                f"{self.device}'s bundle has no masking key for round {round_}, slot {slot}"
            )
        return self.s_pks[index]


def verify_bundle(
    bundle: Mapping[str, object], identity_public_b64: str, rounds: int, slots: int = 1
) -> ParsedBundle:
    """Check a KeyBundle's shape and its signature by the device's identity key.

    Parameters
    ----------
    bundle
        ``{"device", "job", "c_pk", "s_pks", "signature"}`` as published.
    identity_public_b64
        The device's Ed25519 identity key (raw, base64), from the directory.
    rounds, slots
        The job's rounds and the device's number of neighbours: ``s_pks`` must hold
        exactly ``rounds`` × ``slots`` × 32 bytes.

    Raises
    ------
    SecurityError
        A missing or malformed field, a wrong key length, or a bad signature.

    """
    if not isinstance(bundle, Mapping):
        raise SecurityError("a key bundle must be a JSON object")
    try:
        device = validate_id(bundle.get("device"), "bundle device")  # type: ignore[arg-type]
        job = validate_id(bundle.get("job"), "bundle job")  # type: ignore[arg-type]
        c_pk = need_b64(bundle.get("c_pk"), "bundle c_pk", KEY_BYTES)
        s_pks = need_b64(bundle.get("s_pks"), "bundle s_pks", rounds * slots * KEY_BYTES)
        signature = need_b64(bundle.get("signature"), "bundle signature", SIGNATURE_BYTES)
    except MeshflError as exc:
        raise SecurityError(f"malformed key bundle: {exc}") from None
    verify_signature(identity_public_b64, bundle_signed_bytes(job, device, c_pk, s_pks), signature)
    keys = tuple(s_pks[i : i + KEY_BYTES] for i in range(0, len(s_pks), KEY_BYTES))
    return ParsedBundle(device=device, job=job, c_pk=c_pk, s_pks=keys, slots=slots)


# -- agreement, sealing, masks ------------------------------------------------------------


def _exchange(private: X25519PrivateKey, peer_raw: bytes, what: str) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_raw))
    except (ValueError, TypeError):  # wrong length, or a low-order point (all-zero secret)
        raise SecurityError(f"invalid X25519 {what} public key") from None


def share_key(c_private: X25519PrivateKey, peer_c_pk_raw: bytes) -> bytes:
    """The 32-byte AES-256-GCM key two devices share.

    ``HKDF(X25519(c_sk, c_pk'), info=b"meshfl share key")``; symmetric:
    ``share_key(c_j, c_pk_k) == share_key(c_k, c_pk_j)``. SecurityError on an invalid
    peer key.
    """
    return hkdf(_exchange(c_private, peer_c_pk_raw, "share"), b"meshfl share key")


def seal_aad(job: str, round_: int, sender: str, recipient: str) -> bytes:
    """The AAD binding a sealed message to its job, round and direction.

    ``f"{job}|{round}|{sender}|{recipient}"`` as ASCII bytes.
    """
    return f"{job}|{int(round_)}|{sender}|{recipient}".encode()


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM encrypt: ``nonce (12 random bytes) ‖ ciphertext ‖ tag (16 bytes)``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, data: bytes, aad: bytes) -> bytes:
    """Decrypt and authenticate a message made by :func:`seal` with the same ``aad``.

    Raises
    ------
    SecurityError
        The message is truncated, tampered with, or sealed for another key or AAD.

    """
    if len(data) < NONCE_BYTES + _TAG_BYTES:
        raise SecurityError(f"sealed message too short ({len(data)} bytes)")
    try:
        return AESGCM(key).decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad)
    except InvalidTag:
        raise SecurityError(
            "sealed message does not authenticate (tampered, or wrong key/context)"
        ) from None


def mask_seed(
    s_private_r: X25519PrivateKey | bytes,
    peer_s_pk_raw: bytes,
    job: str,
    round_: int,
    aggregator: str,
    a: str,
    b: str,
) -> bytes:
    """The 32-byte pairwise mask seed m_ab of members ``a`` and ``b`` in one instance.

    ``HKDF(X25519(s_sk_r, s_pk'_r), info=b"meshfl mask" +
    f"{job}|{round}|{aggregator}|{min(a,b)}|{max(a,b)}")``; the two members get the same
    seed whichever of them computes it (each with its own private and the other's public
    key), in whichever order ``a``, ``b`` are given. ``s_private_r`` may be the key or
    its raw 32 bytes (as reconstructed from Shamir shares). SecurityError on an invalid
    peer key.
    """
    if isinstance(s_private_r, bytes | bytearray):
        if len(s_private_r) != KEY_BYTES:
            raise SecurityError(f"a masking private key must be {KEY_BYTES} bytes")
        s_private_r = X25519PrivateKey.from_private_bytes(bytes(s_private_r))
    lo, hi = (a, b) if a <= b else (b, a)
    context = f"{job}|{int(round_)}|{aggregator}|{lo}|{hi}".encode()
    return hkdf(_exchange(s_private_r, peer_s_pk_raw, "masking"), b"meshfl mask" + context)
