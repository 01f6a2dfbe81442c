"""Operator API tokens and device enrolment tokens: create, list, revoke, check, consume.

Secrets are ``secrets.token_urlsafe(32)`` (256 bits) behind a prefix that names their
kind — :data:`API_TOKEN_PREFIX` for API tokens, :data:`ENROLMENT_TOKEN_PREFIX` for
enrolment tokens — so a leaked one is recognisable (secret scanners, logs) and the rate
limiter can tell an operator from a device without a database look-up. Only the SHA-256
hex digest of a secret is stored; a presented token is found by its digest (a
high-entropy secret needs no slow hash). The settings' tokens stay valid: the admin
token is the bootstrap ``admin`` and the enrol token a multi-use fleet enrolment token
without tags.

Like :mod:`coordinator.store`, every function takes the request's ``Session`` and the
clock's ``now`` (unix seconds) and raises meshfl errors, never HTTP exceptions.
"""

from __future__ import annotations

import hmac
import math
import secrets
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from coordinator.db import ApiToken, EnrolmentToken
from coordinator.errors import NotFound, Unauthorized
from coordinator.store import hash_token
from coordinator.validation import validate_tags
from meshfl.contract import ApiRole
from meshfl.errors import ConfigError

__all__ = [
    "API_TOKEN_PREFIX",
    "ENROLMENT_TOKEN_PREFIX",
    "MAX_API_TTL_S",
    "MAX_ENROLMENT_TTL_S",
    "MAX_ENROLMENT_USES",
    "OPERATE_ROLES",
    "READ_ROLES",
    "ROLES",
    "Caller",
    "EnrolmentGrant",
    "api_token_status",
    "authenticate",
    "consume_enrolment_token",
    "create_api_token",
    "create_enrolment_token",
    "enrolment_token_status",
    "list_api_tokens",
    "list_enrolment_tokens",
    "revoke_api_token",
    "revoke_enrolment_token",
]

ROLES: tuple[ApiRole, ...] = ("admin", "operator", "read-only")
"""API token roles: ``admin`` does everything (token management included), ``operator``
reads and changes devices, jobs and topology, ``read-only`` only reads."""
READ_ROLES: frozenset[str] = frozenset(ROLES)
OPERATE_ROLES: frozenset[str] = frozenset({"admin", "operator"})

API_TOKEN_PREFIX = "mfa_"
ENROLMENT_TOKEN_PREFIX = "mfe_"

MAX_API_TTL_S = 10 * 365 * 86_400.0
"""Longest API token lifetime (seconds, ten years); no ``ttl_s``: it never expires."""
MAX_ENROLMENT_TTL_S = 30 * 86_400.0
"""Longest enrolment token lifetime (seconds, 30 days)."""
MAX_ENROLMENT_USES = 10_000
"""Largest enrolment quota (devices one enrolment token may enrol)."""

_NAME_MAX = 200
_NEW_FLEET_TOKEN = "ask an operator for a new one (POST /api/v1/enrolment-tokens)"
_NEW_API_TOKEN = "ask an admin for a new one (POST /api/v1/tokens)"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent an operator request: the role and the API token that carries it.

    ``token_id`` ``None``: the settings' admin token (the bootstrap admin).
    """

    role: ApiRole
    token_id: str | None
    name: str


@dataclass(frozen=True, slots=True)
class EnrolmentGrant:
    """What an accepted enrolment token gives the new device.

    ``token_id`` ``None``: the settings' fleet enrol token; ``tags``: the token's tags,
    to apply to the device.
    """

    token_id: str | None
    tags: list[str] = field(default_factory=list)


def _check_name(name: str) -> str:
    if len(name) > _NAME_MAX or any(not c.isprintable() for c in name):
        raise ConfigError(f"name is invalid; use at most {_NAME_MAX} printable characters")
    return name


def _check_ttl(ttl_s: float, longest: float) -> float:
    ok = not isinstance(ttl_s, bool) and math.isfinite(ttl_s) and 0 < ttl_s <= longest
    if not ok:
        raise ConfigError(f"ttl_s = {ttl_s!r} is invalid; give seconds in (0, {longest:g}]")
    return float(ttl_s)


def create_api_token(
    session: Session, *, role: str, now: float, name: str = "", ttl_s: float | None = None
) -> tuple[ApiToken, str]:
    """Create an API token; returns its row and its secret (shown once, never stored).

    Parameters
    ----------
    session : Session
        The request's session; committed.
    role : str
        One of :data:`ROLES`.
    now : float
        Unix seconds, the coordinator's clock.
    name : str, optional
        A label for listings (at most 200 printable characters). Default ``""``.
    ttl_s : float or None, optional
        Lifetime in seconds, in (0, :data:`MAX_API_TTL_S`]. ``None`` (default): never
        expires.

    Raises
    ------
    meshfl.errors.ConfigError
        An unknown role, an invalid name or lifetime.

    """
    if role not in ROLES:
        raise ConfigError(f"role {role!r} is unknown; use one of {', '.join(ROLES)}")
    expires_at = None if ttl_s is None else now + _check_ttl(ttl_s, MAX_API_TTL_S)
    secret = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        id=f"tok-{secrets.token_hex(6)}",
        name=_check_name(name),
        role=role,
        token_hash=hash_token(secret),
        created_at=now,
        expires_at=expires_at,
        revoked_at=None,
    )
    session.add(row)
    session.commit()
    return row, secret


def list_api_tokens(session: Session, *, limit: int = 100, offset: int = 0) -> list[ApiToken]:
    """API tokens, oldest first (ties by id), ``limit`` of them after skipping ``offset``."""
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    return list(session.scalars(query.limit(limit).offset(offset)))


def revoke_api_token(session: Session, token_id: str, now: float) -> ApiToken:
    """Revoke an API token at once (idempotent: the first revocation time stays).

    Raises
    ------
    coordinator.errors.NotFound
        No API token has this id.

    """
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"API token {token_id!r} does not exist; list them with GET /api/v1/tokens")
    if row.revoked_at is None:
        row.revoked_at = now
        session.commit()
    return row


def api_token_status(row: ApiToken, now: float) -> Literal["active", "expired", "revoked"]:
    """``revoked``, ``expired`` (at or after ``expires_at``) or ``active``."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and now >= row.expires_at:
        return "expired"
    return "active"


def authenticate(session: Session, token: str, now: float, *, admin_token: str) -> Caller | None:
    """Return the operator behind a bearer token, or ``None`` if it is no API token.

    The settings' ``admin_token`` (compared in constant time) is the bootstrap admin;
    otherwise an :data:`API_TOKEN_PREFIX` token is looked up by its digest.

    Raises
    ------
    coordinator.errors.Unauthorized
        The API token was revoked or has expired.

    """
    if admin_token and hmac.compare_digest(token.encode(), admin_token.encode()):
        return Caller(role="admin", token_id=None, name="admin token (settings)")
    if not token.startswith(API_TOKEN_PREFIX):  # a device token: no look-up needed
        return None
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None:
        return None
    state = api_token_status(row, now)
    if state != "active":
        raise Unauthorized(f"API token {row.id!r} {state}; {_NEW_API_TOKEN}")
    return Caller(role=row.role, token_id=row.id, name=row.name)  # type: ignore[arg-type]


def create_enrolment_token(
    session: Session,
    *,
    now: float,
    ttl_s: float = 3600.0,
    uses: int = 1,
    tags: list[str] | None = None,
    name: str = "",
) -> tuple[EnrolmentToken, str]:
    """Create an enrolment token; returns its row and its secret (shown once).

    Parameters
    ----------
    session : Session
        The request's session; committed.
    now : float
        Unix seconds, the coordinator's clock.
    ttl_s : float, optional
        Seconds it stays valid, in (0, :data:`MAX_ENROLMENT_TTL_S`]. Default 3600.
    uses : int, optional
        Devices it may enrol, 1..:data:`MAX_ENROLMENT_USES`. Default 1 (one-time).
    tags : list of str, optional
        Tags given to each device it enrols (:func:`validate_tags`). Default none.
    name : str, optional
        A label for listings. Default ``""``.

    Raises
    ------
    meshfl.errors.ConfigError
        An invalid lifetime, quota, tag or name.

    """
    ttl = _check_ttl(ttl_s, MAX_ENROLMENT_TTL_S)
    if isinstance(uses, bool) or not 1 <= uses <= MAX_ENROLMENT_USES:
        raise ConfigError(f"uses = {uses!r} is invalid; give 1..{MAX_ENROLMENT_USES}")
    secret = ENROLMENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = EnrolmentToken(
        id=f"enr-{secrets.token_hex(6)}",
        name=_check_name(name),
        token_hash=hash_token(secret),
        tags=validate_tags(tags or [], "tags"),
        uses=uses,
        uses_left=uses,
        created_at=now,
        expires_at=now + ttl,
        revoked_at=None,
    )
    session.add(row)
    session.commit()
    return row, secret


def list_enrolment_tokens(
    session: Session, *, limit: int = 100, offset: int = 0
) -> list[EnrolmentToken]:
    """Enrolment tokens, oldest first (ties by id), ``limit`` after skipping ``offset``."""
    query = select(EnrolmentToken).order_by(EnrolmentToken.created_at, EnrolmentToken.id)
    return list(session.scalars(query.limit(limit).offset(offset)))


def revoke_enrolment_token(session: Session, token_id: str, now: float) -> EnrolmentToken:
    """Revoke an enrolment token (idempotent); devices it enrolled stay enrolled.

    Raises
    ------
    coordinator.errors.NotFound
        No enrolment token has this id.

    """
    row = session.get(EnrolmentToken, token_id)
    if row is None:
        raise NotFound(
            f"enrolment token {token_id!r} does not exist; list them with"
            " GET /api/v1/enrolment-tokens"
        )
    if row.revoked_at is None:
        row.revoked_at = now
        session.commit()
    return row


def enrolment_token_status(
    row: EnrolmentToken, now: float
) -> Literal["active", "expired", "used up", "revoked"]:
    """``revoked``, ``expired``, ``used up`` or ``active``, in that order of precedence."""
    if row.revoked_at is not None:
        return "revoked"
    if now >= row.expires_at:
        return "expired"
    if row.uses_left <= 0:
        return "used up"
    return "active"


def consume_enrolment_token(
    session: Session, token: str, now: float, *, fleet_token: str | None = None
) -> EnrolmentGrant:
    """Spend one use of an enrolment token and return what it grants.

    The use is taken by one conditional ``UPDATE ... SET uses_left = uses_left - 1 WHERE
    uses_left > 0 AND not revoked AND not expired`` and its row count, so two concurrent
    enrolments cannot both spend the last use (PostgreSQL locks the row, SQLite the
    database, until the transaction ends). **Nothing is committed**: the caller commits
    together with the device it creates, so an enrolment that fails afterwards (a
    rollback) spends no use; call it after validating the request, then commit soon.

    Parameters
    ----------
    session : Session
        The request's session (not committed here).
    token : str
        The token the device presented.
    now : float
        Unix seconds, the coordinator's clock.
    fleet_token : str or None, optional
        The settings' ``enrol_token``: accepted (constant-time comparison) as a
        multi-use token without tags. ``None`` (default): not accepted.

    Returns
    -------
    EnrolmentGrant
        The token's id (``None`` for the fleet token) and its tags.

    Raises
    ------
    coordinator.errors.Unauthorized
        The token is unknown, expired, used up or revoked (HTTP 401).

    """
    if fleet_token and hmac.compare_digest(token.encode(), fleet_token.encode()):
        return EnrolmentGrant(token_id=None, tags=[])
    digest = hash_token(token)
    spent = session.execute(
        update(EnrolmentToken)
        .where(
            EnrolmentToken.token_hash == digest,
            EnrolmentToken.uses_left > 0,
            EnrolmentToken.revoked_at.is_(None),
            EnrolmentToken.expires_at > now,
        )
        .values(uses_left=EnrolmentToken.uses_left - 1)
        .execution_options(synchronize_session=False)
    )
    row = session.scalars(select(EnrolmentToken).where(EnrolmentToken.token_hash == digest)).first()
    if spent.rowcount == 1 and row is not None:  # type: ignore[attr-defined]
        return EnrolmentGrant(token_id=row.id, tags=list(row.tags))
    state = "unknown" if row is None else enrolment_token_status(row, now)
    if state == "active":  # another enrolment took the last use since
        state = "used up"
    raise Unauthorized(f"enrolment token {state}; {_NEW_FLEET_TOKEN}")
