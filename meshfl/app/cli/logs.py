"""Logging of the long-running commands: one text line per record, or one JSON object.

``--log-format text`` (default) keeps the plain ``TIME [PREFIX] LEVEL message`` lines;
``--log-format json`` writes one JSON object per line (python-json-logger) with the
fields ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, ``device``
and ``job`` (``null`` when the line concerns none; :mod:`meshfl.logcontext`), plus
``exc_info`` for a traceback and any ``extra`` a line passes. Both go to stderr.
"""

from __future__ import annotations

import logging
import sys
from enum import Enum
from logging import Handler
from typing import IO, Annotated

import typer

from meshfl.errors import ConfigError
from meshfl.logcontext import ContextFilter

__all__ = [
    "LOG_FORMATS",
    "LogFormat",
    "LogFormatOption",
    "configure_logging",
    "json_formatter",
    "log_handler",
]

LOG_FORMATS = ("text", "json")


class LogFormat(str, Enum):
    """The choices of ``--log-format`` (pass ``.value`` on)."""

    TEXT = "text"
    JSON = "json"


LogFormatOption = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        case_sensitive=False,
        help="Log lines as plain text or as JSON objects with device and job fields.",
    ),
]


def json_formatter() -> logging.Formatter:
    """The JSON formatter of ``--log-format json`` (needs python-json-logger).

    Raises
    ------
    meshfl.errors.ConfigError
        python-json-logger is not installed.

    """
    try:
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        raise ConfigError(
            "--log-format json needs python-json-logger: pip install 'meshfl[agent]' (or"
            " 'meshfl[coordinator]')"
        ) from None
    return JsonFormatter(
        "{levelname}{name}{message}{device}{job}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
    )


def log_handler(
    log_format: str = "text", prefix: str = "", stream: IO[str] | None = None
) -> Handler:
    """A handler writing ``log_format`` lines to ``stream`` (default stderr), with context.

    ``prefix`` (text only) names the process, e.g. the device name. The handler carries a
    :class:`~meshfl.logcontext.ContextFilter`: records get ``device`` and ``job``.

    Raises
    ------
    meshfl.errors.ConfigError
        ``log_format`` is neither ``text`` nor ``json``, or JSON without its package.

    """
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be text or json (got {log_format!r})")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(ContextFilter())
    if log_format == "json":
        handler.setFormatter(json_formatter())
    else:
        tag = f"[{prefix}] " if prefix else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(levelname)s %(message)s"))
    return handler


def configure_logging(verbose: bool = False, prefix: str = "", log_format: str = "text") -> None:
    """Log to stderr at INFO (DEBUG with ``verbose``) in ``log_format``; httpx at WARNING.

    As :func:`logging.basicConfig`: nothing changes when the root logger already has a
    handler (an embedding application's, or pytest's).

    Raises
    ------
    meshfl.errors.ConfigError
        As :func:`log_handler`.

    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        handlers=[log_handler(log_format, prefix)],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
