"""How a client reaches the coordinator: HTTPS verified against a CA, plain HTTP only locally.

The control plane carries bearer tokens, broker passwords, the broker's CA, the peer
keys that verify signed deltas and job specs, so an on-path attacker who could read or
change it could swap any of them. Every client of the coordinator (the agent's REST
client, ``meshfl fleet``, ``meshfl job``, ``meshfl local``) asks :func:`http_verify`
what to do with a URL:

- ``https://``: the server certificate is verified, against ``ca_file`` (a PEM CA, e.g.
  the development CA of ``meshfl coordinator tls``) when one is given, else against the
  system's CA store; host names are checked.
- ``http://`` to a loopback host (``localhost``, 127.0.0.0/8, ``::1``): allowed, nothing
  leaves the machine.
- ``http://`` anywhere else: refused with a one-line error, unless ``insecure_http``
  (``--insecure-http``) says the operator accepts a plain-text control plane (a lab
  network, a TLS-terminating sidecar on the same host).

Standard library only (``ssl``, ``ipaddress``, ``urllib.parse``).
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from meshfl.errors import ConfigError

__all__ = ["certificate_problem", "http_verify", "is_loopback", "untrusted_message"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost`` or a loopback IP (v4 or v6)."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def http_verify(
    url: str, *, ca_file: Path | None = None, insecure_http: bool = False
) -> ssl.SSLContext | bool:
    """Check a coordinator URL against the transport policy; return httpx's ``verify``.

    Parameters
    ----------
    url : str
        The coordinator's base URL, ``https://HOST[:PORT]`` or ``http://HOST[:PORT]``.
    ca_file : Path or None, optional
        PEM file of the CA that signed the coordinator's certificate
        (``--coordinator-ca``). ``None`` (default): the system's CA store.
    insecure_http : bool, optional
        Allow ``http://`` to a host that is not loopback (``--insecure-http``). Default
        ``False``.

    Returns
    -------
    ssl.SSLContext or bool
        An SSL context trusting ``ca_file`` (``https://`` with a CA), else ``True``.

    Raises
    ------
    meshfl.errors.ConfigError
        No ``http(s)://`` scheme; ``http://`` to another host without ``insecure_http``;
        a CA file given for ``http://``; a CA file that cannot be read or is not PEM.

    """
    try:
        parts = urlsplit(url.strip())
        hostname = parts.hostname
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise ConfigError(f"coordinator URL {url!r} is not valid ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not hostname:
        raise ConfigError(
            f"coordinator URL {url!r} must be https://HOST:PORT (or http:// on this machine),"
            " e.g. --coordinator https://coordinator.lan:8443"
        )
    if scheme == "http":
        if ca_file is not None:
            raise ConfigError(
                f"--coordinator-ca is given but {url!r} is plain http://; use https://"
            )
        if not insecure_http and not is_loopback(hostname):
            raise ConfigError(
                f"coordinator URL {url!r} is plain HTTP to another host: tokens and keys would"
                " cross the network unencrypted; use https:// (meshfl coordinator serve"
                " --tls-cert/--tls-key) with --coordinator-ca, or pass --insecure-http"
            )
        return True
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"--coordinator-ca {str(ca_file)!r} cannot be used ({exc.__class__.__name__}:"
            f" {str(exc).splitlines()[0] if str(exc) else 'unreadable'}); give the CA's PEM file"
        ) from None


def certificate_problem(exc: BaseException) -> str | None:
    """The reason a TLS handshake refused the server's certificate, or None if it did not.

    httpx wraps :class:`ssl.SSLCertVerificationError` in a ``ConnectError``; the chain
    (``__cause__``/``__context__``) is walked to find it and its ``verify_message``.
    """
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for link in chain:
        if isinstance(link, ssl.SSLCertVerificationError):
            return str(link.verify_message or link.reason or "certificate verify failed")
    if any("CERTIFICATE_VERIFY_FAILED" in str(link) for link in chain):
        return "certificate verify failed"
    return None


def untrusted_message(url: str, reason: str) -> str:
    """The one-line error for a coordinator whose certificate the client refused."""
    return (
        f"the coordinator at {url} is not trusted ({reason}); give the CA that signed its"
        " certificate with --coordinator-ca (meshfl coordinator tls writes a development one)"
    )
