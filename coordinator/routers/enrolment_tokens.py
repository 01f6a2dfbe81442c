"""``/enrolment-tokens``: tokens devices enrol with (operator or admin): create, list, revoke.

``POST /devices/enrol`` spends one use of the token it is given
(:func:`coordinator.tokens.consume_enrolment_token`) and gives the new device its tags.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from coordinator import tokens
from coordinator.db import EnrolmentToken
from coordinator.deps import NowDep, OperateDep, SessionDep
from meshfl.contract import EnrolmentTokenCreate, EnrolmentTokenCreated, EnrolmentTokenPublic

__all__ = ["router"]

Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items (1..1000)")]
Offset = Annotated[int, Query(ge=0, le=2**31, description="skip this many items first")]

router = APIRouter(prefix="/enrolment-tokens", tags=["enrolment-tokens"])


def _public(row: EnrolmentToken, now: float) -> EnrolmentTokenPublic:
    return EnrolmentTokenPublic(
        token_id=row.id,
        name=row.name,
        tags=list(row.tags),
        uses=row.uses,
        uses_left=row.uses_left,
        status=tokens.enrolment_token_status(row, now),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


@router.post("", response_model=EnrolmentTokenCreated, status_code=status.HTTP_201_CREATED)
def create_enrolment_token(
    body: EnrolmentTokenCreate, _: OperateDep, session: SessionDep, now: NowDep
) -> EnrolmentTokenCreated:
    """Create an enrolment token; the answer's ``token`` is the only copy of the secret.

    Defaults: valid 3600 s (at most 30 days), one use (at most 10,000), no tags.
    """
    row, secret = tokens.create_enrolment_token(
        session,
        now=now,
        ttl_s=body.get("ttl_s", 3600.0),
        uses=body.get("uses", 1),
        tags=body.get("tags", []),
        name=body.get("name", ""),
    )
    return EnrolmentTokenCreated(**_public(row, now), token=secret)


@router.get("", response_model=list[EnrolmentTokenPublic])
def list_enrolment_tokens(
    _: OperateDep, session: SessionDep, now: NowDep, limit: Limit = 100, offset: Offset = 0
) -> list[EnrolmentTokenPublic]:
    """Every enrolment token with its uses left and status, oldest first; never a secret."""
    rows = tokens.list_enrolment_tokens(session, limit=limit, offset=offset)
    return [_public(r, now) for r in rows]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response)
def revoke_enrolment_token(
    token_id: str, _: OperateDep, session: SessionDep, now: NowDep
) -> Response:
    """Revoke an enrolment token (again: no change); devices it enrolled stay enrolled."""
    tokens.revoke_enrolment_token(session, token_id, now)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
