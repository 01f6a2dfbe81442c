"""``/tokens``: operator API tokens with a role (admin only): create, list, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from coordinator import tokens
from coordinator.db import ApiToken
from coordinator.deps import AdminDep, NowDep, SessionDep
from meshfl.contract import ApiTokenCreate, ApiTokenCreated, ApiTokenPublic

__all__ = ["router"]

Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items (1..1000)")]
Offset = Annotated[int, Query(ge=0, le=2**31, description="skip this many items first")]

router = APIRouter(prefix="/tokens", tags=["tokens"])


def _public(row: ApiToken, now: float) -> ApiTokenPublic:
    return ApiTokenPublic(
        token_id=row.id,
        name=row.name,
        role=row.role,  # type: ignore[typeddict-item]
        status=tokens.api_token_status(row, now),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


@router.post("", response_model=ApiTokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(
    body: ApiTokenCreate, _: AdminDep, session: SessionDep, now: NowDep
) -> ApiTokenCreated:
    """Create an API token with a role; the answer's ``token`` is the only copy of the secret.

    Roles: ``admin`` (everything, token management included), ``operator`` (reads and
    changes devices, jobs and topology), ``read-only`` (``GET`` routes only).
    """
    row, secret = tokens.create_api_token(
        session, role=body["role"], now=now, name=body.get("name", ""), ttl_s=body.get("ttl_s")
    )
    return ApiTokenCreated(**_public(row, now), token=secret)


@router.get("", response_model=list[ApiTokenPublic])
def list_tokens(
    _: AdminDep, session: SessionDep, now: NowDep, limit: Limit = 100, offset: Offset = 0
) -> list[ApiTokenPublic]:
    """Every API token (revoked and expired ones too), oldest first; never a secret."""
    return [_public(r, now) for r in tokens.list_api_tokens(session, limit=limit, offset=offset)]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def revoke_token(token_id: str, _: AdminDep, session: SessionDep, now: NowDep) -> Response:
    """Revoke an API token at once (again: no change); requests with it then get 401."""
    tokens.revoke_api_token(session, token_id, now)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
