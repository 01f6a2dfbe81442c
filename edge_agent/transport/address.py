"""Broker URLs (``mqtt://`` and ``mqtts://``) and the TLS context of an ``mqtts://`` connection.

No paho here: :mod:`edge_agent.transport.mqtt` and its protocol probe both use these.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from meshfl.errors import ConfigError

__all__ = ["BrokerAddress", "parse_broker_address", "tls_context"]

_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True)
class BrokerAddress:
    """Where a broker listens: ``host``, ``port`` and whether the listener speaks ``tls``."""

    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_broker_address(url: str) -> BrokerAddress:
    """Parse ``mqtt://host[:port]``, ``mqtts://host[:port]`` or ``host:port``.

    The port defaults to 1883 for ``mqtt`` and 8883 for ``mqtts`` (MQTT over TLS).

    Raises
    ------
    ConfigError
        Anything else (another scheme, no host, a bad port, a path).

    """
    text = url.strip()
    try:
        parts = urlsplit(text if "://" in text else f"mqtt://{text}")
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        port = -1
        parts = urlsplit("")
    if (
        parts.scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or port <= 0
        or parts.path not in ("", "/")
    ):
        raise ConfigError(
            f"bad broker URL {url!r}; use mqtt://HOST:PORT, mqtts://HOST:PORT (TLS) or"
            " HOST:PORT (e.g. mqtt://127.0.0.1:1883)"
        )
    return BrokerAddress(parts.hostname, port, parts.scheme == "mqtts")


def tls_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """Return a client TLS context: TLS 1.2 or newer, the broker's name checked.

    Parameters
    ----------
    ca_file : str, Path or None
        PEM file of the CA that signed the broker's certificate (the one given at
        enrolment, or ``--broker-ca``); None trusts the system's CA store (a broker with
        a public certificate).

    Raises
    ------
    ConfigError
        ``ca_file`` is missing, unreadable or holds no PEM certificate.

    """
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"cannot load the broker CA {ca_file} ({reason}); pass the PEM certificate of the"
            " CA that signed the broker's certificate with --broker-ca"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
