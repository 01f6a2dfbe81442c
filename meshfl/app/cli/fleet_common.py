"""What every ``meshfl fleet`` command shares: options, the client, output helpers.

A command takes the coordinator's options as one :class:`Api` value: decorated with
:func:`with_api` (``--coordinator``, ``--token``, ``--json``) or :func:`with_api_no_json`
(a command that prints no API document).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshfl.app.cli.option_group import option_group
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from meshfl.app.local.fleet_client import FleetClient

__all__ = [
    "DEFAULT_COORDINATOR",
    "Api",
    "CoordinatorUrl",
    "JsonFlag",
    "Token",
    "ago",
    "client",
    "connection",
    "console",
    "parse_ttl",
    "print_json",
    "show_time",
    "with_api",
    "with_api_no_json",
]

DEFAULT_COORDINATOR = "http://127.0.0.1:8080"

CoordinatorUrl = Annotated[
    str,
    typer.Option(
        "--coordinator",
        envvar=["MESHFL_COORDINATOR_URL", "MESHFL_COORDINATOR"],
        help="Coordinator URL.",
    ),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=["MESHFL_API_TOKEN", "MESHFL_ADMIN_TOKEN"],
        help="API token (admin, operator or read-only role) or the coordinator's admin token.",
        show_default=False,
    ),
]
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON (for scripts) instead of a table.")
]


def connection(
    coordinator_ca: Annotated[
        Path | None,
        typer.Option(
            envvar="MESHFL_COORDINATOR_CA",
            help="CA (PEM) that signed the coordinator's HTTPS certificate.",
            show_default=False,
        ),
    ] = None,
    insecure_http: Annotated[
        bool,
        typer.Option(
            "--insecure-http",
            envvar="MESHFL_INSECURE_HTTP",
            help="Allow a plain http:// coordinator URL that is not on this machine.",
        ),
    ] = False,
) -> None:
    """How to reach the coordinator: given before the sub-command (or by environment).

    Recorded in ``MESHFL_COORDINATOR_CA``/``MESHFL_INSECURE_HTTP`` for every client the
    sub-command opens (:class:`meshfl.app.local.admin.AdminClient` reads them).
    """
    if coordinator_ca is not None:
        os.environ["MESHFL_COORDINATOR_CA"] = str(coordinator_ca)
    if insecure_http:
        os.environ["MESHFL_INSECURE_HTTP"] = "1"


def client(url: str, token: str | None) -> FleetClient:
    """A :class:`FleetClient` for ``url`` (use it in a ``with`` block); refuses no token.

    Raises
    ------
    ConfigError
        No token was given (neither ``--token`` nor its environment variables).

    """
    from meshfl.app.local.fleet_client import FleetClient

    if not token:
        raise ConfigError(
            "no API token: pass --token or set MESHFL_API_TOKEN (create one with"
            " `meshfl fleet tokens api create`, or use the coordinator's admin token)"
        )
    return FleetClient(url, token)


@dataclass(frozen=True)
class Api:
    """The coordinator a command talks to (``--coordinator``, ``--token``) and ``--json``."""

    url: str
    token: str | None
    as_json: bool = False

    def client(self) -> FleetClient:
        """A :class:`FleetClient` of the coordinator (use it in a ``with`` block).

        Raises
        ------
        ConfigError
            No token was given (neither ``--token`` nor its environment variables).

        """
        return client(self.url, self.token)

    def printed_json(self, data: Any) -> bool:
        """Print ``data`` (the API's JSON) if ``--json`` was given; whether it was."""
        if self.as_json:
            print_json(data)
        return self.as_json


def _api(
    coordinator: CoordinatorUrl = DEFAULT_COORDINATOR,
    token: Token = None,
    as_json: JsonFlag = False,
) -> Api:
    return Api(coordinator, token, as_json)


def _api_no_json(coordinator: CoordinatorUrl = DEFAULT_COORDINATOR, token: Token = None) -> Api:
    return Api(coordinator, token)


with_api = option_group(_api, into="api")
"""Give a command ``--coordinator``, ``--token`` and ``--json`` as its ``api: Api``."""

with_api_no_json = option_group(_api_no_json, into="api")
"""Give a command ``--coordinator`` and ``--token`` as its ``api: Api``."""


def console() -> Console:
    """A rich console on the current stdout (made per call, so redirection is honoured)."""
    from rich.console import Console

    return Console(highlight=False, markup=False, emoji=False, soft_wrap=False)


def print_json(data: Any) -> None:
    """Print ``data`` (the API's JSON) to stdout, and nothing else."""
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def ago(at: float | None, now: float | None = None) -> str:
    """``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``; ``never`` for ``None``/0.

    ``at`` and ``now`` are unix seconds (``now`` defaults to :func:`time.time`).
    """
    if not at:
        return "never"
    seconds = max(0.0, (time.time() if now is None else now) - at)
    return _span(seconds) + " ago"


def show_time(at: float | None, now: float | None = None) -> str:
    """A time relative to now: ``in 59 min``, ``3 h ago``; ``never`` for ``None``."""
    if at is None:
        return "never"
    current = time.time() if now is None else now
    return f"in {_span(at - current)}" if at > current else ago(at, current)


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


_TTL = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str, option: str = "--ttl") -> float:
    """Seconds of a duration: ``90``, ``90s``, ``30m``, ``1h``, ``7d``.

    Raises
    ------
    ConfigError
        Anything else, naming the option and the accepted forms.

    """
    match = _TTL.fullmatch(text.strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"{option} {text!r}: give a positive duration like 90s, 30m, 1h or 7d")
    return float(match.group(1)) * _UNIT_S[match.group(2)]
