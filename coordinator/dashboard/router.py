"""The dashboard's routes under ``/ui`` (hidden from the OpenAPI: they are no REST API).

- ``GET /ui``: the dashboard page with a live session, else the login page (401).
- ``POST /ui/session``: ``{"token": ...}`` (JSON or form) → 204 and the session cookie,
  or 401 problem details; ``POST /ui/logout``: 204, the session and cookie gone. Both
  refuse a cross-site request (login CSRF): an ``Origin`` header other than the
  request's own ``scheme://host[:port]`` is 403, and a login body of any other media
  type than JSON or a form (``text/plain`` needs no CORS preflight) is 415.
- ``GET /ui/static/{file}``: the page's own scripts and styles (public, no data).
- ``GET /ui/api/snapshot?job=ID``: the snapshot (:mod:`.snapshot`), 401 without a session.
- ``GET /ui/api/events?job=ID``: server-sent events (sse-starlette): a ``snapshot`` event
  at connect and whenever the snapshot changes (checked every :data:`CHECK_EVERY_S`,
  less often when a build is slow: :data:`CHECK_LOAD`),
  a comment every 15 s to keep proxies from closing the stream. The session is
  re-checked on every check: a revoked token or an ended session closes the stream.

Snapshots are built in worker threads (the store is sync SQLAlchemy), at most
:data:`SNAPSHOT_THREADS` at once, so viewers never take the API's threads.
"""

from __future__ import annotations

import asyncio
import json
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
from fastapi import APIRouter, FastAPI, HTTPException, Request, Response, status
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse, ServerSentEvent

from coordinator.dashboard.session import SESSION_COOKIE, Sessions, check_token
from coordinator.dashboard.snapshot import SnapshotCache, build_snapshot, fingerprint
from coordinator.deps import NowDep, SessionDep, SettingsDep
from coordinator.settings import CoordinatorSettings
from meshfl.errors import ConfigError

__all__ = ["CHECK_EVERY_S", "EVENTS_PATH", "SNAPSHOT_THREADS", "install", "router"]

EVENTS_PATH = "/ui/api/events"
"""Path of the event stream (long-lived: the concurrency limit does not count it)."""
CHECK_EVERY_S = 1.0
"""Seconds between two snapshot checks of an event stream (at least)."""
CHECK_LOAD = 0.2
"""Largest share of the time a stream spends building snapshots: after a check that took
t seconds the next waits at least t / CHECK_LOAD, so a large job slows its updates down
instead of keeping a core busy."""
SNAPSHOT_THREADS = 4
"""Most snapshots built at once, over all viewers."""
PING_S = 15
"""Seconds between keep-alive comments on an event stream."""

_STATIC = Path(__file__).parent / "static"
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_PAGE_HEADERS = {
    **_HEADERS,
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
}
_LOGIN_AGAIN = (
    "no dashboard session, or it ended (logged out, expired, or its token was revoked);"
    " open /ui and log in with an API token"
)

router = APIRouter(include_in_schema=False)


@cache
def _page(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.dashboard_sessions
    return sessions


def _logged_in(app: Any, session_id: str | None, now: float) -> bool:
    """Whether ``session_id`` is a live session whose token still passes (else dropped)."""
    sessions: Sessions = app.state.dashboard_sessions
    token = sessions.token_of(session_id, now)
    if token is None:
        return False
    settings: CoordinatorSettings = app.state.settings
    with app.state.sessionmaker() as db:
        caller = check_token(db, token, now, admin_token=settings.admin_token or "")
    if caller is None:
        sessions.drop(session_id)
    return caller is not None


@router.get("/ui", response_class=HTMLResponse)
def page(request: Request, now: NowDep) -> HTMLResponse:
    """The dashboard with a live session; the login page (401) without one."""
    if _logged_in(request.app, request.cookies.get(SESSION_COOKIE), now):
        return HTMLResponse(_page("index.html"), headers=_PAGE_HEADERS)
    return HTMLResponse(_page("login.html"), status.HTTP_401_UNAUTHORIZED, headers=_PAGE_HEADERS)


_FORM = "application/x-www-form-urlencoded"
_JSON = "application/json"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, host: str | None, port: int | None) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of an origin, lower case, the scheme's default port filled in."""
    scheme = scheme.lower()
    return scheme, (host or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def _check_origin(request: Request) -> None:
    """Refuse (403) a request whose ``Origin`` header names another site; none is fine.

    Browsers send ``Origin`` on every cross-site POST, so a page elsewhere cannot log a
    viewer in with the attacker's token (login CSRF) or log them out. Tools that send no
    ``Origin`` (curl, tests) are not affected.
    """
    sent = request.headers.get("origin")
    if sent is None:
        return
    own = request.url
    try:
        parts = urlsplit(sent)
        theirs = _origin(parts.scheme, parts.hostname, parts.port)
    except ValueError:  # a malformed port
        theirs = None
    if theirs != _origin(own.scheme, own.hostname, own.port):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"cross-site request refused: Origin {sent[:200]!r} is not this server"
            f" ({own.scheme}://{own.netloc}); open the dashboard at that address (behind a"
            " proxy, forward the Host header and X-Forwarded-Proto)",
        )


async def _posted_token(request: Request) -> str:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in (_JSON, _FORM):
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"unsupported Content-Type {kind!r}: send"
            f' {{"token": "<API token>"}} as {_JSON}, or a form field token as {_FORM}',
        )
    body = await request.body()
    try:
        if kind == _FORM:
            token: Any = parse_qs(body.decode("utf-8")).get("token", [""])[0]
        else:
            token = json.loads(body or b"{}").get("token")
    except (ValueError, AttributeError, RecursionError):  # RecursionError: nested too deep
        token = None
    if not isinstance(token, str) or not token:
        raise ConfigError(
            'invalid request: send {"token": "<API token>"} as JSON, or a form field token'
        )
    return token


@router.post("/ui/session", status_code=status.HTTP_204_NO_CONTENT)
async def login(request: Request) -> Response:
    """Open a session for a valid API token (any role) or the admin token; 401 otherwise."""
    _check_origin(request)
    token = await _posted_token(request)
    app = request.app
    now: float = app.state.clock()

    def check() -> bool:
        settings: CoordinatorSettings = app.state.settings
        with app.state.sessionmaker() as db:
            return check_token(db, token, now, admin_token=settings.admin_token or "") is not None

    if not await anyio.to_thread.run_sync(check):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "this token cannot open the dashboard: it is unknown, revoked or expired, or a"
            " device or enrolment token; log in with an API token (meshfl fleet tokens api"
            " create) or the admin token",
        )
    sessions = _sessions(request)
    response = Response(status_code=status.HTTP_204_NO_CONTENT, headers=_HEADERS)
    response.set_cookie(
        SESSION_COOKIE,
        sessions.open(token, now),
        max_age=int(sessions.ttl_s),
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/ui/logout", status_code=status.HTTP_204_NO_CONTENT)
def logout(request: Request) -> Response:
    """End this browser's session (if any) and clear its cookie; 403 from another site."""
    _check_origin(request)
    _sessions(request).drop(request.cookies.get(SESSION_COOKIE))
    response = Response(status_code=status.HTTP_204_NO_CONTENT, headers=_HEADERS)
    response.delete_cookie(
        SESSION_COOKIE,
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("/ui/api/snapshot")
def snapshot(
    request: Request,
    db: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    job: str | None = None,
) -> JSONResponse:
    """The snapshot of ``job`` (default: the current job); 401 without a live session."""
    if not _logged_in(request.app, request.cookies.get(SESSION_COOKIE), now):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, _LOGIN_AGAIN)
    presence = getattr(request.app.state, "presence", None)
    body = build_snapshot(db, settings, now, job_id=job, presence=presence)
    return JSONResponse(body, headers=_HEADERS)


class _Limiter:
    """An anyio capacity limiter per event loop (tests run several loops in one process)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    def get(self) -> anyio.CapacityLimiter:
        loop = asyncio.get_running_loop()
        if self._limiter is None or self._loop is not loop:
            self._limiter, self._loop = anyio.CapacityLimiter(self.tokens), loop
        return self._limiter


def _checked_snapshot(
    app: Any, session_id: str | None, job_id: str | None
) -> tuple[dict[str, Any], str] | None:
    """``(snapshot, fingerprint)`` for a live session, ``None`` once it ended (in a thread)."""
    now: float = app.state.clock()
    if not _logged_in(app, session_id, now):
        return None
    cached: SnapshotCache = app.state.dashboard_snapshots
    body = cached.get(job_id)
    return body, fingerprint(body)


@router.get(EVENTS_PATH)
async def events(request: Request, job: str | None = None) -> EventSourceResponse:
    """Stream ``snapshot`` events: one at connect, then one per change; 401 without a session."""
    app = request.app
    session_id = request.cookies.get(SESSION_COOKIE)
    limiter: _Limiter = app.state.dashboard_limiter

    async def check() -> tuple[dict[str, Any], str] | None:
        return await anyio.to_thread.run_sync(
            _checked_snapshot, app, session_id, job, limiter=limiter.get()
        )

    first = await check()  # an unknown job raises NotFound here: a 404 before the stream
    if first is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, _LOGIN_AGAIN)

    async def stream() -> Any:
        current: tuple[dict[str, Any], str] | None = first
        sent = ""
        took = 0.0
        while current is not None:
            body, digest = current
            if digest != sent:
                sent = digest
                yield ServerSentEvent(json.dumps(body), event="snapshot")
            await anyio.sleep(max(CHECK_EVERY_S, took / CHECK_LOAD))
            started = anyio.current_time()
            current = await check()
            took = anyio.current_time() - started

    return EventSourceResponse(stream(), ping=PING_S, send_timeout=30.0, headers=_HEADERS)


def install(app: FastAPI) -> None:
    """Mount the dashboard on ``app``: its routes, static files and in-memory state.

    Sets ``app.state.dashboard_sessions`` (:class:`~.session.Sessions`),
    ``dashboard_snapshots`` (a :class:`~.snapshot.SnapshotCache` shared by the event
    streams) and ``dashboard_limiter``. Reads ``app.state.presence`` at request time when
    another part of the coordinator sets it (a device's latest announced round).
    """
    app.state.dashboard_sessions = Sessions()
    app.state.dashboard_limiter = _Limiter(SNAPSHOT_THREADS)

    def build(job_id: str | None) -> dict[str, Any]:
        with app.state.sessionmaker() as db:
            presence = getattr(app.state, "presence", None)
            now: float = app.state.clock()
            return build_snapshot(db, app.state.settings, now, job_id=job_id, presence=presence)

    app.state.dashboard_snapshots = SnapshotCache(build)
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=_STATIC), name="dashboard-static")
