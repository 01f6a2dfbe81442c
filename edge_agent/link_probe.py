"""Measure this device's link to the broker *through* the broker.

The agent publishes on its own probe topic (``meshfl/v1/{fleet}/node/{device}/probe``,
see :func:`meshfl.wire.probe_topic`), which it is also subscribed to, so every message
goes device → broker → device. ACL-wise the device writes and reads only a topic that
carries its own id.

Two measurements, both bounded by ``timeout_s`` in total:

- **RTT**: ``rounds`` small QoS 1 messages, one at a time; each round trip is the time
  from :meth:`Transport.publish` to the message's delivery back to us. The median is
  reported as ``broker_rtt_s`` (publish → broker → own delivery: one up and one down leg).
- **Throughput**: a burst of ``rounds`` messages of ``payload_bytes`` each, published
  back to back; timed from the first publish to the last delivery, minus the median RTT
  (the propagation part, floored so noise cannot inflate the figure more than twice).
  Every byte crosses the uplink and then the downlink of the same connection, pipelined,
  so the loop runs at the speed of the slower direction: what is measured is
  **min(uplink, downlink)**. The two directions are not separable on one loop, so
  ``uplink_bytes_per_s`` and ``downlink_bytes_per_s`` are reported *equal* (both that
  minimum). A device on an asymmetric link (a fast download, a slow upload) is therefore
  reported at its slower direction for both, which is the right figure for gossip
  (every device uploads and downloads about the same bytes per round).

Nothing here raises for a slow or broken link: a figure that could not be measured
within the time budget is None (a warning is logged), the rest is kept.

The probe borrows the transport's handler for the measurement: it installs a small
dispatcher that takes its own probe messages and forwards every other message to the
handler that was there before (the gossip engine's, when refreshing between rounds), then
puts that handler back. Neighbours' messages that arrive meanwhile are therefore
delivered to the engine as usual, not consumed.
"""

from __future__ import annotations

import logging
import secrets
import statistics
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.transport.base import Handler, Transport
from meshfl.contract import CapabilityProfile
from meshfl.errors import MeshflError
from meshfl.wire import probe_topic

__all__ = ["LinkProfile", "measure_link"]

log = logging.getLogger("meshfl.agent.link_probe")

_MAGIC = b"MFLP"
_HEADER = struct.Struct(">4s8scI")  # magic, token of this measurement, kind, sequence
_PING, _BURST = b"r", b"t"


@dataclass(frozen=True)
class LinkProfile:
    """What :func:`measure_link` measured; a None figure could not be measured in time.

    Attributes
    ----------
    broker_rtt_s : float or None
        Median round trip device → broker → device of a small QoS 1 message, seconds.
    uplink_bytes_per_s, downlink_bytes_per_s : float or None
        Loop throughput through the broker, bytes/s: min(uplink, downlink), reported
        for both directions (see the module docstring: one loop cannot separate them).
    rtt_samples : int
        How many pings came back.
    burst_delivered : int
        How many of the burst messages came back (throughput is computed from these
        when the burst was cut short by the timeout).

    """

    broker_rtt_s: float | None
    uplink_bytes_per_s: float | None
    downlink_bytes_per_s: float | None
    rtt_samples: int = 0
    burst_delivered: int = 0

    def profile_fields(self) -> CapabilityProfile:
        """The measured figures as capability-profile fields; unmeasured ones are left out."""
        fields: CapabilityProfile = {}
        if self.broker_rtt_s is not None:
            fields["broker_rtt_s"] = self.broker_rtt_s
        if self.uplink_bytes_per_s is not None:
            fields["uplink_bytes_per_s"] = self.uplink_bytes_per_s
        if self.downlink_bytes_per_s is not None:
            fields["downlink_bytes_per_s"] = self.downlink_bytes_per_s
        return fields


class _Loop:
    """The handler installed while probing: records own probe messages, forwards the rest."""

    def __init__(
        self, topic: str, token: bytes, previous: Handler | None, clock: Callable[[], float]
    ) -> None:
        self.topic = topic
        self.token = token
        self.previous = previous
        self.clock = clock
        self.arrivals: dict[tuple[bytes, int], float] = {}
        self.cond = threading.Condition()

    def __call__(self, topic: str, payload: bytes) -> None:
        if topic != self.topic:
            if self.previous is not None:
                self.previous(topic, payload)
            return
        now = self.clock()
        if len(payload) < _HEADER.size:
            return
        magic, token, kind, seq = _HEADER.unpack_from(payload)
        if magic != _MAGIC or token != self.token:
            return  # a late message of an earlier measurement
        with self.cond:
            self.arrivals.setdefault((kind, seq), now)
            self.cond.notify_all()

    def wait(self, keys: list[tuple[bytes, int]], deadline: float) -> bool:
        """Wait until every key arrived or ``deadline`` (on ``clock``) passed."""
        with self.cond:
            while not all(k in self.arrivals for k in keys):
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.05))
            return True


def measure_link(
    transport: Transport,
    fleet: str,
    device_id: str,
    *,
    payload_bytes: int = 64 * 1024,
    rounds: int = 5,
    timeout_s: float = 5.0,
) -> LinkProfile:
    """Measure RTT and throughput to the broker through the broker (see the module docstring).

    Parameters
    ----------
    transport : Transport
        A connected transport; its current handler keeps receiving every non-probe
        message during the measurement and is restored afterwards.
    fleet, device_id : str
        Name the probe topic, ``meshfl/v1/{fleet}/node/{device_id}/probe``.
    payload_bytes : int, default 64 KiB
        Size of each burst message (at least the 17-byte probe header; at most the
        broker's payload limit on the probe topic, ``Transport.payload_limit``).
    rounds : int, default 5
        Number of pings, and number of burst messages.
    timeout_s : float, default 5.0
        Time budget for pings and burst together, seconds. (Subscribing to the probe
        topic, which an MQTT transport acknowledges first, is bounded by the transport's
        own timeout.)

    Returns
    -------
    LinkProfile
        Figures not measured within the budget are None; this never raises for a slow
        or broken link (a transport error is logged and yields None figures).

    Raises
    ------
    ConfigError
        ``fleet`` or ``device_id`` is not a valid id.

    """
    topic = probe_topic(fleet, device_id)
    rounds = max(1, int(rounds))
    # A broker that announced a smaller Maximum Packet Size would refuse the burst: the
    # probe stays under it (the figure is still bytes per second, from smaller messages).
    limit = transport.payload_limit(topic)
    payload_bytes = int(payload_bytes) if limit is None else min(int(payload_bytes), limit)
    payload_bytes = max(_HEADER.size, payload_bytes)
    clock = time.perf_counter
    deadline = clock() + timeout_s
    token = secrets.token_bytes(8)
    previous = transport.handler
    loop = _Loop(topic, token, previous, clock)
    rtts: list[float] = []
    burst: list[float] = []
    burst_start = 0.0
    transport.set_handler(loop)
    try:
        transport.subscribe(topic, qos=1)
        for seq in range(rounds):
            sent = clock()
            transport.publish(topic, _HEADER.pack(_MAGIC, token, _PING, seq), qos=1)
            if not loop.wait([(_PING, seq)], deadline):
                break
            rtts.append(loop.arrivals[(_PING, seq)] - sent)
        if rtts:  # nothing came back: the loop is broken, do not flood it
            padding = bytes(payload_bytes - _HEADER.size)
            burst_start = clock()
            for seq in range(rounds):
                header = _HEADER.pack(_MAGIC, token, _BURST, seq)
                transport.publish(topic, header + padding, qos=1)
            loop.wait([(_BURST, seq) for seq in range(rounds)], deadline)
    except MeshflError as exc:
        log.warning("link probe on %s failed: %s", topic, exc)
    finally:
        if transport.handler is loop:
            transport.set_handler(previous)
        with loop.cond:
            burst = [t for (kind, _), t in loop.arrivals.items() if kind == _BURST]
    rtt = statistics.median(rtts) if rtts else None
    throughput = None
    if burst:
        elapsed = max(burst) - burst_start
        transfer = max(elapsed - (rtt or 0.0), elapsed / 2)
        if transfer > 0:
            throughput = len(burst) * payload_bytes / transfer
    if rtt is None or throughput is None or len(burst) < rounds:
        log.warning(
            "link probe on %s incomplete within %g s: %d/%d pings, %d/%d burst messages back",
            topic,
            timeout_s,
            len(rtts),
            rounds,
            len(burst),
            rounds,
        )
    return LinkProfile(
        broker_rtt_s=rtt,
        uplink_bytes_per_s=throughput,
        downlink_bytes_per_s=throughput,
        rtt_samples=len(rtts),
        burst_delivered=len(burst),
    )
