"""Device presence from the MQTT status topics: a killed agent shows offline at once.

Every agent keeps a retained status on ``meshfl/v1/{fleet}/node/{device}/status``
(JSON ``{"state": "online"|"offline"|"declined", "job": ..., "round": ...}``) and sets a
retained Last Will ``{"state": "offline"}`` there when it connects, which the broker
publishes when the agent's connection dies without a clean disconnect. The coordinator
subscribes to ``meshfl/v1/{fleet}/node/+/status`` (:func:`meshfl.wire.status_filter`)
through an injected :data:`Subscribe` — it never imports an MQTT client — and
:class:`Presence` keeps the latest status of each device, stamped with the time the
coordinator received it.

**The online rule.** A device is ``online`` when

- its latest status was received at or after its ``last_seen`` (heartbeat, assignment
  poll or round report): the status decides — ``offline`` (a Last Will or a clean
  shutdown) is offline, ``online``/``declined`` is online; ``online_source`` is
  ``"last_will"``;
- otherwise (no status, or heard from over REST since): it was heard from within
  ``live_within_s`` seconds (the heartbeat rule); ``online_source`` is ``"heartbeat"``.

So a killed agent turns offline as soon as the broker publishes its Will (at most about
1.5 × its MQTT keepalive when the network, not the process, died), and an agent that keeps
sending heartbeats stays online even if a network blip made the broker publish its Will.

A retained status delivered at subscribe time counts as received then: after a
coordinator restart the broker's retained statuses (the Wills of agents that died
meanwhile) apply at once. One limit: a broker that goes down publishes no Wills, and
one restarted from persistence still holds the ``online`` status of an agent that died
during the outage; that device shows online until its status changes (the agent comes
back and leaves cleanly, or is killed again) — check ``last_seen`` after a broker outage.

**Who can publish.** On an anonymous broker anyone who reaches it can publish (and so
spoof) any device's status; the secure broker's ACL lets only device ``u`` write
``.../node/u/status``. Memory stays bounded either way: only topics whose device id
passes the wire id rule (:func:`meshfl.wire.validate_id`, 1-64 characters) are kept, a
status is decoded by :func:`meshfl.wire.status.decode_status` (at most
:data:`~meshfl.wire.status.MAX_STATUS_BYTES`, its ``job`` a valid id, anything else
rejected and counted), and at most :data:`MAX_DEVICES` records are held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from meshfl.errors import WireError
from meshfl.wire import parse_topic
from meshfl.wire.status import decode_status

__all__ = [
    "MAX_DEVICES",
    "OnlineSource",
    "OnlineStatus",
    "Presence",
    "PresenceRecord",
    "Subscribe",
    "online_status",
]

log = logging.getLogger("coordinator.presence")

MAX_DEVICES = 200_000
"""Default cap of devices remembered; the least recently updated is dropped first."""

OnlineSource = Literal["last_will", "heartbeat"]
"""What decided ``online``: the status topic (Last Will / agent status) or heartbeats."""

Subscribe = Callable[[str, Callable[[str, bytes], None]], None]
"""``subscribe(topic_filter, on_message)``: deliver every message on ``topic_filter``
(MQTT wildcards, retained messages included) as ``on_message(topic, payload)``, from any
thread, until the process ends. It may raise :class:`meshfl.errors.MeshflError`."""


@dataclass(frozen=True, slots=True)
class PresenceRecord:
    """The latest status of one device.

    Attributes
    ----------
    online : bool
        False for ``offline`` (Last Will or clean shutdown), True otherwise.
    at : float
        When the coordinator received it (unix seconds, the app's clock).
    job : str or None
        The job the device was in; an ``offline`` status without one keeps the last.
    round : int or None
        The round it was at in ``job``; kept like ``job``.

    """

    online: bool
    at: float
    job: str | None
    round: int | None


class OnlineStatus(NamedTuple):
    """Whether a device is online and what decided it (see the module's rule)."""

    online: bool
    source: OnlineSource


def online_status(
    presence: Presence | None,
    device_id: str,
    last_seen: float,
    *,
    now: float,
    live_within_s: float,
) -> OnlineStatus:
    """Apply the online rule to one device; ``presence`` ``None``: the heartbeat rule only.

    Parameters
    ----------
    presence : Presence or None
        The statuses received so far.
    device_id : str
        The device.
    last_seen : float
        When it was last heard from over REST (unix seconds).
    now : float
        The current time (unix seconds).
    live_within_s : float
        Heartbeat window (seconds, ``CoordinatorSettings.live_within_s``).

    Returns
    -------
    OnlineStatus
        ``(online, source)``; ``source`` is ``"last_will"`` when the status decided.

    """
    record = None if presence is None else presence.get(device_id)
    if record is not None and record.at >= last_seen:
        return OnlineStatus(record.online, "last_will")
    return OnlineStatus(now - last_seen <= live_within_s, "heartbeat")


class Presence:
    """The latest status of each device of one fleet, fed by :meth:`on_status`.

    Thread-safe: MQTT delivers from its network thread, requests read from others.

    Parameters
    ----------
    fleet : str
        Statuses of other fleets are rejected.
    clock : callable, optional
        Current time in unix seconds (default :func:`time.time`): the app's clock.
    max_devices : int, optional
        Most devices remembered (default :data:`MAX_DEVICES`); past it the least
        recently updated record is dropped (that device falls back to heartbeats).

    Raises
    ------
    ValueError
        ``max_devices`` is below 1.

    """

    def __init__(
        self,
        fleet: str,
        *,
        clock: Callable[[], float] = time.time,
        max_devices: int = MAX_DEVICES,
    ) -> None:
        if max_devices < 1:
            raise ValueError(f"max_devices must be at least 1, got {max_devices}")
        self.fleet = fleet
        self._clock = clock
        self._max_devices = max_devices
        self._lock = threading.Lock()
        self._records: dict[str, PresenceRecord] = {}  # least recently updated first
        self._rejected = 0
        self._dropped = 0

    def on_status(self, topic: str, payload: bytes) -> None:
        """Take one message of the status filter; a bad one is counted and ignored.

        Never raises. An empty payload (a cleared retained status) forgets the device.
        """
        device_id = self._device_of(topic)
        if device_id is None:
            self._reject("not a status topic of fleet %r: %r", self.fleet, topic)
            return
        if not payload:
            with self._lock:
                self._records.pop(device_id, None)
            return
        parsed = _parse(payload)
        if parsed is None:
            self._reject("bad status payload on %s (%d bytes)", topic, len(payload))
            return
        online, job, rnd = parsed
        at = self._clock()
        with self._lock:
            previous = self._records.pop(device_id, None)
            if not online and job is None and previous is not None:
                job, rnd = previous.job, previous.round  # a Will carries neither
            self._records[device_id] = PresenceRecord(online, at, job, rnd)
            if len(self._records) > self._max_devices:
                self._records.pop(next(iter(self._records)))
                self._dropped += 1

    def get(self, device_id: str) -> PresenceRecord | None:
        """The latest status of ``device_id``, or ``None`` (none received, or dropped)."""
        with self._lock:
            return self._records.get(device_id)

    def round_of(self, device_id: str, job_id: str | None = None) -> int | None:
        """The round ``device_id`` last reported in its status, or ``None``.

        With ``job_id``: only a round of that job (``None`` for another job's round).
        """
        record = self.get(device_id)
        if record is None or (job_id is not None and record.job != job_id):
            return None
        return record.round

    def online(
        self, device_id: str, last_seen: float, *, now: float, live_within_s: float
    ) -> OnlineStatus:
        """Apply the online rule (module docstring); see :func:`online_status`."""
        return online_status(self, device_id, last_seen, now=now, live_within_s=live_within_s)

    @property
    def rejected(self) -> int:
        """Messages ignored: bad topic, fleet or device id, or not a status (long ``job`` too)."""
        return self._rejected

    @property
    def dropped(self) -> int:
        """Records dropped so far because ``max_devices`` was reached."""
        return self._dropped

    def __len__(self) -> int:
        """How many devices have a record."""
        with self._lock:
            return len(self._records)

    def _device_of(self, topic: str) -> str | None:
        try:
            info = parse_topic(topic)
        except WireError:
            return None
        if info.kind != "status" or info.fleet != self.fleet:
            return None
        return info.device

    def _reject(self, message: str, *args: Any) -> None:
        with self._lock:
            self._rejected += 1
        log.debug(message, *args)


def _parse(payload: bytes) -> tuple[bool, str | None, int | None] | None:
    """``(online, job, round)`` of a status payload, or ``None`` when it is not one."""
    try:
        status = decode_status(payload)
    except WireError:
        return None
    if status is None:
        return None
    return status.state != "offline", status.job, status.round
