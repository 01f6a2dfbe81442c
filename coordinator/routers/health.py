"""Probes and metrics at the root: ``/healthz``, ``/readyz``, ``/metrics``.

``/healthz`` (liveness, no auth) answers while the process serves requests: Docker health
checks and ``meshfl local`` wait on it. ``/readyz`` (readiness, no auth) answers 200 only
when the database is reachable and its schema is at the Alembic head this coordinator
ships, else 503 as RFC 9457 problem details: a load balancer sends traffic only to ready
coordinators. ``/metrics`` is the Prometheus exposition (:mod:`coordinator.metrics`); it
needs an operator token unless the ``metrics_public`` setting is on.
"""

from __future__ import annotations

import functools
from typing import Annotated

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from coordinator import migrate
from coordinator.deps import NowDep, SessionDep, SettingsDep, bearer_token, require_read
from coordinator.metrics import CoordinatorMetrics
from coordinator.problems import problem

__all__ = ["router", "schema_problem"]

router = APIRouter(tags=["health"])

_bearer = HTTPBearer(auto_error=False, description="an operator token (any role)")


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Return ``{"status": "ok"}`` while the process serves requests."""
    return {"status": "ok"}


@functools.cache
def _heads() -> frozenset[str]:
    """The migration heads this coordinator ships (read once per process)."""
    return frozenset(ScriptDirectory.from_config(migrate.alembic_config()).get_heads())


def schema_problem(engine: Engine) -> str | None:
    """Why the database behind ``engine`` cannot serve this coordinator, or ``None``.

    Unreachable (any SQLAlchemy error on connecting or reading ``alembic_version``), or
    its schema revision is not the Alembic head of ``coordinator/migrations``.
    """
    try:
        with engine.connect() as connection:
            current = frozenset(MigrationContext.configure(connection).get_current_heads())
    except SQLAlchemyError as exc:
        return (
            f"the database is not reachable ({type(exc).__name__}); check db_url and that"
            " the database server is up"
        )
    heads = _heads()
    if current != heads:
        have = ", ".join(sorted(current)) or "none"
        return (
            f"the database schema is at revision {have} but this coordinator needs"
            f" {', '.join(sorted(heads))}; restart the coordinator to migrate it"
            " (create_app runs the migrations)"
        )
    return None


@router.get(
    "/readyz",
    responses={503: {"description": "Database unreachable or not migrated"}},
)
def readyz(request: Request) -> Response:
    """200 ``{"status": "ready"}`` when the database is reachable and migrated, else 503."""
    why = schema_problem(request.app.state.engine)
    if why is None:
        return JSONResponse({"status": "ready"})
    return problem(503, why, request.url.path)


def metrics_access(
    settings: SettingsDep,
    session: SessionDep,
    now: NowDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Let a scrape through: anyone with ``metrics_public``, else any operator token.

    401 without a token (or an expired one), 403 for a device token.
    """
    if settings.metrics_public:
        return
    require_read(bearer_token(credentials), session, settings, now)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
def metrics(request: Request, _: Annotated[None, Depends(metrics_access)]) -> Response:
    """The coordinator's Prometheus metrics (requests, devices, jobs; text format)."""
    registry: CoordinatorMetrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
