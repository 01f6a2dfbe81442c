"""The coordinator's app factory: ``create_app(settings)``.

Nothing happens at import time. ``create_app`` opens the engine, migrates the store to
the latest schema (Alembic ``upgrade head``), mounts one router per resource under
``/api/v1`` (``/healthz``, ``/readyz`` and Prometheus ``/metrics`` at the root,
:mod:`coordinator.metrics`) and answers every error as RFC 9457 problem
details whose ``detail`` is one line naming the problem and the fix
(:mod:`coordinator.problems`); requests are rate limited per identity
(:mod:`coordinator.ratelimit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from coordinator import dashboard, enrolment, migrate, problems, secagg
from coordinator.artifacts import ArtifactStore
from coordinator.brokerauth import BrokerAccounts
from coordinator.control import Control, Publish
from coordinator.dashboard.router import EVENTS_PATH
from coordinator.db import THREADS, make_engine, make_sessionmaker
from coordinator.liveness import Liveness
from coordinator.metrics import CoordinatorMetrics, RequestMetrics
from coordinator.presence import Presence, Subscribe
from coordinator.ratelimit import RateLimit
from coordinator.request_context import bind_request_context
from coordinator.routers import (
    artifacts,
    devices,
    enrolment_tokens,
    fleet_enrolment,
    health,
    heartbeat,
    jobs,
    privacy,
    tokens,
    topology,
)
from coordinator.settings import CoordinatorSettings
from meshfl import __version__
from meshfl.contract import API_PREFIX
from meshfl.errors import ConfigError, MeshflError
from meshfl.wire import status_filter

__all__ = ["create_app"]

log = logging.getLogger("coordinator.app")

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
            await _too_large(send, scope, self.max_bytes)
            return
        # A streamed (chunked) body is read here, at most max_bytes, before the app sees
        # it: an error raised from inside the app's body read would become FastAPI's 400.
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await _too_large(send, scope, self.max_bytes)
                return
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay() -> Any:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Any, scope: Any, max_bytes: int) -> None:
    detail = f"request body over {max_bytes} bytes; send less"
    await problems.send_problem(send, 413, detail, scope.get("path", ""))


MAX_CONCURRENT_REQUESTS = THREADS * 3 // 4
"""Requests inside the app at once; more wait in the event loop.

Fewer than the sync-route threads (:data:`coordinator.db.THREADS`, which the connection
pool matches): a request holding a database connection always finds a thread for its
session's teardown, and a thread always finds a connection, so bursts queue instead of
deadlocking into pool timeouts.
"""


class ConcurrencyLimit:
    """ASGI middleware admitting at most ``limit`` HTTP requests at a time (FIFO wait).

    The dashboard's event streams (:data:`~coordinator.dashboard.router.EVENTS_PATH`)
    are not counted: they stay open, and build their snapshots in a limiter of their own.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit
        self._slots: asyncio.Semaphore | None = None  # one per event loop (tests run several)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") == EVENTS_PATH:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.limit), loop
        async with self._slots:
            await self.app(scope, receive, send)


def create_app(
    settings: CoordinatorSettings,
    publish: Publish | None = None,
    *,
    clock: Callable[[], float] = time.time,
    broker_accounts: BrokerAccounts | None = None,
    subscribe: Subscribe | None = None,
) -> FastAPI:
    """Build the coordinator's FastAPI app.

    Parameters
    ----------
    settings : CoordinatorSettings
        Must carry ``admin_token`` (``serve()`` fills a missing one); ``enrol_token``
        ``None`` leaves the fleet's shared enrolment token off.
    publish : callable, optional
        ``publish(topic, payload)`` sends one retained QoS 1 MQTT message; each new
        topology version and each end of a job is published on the fleet's control topic
        (:mod:`coordinator.control`). ``None`` (default): no push; agents poll REST.
        Its failures are logged, never raised to a request.
    clock : callable, optional
        Returns the current time in unix seconds; default :func:`time.time`. Tests pass
        a fake clock to move time (stale-device rule, elapsed times).
    broker_accounts : BrokerAccounts, optional
        The broker's login table (:mod:`coordinator.brokerauth`): enrolment adds a login
        for the new device (username = device id, a fresh password returned once) and
        revocation removes it. ``None`` (default): no broker logins are managed.
    subscribe : callable, optional
        ``subscribe(topic_filter, on_message)`` (:data:`coordinator.presence.Subscribe`):
        the app subscribes to every device's status topic
        (``meshfl/v1/{fleet}/node/+/status``) so a device's Last Will turns it offline at
        once (:mod:`coordinator.presence`, kept as ``app.state.presence``). ``None``
        (default): no statuses; ``online`` follows heartbeats only. A failure to subscribe
        is logged, never raised.

    Returns
    -------
    FastAPI
        The app; its store is migrated to the latest schema. OpenAPI docs at ``/docs``.

    Raises
    ------
    meshfl.errors.ConfigError
        A token is missing.

    """
    if not settings.admin_token:
        raise ConfigError(
            "the coordinator needs admin_token; set MESHFL_COORDINATOR_ADMIN_TOKEN or start"
            " it with serve(), which generates one"
        )
    engine = make_engine(settings.db_url)
    migrate.upgrade(engine)
    enrolment.seed(make_sessionmaker(engine), settings, clock())  # the fleet token, or off

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        flusher = asyncio.create_task(liveness.flush_every(settings.heartbeat_flush_s))
        yield
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        liveness.flush()  # heartbeats of the last interval are not lost
        engine.dispose()

    from fastapi_offline import FastAPIOffline

    # Docs assets served from the package, not a CDN: coordinators often run offline.
    app = FastAPIOffline(
        title="meshfl coordinator",
        version=__version__,
        lifespan=lifespan,
        dependencies=[Depends(bind_request_context)],  # log lines name the job and device
        description="Control plane of a meshfl fleet: enrolment, jobs, topology, metrics.",
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.liveness = liveness = Liveness(app.state.sessionmaker)
    app.state.signing_key = secagg.load_signing_key(app.state.sessionmaker, clock())
    app.state.clock = clock
    app.state.broker_accounts = broker_accounts
    app.state.control = Control(fleet=settings.fleet, publish=publish)
    app.state.artifacts = ArtifactStore(settings.artifacts_path(), settings.max_model_bytes)
    app.add_middleware(ConcurrencyLimit, limit=MAX_CONCURRENT_REQUESTS)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, exempt=artifacts.UPLOAD_PATH)
    app.add_middleware(RateLimit, settings=settings)  # before any body is read
    app.state.presence = presence = Presence(settings.fleet, clock=clock)
    _watch_statuses(presence, subscribe)
    app.state.metrics = CoordinatorMetrics(app.state.sessionmaker, settings, clock, presence)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)  # outermost: 413s, 429s
    problems.install(app)
    app.include_router(health.router)
    app.include_router(devices.router, prefix=API_PREFIX)
    app.include_router(heartbeat.router, prefix=API_PREFIX)
    app.include_router(jobs.router, prefix=API_PREFIX)
    app.include_router(artifacts.router, prefix=API_PREFIX)
    app.include_router(privacy.router, prefix=API_PREFIX)
    app.include_router(topology.router, prefix=API_PREFIX)
    app.include_router(tokens.router, prefix=API_PREFIX)
    app.include_router(fleet_enrolment.router, prefix=API_PREFIX)  # before /{token_id}
    app.include_router(enrolment_tokens.router, prefix=API_PREFIX)
    dashboard.install(app)  # /ui: hidden from the OpenAPI
    problems.document(app)  # after every router: the problem statuses in the OpenAPI
    return app


def _watch_statuses(presence: Presence, subscribe: Subscribe | None) -> None:
    """Subscribe ``presence`` to the fleet's status topics; a failure only costs the Will."""
    if subscribe is None:
        return
    try:
        subscribe(status_filter(presence.fleet), presence.on_status)
    except MeshflError as exc:
        log.warning("no device statuses (%s); online follows heartbeats only", exc)
