"""The secure-aggregation key directory and the coordinator's signed declarations.

The coordinator is the authenticated public-key directory of Bonawitz et al. (CCS 2017,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", rounds 0–1) run
once per neighbourhood (SecAgg+, Bell et al., CCS 2020): every participant of a secure
job uploads a :class:`~meshfl.contract.KeyBundle` signed with the Ed25519 identity key it
registered at enrolment, and fetches everyone's bundles, identity keys and
neighbourhoods N(i). It also drives dropout recovery (round 3): an aggregator declares
which members of N(i) survived a round; the coordinator checks the declaration against
its directory, keeps the first one per (job, round, aggregator) and returns it signed
with its own Ed25519 key, so members reveal shares only for a declaration every honest
member sees identically. The coordinator never sees a masked or unmasked delta.

Base64 is the standard alphabet with padding; raw keys are 32 bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Sequence
from typing import Any, cast

from Crypto.Signature import eddsa
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from coordinator import store
from coordinator.db import CoordinatorKey, Device, Job, SecAggBundle, SecAggDeclaration
from coordinator.errors import Conflict, Forbidden
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import Declaration, KeyBundle, SecAggDirectory, SignedDeclaration
from meshfl.errors import ConfigError
from meshfl.wire.secagg import encode_declaration

__all__ = [
    "BUNDLE_CONTEXT",
    "KEY_BYTES",
    "bundle_message",
    "declare",
    "directory",
    "load_signing_key",
    "neighbourhoods",
    "parse_identity_key",
    "placement",
    "public_key_b64",
    "put_bundle",
]

KEY_BYTES = 32
"""Bytes of a raw Ed25519 or X25519 public key."""

BUNDLE_CONTEXT = b"meshfl-keybundle-v1\0"
"""Domain-separation prefix of the bytes a device signs for its key bundle."""

_SIGNING = "signing"


def _b64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ConfigError(f"{what} is not valid base64; send standard base64, padded") from None


def parse_identity_key(text: object) -> str:
    """Check an Ed25519 identity public key (base64 of 32 raw bytes); return it unchanged.

    Raises
    ------
    meshfl.errors.ConfigError
        Not base64, not 32 bytes, or not the encoding of a point on Ed25519 (RFC 8032,
        5.1.3: about half of all 32-byte strings are not; OpenSSL loads any 32 bytes,
        so pycryptodome's decoding checks the point).

    """
    raw = _b64(text, "identity_key")
    if len(raw) != KEY_BYTES:
        raise ConfigError(
            f"identity_key must be a raw {KEY_BYTES}-byte Ed25519 public key in base64,"
            f" got {len(raw)} bytes"
        )
    try:
        eddsa.import_public_key(raw)
    except ValueError:
        raise ConfigError("identity_key is not a valid Ed25519 public key") from None
    return cast(str, text)


def public_key_b64(key: Ed25519PrivateKey) -> str:
    """The raw 32-byte public key of ``key``, base64."""
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_signing_key(make_session: sessionmaker[Session], now: float) -> Ed25519PrivateKey:
    """The coordinator's Ed25519 declaration key, created and stored on first use.

    Kept in ``coordinator_keys`` (raw private key, base64), so a restart on the same
    database signs with the same key that devices already pinned from the directory.
    """
    with make_session() as session:
        row = session.get(CoordinatorKey, _SIGNING)
        if row is None:
            fresh = base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
            session.add(CoordinatorKey(name=_SIGNING, private_key=fresh, created_at=now))
            try:
                session.commit()
            except IntegrityError:  # another process created it first: use theirs
                session.rollback()
            row = session.get(CoordinatorKey, _SIGNING, populate_existing=True)
        assert row is not None
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(row.private_key))


def bundle_message(job_id: str, device_id: str, c_pk: bytes, s_pks: bytes) -> bytes:
    """The bytes a device signs for its key bundle (``docs/privacy.md``)."""
    return BUNDLE_CONTEXT + job_id.encode() + b"\0" + device_id.encode() + b"\0" + c_pk + s_pks


def _options(job: Job) -> PrivacyOptions:
    options = PrivacyOptions.from_spec(job.spec)
    if not options.secure:
        raise Conflict(
            f"job {job.id!r} does not use secure aggregation; create it with"
            " secure_aggregation set to a threshold"
        )
    return options


def _running(job: Job) -> None:
    if job.status not in ("running", "paused"):  # paused: devices finish their round
        raise Conflict(f"job {job.id!r} is {job.status}, not running; secure keys and"
                       " declarations belong to a running job")  # fmt: skip


def _current_member(job: Job, device: Device) -> None:
    if device.id not in (job.topology or {}).get("devices", []):
        raise Forbidden(
            f"device {device.id!r} is not a current participant of job {job.id!r}; ask GET"
            " /devices/{device_id}/assignment for this device's job"
        )


def _verify_bundle(bundle: KeyBundle, device: Device, job: Job) -> None:
    if bundle["device"] != device.id or bundle["job"] != job.id:
        raise ConfigError(
            f"bundle names device {bundle['device']!r} and job {bundle['job']!r} but was sent"
            f" for device {device.id!r} and job {job.id!r}; upload each device's own bundle"
        )
    if device.identity_key is None:
        raise ConfigError(
            f"device {device.id!r} enrolled without an identity_key, so its bundle cannot be"
            " verified; re-enrol with an agent that sends identity_key"
        )
    rounds = int(job.spec["rounds"])
    slots = max(1, len(neighbourhoods(job).get(device.id, [])))  # keys per round
    c_pk = _b64(bundle["c_pk"], "bundle.c_pk")
    s_pks = _b64(bundle["s_pks"], "bundle.s_pks")
    signature = _b64(bundle["signature"], "bundle.signature")
    if len(c_pk) != KEY_BYTES:
        raise ConfigError(f"bundle.c_pk must be {KEY_BYTES} raw bytes, got {len(c_pk)}")
    if len(s_pks) != KEY_BYTES * rounds * slots:
        raise ConfigError(
            f"bundle.s_pks must hold one {KEY_BYTES}-byte masking key per round and"
            f" neighbour: job {job.id!r} has {rounds} rounds and device {device.id!r}"
            f" {slots} neighbours, so {KEY_BYTES * rounds * slots} bytes, got {len(s_pks)}"
        )
    identity = Ed25519PublicKey.from_public_bytes(base64.b64decode(device.identity_key))
    try:
        identity.verify(signature, bundle_message(job.id, device.id, c_pk, s_pks))
    except InvalidSignature:
        raise ConfigError(
            f"bundle signature does not verify with device {device.id!r}'s identity key; sign"
            " it with the key sent at enrolment"
        ) from None


def put_bundle(session: Session, job: Job, device: Device, bundle: KeyBundle, now: float) -> bool:
    """Verify and store ``device``'s bundle for ``job``; ``True`` when new, ``False`` if equal.

    Raises
    ------
    Conflict
        Not a secure job, not running, or a different bundle is already stored.
    Forbidden
        The device is not a current participant.
    meshfl.errors.ConfigError
        A malformed bundle, a wrong length, no identity key or a bad signature.

    """
    _options(job)
    _running(job)
    store.participation(session, job, device)
    _current_member(job, device)
    _verify_bundle(bundle, device, job)
    body = {k: bundle[k] for k in ("device", "job", "c_pk", "s_pks", "signature")}
    stored = session.get(SecAggBundle, (job.id, device.id))
    if stored is None:
        session.add(SecAggBundle(job_id=job.id, device_id=device.id, bundle=body, received_at=now))
        try:
            session.commit()
            return True
        except IntegrityError:  # a concurrent upload won: compare with it
            session.rollback()
            stored = session.get(SecAggBundle, (job.id, device.id), populate_existing=True)
    if stored is not None and stored.bundle == body:
        return False
    raise Conflict(
        f"device {device.id!r} already published different keys for job {job.id!r}; keys"
        " cannot change within a job"
    )


def neighbourhoods(job: Job) -> dict[str, list[str]]:
    """Each device's sorted neighbour ids N(i).

    A secure job's neighbourhoods are those of its start, kept in the topology as
    ``secure_neighbourhoods``: a device that leaves stays in its neighbours'
    neighbourhoods (they declare it dropped), so every key bundle and declaration is
    checked against the graph the agents use.
    """
    topo: dict[str, Any] = job.topology or {}
    fixed = topo.get("secure_neighbourhoods")
    if fixed is not None:
        return {d: list(peers) for d, peers in fixed.items()}
    ids = list(topo.get("devices", []))
    out: dict[str, set[str]] = {d: set() for d in ids}
    for i, j in topo.get("edges", []):
        out[ids[int(i)]].add(ids[int(j)])
        out[ids[int(j)]].add(ids[int(i)])
    return {d: sorted(peers) for d, peers in out.items()}


def directory(session: Session, job: Job, coordinator_key: str) -> SecAggDirectory:
    """The job's key directory (409 unless it is a started secure job)."""
    options = _options(job)
    if job.topology is None:
        raise Conflict(f"job {job.id!r} has not started; its key directory opens at the start")
    members = neighbourhoods(job)
    rows = session.scalars(select(SecAggBundle).where(SecAggBundle.job_id == job.id))
    bundles = {r.device_id: cast(KeyBundle, r.bundle) for r in rows if r.device_id in members}
    keys = {d.id: d.identity_key for d in store.get_devices(session, sorted(members))}
    return SecAggDirectory(
        job_id=job.id,
        threshold=options.threshold,
        coordinator_key=coordinator_key,
        identity_keys={d: k for d, k in keys.items() if k is not None},
        bundles=bundles,
        neighbourhoods=members,
        complete=bool(members) and set(bundles) == set(members),
    )


def _checked(job: Job, device: Device, body: Declaration, threshold: int) -> Declaration:
    if body["aggregator"] != device.id:
        raise Forbidden(
            f"device {device.id!r} cannot declare for aggregator {body['aggregator']!r};"
            " an aggregator declares only its own neighbourhood"
        )
    if body["job"] != job.id:
        raise ConfigError(f"declaration.job = {body['job']!r} but it was sent for job {job.id!r}")
    rounds = int(job.spec["rounds"])
    if not 1 <= body["round"] <= rounds:
        raise ConfigError(f"declaration.round = {body['round']} is not in 1..{rounds}")
    survivors, dropped = set(body["survivors"]), set(body["dropped"])
    members = set(neighbourhoods(job)[device.id])
    if len(survivors) != len(body["survivors"]) or len(dropped) != len(body["dropped"]):
        raise ConfigError("declaration lists a device twice; list each neighbour once")
    if survivors & dropped or not survivors | dropped <= members:
        raise ConfigError(
            f"declaration survivors and dropped must be disjoint lists of aggregator"
            f" {device.id!r}'s neighbours {sorted(members)}"
        )
    if not body["aborted"] and len(survivors) < threshold:
        raise ConfigError(
            f"declaration.aborted must be true: {len(survivors)} survivors are below the"
            f" threshold {threshold}"
        )
    return Declaration(
        job=job.id,
        round=body["round"],
        aggregator=device.id,
        survivors=sorted(survivors),
        dropped=sorted(dropped),
        aborted=body["aborted"],
    )


def declare(
    session: Session,
    job: Job,
    device: Device,
    body: Declaration,
    key: Ed25519PrivateKey,
    now: float,
) -> SignedDeclaration:
    """Check, store (first write wins) and sign an aggregator's declaration.

    The stored declaration has its lists sorted; the same declaration again returns the
    same signed one.

    Raises
    ------
    Conflict
        Not a running secure job, or a different declaration is stored for the round.
    Forbidden
        The caller is not the aggregator, or not a current participant.
    meshfl.errors.ConfigError
        Survivors and dropped are not disjoint subsets of N(aggregator) (``dropped``
        lists only the absent members some survivor masked with), a round out of range,
        or ``aborted`` false below the threshold (an aggregator may abort above it).

    """
    options = _options(job)
    _running(job)
    store.participation(session, job, device)
    _current_member(job, device)
    declaration = _checked(job, device, body, options.threshold)
    pk = (job.id, declaration["round"], device.id)
    stored = session.get(SecAggDeclaration, pk)
    if stored is None:
        signature = base64.b64encode(key.sign(encode_declaration(declaration))).decode()
        session.add(
            SecAggDeclaration(
                job_id=job.id,
                round=declaration["round"],
                aggregator=device.id,
                body=dict(declaration),
                signature=signature,
                declared_at=now,
            )
        )
        try:
            session.commit()
            return SignedDeclaration(declaration=declaration, signature=signature)
        except IntegrityError:  # a concurrent declaration won: compare with it
            session.rollback()
            stored = session.get(SecAggDeclaration, pk, populate_existing=True)
    if stored is not None and stored.body == dict(declaration):
        return SignedDeclaration(
            declaration=cast(Declaration, stored.body), signature=stored.signature
        )
    raise Conflict(
        f"aggregator {device.id!r} already declared round {declaration['round']} of job"
        f" {job.id!r} differently; the first declaration stands"
    )


def placement(devices: Sequence[Device], salt: str | None = None) -> tuple[str, list[Device]]:
    """Order a secure job's devices by SHA-256(salt ‖ device id): their graph positions.

    A device chooses its name, and positions by name would let it choose its neighbours
    (and so which aggregator it colludes with); device ids are the coordinator's random
    ``dev-…`` and the salt is drawn fresh per job at its start (128 bits,
    :func:`secrets.token_hex`), so no device can predict or steer its position. The salt
    is kept in the job's topology (``placement_salt``) so the order can be checked
    afterwards. ``salt`` given: reuse it (tests, re-checking).

    Returns
    -------
    tuple
        The salt (hex) and the devices in position order.

    """
    salt = secrets.token_hex(16) if salt is None else salt

    def rank(device: Device) -> bytes:
        return hashlib.sha256(bytes.fromhex(salt) + device.id.encode()).digest()

    return salt, sorted(devices, key=rank)
