"""Loopback port helpers: the project's one place that probes TCP ports.

Shared by the embedded broker, Mosquitto, ``meshfl local``'s supervisor and the tests.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

__all__ = ["free_port", "port_accepts", "port_in_use", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now.

    The kernel picks the port (bind to port 0); another process could take it before the
    caller binds it, which is acceptable on a test machine.

    Returns
    -------
    int
        A port number in the ephemeral range.

    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_accepts(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Return True when a TCP connection to ``host:port`` succeeds within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_in_use(host: str, port: int) -> bool:
    """Return True when ``host:port`` cannot be bound (someone already listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def wait_for_port(
    host: str, port: int, timeout_s: float, stop: Callable[[], bool] | None = None
) -> bool:
    """Poll ``host:port`` every 20 ms until it accepts a connection or ``timeout_s`` seconds pass.

    ``stop``, when given, is asked before each attempt; True gives up at once (the process
    that was to listen has exited, say).

    Returns
    -------
    bool
        True when the port accepted a connection in time.

    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop is not None and stop():
            return False
        if port_accepts(host, port):
            return True
        time.sleep(0.02)
    return False
