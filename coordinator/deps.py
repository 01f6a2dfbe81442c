"""FastAPI dependencies and their ``Annotated`` aliases, used by every router.

Authentication is ``Authorization: Bearer <token>``: a missing (or non-bearer) header
is 401; a token that is present but not accepted for this endpoint is 403; an expired
or revoked API token is 401. Operator routes take a role (:mod:`coordinator.tokens`):
``ReadDep`` any API token role, ``OperateDep`` ``operator`` or ``admin``, ``AdminDep``
``admin``; the settings' admin token is an ``admin``, device tokens pass none of them.
The admin token is compared with :func:`hmac.compare_digest`; API and device tokens are
looked up by their SHA-256 digest. The clock (``NowDep``) is ``app.state.clock`` so tests
can replace it, or override :func:`get_now` with ``app.dependency_overrides``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from coordinator import store, tokens
from coordinator.artifacts import ArtifactStore
from coordinator.brokerauth import BrokerAccounts
from coordinator.control import Control
from coordinator.db import Device
from coordinator.presence import Presence
from coordinator.settings import CoordinatorSettings

__all__ = [
    "REVOKED_CHALLENGE",
    "AdminDep",
    "AdminOrFleetDeviceDep",
    "ArtifactsDep",
    "BrokerAccountsDep",
    "ControlDep",
    "DeviceDep",
    "NowDep",
    "OperateDep",
    "OwnDeviceDep",
    "PresenceDep",
    "ReadDep",
    "SessionDep",
    "SettingsDep",
    "SigningKeyDep",
    "bearer_token",
    "get_artifacts",
    "get_broker_accounts",
    "get_control",
    "get_now",
    "get_presence",
    "get_session",
    "get_settings",
    "get_signing_key",
    "refuse_revoked",
]

_bearer = HTTPBearer(auto_error=False, description="API token, admin token or device token")


def get_settings(request: Request) -> CoordinatorSettings:
    """Return the settings ``create_app`` was given."""
    settings: CoordinatorSettings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One SQLAlchemy session per request, closed afterwards."""
    with request.app.state.sessionmaker() as session:
        yield session


def get_now(request: Request) -> float:
    """Return the coordinator's clock reading, unix seconds."""
    now: float = request.app.state.clock()
    return now


def get_control(request: Request) -> Control:
    """Return the app's :class:`~coordinator.control.Control` (lock and publisher)."""
    control: Control = request.app.state.control
    return control


def get_presence(request: Request) -> Presence:
    """Return the app's :class:`~coordinator.presence.Presence` (device statuses over MQTT)."""
    presence: Presence = request.app.state.presence
    return presence


def get_artifacts(request: Request) -> ArtifactStore:
    """Return the app's :class:`~coordinator.artifacts.ArtifactStore` (model files)."""
    artifacts: ArtifactStore = request.app.state.artifacts
    return artifacts


def get_broker_accounts(request: Request) -> BrokerAccounts | None:
    """Return the broker login table ``create_app`` was given (``None``: not managed)."""
    accounts: BrokerAccounts | None = request.app.state.broker_accounts
    return accounts


def get_signing_key(request: Request) -> Ed25519PrivateKey:
    """Return the coordinator's Ed25519 key that signs secure-aggregation declarations."""
    key: Ed25519PrivateKey = request.app.state.signing_key
    return key


SettingsDep = Annotated[CoordinatorSettings, Depends(get_settings)]
SigningKeyDep = Annotated[Ed25519PrivateKey, Depends(get_signing_key)]
BrokerAccountsDep = Annotated[BrokerAccounts | None, Depends(get_broker_accounts)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
ControlDep = Annotated[Control, Depends(get_control)]
PresenceDep = Annotated[Presence, Depends(get_presence)]
SessionDep = Annotated[Session, Depends(get_session)]
NowDep = Annotated[float, Depends(get_now)]


def bearer_token(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """Return the request's bearer token; 401 when there is none."""
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token; send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return credentials.credentials


TokenDep = Annotated[str, Depends(bearer_token)]


def _caller(token: str, session: Session, settings: SettingsDep, now: float) -> tokens.Caller:
    caller = tokens.authenticate(session, token, now, admin_token=settings.admin_token or "")
    if caller is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs an API token or the admin token (printed at coordinator"
            " start, MESHFL_COORDINATOR_ADMIN_TOKEN); device tokens only reach device routes",
        )
    return caller


def _role(caller: tokens.Caller, allowed: frozenset[str], what: str) -> tokens.Caller:
    if caller.role not in allowed:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this endpoint needs {what}; this token is {caller.role!r}, ask an admin for"
            " a token with that role (POST /api/v1/tokens)",
        )
    return caller


def require_read(
    token: TokenDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> tokens.Caller:
    """Accept any API token role or the admin token (403 otherwise; 401 expired/revoked)."""
    return _caller(token, session, settings, now)


def require_operate(
    token: TokenDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> tokens.Caller:
    """Accept an ``operator`` or ``admin`` API token or the admin token (else 403)."""
    caller = _caller(token, session, settings, now)
    return _role(caller, tokens.OPERATE_ROLES, "an operator or admin token")


def require_admin(
    token: TokenDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> tokens.Caller:
    """Accept an ``admin`` API token or the settings' admin token (else 403)."""
    caller = _caller(token, session, settings, now)
    return _role(caller, frozenset({"admin"}), "an admin token")


ReadDep = Annotated[tokens.Caller, Depends(require_read)]
OperateDep = Annotated[tokens.Caller, Depends(require_operate)]


REVOKED_CHALLENGE = 'Bearer error="invalid_token", error_description="device revoked"'
"""``WWW-Authenticate`` of the 401 a revoked device gets (RFC 6750); agents stop on it."""


def refuse_revoked(device: Device) -> None:
    """Answer 401 (``WWW-Authenticate``: :data:`REVOKED_CHALLENGE`) for a revoked device.

    A deleted device (a tombstone, :mod:`coordinator.fleet`) was revoked first: likewise.
    """
    if device.state in ("revoked", "deleted"):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            f"device {device.id!r} was revoked by an operator and its token no longer works;"
            " enrol the device again with a new enrolment token",
            headers={"WWW-Authenticate": REVOKED_CHALLENGE},
        )


def current_device(token: TokenDep, session: SessionDep) -> Device:
    """Return the device whose token was sent (403 for an unknown token, 401 if revoked)."""
    device = store.device_by_token(session, token)
    if device is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs a device token; enrol with POST /devices/enrol to get one",
        )
    refuse_revoked(device)
    return device


DeviceDep = Annotated[Device, Depends(current_device)]


def own_device(device_id: str, device: DeviceDep) -> Device:
    """Return the authenticated device if it is the path's ``{device_id}`` (else 403)."""
    if device.id != device_id:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this token belongs to device {device.id!r}, not {device_id!r}; "
            "use that device's own token",
        )
    return device


AdminDep = Annotated[tokens.Caller, Depends(require_admin)]
OwnDeviceDep = Annotated[Device, Depends(own_device)]


def admin_or_fleet_device(
    token: TokenDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> None:
    """Accept an operator credential (any role) or a token of a device of this fleet."""
    if tokens.authenticate(session, token, now, admin_token=settings.admin_token or ""):
        return
    device = store.device_by_token(session, token)
    if device is not None:
        refuse_revoked(device)
    if device is None or device.fleet != settings.fleet:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs the admin token or a device token of this fleet; enrol with"
            " POST /devices/enrol to get one",
        )


AdminOrFleetDeviceDep = Annotated[None, Depends(admin_or_fleet_device)]
