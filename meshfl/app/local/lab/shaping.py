"""A TCP shaping proxy: a slow, far-away link between one agent and the broker.

Test and benchmark tooling for ``meshfl local --link DEVICE:SPEC`` (this kernel has no
``netem`` and the launcher has no root for network namespaces and ``tc tbf``). The agent
connects to the proxy on 127.0.0.1; the proxy connects to the broker and relays bytes in
both directions. Each direction is a *link*: a token bucket at ``rate_bytes_per_s``
(depth :data:`BUCKET_BYTES`, about one segment: a burst never exceeds it) followed by a
fixed one-way delay of ``latency_s / 2``, so a message of b bytes arrives
≈ b / rate + latency / 2 seconds after it was sent, in order. Closing either side closes
the other (:class:`meshfl.app.local.lab.relay.TcpRelay` runs the connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from dataclasses import dataclass

from meshfl.app.local.lab.relay import TcpRelay
from meshfl.errors import ConfigError

__all__ = ["BUCKET_BYTES", "LinkSpec", "ShapingProxy", "parse_link"]

BUCKET_BYTES = 4096
"""Token bucket depth (bytes): the largest burst sent at once, about one TCP segment."""

_READ_BYTES = 65536
_RATE_UNITS = {"kbit": 125.0, "mbit": 125e3, "gbit": 125e6, "kbyte": 1e3, "mbyte": 1e6}
_LATENCY_UNITS = {"ms": 1e-3, "s": 1.0}
_LINK = re.compile(r"(?P<rate>[0-9.]+)(?P<ru>[a-z]+)(?::(?P<lat>[0-9.]+)(?P<lu>[a-z]+))?")


@dataclass(frozen=True)
class LinkSpec:
    """A link: its rate and its round-trip latency.

    Parameters
    ----------
    rate_bytes_per_s : float
        Throughput of each direction, bytes per second (> 0, finite).
    latency_s : float
        Round-trip time added by the link, seconds (≥ 0, finite); each direction delays
        every byte by ``latency_s / 2``.

    Raises
    ------
    ConfigError
        A rate that is not positive or a latency that is negative, or either not finite.

    """

    rate_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_bytes_per_s) and self.rate_bytes_per_s > 0):
            raise ConfigError(f"link rate must be a positive number (got {self.rate_bytes_per_s})")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link latency must be >= 0 seconds (got {self.latency_s})")


def parse_link(text: str) -> LinkSpec:
    """Parse ``RATE[:LATENCY]``, e.g. ``"1mbit:200ms"``, ``"256kbit:1.5s"``, ``"2mbyte"``.

    RATE units: ``kbit``, ``mbit``, ``gbit`` (10³, 10⁶, 10⁹ bits per second) and
    ``kbyte``, ``mbyte`` (10³, 10⁶ bytes per second); LATENCY (the round trip, default 0)
    units: ``ms``, ``s``. Case-insensitive.

    Raises
    ------
    ConfigError
        Anything else; the message shows the expected form.

    """
    match = _LINK.fullmatch(text.strip().lower())
    usage = f"bad link {text!r}; use RATE[:LATENCY], e.g. 1mbit:200ms (rate in kbit, mbit,"
    usage += " gbit, kbyte or mbyte per second; latency in ms or s)"
    if match is None or match["ru"] not in _RATE_UNITS:
        raise ConfigError(usage)
    if match["lat"] is not None and match["lu"] not in _LATENCY_UNITS:
        raise ConfigError(usage)
    try:
        rate = float(match["rate"]) * _RATE_UNITS[match["ru"]]
        latency = 0.0 if match["lat"] is None else float(match["lat"]) * _LATENCY_UNITS[match["lu"]]
    except ValueError:
        raise ConfigError(usage) from None
    if rate <= 0:
        raise ConfigError(f"bad link {text!r}: the rate must be positive")
    return LinkSpec(rate, latency)


class _TokenBucket:
    """Tokens (bytes) refill at ``rate`` per second up to ``depth``."""

    def __init__(self, rate: float, depth: int) -> None:
        self.rate, self.depth = rate, depth
        self.tokens = float(depth)
        self.stamp = asyncio.get_running_loop().time()

    async def take(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self.tokens = min(self.depth, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await asyncio.sleep((n - self.tokens) / self.rate)


class ShapingProxy(TcpRelay):
    """Relay TCP connections from 127.0.0.1 to ``target_host:target_port`` over ``link``.

    Parameters
    ----------
    target_host, target_port : str, int
        Where every accepted connection is relayed (the broker).
    link : LinkSpec
        Rate and latency of each direction.

    Attributes
    ----------
    port : int or None
        The listening port on 127.0.0.1 once started.
    bytes_up, bytes_down : int
        Bytes delivered so far towards the target and back towards the clients.

    Examples
    --------
    >>> proxy = ShapingProxy("127.0.0.1", 1883, parse_link("1mbit:200ms"))  # doctest: +SKIP
    >>> port = proxy.start()  # agents use mqtt://127.0.0.1:{port}  # doctest: +SKIP
    >>> proxy.stop()  # doctest: +SKIP

    """

    name = "shaping-proxy"

    def __init__(self, target_host: str, target_port: int, link: LinkSpec) -> None:
        super().__init__(target_host, target_port)
        self.link = link
        self.bytes_up = 0
        self.bytes_down = 0

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        target_r: asyncio.StreamReader,
        target_w: asyncio.StreamWriter,
    ) -> None:
        up = asyncio.ensure_future(self._direction(client_r, target_w, up=True))
        down = asyncio.ensure_future(self._direction(target_r, client_w, up=False))
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:  # one side closed (or we are cancelled): close the other too
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _direction(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool
    ) -> None:
        """Relay one direction until EOF: token bucket, then the one-way delay, in order."""
        loop = asyncio.get_running_loop()
        bucket = _TokenBucket(self.link.rate_bytes_per_s, BUCKET_BYTES)
        delay = self.link.latency_s / 2
        # Room for what the link holds in flight (rate × delay) and a little more; a full
        # queue (a slow reader at the far end) stops reading here: TCP backpressure.
        in_flight = math.ceil(self.link.rate_bytes_per_s * delay / BUCKET_BYTES)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(16 + min(in_flight, 1 << 16))

        async def deliver() -> None:
            while True:
                due, piece = await queue.get()
                if not piece:
                    return
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if up:  # counted before the far side can see them
                    self.bytes_up += len(piece)
                else:
                    self.bytes_down += len(piece)
                writer.write(piece)
                await writer.drain()

        delivery = asyncio.ensure_future(deliver())
        try:
            while not delivery.done():  # done early: the far side is gone
                try:
                    data = await reader.read(_READ_BYTES)
                except OSError:
                    data = b""
                for start in range(0, len(data), BUCKET_BYTES):
                    piece = data[start : start + BUCKET_BYTES]
                    await bucket.take(len(piece))
                    await queue.put((loop.time() + delay, piece))
                if not data:  # EOF: what is in flight still arrives, then the link closes
                    await queue.put((loop.time() + delay, b""))
                    await delivery
                    return
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            delivery.cancel()
            with contextlib.suppress(BaseException):
                await delivery
