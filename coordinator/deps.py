"""FastAPI dependencies and their ``Annotated`` aliases, used by every router.

Authentication is ``Authorization: Bearer <token>``: a missing (or non-bearer) header
is 401; a token that is present but not accepted for this endpoint is 403. Admin
tokens are compared with :func:`hmac.compare_digest`; device tokens are looked up by
their SHA-256 digest. The clock (``NowDep``) is ``app.state.clock`` so tests can replace
it, or override :func:`get_now` with ``app.dependency_overrides``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from coordinator import store
from coordinator.artifacts import ArtifactStore
from coordinator.control import Control
from coordinator.db import Device
from coordinator.settings import CoordinatorSettings

__all__ = [
    "AdminDep",
    "AdminOrFleetDeviceDep",
    "ArtifactsDep",
    "ControlDep",
    "DeviceDep",
    "NowDep",
    "OwnDeviceDep",
    "SessionDep",
    "SettingsDep",
    "SigningKeyDep",
    "get_artifacts",
    "get_control",
    "get_now",
    "get_session",
    "get_settings",
    "get_signing_key",
]

_bearer = HTTPBearer(auto_error=False, description="admin token or device token")


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


def get_artifacts(request: Request) -> ArtifactStore:
    """Return the app's :class:`~coordinator.artifacts.ArtifactStore` (model files)."""
    artifacts: ArtifactStore = request.app.state.artifacts
    return artifacts


def get_signing_key(request: Request) -> Ed25519PrivateKey:
    """Return the coordinator's Ed25519 key that signs secure-aggregation declarations."""
    key: Ed25519PrivateKey = request.app.state.signing_key
    return key


SettingsDep = Annotated[CoordinatorSettings, Depends(get_settings)]
SigningKeyDep = Annotated[Ed25519PrivateKey, Depends(get_signing_key)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
ControlDep = Annotated[Control, Depends(get_control)]
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


def require_admin(token: TokenDep, settings: SettingsDep) -> None:
    """Accept only the admin token (403 for any other token)."""
    expected = settings.admin_token or ""
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs the admin token; use the one printed at coordinator "
            "start (MESHFL_COORDINATOR_ADMIN_TOKEN)",
        )


def current_device(token: TokenDep, session: SessionDep) -> Device:
    """Return the device whose token was sent (403 for an unknown token)."""
    device = store.device_by_token(session, token)
    if device is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs a device token; enrol with POST /devices/enrol to get one",
        )
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


AdminDep = Annotated[None, Depends(require_admin)]
OwnDeviceDep = Annotated[Device, Depends(own_device)]


def admin_or_fleet_device(token: TokenDep, session: SessionDep, settings: SettingsDep) -> None:
    """Accept the admin token or the token of any device of this coordinator's fleet."""
    expected = settings.admin_token or ""
    if hmac.compare_digest(token.encode(), expected.encode()):
        return
    device = store.device_by_token(session, token)
    if device is None or device.fleet != settings.fleet:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this endpoint needs the admin token or a device token of this fleet; enrol with"
            " POST /devices/enrol to get one",
        )


AdminOrFleetDeviceDep = Annotated[None, Depends(admin_or_fleet_device)]
