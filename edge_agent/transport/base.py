"""The transport interface: publish/subscribe of byte payloads on MQTT topics.

Every implementation (in-memory, paho-mqtt) behaves the same way, so the agent and its
tests can run on either::

    Transport
    ├── MemoryTransport   in-process MemoryBroker, for unit tests (protocol "memory")
    └── MqttTransport     paho-mqtt 2.x, MQTT 5 with a 3.1.1 fallback

Errors are meshfl errors only: :class:`meshfl.errors.BrokerUnreachable` when nothing
answers at the broker address, :class:`meshfl.errors.TransportError` when the broker
refuses us or an operation fails, :class:`meshfl.errors.ConfigError` for a bad URL.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Handler", "Message", "Transport"]

Handler = Callable[[str, bytes], None]
"""A message handler: ``handler(topic, payload)``; its exceptions are logged and counted."""

log = logging.getLogger("meshfl.transport")

_Callback = TypeVar("_Callback", bound=Callable[..., Any])


@dataclass(frozen=True)
class Message:
    """One MQTT application message.

    Attributes
    ----------
    topic : str
        Topic name (no wildcards).
    payload : bytes
        The body; an empty payload on a retained topic deletes the retained message.
    qos : int, default 1
        MQTT quality of service, 0, 1 or 2.
    retain : bool, default False
        Whether the broker keeps it as the topic's retained message. Ignored for a Last
        Will, which transports always publish retained (it is a liveness status).

    """

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False


class Transport(ABC):
    """Publish/subscribe to an MQTT broker (or its in-memory twin).

    Subscriptions are remembered and restored after a reconnect; the handler set with
    :meth:`set_handler` receives every delivered message. Byte counters count payload
    bytes only (no MQTT headers), so they are comparable across implementations.
    """

    def __init__(self) -> None:
        self._handler: Handler | None = None
        self._bytes_sent = 0
        self._bytes_received = 0
        self._callback_errors = 0

    @abstractmethod
    def connect(self, client_id: str, will: Message | None = None) -> None:
        """Connect as ``client_id`` and block until connected.

        Parameters
        ----------
        client_id : str
            MQTT client identifier; reconnecting with the same id resumes the session.
        will : Message or None
            Last Will, published retained by the broker if the connection dies without a
            clean :meth:`close`. None means no will.

        Raises
        ------
        BrokerUnreachable
            Nothing answered at the broker address within the connect timeout.
        TransportError
            The broker refused the connection (the message gives its reason).

        """

    @abstractmethod
    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Enqueue ``payload`` on ``topic`` without waiting for the broker (see :meth:`flush`)."""

    @abstractmethod
    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe to ``topic_filter`` (``+`` and ``#`` wildcards); kept across reconnects."""

    @abstractmethod
    def close(self) -> None:
        """Disconnect cleanly: the broker does not publish the Last Will."""

    @abstractmethod
    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until every QoS ≥ 1 publish is acknowledged.

        Returns
        -------
        bool
            True when nothing is left unacknowledged.

        """

    @property
    @abstractmethod
    def connected(self) -> bool:
        """True while the connection to the broker is up."""

    @property
    @abstractmethod
    def protocol(self) -> str:
        """The negotiated protocol: "MQTTv5", "MQTTv311" or "memory"."""

    @property
    @abstractmethod
    def reconnects(self) -> int:
        """How many times the connection came back after being lost."""

    def set_handler(self, handler: Handler | None) -> None:
        """Set the function called as ``handler(topic, payload)`` for every delivered message.

        None drops deliveries (they are still counted). A component that borrows the
        transport for a while (the link probe) reads :attr:`handler`, installs its own
        and puts the previous one back.
        """
        self._handler = handler

    @property
    def handler(self) -> Handler | None:
        """The handler set by :meth:`set_handler`, or None."""
        return self._handler

    @property
    def bytes_sent(self) -> int:
        """Payload bytes passed to :meth:`publish` so far."""
        return self._bytes_sent

    @property
    def bytes_received(self) -> int:
        """Payload bytes delivered to the handler so far."""
        return self._bytes_received

    @property
    def callback_errors(self) -> int:
        """Exceptions raised by the message handler or the transport's own callbacks.

        Each was logged (with its traceback) and contained: the network loop carried on.
        """
        return self._callback_errors

    def payload_limit(self, topic: str) -> int | None:
        """Largest payload in bytes the broker accepts on ``topic``; None: no limit known.

        An MQTT 5 broker announces its Maximum Packet Size in CONNACK; the limit is that
        minus the PUBLISH header for ``topic``. Implementations without limits return None.
        """
        return None

    def chunk_size(self, topic: str, configured: int) -> int:
        """Return the chunk size to use on ``topic``: ``min(configured, payload_limit(topic))``.

        Parameters
        ----------
        topic : str
            The topic the chunks go to (its length counts against the broker's limit).
        configured : int
            The job's ``max_payload_bytes``, bytes.

        Returns
        -------
        int
            Bytes per chunk, header and CRC included.

        """
        limit = self.payload_limit(topic)
        return configured if limit is None else min(configured, limit)

    def _contained(self, callback: _Callback) -> _Callback:
        """Wrap a network-thread callback: an exception is logged and counted, never raised.

        paho re-raises a callback's exception out of its network loop unless
        ``suppress_exceptions`` is set, which ends the thread: no more deliveries, no
        reconnects.
        """

        @functools.wraps(callback)
        def contained(*args: Any) -> None:
            try:
                callback(*args)
            except Exception:
                self._callback_errors += 1
                log.exception("MQTT callback %s failed; the network loop carries on", callback)

        return contained  # type: ignore[return-value]

    def _deliver(self, topic: str, payload: bytes) -> None:
        """Count and hand one message to the handler; a handler exception is logged and counted."""
        self._bytes_received += len(payload)
        handler = self._handler
        if handler is None:
            return
        try:
            handler(topic, payload)
        except Exception:
            self._callback_errors += 1
            log.exception("message handler failed on topic %s; message dropped", topic)
