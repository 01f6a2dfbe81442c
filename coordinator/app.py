"""The coordinator's app factory: ``create_app(settings)``.

Nothing happens at import time. ``create_app`` opens the engine, migrates the store to
the latest schema (Alembic ``upgrade head``), mounts one router per resource under
``/api/v1`` (``/healthz`` at the root) and maps the store's errors to HTTP statuses,
each answered as ``{"detail": "<one line: the problem and the fix>"}``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from coordinator import migrate, secagg
from coordinator.artifacts import ArtifactStore
from coordinator.control import Control, Publish
from coordinator.db import make_engine, make_sessionmaker
from coordinator.errors import Conflict, Forbidden, NotFound
from coordinator.routers import artifacts, devices, health, jobs, privacy
from coordinator.settings import CoordinatorSettings
from meshfl import __version__
from meshfl.contract import API_PREFIX
from meshfl.errors import ConfigError, MeshflError

__all__ = ["create_app"]

_STATUS: list[tuple[type[MeshflError], int]] = [
    (NotFound, status.HTTP_404_NOT_FOUND),
    (Conflict, status.HTTP_409_CONFLICT),
    (Forbidden, status.HTTP_403_FORBIDDEN),
    (ConfigError, 422),
]


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def _meshfl_error(_request: Request, exc: Exception) -> JSONResponse:
    code = next((c for kind, c in _STATUS if isinstance(exc, kind)), 500)
    return JSONResponse({"detail": _one_line(str(exc))}, status_code=code)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = [
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors
    ]
    detail = "invalid request: " + "; ".join(parts) + " (fix these fields and retry)"
    return JSONResponse({"detail": _one_line(detail)}, status_code=422)


MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (bytes); a round report with a 4096-entry sketch is ~100 KB."""


class BodyLimit:
    """ASGI middleware answering 413 to a body over ``max_bytes`` (declared or streamed).

    Paths matching ``exempt`` (model uploads, which bound their own size) pass through.
    """

    def __init__(self, app: Any, max_bytes: int, exempt: re.Pattern[str] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (
            self.exempt is not None and self.exempt.fullmatch(scope.get("path", ""))
        ):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(send, self.max_bytes)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any, max_bytes: int) -> None:
    body = json.dumps({"detail": f"request body over {max_bytes} bytes; send less"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def create_app(
    settings: CoordinatorSettings,
    publish: Publish | None = None,
    *,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """Build the coordinator's FastAPI app.

    Parameters
    ----------
    settings : CoordinatorSettings
        Must carry ``enrol_token`` and ``admin_token`` (``serve()`` fills missing ones).
    publish : callable, optional
        ``publish(topic, payload)`` sends one retained QoS 1 MQTT message; each new
        topology version and each end of a job is published on the fleet's control topic
        (:mod:`coordinator.control`). ``None`` (default): no push; agents poll REST.
        Its failures are logged, never raised to a request.
    clock : callable, optional
        Returns the current time in unix seconds; default :func:`time.time`. Tests pass
        a fake clock to move time (stale-device rule, elapsed times).

    Returns
    -------
    FastAPI
        The app; its store is migrated to the latest schema. OpenAPI docs at ``/docs``.

    Raises
    ------
    meshfl.errors.ConfigError
        A token is missing.

    """
    if not settings.enrol_token or not settings.admin_token:
        raise ConfigError(
            "the coordinator needs enrol_token and admin_token; set "
            "MESHFL_COORDINATOR_ENROL_TOKEN/ADMIN_TOKEN or start it with serve(), "
            "which generates them"
        )
    engine = make_engine(settings.db_url)
    migrate.upgrade(engine)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    from fastapi_offline import FastAPIOffline

    # Docs assets served from the package, not a CDN: coordinators often run offline.
    app = FastAPIOffline(
        title="meshfl coordinator",
        version=__version__,
        lifespan=lifespan,
        description="Control plane of a meshfl fleet: enrolment, jobs, topology, metrics.",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.signing_key = secagg.load_signing_key(app.state.sessionmaker, clock())
    app.state.clock = clock
    app.state.control = Control(fleet=settings.fleet, publish=publish)
    app.state.artifacts = ArtifactStore(settings.artifacts_path(), settings.max_model_bytes)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, exempt=artifacts.UPLOAD_PATH)
    app.add_exception_handler(MeshflError, _meshfl_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(health.router)
    app.include_router(devices.router, prefix=API_PREFIX)
    app.include_router(jobs.router, prefix=API_PREFIX)
    app.include_router(artifacts.router, prefix=API_PREFIX)
    app.include_router(privacy.router, prefix=API_PREFIX)
    return app
