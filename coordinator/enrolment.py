"""The fleet's shared enrolment token and who may enrol under an identity key (issue 23).

**The fleet token** is off unless asked for: ``meshfl coordinator serve --enrol-token``
(or ``MESHFL_COORDINATOR_ENROL_TOKEN``) seeds it at start (:func:`seed`), ``meshfl
local`` always does, and an operator can rotate one in over REST. It lives in
``fleet_enrolment`` (migration 0009) as the SHA-256 digest of its secret, with an
optional quota (``--enrol-token-uses``) and expiry (``--enrol-token-ttl``), and can be
**disabled** (refused at once) and **rotated** (a new secret; the old one is refused at
once) by an operator. The row remembers the digest of the setting that seeded it, so a
restart with the same ``--enrol-token`` keeps a rotation or a disable; a *different*
setting replaces the row (the operator changed the configuration); a restart without
one disables a row the setting had made, but keeps a rotated-in one.

**Identity keys.** A device presents its Ed25519 identity key at enrolment. A key that
belongs to a revoked or deleted device is refused whatever the token: revoking a device
bars its identity from enrolling again. A key that an active device holds is accepted
only with ``identity_proof`` (the key's signature of
:func:`meshfl.contract.enrol_proof_message`), and then the old device is revoked — its
token and its broker login stop working — so a re-enrolled device never leaves a live
broker login behind. Someone who only knows a device's public key can neither take its
place nor evict it.

Functions take the request's session and ``now`` (unix seconds) and raise meshfl
errors, like :mod:`coordinator.tokens`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import secrets

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from coordinator.db import Device, FleetEnrolment
from coordinator.errors import Conflict, Forbidden, NotFound
from coordinator.settings import CoordinatorSettings
from coordinator.store import hash_token
from meshfl.contract import FleetEnrolmentPublic, enrol_proof_message
from meshfl.errors import ConfigError

__all__ = [
    "MAX_FLEET_TTL_S",
    "MAX_FLEET_USES",
    "consume",
    "device_to_replace",
    "disable",
    "public",
    "rotate",
    "seed",
]

MAX_FLEET_TTL_S = 10 * 365 * 86_400.0
"""Longest lifetime of a fleet token (seconds, ten years); none: it never expires."""
MAX_FLEET_USES = 10_000_000
"""Largest quota of a fleet token (devices it may enrol); none: unlimited."""

TOKEN_PREFIX = "mfe_"  # as coordinator.tokens.ENROLMENT_TOKEN_PREFIX: an enrolment secret


def _limits(ttl_s: float | None, uses: int | None) -> None:
    if ttl_s is not None and not (
        not isinstance(ttl_s, bool) and math.isfinite(ttl_s) and 0 < ttl_s <= MAX_FLEET_TTL_S
    ):
        raise ConfigError(f"ttl_s = {ttl_s!r} is invalid; give seconds in (0, {MAX_FLEET_TTL_S:g}]")
    if uses is not None and (isinstance(uses, bool) or not 1 <= uses <= MAX_FLEET_USES):
        raise ConfigError(f"uses = {uses!r} is invalid; give 1..{MAX_FLEET_USES} (none: unlimited)")


def _fresh(
    fleet: str, digest: str, now: float, ttl_s: float | None, uses: int | None, seed: str | None
) -> FleetEnrolment:
    return FleetEnrolment(
        fleet=fleet,
        token_hash=digest,
        seed_hash=seed,
        uses=uses,
        uses_left=uses,
        created_at=now,
        expires_at=None if ttl_s is None else now + ttl_s,
        disabled_at=None,
    )


def seed(make_session: sessionmaker[Session], settings: CoordinatorSettings, now: float) -> None:
    """Bring the fleet token in line with the settings at start (see the module docstring).

    Raises
    ------
    meshfl.errors.ConfigError
        ``enrol_token_ttl_s`` or ``enrol_token_uses`` out of range.

    """
    ttl_s, uses = settings.enrol_token_ttl_s, settings.enrol_token_uses
    _limits(ttl_s, uses)
    with make_session() as session:
        row = session.get(FleetEnrolment, settings.fleet)
        if settings.enrol_token is None:
            if (
                row is not None
                and row.seed_hash is not None
                and row.disabled_at is None
                and row.token_hash == row.seed_hash
            ):
                row.disabled_at = now  # the setting's token, no longer asked for
            session.commit()
            return
        digest = hash_token(settings.enrol_token)
        if row is not None and row.seed_hash == digest:
            return  # the same setting: a rotation or a disable since then stands
        if row is not None:
            session.delete(row)
            session.flush()
        session.add(_fresh(settings.fleet, digest, now, ttl_s, uses, seed=digest))
        try:
            session.commit()
        except IntegrityError:  # another process seeded it at the same moment
            session.rollback()


def _status(row: FleetEnrolment | None, now: float) -> str:
    if row is None:
        return "off"
    if row.disabled_at is not None:
        return "disabled"
    if row.expires_at is not None and now >= row.expires_at:
        return "expired"
    if row.uses_left is not None and row.uses_left <= 0:
        return "used up"
    return "active"


def public(session: Session, fleet: str, now: float) -> FleetEnrolmentPublic:
    """The fleet token's state, never its secret."""
    row = session.get(FleetEnrolment, fleet)
    return FleetEnrolmentPublic(
        status=_status(row, now),  # type: ignore[typeddict-item]
        uses=None if row is None else row.uses,
        uses_left=None if row is None else row.uses_left,
        created_at=None if row is None else row.created_at,
        expires_at=None if row is None else row.expires_at,
        disabled_at=None if row is None else row.disabled_at,
    )


def consume(session: Session, fleet: str, token: str, now: float) -> bool:
    """Spend one use of the fleet token if ``token`` is it and it is active; nothing committed.

    Returns ``False`` when ``token`` is not the fleet token (another enrolment token may
    be). Like :func:`coordinator.tokens.consume_enrolment_token`, the use is one
    conditional ``UPDATE`` (two enrolments cannot both take the last use) and the caller
    commits with the device it creates.

    Raises
    ------
    coordinator.errors.Forbidden
        It is the fleet token but disabled, expired or used up (the reason named).

    """
    row = session.get(FleetEnrolment, fleet)
    if row is None or not hmac.compare_digest(row.token_hash, hash_token(token)):
        return False
    state = _status(row, now)
    if state == "active" and row.uses_left is not None:
        spent = session.execute(
            update(FleetEnrolment)
            .where(FleetEnrolment.fleet == fleet, FleetEnrolment.uses_left > 0)
            .values(uses_left=FleetEnrolment.uses_left - 1)
            .execution_options(synchronize_session=False)
        )
        if spent.rowcount != 1:  # type: ignore[attr-defined]
            state = "used up"
    if state != "active":
        raise Forbidden(
            f"the fleet enrolment token is {state}; ask an operator for an enrolment token"
            " (meshfl fleet tokens create, or meshfl fleet tokens enrol rotate)"
        )
    return True


def rotate(
    session: Session, fleet: str, now: float, *, ttl_s: float | None = None, uses: int | None = None
) -> tuple[FleetEnrolmentPublic, str]:
    """Replace the fleet token with a new secret (enabled); returns its state and the secret.

    The old secret is refused from now on; devices already enrolled keep working.

    Raises
    ------
    meshfl.errors.ConfigError
        ``ttl_s`` or ``uses`` out of range.

    """
    _limits(ttl_s, uses)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = session.get(FleetEnrolment, fleet)
    fresh = _fresh(fleet, hash_token(secret), now, ttl_s, uses, seed=None)
    if row is None:
        session.add(fresh)
    else:
        for column in ("token_hash", "uses", "uses_left", "created_at", "expires_at"):
            setattr(row, column, getattr(fresh, column))
        row.disabled_at = None  # seed_hash stays: a restart with the same setting keeps this
    session.commit()
    return public(session, fleet, now), secret


def disable(session: Session, fleet: str, now: float) -> FleetEnrolmentPublic:
    """Refuse the fleet token from now on (idempotent: the first time stays).

    Raises
    ------
    coordinator.errors.NotFound
        There is no fleet token to disable (``status`` ``off``).

    """
    row = session.get(FleetEnrolment, fleet)
    if row is None:
        raise NotFound("there is no fleet enrolment token to disable (its status is off)")
    if row.disabled_at is None:
        row.disabled_at = now
        session.commit()
    return public(session, fleet, now)


def _proof_ok(identity_key: str, proof: str | None, token: str, name: str) -> bool:
    if proof is None:
        return False
    try:
        signature = base64.b64decode(proof.encode("ascii"), validate=True)
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(identity_key))
        key.verify(signature, enrol_proof_message(token, name, identity_key))
    except (binascii.Error, UnicodeEncodeError, ValueError, InvalidSignature):
        return False
    return True


def device_to_replace(
    session: Session, identity_key: str | None, proof: str | None, token: str, name: str
) -> Device | None:
    """The active device an enrolment under ``identity_key`` replaces, if any.

    Raises
    ------
    coordinator.errors.Forbidden
        The key belongs to a revoked or deleted device.
    coordinator.errors.Conflict
        An active device holds the key and ``proof`` does not verify
        (:func:`meshfl.contract.enrol_proof_message`).

    """
    if identity_key is None:
        return None
    holders = list(session.scalars(select(Device).where(Device.identity_key == identity_key)))
    barred = [d for d in holders if d.state in ("revoked", "deleted")]
    if barred:
        raise Forbidden(
            f"this identity key belongs to device {barred[0].id!r}, which an operator revoked;"
            " a revoked device cannot enrol again (a new device needs a new identity key)"
        )
    if not holders:
        return None
    if not _proof_ok(identity_key, proof, token, name):
        raise Conflict(
            f"device {holders[0].id!r} holds this identity key; to enrol again as that"
            " device send identity_proof (the key's signature of the enrolment message)"
        )
    return holders[0]
