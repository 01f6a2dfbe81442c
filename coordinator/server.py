"""Run the coordinator under uvicorn: ``serve(settings)``."""

from __future__ import annotations

import ctypes
import os
import secrets
import ssl
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from coordinator.brokerauth import BrokerAccounts
from coordinator.control import Publish
from coordinator.presence import Subscribe
from coordinator.settings import CoordinatorSettings
from meshfl.coordinator_url import is_loopback
from meshfl.errors import ConfigError

__all__ = [
    "MALLOC_ARENAS",
    "TlsFiles",
    "check_tls",
    "ensure_tokens",
    "http_stack",
    "limit_malloc_arenas",
    "serve",
    "tls_arguments",
]

MALLOC_ARENAS = 2
"""glibc malloc arenas the coordinator allows (``mallopt(M_ARENA_MAX)``); see below."""

_M_ARENA_MAX = -8  # glibc's <malloc.h>


def ensure_tokens(settings: CoordinatorSettings) -> tuple[CoordinatorSettings, list[str]]:
    """Fill a missing admin token with :func:`secrets.token_urlsafe`.

    Returns the completed settings and the names of the tokens generated (so the caller
    can show them once). The fleet enrol token is never generated: it is off unless the
    operator asks for it (``--enrol-token``; :mod:`coordinator.enrolment`).
    """
    update = {
        name: secrets.token_urlsafe(24) for name in ("admin_token",) if not getattr(settings, name)
    }
    return settings.model_copy(update=update), sorted(update)


def serve(
    settings: CoordinatorSettings,
    host: str = "127.0.0.1",
    port: int = 8080,
    publish: Publish | None = None,
    broker_accounts: BrokerAccounts | None = None,
    subscribe: Subscribe | None = None,
    uvicorn_logging: bool = True,
    tls: TlsFiles | None = None,
) -> None:
    """Serve the coordinator until interrupted (uvicorn, log level ``warning``).

    Prints one block with the URL, the enrol token (or that it is off) and the admin
    token; a token given in ``settings`` (or its environment variable) is shown as such,
    a generated admin token is shown in full once — it is not stored anywhere, so note it.
    ``publish`` is the control-topic publisher handed to
    :func:`coordinator.app.create_app` (``None``: no push); ``broker_accounts`` the
    broker's login table it updates on enrol and revoke (``None``: none); ``subscribe``
    delivers the devices' status topics, so a Last Will turns a device offline at once
    (:mod:`coordinator.presence`; ``None``: heartbeats only). ``uvicorn_logging`` False
    leaves logging as the caller configured it (JSON lines, :mod:`meshfl.app.cli.logs`):
    uvicorn's loggers then propagate to the root's handler. ``tls`` serves HTTPS from that
    certificate and key (:func:`check_tls`); ``None``: plain HTTP, which clients accept
    only on loopback (:mod:`meshfl.coordinator_url`).
    """
    import uvicorn
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from coordinator.app import create_app

    limit_malloc_arenas()
    settings, generated = ensure_tokens(settings)
    try:
        app = create_app(settings, publish, broker_accounts=broker_accounts, subscribe=subscribe)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise ConfigError(
            f"cannot open the database {settings.db_url!r}: {reason}; check --db"
            " (e.g. sqlite:///fleet.db or postgresql://user@host/db)"
        ) from None

    def shown(name: str) -> str:
        if getattr(settings, name) is None:
            return (
                "off (devices enrol with `meshfl fleet tokens create` tokens; or pass"
                " --enrol-token, or rotate one in: `meshfl fleet tokens enrol rotate`)"
            )
        value = str(getattr(settings, name))
        env = f"MESHFL_COORDINATOR_{name.upper()}"
        return (
            f"{value}  (generated; set {env} to keep it)"
            if name in generated
            else f"(given by --{name.replace('_', '-')} or {env}; not printed)"
        )

    stack = http_stack()
    base = f"{'https' if tls else 'http'}://{host}:{port}"
    print(
        "meshfl coordinator\n"
        f"  URL:          {base}  (API docs: {base}/docs)\n"
        f"  dashboard:    {base}/ui  (log in with an API token)\n"
        f"  TLS:          {_tls_line(tls, host)}\n"
        f"  fleet:        {settings.fleet}\n"
        f"  enrol token:  {shown('enrol_token')}\n"
        f"  admin token:  {shown('admin_token')}\n"
        f"  database:     {make_url(settings.db_url).render_as_string(hide_password=True)}\n"
        f"  artifacts:    {settings.artifacts_path()}\n"
        f"  control push: {'MQTT ' + str(settings.broker_url) if publish else 'off (agents poll)'}"
        f"\n  device status: {'Last Will over MQTT' if subscribe else 'heartbeats only'}"
        f"\n  broker logins: {'one per device' if broker_accounts else 'not managed'}"
        f"\n  HTTP server:  uvicorn, {stack[0]} loop, {stack[1]} parser",
        flush=True,
    )
    # Keep idle connections 15 s (uvicorn's default is 5): a device polling or sending a
    # heartbeat every 10 s then reuses its connection (W5: 1.96 instead of 2.37 ms of
    # server CPU a heartbeat, BENCHMARKS.md).
    logging: dict[str, Any] = {} if uvicorn_logging else {"log_config": None}
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_keep_alive=15,
        loop=stack[0],
        http=stack[1],
        **logging,
        **tls_arguments(tls),
    )


def _tls_line(tls: TlsFiles | None, host: str) -> str:
    if tls is not None:
        return f"certificate {tls.cert}"
    if is_loopback(host):
        return "off (plain HTTP on this machine only)"
    return (
        "OFF: clients elsewhere refuse plain HTTP unless --insecure-http; use --tls-cert/--tls-key"
    )


@dataclass(frozen=True)
class TlsFiles:
    """The coordinator's HTTPS certificate chain and private key (PEM files)."""

    cert: Path
    key: Path


def check_tls(cert: Path | None, key: Path | None) -> TlsFiles | None:
    """Check ``--tls-cert``/``--tls-key`` before serving; ``None`` when neither is given.

    The pair is loaded into an :class:`ssl.SSLContext` once, so a missing file, a key
    that does not match the certificate or a file that is not PEM is a one-line error
    now rather than a uvicorn traceback later.

    Raises
    ------
    meshfl.errors.ConfigError
        Only one of the two given, or the pair cannot be loaded.

    """
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError(
            "--tls-cert and --tls-key go together (the certificate and its private key);"
            " make a development pair with `meshfl coordinator tls --out DIR`"
        )
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = (str(exc).splitlines() or ["unreadable"])[0]
        raise ConfigError(
            f"cannot use --tls-cert {str(cert)!r} with --tls-key {str(key)!r} ({reason});"
            " give a PEM certificate and its matching key"
        ) from None
    return TlsFiles(Path(cert), Path(key))


def tls_arguments(tls: TlsFiles | None) -> dict[str, Any]:
    """``uvicorn.run``'s keyword arguments for ``tls`` (TLS 1.2 or later)."""
    if tls is None:
        return {}
    return {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas``; True if the cap was set.

    glibc gives each thread that allocates its own arena, up to 8 per core, and an
    arena's freed memory stays with it. The coordinator answers requests on a pool of
    up to 40 threads, so arenas added about 11 MiB to its peak RSS on W1 (BENCHMARKS.md).
    Threads then share the 2 arenas' locks; a request holds the GIL for most of its
    allocations anyway. Not set (False) off Linux, where libc is not glibc, or where the
    operator chose with the ``MALLOC_ARENA_MAX`` environment variable.
    """
    if not sys.platform.startswith("linux") or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # musl (no libc.so.6) or a libc without mallopt
        return False


def http_stack() -> tuple[Literal["uvloop", "asyncio"], Literal["httptools", "h11"]]:
    """The event loop and HTTP parser for uvicorn: uvloop and httptools where importable.

    They are in the ``coordinator`` extra (uvloop has no Windows build); without them
    uvicorn falls back to asyncio's loop and the pure-Python h11 parser, which cost
    several times more CPU a request (W5, BENCHMARKS.md). Returns ``uvicorn.run``'s
    ``(loop, http)`` arguments.
    """
    return (
        "uvloop" if find_spec("uvloop") else "asyncio",
        "httptools" if find_spec("httptools") else "h11",
    )
