"""The acknowledgements an MQTT client waits for: PUBACKs of QoS 1 publishes, SUBACKs.

Both are written by paho's network thread and read by the caller's thread, so each is a
small lock-guarded ledger of packet ids (``mid``) used by
:class:`~edge_agent.transport.mqtt.MqttTransport`.
"""

from __future__ import annotations

import threading
from typing import Any

from edge_agent.transport.base import log
from edge_agent.transport.refusals import Reason, acl_error
from meshfl.errors import ConfigError

__all__ = ["Pubacks", "Subacks"]


class Pubacks:
    """QoS 1 publishes awaiting their PUBACK, and the ACL denial (0x87) one reported.

    A PUBACK may come before ``client.publish`` returns its ``mid`` (a fast broker): it is
    kept until :meth:`sent` names the publish.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unacked: dict[int, str] = {}  # mid -> topic
        self._early: dict[int, int] = {}  # mid -> PUBACK reason, before publish returned
        self._denied: ConfigError | None = None

    def sent(self, mid: int, topic: str, qos: int, client_id: str) -> None:
        """Record publish ``mid`` to ``topic`` (caller's thread, after paho returned it)."""
        with self._lock:
            early = self._early.pop(mid, None)
            if qos >= 1 and early is None:
                self._unacked[mid] = topic
            elif early == Reason.NOT_AUTHORIZED:
                self._deny(topic, client_id)

    def acked(self, mid: int, code: int, client_id: str) -> None:
        """Record the PUBACK of ``mid`` with reason ``code`` (network thread)."""
        with self._lock:
            topic = self._unacked.pop(mid, None)
            if topic is None:
                self._early[mid] = code
            elif code == Reason.NOT_AUTHORIZED:
                self._deny(topic, client_id)
        if code == Reason.NOT_AUTHORIZED:
            log.error("the broker denied a publish to %s (0x87 not authorized)", topic or "?")

    def _deny(self, topic: str, client_id: str) -> None:
        if self._denied is None:
            self._denied = acl_error("publishing to", topic, client_id)

    @property
    def settled(self) -> bool:
        """True when no QoS 1 publish awaits its PUBACK."""
        with self._lock:
            return not self._unacked

    def take_denial(self) -> ConfigError | None:
        """The first ACL denial since the last call (then forgotten), or None."""
        with self._lock:
            denied, self._denied = self._denied, None
        return denied


class Subacks:
    """The SUBACKs received, by ``mid``: the failed reason codes of each (empty: granted)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._received: dict[int, list[Any]] = {}

    def received(self, mid: int, reasons: Any) -> None:
        """Record the SUBACK of ``mid`` (network thread)."""
        failed = [r for r in reasons if getattr(r, "is_failure", False)]
        with self._cond:
            self._received[mid] = failed
            self._cond.notify_all()

    def wait(self, mids: list[int], timeout_s: float) -> dict[int, list[Any]]:
        """Wait up to ``timeout_s`` seconds for the SUBACKs of ``mids``; take those that came.

        Returns ``{mid: failed reason codes}`` for each ``mid`` acknowledged in time.
        """
        with self._cond:
            self._cond.wait_for(lambda: all(m in self._received for m in mids), timeout_s)
            return {m: self._received.pop(m) for m in mids if m in self._received}
