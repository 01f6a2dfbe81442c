"""The in-memory twin of the MQTT transport: a broker object shared by transports in one process.

Delivery is asynchronous, like a real broker: :meth:`MemoryTransport.publish` routes the
message under the broker lock and enqueues it; one broker-owned daemon thread
("meshfl-memory-broker") calls handlers in publish order, with no lock held. A handler
may therefore publish, subscribe or close without deadlocking. Use :meth:`flush` (or
:meth:`MemoryBroker.drain`) to wait until everything published so far was delivered.

Semantics copied from MQTT: ``+``/``#`` topic filters, retained messages (an empty
payload deletes), persistent sessions (a client id that reconnects finds its
subscriptions and the QoS ≥ 1 messages queued while it was away), and the Last Will,
published retained when a client is :meth:`MemoryTransport.kill`-ed.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

from edge_agent.transport.base import Message, Transport, log
from meshfl.errors import BrokerUnreachable, TransportError

__all__ = ["MemoryBroker", "MemoryTransport", "topic_matches"]


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Return True when ``topic`` matches the MQTT ``topic_filter`` (``+`` one level, ``#`` rest).

    ``a/#`` also matches ``a`` (MQTT-4.7.1-2); wildcards at the first level do not match
    topics that start with ``$`` (MQTT-4.7.2-1).
    """
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels, t_levels = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(t_levels) or (level != "+" and level != t_levels[i]):
            return False
    return len(f_levels) == len(t_levels)


@dataclass
class _Session:
    subscriptions: dict[str, int] = field(default_factory=dict)
    pending: list[Message] = field(default_factory=list)
    transport: MemoryTransport | None = None
    will: Message | None = None


class MemoryBroker:
    """An in-process MQTT broker for tests; thread-safe. See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._sessions: dict[str, _Session] = {}
        self._retained: dict[str, Message] = {}
        self._queue: collections.deque[tuple[str, Message]] = collections.deque()
        self._unfinished = 0
        self._running = True
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """False after :meth:`stop`: connects then raise BrokerUnreachable."""
        return self._running

    def stop(self) -> None:
        """Stop the broker: drop every connection (no wills) and end the delivery thread."""
        with self._lock:
            self._running = False
            for session in self._sessions.values():
                if session.transport is not None:
                    session.transport._detached()
                    session.transport = None
            self._idle.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self._thread = None

    def drain(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` seconds until every enqueued message was handed over."""
        if threading.current_thread() is self._thread:
            return not self._queue
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout=timeout_s)

    def retained(self, topic: str) -> bytes | None:
        """Return the retained payload of ``topic``, or None."""
        with self._lock:
            msg = self._retained.get(topic)
        return None if msg is None else msg.payload

    # -- called by MemoryTransport ------------------------------------------------------------

    def _attach(self, client_id: str, transport: MemoryTransport, will: Message | None) -> bool:
        with self._lock:
            if not self._running:
                raise BrokerUnreachable("memory broker is stopped; create a new MemoryBroker")
            session = self._sessions.setdefault(client_id, _Session())
            present = bool(session.subscriptions or session.pending)
            if session.transport is not None and session.transport is not transport:
                session.transport._detached()  # MQTT-3.1.4-2: the new connection takes over
            session.transport, session.will = transport, will
            for msg in session.pending:
                self._enqueue(client_id, msg)
            session.pending.clear()
            self._ensure_thread()
            return present

    def _detach(self, client_id: str, *, fire_will: bool) -> None:
        with self._lock:
            session = self._sessions.get(client_id)
            if session is None:
                return
            session.transport = None
            will, session.will = session.will, None
        if fire_will and will is not None:
            self._publish(Message(will.topic, will.payload, will.qos, retain=True))

    def _subscribe(self, client_id: str, topic_filter: str, qos: int) -> None:
        with self._lock:
            session = self._sessions.setdefault(client_id, _Session())
            session.subscriptions[topic_filter] = qos
            for topic, msg in sorted(self._retained.items()):
                if topic_matches(topic_filter, topic):
                    self._enqueue(client_id, msg)

    def _publish(self, msg: Message) -> None:
        with self._lock:
            if msg.retain:
                if msg.payload:
                    self._retained[msg.topic] = msg
                else:
                    self._retained.pop(msg.topic, None)
            for client_id, session in self._sessions.items():
                qos = max(
                    (q for f, q in session.subscriptions.items() if topic_matches(f, msg.topic)),
                    default=-1,
                )
                if qos < 0:
                    continue
                if session.transport is not None:
                    self._enqueue(client_id, msg)
                elif min(qos, msg.qos) >= 1:
                    session.pending.append(msg)

    def _enqueue(self, client_id: str, msg: Message) -> None:  # lock held
        self._queue.append((client_id, msg))
        self._unfinished += 1
        self._idle.notify_all()

    def _ensure_thread(self) -> None:  # lock held
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._dispatch, name="meshfl-memory-broker", daemon=True
            )
            self._thread.start()

    def _dispatch(self) -> None:
        while True:
            with self._idle:
                self._idle.wait_for(lambda: bool(self._queue) or not self._running)
                if not self._running:
                    self._queue.clear()
                    self._unfinished = 0
                    self._idle.notify_all()
                    return
                client_id, msg = self._queue.popleft()
                session = self._sessions.get(client_id)
                target = None if session is None else session.transport
                if target is None and session is not None and msg.qos >= 1:
                    session.pending.append(msg)
            if target is not None:
                target._deliver(msg.topic, msg.payload)
            with self._idle:
                self._unfinished -= 1
                self._idle.notify_all()


class MemoryTransport(Transport):
    """A :class:`Transport` over a :class:`MemoryBroker`; protocol ``"memory"``.

    Parameters
    ----------
    broker : MemoryBroker
        The shared in-process broker.

    """

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__()
        self._broker = broker
        self._client_id: str | None = None
        self._connected = False
        self._ever_connected = False
        self._reconnects = 0
        self._subscriptions: dict[str, int] = {}

    def connect(self, client_id: str, will: Message | None = None) -> None:
        """Attach to the broker as ``client_id``; see :meth:`Transport.connect`."""
        present = self._broker._attach(client_id, self, will)
        self._client_id, self._connected = client_id, True
        if self._ever_connected:
            self._reconnects += 1
            log.info("memory transport %s reconnected", client_id)
        self._ever_connected = True
        if not present:
            for topic_filter, qos in self._subscriptions.items():
                self._broker._subscribe(client_id, topic_filter, qos)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Route ``payload`` to matching subscribers; see :meth:`Transport.publish`."""
        if not self._connected:
            raise TransportError(f"cannot publish to {topic}: not connected; call connect() first")
        self._bytes_sent += len(payload)
        self._broker._publish(Message(topic, bytes(payload), qos, retain))

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe and remember ``topic_filter``; see :meth:`Transport.subscribe`."""
        self._subscriptions[topic_filter] = qos
        if self._connected and self._client_id is not None:
            self._broker._subscribe(self._client_id, topic_filter, qos)

    def close(self) -> None:
        """Detach cleanly; the will is not published. The session stays on the broker."""
        if self._connected and self._client_id is not None:
            self._connected = False
            self._broker._detach(self._client_id, fire_will=False)

    def kill(self) -> None:
        """Simulate a crash: drop the connection without DISCONNECT, so the will fires."""
        if self._connected and self._client_id is not None:
            self._connected = False
            self._broker._detach(self._client_id, fire_will=True)

    def flush(self, timeout_s: float) -> bool:
        """Wait until the broker has delivered everything published so far."""
        return self._broker.drain(timeout_s)

    def _detached(self) -> None:
        self._connected = False

    @property
    def connected(self) -> bool:
        """True between :meth:`connect` and :meth:`close`/:meth:`kill`."""
        return self._connected

    @property
    def protocol(self) -> str:
        """Always ``"memory"``."""
        return "memory"

    @property
    def reconnects(self) -> int:
        """How many times :meth:`connect` was called again after the first connection."""
        return self._reconnects
