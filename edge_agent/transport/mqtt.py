"""The MQTT transport over paho-mqtt 2.x: the only module of edge_agent that imports paho.

Connection policy (see ``docs/brokers.md``):

- Protocol: MQTT 5 where the broker speaks it, else MQTT 3.1.1, decided by a probe
  (:func:`edge_agent.transport._probe.probe_protocol`) because amqtt hangs on a full v5
  CONNECT instead of refusing it.
- Persistent session: MQTT 5 ``clean_start=False`` with a Session Expiry Interval;
  MQTT 3.1.1 ``clean_session=False``. QoS 1 messages published while we are away are
  delivered after we reconnect with the same client id.
- Last Will: published retained by the broker when the connection dies uncleanly.
- Reconnect: paho's network thread (``loop_start``) retries with exponential backoff from
  ``reconnect_min_s`` (jittered ×0.5–1.5 per client, so a fleet does not reconnect in
  lock step) to ``reconnect_max_s``; subscriptions are re-sent when the broker did not
  resume the session.
- Errors: paho's return and reason codes are translated here, into
  :class:`meshfl.errors.TransportError` / :class:`~meshfl.errors.BrokerUnreachable`.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.transport._probe import probe_protocol
from edge_agent.transport.base import Message, Transport, log
from meshfl.errors import BrokerUnreachable, ConfigError, MeshflError, TransportError

__all__ = ["MqttTransport", "parse_broker_url"]

_MAX_INFLIGHT = 20  # QoS 1 messages awaiting PUBACK; more are queued in paho, unbounded


def parse_broker_url(url: str) -> tuple[str, int]:
    """Split ``mqtt://host:port``, ``mqtt://host`` or ``host:port`` into (host, port).

    The port defaults to 1883. Raises :class:`meshfl.errors.ConfigError` for anything else.
    """
    text = url.strip()
    try:
        parts = urlsplit(text if "://" in text else f"mqtt://{text}")
        port = parts.port or 1883
    except ValueError:
        port = -1
        parts = urlsplit("")
    if parts.scheme != "mqtt" or not parts.hostname or port <= 0 or parts.path not in ("", "/"):
        raise ConfigError(
            f"bad broker URL {url!r}; use mqtt://HOST:PORT or HOST:PORT (e.g. mqtt://127.0.0.1:1883)"
        )
    return parts.hostname, port


def _no_delay(client: paho.Client) -> None:
    """Turn Nagle's algorithm off on the client's socket.

    Small QoS 1 messages otherwise wait ~40 ms each for the peer's delayed ACK (measured
    on loopback: RTT 44 ms with Nagle, 0.1-0.3 ms without).
    """
    sock = client.socket()
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _error_text(rc: MQTTErrorCode | int) -> str:
    return str(paho.error_string(rc))


class MqttTransport(Transport):
    """A :class:`Transport` over a real MQTT broker (paho-mqtt 2.x, callback API v2).

    Parameters
    ----------
    url : str
        ``mqtt://host:port`` or ``host:port``; port 1883 by default.
    keepalive_s : int, default 30
        MQTT keepalive in seconds; a dead peer is noticed within about 1.5× this.
    session_expiry_s : int, default 3600
        MQTT 5 Session Expiry Interval in seconds: how long the broker keeps our
        subscriptions and queued QoS 1 messages while we are away (3.1.1: until removed).
    connect_timeout_s : float, default 10.0
        Seconds :meth:`connect` waits for the first CONNACK.
    reconnect_min_s, reconnect_max_s : float, default 0.5 and 30.0
        Reconnect backoff bounds in seconds; the delay doubles after each failed try.

    Raises
    ------
    ConfigError
        ``url`` is not a broker URL.

    """

    def __init__(
        self,
        url: str,
        *,
        keepalive_s: int = 30,
        session_expiry_s: int = 3600,
        connect_timeout_s: float = 10.0,
        reconnect_min_s: float = 0.5,
        reconnect_max_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.host, self.port = parse_broker_url(url)
        self.keepalive_s = keepalive_s
        self.session_expiry_s = session_expiry_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_min_s = reconnect_min_s
        self.reconnect_max_s = reconnect_max_s
        self.broker_limits: dict[str, int] = {}
        """MQTT 5 CONNACK limits (e.g. ``MaximumPacketSize`` in bytes); empty on 3.1.1."""
        self._client: paho.Client | None = None
        self._protocol = ""
        self._lock = threading.Lock()
        self._subscriptions: dict[str, int] = {}
        self._unacked: set[int] = set()
        self._acked_early: set[int] = set()
        self._connected = False
        self._ever_connected = False
        self._closing = False
        self._reconnects = 0
        self._first_result = threading.Event()
        self._first_error: MeshflError | None = None
        self._subacks = threading.Condition()
        self._subacked: dict[int, str | None] = {}  # mid -> failure reason or None
        self._initial_subscriptions: dict[int, str] = {}  # mid -> filter, sent on connect

    @property
    def _where(self) -> str:
        return f"{self.host}:{self.port}"

    # -- connection -------------------------------------------------------------------------

    def connect(self, client_id: str, will: Message | None = None) -> None:
        """Connect as ``client_id``; see :meth:`Transport.connect`.

        The will is always published retained. Raises BrokerUnreachable or TransportError.
        """
        if self._client is not None:
            raise TransportError(f"already connected to {self._where}; call close() first")
        self._protocol = probe_protocol(self.host, self.port, self.connect_timeout_s)
        v5 = self._protocol == "MQTTv5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            clean_session=None if v5 else False,
        )
        client.connect_timeout = self.connect_timeout_s
        client.max_inflight_messages_set(_MAX_INFLIGHT)
        client.max_queued_messages_set(0)
        jitter = random.uniform(0.5, 1.5)
        client.reconnect_delay_set(
            min_delay=self.reconnect_min_s * jitter,  # type: ignore[arg-type]  # floats work
            max_delay=self.reconnect_max_s,  # type: ignore[arg-type]
        )
        if will is not None:
            client.will_set(will.topic, will.payload, will.qos, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        self._first_result.clear()
        self._first_error = None
        self._initial_subscriptions = {}
        self._ever_connected = False
        self._closing = False
        try:
            if v5:
                props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                props.SessionExpiryInterval = self.session_expiry_s
                client.connect_async(
                    self.host, self.port, self.keepalive_s, clean_start=False, properties=props
                )
            else:
                client.connect_async(self.host, self.port, self.keepalive_s)
        except ValueError as exc:
            raise ConfigError(f"cannot connect to {self._where}: {exc}") from exc
        self._client = client
        client.loop_start()
        started = time.monotonic()
        if self._first_result.wait(self.connect_timeout_s) and self._first_error is None:
            try:
                self._await_initial_subacks(self.connect_timeout_s - (time.monotonic() - started))
            except TransportError:
                self._shutdown(client)
                raise
            return
        error = self._first_error or BrokerUnreachable(
            f"MQTT broker at {self._where} did not accept the connection within "
            f"{self.connect_timeout_s:g} s; check that it runs and the --broker URL"
        )
        self._shutdown(client)
        raise error

    def _await_initial_subacks(self, timeout_s: float) -> None:
        """Wait for the SUBACKs of the subscriptions made before :meth:`connect`.

        So that, as after :meth:`subscribe`, a message published once ``connect`` returns
        is delivered to us. A refusal (an ACL denial) raises TransportError; a broker that
        does not answer in time is logged and the subscriptions stay pending.
        """
        pending = dict(self._initial_subscriptions)
        with self._subacks:
            self._subacks.wait_for(
                lambda: all(mid in self._subacked for mid in pending), timeout=max(timeout_s, 0.1)
            )
            results = {mid: self._subacked.pop(mid) for mid in pending if mid in self._subacked}
        refused = [f"{pending[mid]} ({why})" for mid, why in results.items() if why is not None]
        if refused:
            raise TransportError(
                f"the broker at {self._where} refused the subscription to {', '.join(refused)};"
                " check the broker's ACL for this client"
            )
        if len(results) < len(pending):
            log.warning("the broker at %s has not acknowledged every subscription yet", self._where)

    def close(self) -> None:
        """Send DISCONNECT (no will) and stop the network thread; call :meth:`flush` first."""
        client = self._client
        if client is None:
            return
        self._closing = True
        self._shutdown(client)
        log.info("disconnected from %s", self._where)

    def _shutdown(self, client: paho.Client) -> None:
        client.disconnect()
        client.loop_stop()
        self._client = None
        self._connected = False

    # -- publish / subscribe ----------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Enqueue ``payload``; see :meth:`Transport.publish`. Queued while reconnecting.

        Raises
        ------
        TransportError
            Not connected yet, an invalid topic, or paho refused the message.

        """
        client = self._require_client(f"publish to {topic}")
        try:
            info = client.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:
            raise TransportError(f"cannot publish to {topic}: {exc}") from exc
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise TransportError(f"cannot publish to {topic}: {_error_text(info.rc)}")
        self._bytes_sent += len(payload)
        with self._lock:
            if qos >= 1 and info.mid not in self._acked_early:
                self._unacked.add(info.mid)
            self._acked_early.discard(info.mid)

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        """Subscribe, and again after any reconnect without a session.

        When connected, blocks until the broker's SUBACK (up to ``connect_timeout_s``),
        so a message published after this returns is delivered to us.

        Raises
        ------
        TransportError
            The broker refused the subscription (e.g. an ACL denial) or did not answer.

        """
        self._subscriptions[topic_filter] = qos
        client = self._client
        if client is None or not self._connected:
            return
        try:
            rc, mid = client.subscribe(topic_filter, qos)
        except ValueError as exc:
            raise TransportError(f"cannot subscribe to {topic_filter}: {exc}") from exc
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN or mid is None:
            return  # re-sent by _on_connect after the reconnect
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise TransportError(f"cannot subscribe to {topic_filter}: {_error_text(rc)}")
        with self._subacks:
            acked = self._subacks.wait_for(
                lambda: mid in self._subacked, timeout=self.connect_timeout_s
            )
            failure = self._subacked.pop(mid, None)
        if not acked and self._connected:
            raise TransportError(
                f"the broker at {self._where} did not acknowledge the subscription to"
                f" {topic_filter} within {self.connect_timeout_s:g} s"
            )
        if failure is not None:
            raise TransportError(
                f"the broker at {self._where} refused the subscription to {topic_filter}"
                f" ({failure}); check the broker ACL for this device"
            )

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until every QoS ≥ 1 publish got its PUBACK."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._unacked:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _require_client(self, what: str) -> paho.Client:
        if self._client is None:
            raise TransportError(f"cannot {what}: not connected to {self._where}; call connect()")
        return self._client

    # -- paho callbacks (network thread) ------------------------------------------------------

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        _no_delay(client)
        if reason.is_failure:
            error = TransportError(
                f"MQTT broker at {self._where} refused the connection: {reason}; "
                "check the client id, credentials and broker ACLs"
            )
            log.warning("%s", error)
            if not self._ever_connected:
                self._first_error = error
                self._first_result.set()
            return
        if properties is not None and self._protocol == "MQTTv5":
            for name in ("MaximumPacketSize", "ReceiveMaximum", "TopicAliasMaximum"):
                if hasattr(properties, name):
                    self.broker_limits[name] = int(getattr(properties, name))
        resumed = bool(flags.session_present)
        if self._ever_connected:
            self._reconnects += 1
        log.info(
            "%s to %s (%s, session resumed: %s)",
            "reconnected" if self._ever_connected else "connected",
            self._where,
            self._protocol,
            resumed,
        )
        if not resumed or not self._ever_connected:
            for topic_filter, qos in list(self._subscriptions.items()):
                rc, mid = client.subscribe(topic_filter, qos)
                if (
                    not self._ever_connected
                    and rc == MQTTErrorCode.MQTT_ERR_SUCCESS
                    and mid is not None
                ):
                    self._initial_subscriptions[mid] = topic_filter
        self._connected = True
        self._ever_connected = True
        self._first_result.set()

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        was_connected, self._connected = self._connected, False
        if self._closing:
            return
        if was_connected:
            log.warning("lost connection to %s (%s); reconnecting", self._where, reason)

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        self._deliver(message.topic, bytes(message.payload))

    def _on_subscribe(
        self, client: paho.Client, userdata: Any, mid: int, reasons: Any, properties: Any
    ) -> None:
        failed = [str(r) for r in reasons if getattr(r, "is_failure", False)]
        with self._subacks:
            self._subacked[mid] = ", ".join(failed) if failed else None
            self._subacks.notify_all()

    def _on_publish(
        self, client: paho.Client, userdata: Any, mid: int, reason: Any, properties: Any
    ) -> None:
        with self._lock:
            if mid in self._unacked:
                self._unacked.discard(mid)
            else:
                self._acked_early.add(mid)

    # -- properties ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the MQTT connection is up (False while paho reconnects)."""
        return self._connected

    @property
    def protocol(self) -> str:
        """Return the negotiated protocol, "MQTTv5" or "MQTTv311"; empty before connect()."""
        return self._protocol

    @property
    def reconnects(self) -> int:
        """Successful reconnections after the first connection."""
        return self._reconnects
