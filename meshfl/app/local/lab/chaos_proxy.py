"""A fault-injecting MQTT proxy between one agent and the broker (``meshfl local --chaos``).

The agent connects to the proxy on 127.0.0.1; the proxy relays its connections to the
broker (:class:`meshfl.app.local.lab.relay.TcpRelay`) packet by packet
(:mod:`meshfl.app.local.lab.mqtt_frames`), and injects faults into the **data plane in the
broker → agent direction**: each PUBLISH on a delta or inbox topic — one delivery of
one chunk to one receiver — is, with the given probabilities and in this order,

- **dropped**: never delivered. A dropped QoS 1 PUBLISH is acknowledged to the broker by
  a forged PUBACK, as a broker that loses a queued message would: in a live connection
  the broker never sends it again (MQTT 5 §4.4 re-sends unacknowledged messages only on
  reconnect), and an unacknowledged one would hold one of its in-flight slots for good.
  This is a real loss the receiving engine must detect (a sequence gap or an incomplete
  message → keyframe) or report;
- **corrupted**: one byte of the application payload (never the MQTT framing) XORed
  with a random non-zero byte, so the chunk's CRC-32 must catch it;
- **duplicated**: delivered twice (the agent's second PUBACK is not passed on);
- **reordered**: held back and delivered after the next data PUBLISH (or after
  :data:`REORDER_HOLD_S` when no other comes);
- **delayed**: every data PUBLISH is delivered ``delay_s`` late, in order; acks, pings
  and statuses overtake it.

Control, status and probe topics, QoS 2 packets and the agent → broker direction are
relayed untouched. A **partition** (:meth:`ChaosProxy.partition`) stops relaying both
ways for a while: bytes wait in the sockets as they would behind a dead link (TCP
retransmits), a new connection is closed at once (the agent sees its connect fail and
retries later), and a side that hangs up is not told to the other until it heals.
Shorter than the MQTT keepalive, Mosquitto loses nothing (amqtt may: it gives up on
a QoS 1 delivery unacknowledged for 5 s). Longer than 1.5× the keepalive,
Mosquitto drops the agent and publishes its Last Will, and the agent reconnects once
it heals (the embedded amqtt never drops a silent client; paho gives up after 1–2×
the keepalive without an answer). Decisions come from a seeded
:class:`random.Random`, drawn per data PUBLISH in arrival order, so the same traffic
gets the same faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from meshfl.app.local.lab.mqtt_frames import (
    PacketSplitter,
    PacketType,
    connect_level,
    packet_id,
    packet_type,
    parse_publish,
    puback,
)
from meshfl.app.local.lab.relay import TcpRelay
from meshfl.errors import ConfigError, WireError
from meshfl.wire import parse_topic

__all__ = ["MAX_DELAY_S", "REORDER_HOLD_S", "ChaosProxy", "FaultCounts", "Faults"]

REORDER_HOLD_S = 0.5
"""Longest a reordered PUBLISH is held when no other data PUBLISH follows it (seconds)."""
MAX_DELAY_S = 2.0
"""Largest ``delay_s`` (seconds): the embedded broker (amqtt) gives up on a QoS 1
delivery whose PUBACK takes 5 s."""

_READ_BYTES = 65536
_DATA_KINDS = ("delta", "inbox")


@dataclass(frozen=True)
class Faults:
    """Fault probabilities per data PUBLISH, and the delay.

    Parameters
    ----------
    drop, duplicate, reorder, corrupt : float, default 0
        Probabilities in [0, 1] (see the module docstring).
    delay_s : float, default 0
        Added to every data PUBLISH, seconds, in [0, :data:`MAX_DELAY_S`].

    Raises
    ------
    ConfigError
        A probability outside [0, 1] or a delay outside its range.

    """

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder", "corrupt"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise ConfigError(f"chaos {name} must be a probability in [0, 1] (got {value})")
        if not (math.isfinite(self.delay_s) and 0 <= self.delay_s <= MAX_DELAY_S):
            raise ConfigError(
                f"chaos delay must be 0..{MAX_DELAY_S * 1000:.0f} ms"
                f" (got {self.delay_s * 1000:g} ms)"
            )


@dataclass
class FaultCounts:
    """What one proxy did (counts, except ``partitioned_s``).

    ``publishes`` counts the data PUBLISHes from the broker it decided on; ``corrupted``
    ones that are also duplicated reach the agent twice; ``acks_forged`` are PUBACKs sent
    to the broker for dropped QoS 1 PUBLISHes, ``acks_swallowed`` the agent's second
    PUBACKs of duplicated ones; ``connections`` the agent's connections relayed (a
    reconnect adds one), ``refused`` those closed at once during a partition;
    ``reconnects`` the partitions after which the agent had to open a new connection
    (the old one died: a keepalive expired); ``partitioned_s`` the partitions' total
    length, seconds.
    """

    publishes: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0
    corrupted: int = 0
    acks_forged: int = 0
    acks_swallowed: int = 0
    connections: int = 0
    refused: int = 0
    partitions: int = 0
    reconnects: int = 0
    partitioned_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


@dataclass
class _Link:
    """One relayed connection: its writers and what the proxy holds for it."""

    client_w: asyncio.StreamWriter
    target_w: asyncio.StreamWriter
    v5: bool = False
    swallow: Counter[int] = field(default_factory=Counter)
    held: list[bytes] | None = None
    held_timer: asyncio.TimerHandle | None = None
    delayed: asyncio.Queue[tuple[float, list[bytes]]] = field(default_factory=asyncio.Queue)

    def send(self, packets: list[bytes]) -> None:
        if not self.client_w.is_closing():
            for packet in packets:
                self.client_w.write(packet)


def _is_data(topic: str) -> bool:
    try:
        return parse_topic(topic).kind in _DATA_KINDS
    except WireError:
        return False


class ChaosProxy(TcpRelay):
    """Relay one agent's MQTT connections to the broker, injecting ``faults``.

    Parameters
    ----------
    target_host, target_port : str, int
        The broker (or a shaping proxy in front of it).
    faults : Faults
        What to inject (see the module docstring).
    seed : int or str
        Seed of the proxy's random decisions (``meshfl local`` uses ``"SEED:DEVICE"``).

    Attributes
    ----------
    counts : FaultCounts
        What it injected so far (updated on the proxy's thread).

    """

    name = "chaos-proxy"

    def __init__(self, target_host: str, target_port: int, faults: Faults, seed: int | str) -> None:
        super().__init__(target_host, target_port)
        self.faults = faults
        self.counts = FaultCounts()
        self._rng = random.Random(seed)
        self._gate = asyncio.Event()  # set: relaying; clear: partitioned
        self._gate.set()
        self._heal: asyncio.TimerHandle | None = None
        self._cut = False  # partitioned since the last connection was relayed

    def partition(self, seconds: float) -> None:
        """Stop relaying both ways for ``seconds`` from now (thread-safe)."""
        self.call_soon(self._partition, float(seconds))

    def _partition(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        heal_at = loop.time() + seconds
        if self._heal is not None and not self._gate.is_set():
            heal_at = max(heal_at, self._heal.when())  # overlapping: the later end
            self._heal.cancel()
        self._gate.clear()
        self._cut = True
        self.counts.partitions += 1
        self.counts.partitioned_s += seconds
        self._heal = loop.call_at(heal_at, self._gate.set)

    def _admit(self) -> bool:
        if self._gate.is_set():
            return True
        self.counts.refused += 1  # a partitioned device cannot reach the broker
        return False

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        target_r: asyncio.StreamReader,
        target_w: asyncio.StreamWriter,
    ) -> None:
        self.counts.connections += 1
        if self._cut:
            self.counts.reconnects += 1
            self._cut = False
        link = _Link(client_w, target_w)
        tasks = [
            asyncio.ensure_future(self._upstream(client_r, link)),
            asyncio.ensure_future(self._downstream(target_r, link)),
        ]
        delivery = asyncio.ensure_future(self._deliver(link))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            await self._gate.wait()  # a partitioned link tells neither side the other left
        finally:
            for task in (*tasks, delivery):
                task.cancel()
            await asyncio.gather(*tasks, delivery, return_exceptions=True)
            if link.held_timer is not None:
                link.held_timer.cancel()

    async def _packets(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """Yield whole MQTT packets until EOF, a socket error or a malformed stream."""
        splitter = PacketSplitter()
        while True:
            try:
                data = await reader.read(_READ_BYTES)
                packets = splitter.feed(data)
            except (OSError, WireError):
                return
            if not data:
                return
            for packet in packets:
                await self._gate.wait()
                yield packet

    async def _upstream(self, reader: asyncio.StreamReader, link: _Link) -> None:
        """Agent → broker: relayed as is, less the PUBACKs of duplicates."""
        async for packet in self._packets(reader):
            kind = packet_type(packet)
            with contextlib.suppress(WireError):
                if kind == PacketType.CONNECT:
                    link.v5 = connect_level(packet) == 5
                elif kind == PacketType.PUBACK and link.swallow[packet_id(packet)] > 0:
                    link.swallow[packet_id(packet)] -= 1
                    self.counts.acks_swallowed += 1
                    continue
            if link.target_w.is_closing():
                return
            link.target_w.write(packet)
            with contextlib.suppress(OSError):
                await link.target_w.drain()

    async def _downstream(self, reader: asyncio.StreamReader, link: _Link) -> None:
        """Broker → agent: data PUBLISHes get their faults, everything else goes through."""
        async for packet in self._packets(reader):
            if packet_type(packet) == PacketType.PUBLISH:
                self._on_publish(packet, link)
            else:
                link.send([packet])
            with contextlib.suppress(OSError):
                await link.client_w.drain()

    def _on_publish(self, packet: bytes, link: _Link) -> None:
        try:
            publish = parse_publish(packet, link.v5)
        except WireError:
            publish = None
        if publish is None or publish.qos == 2 or not _is_data(publish.topic):
            link.send([packet])
            return
        rng, faults, counts = self._rng, self.faults, self.counts
        counts.publishes += 1
        # The same number of draws per PUBLISH whatever happens: the stream stays aligned.
        drop, corrupt, duplicate, reorder, where = (rng.random() for _ in range(5))
        flip = rng.randrange(1, 256)
        if drop < faults.drop:
            counts.dropped += 1
            if publish.packet_id is not None and not link.target_w.is_closing():
                link.target_w.write(puback(publish.packet_id))
                counts.acks_forged += 1
            return
        body = len(packet) - publish.payload_start
        if corrupt < faults.corrupt and body > 0:
            at = publish.payload_start + int(where * body)
            packet = packet[:at] + bytes((packet[at] ^ flip,)) + packet[at + 1 :]
            counts.corrupted += 1
        copies = [packet]
        if duplicate < faults.duplicate:
            copies.append(packet)
            counts.duplicated += 1
            if publish.packet_id is not None:
                link.swallow[publish.packet_id] += 1
        if reorder < faults.reorder and link.held is None:
            counts.reordered += 1
            link.held = copies
            loop = asyncio.get_running_loop()
            link.held_timer = loop.call_later(REORDER_HOLD_S, self._release, link, True)
            return
        self._emit(link, copies)
        self._release(link)

    def _release(self, link: _Link, timer: bool = False) -> None:
        """Deliver the held PUBLISH (from its timer: once the partition, if any, heals)."""
        if timer and not self._gate.is_set():
            loop = asyncio.get_running_loop()
            link.held_timer = loop.call_later(REORDER_HOLD_S, self._release, link, True)
            return
        held, link.held = link.held, None
        if link.held_timer is not None:
            link.held_timer.cancel()
            link.held_timer = None
        if held is not None:
            self._emit(link, held)

    def _emit(self, link: _Link, packets: list[bytes]) -> None:
        if self.faults.delay_s <= 0:
            link.send(packets)
            return
        self.counts.delayed += 1
        due = asyncio.get_running_loop().time() + self.faults.delay_s
        link.delayed.put_nowait((due, packets))

    async def _deliver(self, link: _Link) -> None:
        """Deliver the delayed PUBLISHes in order, each when due."""
        loop = asyncio.get_running_loop()
        while True:
            due, packets = await link.delayed.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._gate.wait()
            link.send(packets)
