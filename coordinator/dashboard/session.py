"""Login sessions of the web dashboard: a cookie names a session, the session holds a token.

The dashboard is a browser page, so it cannot send ``Authorization: Bearer`` on every
request (an ``EventSource`` cannot send headers at all). Instead the page posts an API
token once (``POST /ui/session``) and gets a random session id in an HttpOnly cookie
(:data:`SESSION_COOKIE`). The server keeps ``session id -> token`` in memory for
:data:`SESSION_TTL_S` seconds and **re-checks the token on every request** with the
API's own check (:func:`coordinator.tokens.authenticate`, the one behind ``ReadDep``),
so revoking or expiring the API token ends each of its sessions at once. Any API role
(``admin``, ``operator``, ``read-only``) and the settings' admin token may read the
dashboard; device and enrolment tokens are refused.

Sessions live in this process only (the coordinator runs as one uvicorn worker): a
restart logs everybody out, which costs one login. Each token keeps at most
:data:`MAX_SESSIONS_PER_TOKEN` sessions (a new login drops that token's oldest), so
logging in again and again with one token cannot push other viewers out; the global
:data:`MAX_SESSIONS` is a last resort against many tokens at once.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy.orm import Session

from coordinator import tokens
from coordinator.errors import Unauthorized

__all__ = [
    "MAX_SESSIONS",
    "MAX_SESSIONS_PER_TOKEN",
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "LoginSession",
    "Sessions",
    "check_token",
]

SESSION_COOKIE = "meshfl_session"
"""Name of the cookie carrying the session id (HttpOnly, SameSite=Strict, Path=/ui)."""
SESSION_TTL_S = 12 * 3600.0
"""Lifetime of a login session (seconds, 12 h from login); then the page asks again."""
MAX_SESSIONS = 10_000
"""Most sessions kept at once, over all tokens; opening one more drops the oldest (of any
token). A last resort: the per-token cap keeps one token from reaching it alone."""
MAX_SESSIONS_PER_TOKEN = 20
"""Most sessions of one token; opening one more drops that token's oldest."""


@dataclass(frozen=True, slots=True)
class LoginSession:
    """One login: the API token it was opened with and when it ends (unix seconds)."""

    token: str
    expires_at: float


def check_token(
    session: Session, token: str, now: float, *, admin_token: str
) -> tokens.Caller | None:
    """Check ``token`` exactly as the API checks a bearer token on its read routes.

    Parameters
    ----------
    session : Session
        A database session (read only).
    token : str
        The presented secret.
    now : float
        The coordinator's clock, unix seconds.
    admin_token : str
        The settings' admin token ("" when unset).

    Returns
    -------
    tokens.Caller or None
        The operator behind the token; ``None`` for a device, enrolment, unknown,
        revoked or expired token (the API answers those 403 or 401; the dashboard
        answers 401 to all of them).

    """
    if not token:
        return None
    try:
        return tokens.authenticate(session, token, now, admin_token=admin_token)
    except Unauthorized:  # a revoked or expired API token
        return None


class Sessions:
    """The dashboard's login sessions of one app, in memory; safe across threads.

    Parameters
    ----------
    ttl_s : float, optional
        Seconds a session lasts from its login (default :data:`SESSION_TTL_S`).
    max_sessions : int, optional
        Most sessions kept (default :data:`MAX_SESSIONS`); the oldest goes first.
    max_per_token : int, optional
        Most sessions of one token (default :data:`MAX_SESSIONS_PER_TOKEN`); that
        token's oldest goes first.

    Raises
    ------
    ValueError
        ``ttl_s`` not positive, or ``max_sessions`` or ``max_per_token`` below 1.

    """

    def __init__(
        self,
        *,
        ttl_s: float = SESSION_TTL_S,
        max_sessions: int = MAX_SESSIONS,
        max_per_token: int = MAX_SESSIONS_PER_TOKEN,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive seconds, got {ttl_s!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if max_per_token < 1:
            raise ValueError(f"max_per_token must be at least 1, got {max_per_token}")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_per_token = max_per_token
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, LoginSession] = OrderedDict()  # oldest first
        self._by_token: dict[str, OrderedDict[str, None]] = {}  # token -> its ids, oldest first

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)

    def open(self, token: str, now: float) -> str:
        """Open a session for an already checked ``token``; return its new random id."""
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._drop_expired(now)
            mine = self._by_token.get(token)
            while mine and len(mine) >= self.max_per_token:
                self._remove(next(iter(mine)))
            while len(self._by_id) >= self.max_sessions:
                self._remove(next(iter(self._by_id)))
            self._by_id[session_id] = LoginSession(token=token, expires_at=now + self.ttl_s)
            self._by_token.setdefault(token, OrderedDict())[session_id] = None
        return session_id

    def token_of(self, session_id: str | None, now: float) -> str | None:
        """The token of a live session, or ``None`` (unknown, or expired: then dropped)."""
        if not session_id:
            return None
        with self._lock:
            found = self._by_id.get(session_id)
            if found is None:
                return None
            if now >= found.expires_at:
                self._remove(session_id)
                return None
            return found.token

    def drop(self, session_id: str | None) -> None:
        """Forget a session (logout, or its token no longer passes); unknown ids are ignored."""
        if session_id:
            with self._lock:
                self._remove(session_id)

    def _drop_expired(self, now: float) -> None:
        for session_id in [k for k, v in self._by_id.items() if now >= v.expires_at]:
            self._remove(session_id)

    def _remove(self, session_id: str) -> None:
        """Forget one session in both maps (the lock held); unknown ids are ignored."""
        found = self._by_id.pop(session_id, None)
        if found is None:
            return
        mine = self._by_token[found.token]
        del mine[session_id]
        if not mine:
            del self._by_token[found.token]
