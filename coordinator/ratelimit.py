"""Rate limits per identity on ``/api/v1``: ASGI middleware over the ``limits`` library.

``limits`` is the maintained engine under slowapi; slowapi's own middleware applies one
limit to every caller (or per-route decorators), while here the limit depends on who
calls, so this module asks ``limits`` directly. The identity is the SHA-256 digest of a
*known* bearer token — the settings' admin token, or one whose digest is an API token's
or a device's in the store — and the client address otherwise: a request without a
token (enrolment) or with a token the store does not know is counted by address, so
sending a fresh made-up token with each request buys no new budget (issue 23). Its
*kind* picks the limit:

- ``operator``: the settings' admin token or an API token — ``rate_limit_operator``;
- ``heartbeat``: a device token on ``POST /devices/{id}/heartbeat`` —
  ``rate_limit_heartbeat`` (at least 10/s, a budget of its own);
- ``device``: a device token elsewhere — ``rate_limit_device``;
- ``address``: no known token, by client address — ``rate_limit_enrol``.

A token is looked up once (in a worker thread, one indexed query) and remembered in a
bounded LRU of :data:`KNOWN_TOKENS` digests; only tokens the store knows enter it, so a
caller cannot flood it. An unknown token is looked up only while its address is under
its limit: an address over it is refused without a database query.

Counting is a fixed window per identity in this process's memory (the coordinator is
one process), so ``Retry-After`` is exact: the seconds until the window ends. A refused
request gets 429 as problem details before any handler runs (no database work). The
memory is :class:`SweptMemoryStorage`: ``limits``' own, swept for expired windows at
most once a second rather than 10 ms after any hit.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections import OrderedDict
from typing import Any, Literal

import anyio.to_thread
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from coordinator.db import ApiToken, Device
from coordinator.problems import send_problem
from coordinator.settings import CoordinatorSettings
from meshfl.contract import API_PREFIX

__all__ = ["HEARTBEAT_PATH", "KNOWN_TOKENS", "RateLimit", "SweptMemoryStorage", "parse_limits"]

KNOWN_TOKENS = 65_536
"""Digests of store-known tokens the limiter remembers (LRU); about 10 MiB at most."""

TokenKind = Literal["operator", "device"]

HEARTBEAT_PATH = re.compile(re.escape(API_PREFIX) + r"/devices/[^/]+/heartbeat")
"""Paths counted against the heartbeat budget rather than the device budget."""

_WHO = {
    "operator": "this API token",
    "device": "this device token",
    "heartbeat": "this device's heartbeats",
    "address": "requests without a token the coordinator knows, from this address",
}


def parse_limits(value: str) -> list[RateLimitItem]:
    """Parse a limit setting: ``"600/minute"``, ``"10/second;500/minute"``; ``""``/``"0"``: none.

    Raises
    ------
    ValueError
        The text is not in the ``limits`` notation (``N/second|minute|hour|day``).

    """
    text = value.strip()
    if text in ("", "0"):
        return []
    return list(parse_many(text))


class SweptMemoryStorage(MemoryStorage):
    """``limits``' in-memory storage, swept for expired windows at most every ``sweep_s``.

    ``MemoryStorage`` starts a :class:`threading.Timer` 10 ms after any hit whose sweep
    walks every key: with 10,000 devices sending heartbeats that is a new thread and a
    walk of 10,000 keys up to 100 times a second, about a third of the coordinator's CPU
    a heartbeat (W5, BENCHMARKS.md). Counting is unchanged: ``limits`` drops an
    expired window when its key is next read; the sweep only frees the memory of
    identities that went quiet, which once a second does as well.

    Parameters
    ----------
    sweep_s : float, optional
        Least time between two sweeps, in seconds; default 1.

    """

    def __init__(self, sweep_s: float = 1.0) -> None:
        super().__init__()
        self.sweep_s = sweep_s
        self._next_sweep = 0.0

    def _MemoryStorage__schedule_expiry(self) -> None:  # overrides limits' private hook
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_s
            getattr(super(), "_MemoryStorage__schedule_expiry")()  # noqa: B009


class RateLimit:
    """ASGI middleware refusing (429) a request over its identity's limit.

    Parameters
    ----------
    app : ASGI app
        The wrapped application.
    settings : CoordinatorSettings
        Its ``rate_limit_*`` fields (validated there) and ``admin_token``.

    """

    def __init__(self, app: Any, settings: CoordinatorSettings) -> None:
        self.app = app
        self.admin_token = (settings.admin_token or "").encode()
        self.limits = {
            "operator": parse_limits(settings.rate_limit_operator),
            "device": parse_limits(settings.rate_limit_device),
            "heartbeat": parse_limits(settings.rate_limit_heartbeat),
            "address": parse_limits(settings.rate_limit_enrol),
        }
        self.limiter = FixedWindowRateLimiter(SweptMemoryStorage())
        self.known: OrderedDict[str, TokenKind] = OrderedDict()

    def _remember(self, digest: str, kind: TokenKind) -> None:
        self.known[digest] = kind
        self.known.move_to_end(digest)
        while len(self.known) > KNOWN_TOKENS:
            self.known.popitem(last=False)

    @staticmethod
    def _lookup(scope: Any, digest: str) -> TokenKind | None:
        """``operator``/``device`` if the store knows the token with this digest, else None."""
        app = scope.get("app")
        make_session = getattr(getattr(app, "state", None), "sessionmaker", None)
        if make_session is None:
            return None
        try:
            with make_session() as session:
                if session.scalar(select(ApiToken.id).where(ApiToken.token_hash == digest)):
                    return "operator"
                if session.scalar(select(Device.id).where(Device.token_hash == digest)):
                    return "device"
        except SQLAlchemyError:  # a busy store: count by address this time
            return None
        return None

    async def identify(self, scope: Any) -> tuple[str, str]:
        """Return ``(kind, identity)`` of a request (see the module docstring)."""
        authorization = ""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        client = scope.get("client")
        address = ("address", str(client[0]) if client else "unknown")
        if scheme.lower() != "bearer" or not token:
            return address
        digest = hashlib.sha256(token.encode()).hexdigest()
        if hmac.compare_digest(token.encode(), self.admin_token):
            return "operator", digest
        kind = self.known.get(digest)
        if kind is None:
            if any(not self.limiter.test(item, *address) for item in self.limits["address"]):
                return address  # already over: refused below, no database query
            kind = await anyio.to_thread.run_sync(self._lookup, scope, digest)
            if kind is None:
                return address
            self._remember(digest, kind)
        else:
            self.known.move_to_end(digest)
        if (
            kind == "device"
            and scope.get("method") == "POST"
            and HEARTBEAT_PATH.fullmatch(scope.get("path", ""))
        ):
            return "heartbeat", digest
        return kind, digest

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Count an ``/api/v1`` request against its identity's limits; 429 once over."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(API_PREFIX + "/"):
            kind, identity = await self.identify(scope)
            for item in self.limits[kind]:
                if not self.limiter.hit(item, kind, identity):
                    stats = self.limiter.get_window_stats(item, kind, identity)
                    wait = max(1, math.ceil(stats.reset_time - time.time()))
                    detail = (
                        f"rate limit of {item} for {_WHO[kind]} exceeded; retry after"
                        f" {wait} s (the Retry-After header)"
                    )
                    await send_problem(send, 429, detail, path, [("Retry-After", str(wait))])
                    return
        await self.app(scope, receive, send)
