"""``POST /devices/{device_id}/heartbeat``: a device says it is alive.

The route is ``async`` and, once a device's token is cached, touches neither the
database nor a worker thread: it checks the token against
:class:`~coordinator.liveness.Liveness`'s cache and records the time in its buffer,
which is flushed to ``devices.last_seen`` about once a second. The first heartbeat of a
token (or the first after a revocation) looks the device up in the database.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from coordinator.deps import bearer_token, refuse_revoked
from coordinator.liveness import Liveness

__all__ = ["router"]

router = APIRouter(prefix="/devices", tags=["devices"])

_bearer = HTTPBearer(auto_error=False, description="the device's own token")


async def _liveness(request: Request) -> Liveness:
    liveness: Liveness = request.app.state.liveness
    return liveness


@router.post(
    "/{device_id}/heartbeat",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={
        401: {"description": "No bearer token, or the device was revoked"},
        403: {"description": "Not a device token, or another device's token"},
    },
)
async def heartbeat(
    device_id: str,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    liveness: Annotated[Liveness, Depends(_liveness)],
) -> Response:
    """Record that the device is alive now (its own token only; no body; 204).

    The time shows as ``last_seen`` of ``GET /devices/{device_id}`` at once and reaches
    the database within ``heartbeat_flush_s`` seconds. Agents polling their assignment
    need not send heartbeats: a poll counts as one.
    """
    token = bearer_token(credentials)
    owner = liveness.device_for(token)
    if owner is None:
        device = await run_in_threadpool(liveness.lookup, token)
        if device is None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "this endpoint needs a device token; enrol with POST /devices/enrol to get one",
            )
        refuse_revoked(device)
        owner = device.id
    if owner != device_id:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this token belongs to device {owner!r}, not {device_id!r}; "
            "use that device's own token",
        )
    liveness.seen(owner, request.app.state.clock())
    return Response(status_code=status.HTTP_204_NO_CONTENT)
