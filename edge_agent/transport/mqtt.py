"""The MQTT transport over paho-mqtt 2.x (with its helpers, the only paho code in edge_agent).

Its connection policy is described in ``docs/brokers.md``: MQTT 5 where the broker speaks
it (a probe decides: amqtt hangs on a v5 CONNECT), a persistent session with a retained
Last Will, jittered reconnects (:class:`~edge_agent.transport.backoff.Backoff`) that
re-subscribe where the broker lost the session, the CONNACK's limits honoured (in-flight
window, :meth:`MqttTransport.payload_limit`; a larger publish is refused, as paho would
re-send it after every reconnect), callbacks that log and count their exceptions, TLS with
the enrolment CA for ``mqtts://``. paho's codes become meshfl errors here (section
"Refusals" there): :class:`~meshfl.errors.ConfigError` for what retrying cannot fix (a
refused login or client id, an ACL denial), :class:`~meshfl.errors.BrokerUnreachable`
and :class:`~meshfl.errors.TransportError` otherwise.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.transport.acks import Pubacks, Subacks
from edge_agent.transport.address import parse_broker_address, tls_context
from edge_agent.transport.backoff import Backoff
from edge_agent.transport.base import Message, Transport, log
from edge_agent.transport.limits import BrokerLimits, inflight_cap, payload_limit
from edge_agent.transport.mqtt_options import (
    MAX_INFLIGHT,
    new_client,
    no_delay,
    resubscribe_options,
    set_inflight,
)
from edge_agent.transport.refusals import (
    BAD_LOGIN,
    Reason,
    code_of,
    connack_error,
    suback_error,
    taken_over_error,
)
from edge_agent.transport.version_probe import probe_protocol
from meshfl.errors import BrokerUnreachable, ConfigError, MeshflError, TransportError

__all__ = ["MqttTransport"]

LOGIN_RETRY_S = 1.0
"""Seconds before the one retry of a refused first login (see :meth:`MqttTransport.connect`)."""


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
        Reconnect backoff bounds in seconds: the delay's ceiling doubles after each failed
        try, and each delay is drawn in [ceiling/2, ceiling] (:class:`Backoff`).
    username, password : str or None
        The broker login (from enrolment); None connects without one.
    ca_file : str, Path or None
        With ``mqtts://``: PEM of the CA that signed the broker's certificate; None trusts
        the system's CA store. Refused with a plain ``mqtt://`` URL.

    Raises
    ------
    ConfigError
        ``url`` is not a broker URL, ``ca_file`` is given without ``mqtts://`` or cannot
        be loaded, a password is given without a username, or the reconnect bounds are
        not ``0 < min <= max``.

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
        username: str | None = None,
        password: str | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__()
        address = parse_broker_address(url)
        self.host, self.port = address.host, address.port
        if ca_file is not None and not address.tls:
            raise ConfigError(
                f"a broker CA was given but {url!r} is not a TLS URL; use mqtts://{address}"
            )
        if password is not None and not username:
            raise ConfigError("a broker password was given without a username")
        self._tls = tls_context(ca_file) if address.tls else None
        self._username = username
        self._password = password
        self.keepalive_s = keepalive_s
        self.session_expiry_s = session_expiry_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_min_s = reconnect_min_s
        self.reconnect_max_s = reconnect_max_s
        self.backoff = Backoff(reconnect_min_s, reconnect_max_s)
        """The reconnect schedule; replace it (e.g. with a seeded RNG) before :meth:`connect`."""
        self.limits = BrokerLimits()
        """The limits of the last MQTT 5 CONNACK; all None on 3.1.1 and before connecting."""
        self._client: paho.Client | None = None
        self._protocol = ""
        self._subscriptions: dict[str, int] = {}
        self._pubacks = Pubacks()  # a denial (0x87) is raised by the next publish/flush
        self._fatal: MeshflError | None = None  # a reconnect refused for good (login revoked)
        self._client_id = ""
        self._refused: int | None = None  # the reason code of the last refused CONNACK
        self._connected = False
        self._ever_connected = False
        self._closing = False
        self._reconnects = 0
        self._first_result = threading.Event()
        self._first_error: MeshflError | None = None
        self._subacks = Subacks()
        self._initial_subscriptions: dict[int, str] = {}  # mid -> filter, sent on connect

    @property
    def _where(self) -> str:
        return f"{self.host}:{self.port}"

    # -- connection -------------------------------------------------------------------------

    def connect(self, client_id: str, will: Message | None = None) -> None:
        """Connect as ``client_id``; see :meth:`Transport.connect`.

        The will is always published retained. A refused login, or a failed TLS handshake,
        is tried once more after :data:`LOGIN_RETRY_S` seconds: a login added a moment ago
        (enrolment) may not be loaded by the broker yet, and Mosquitto resets the TLS
        handshakes under way while it reloads (on SIGHUP, after each new login).

        Raises
        ------
        BrokerUnreachable
            Nothing answered at the broker address.
        ConfigError
            The broker refused the login or the client id, the TLS certificate does not
            verify, or a subscription made before connecting is denied by its ACL.
        TransportError
            The broker refused the connection otherwise.

        """
        if self._client is not None:
            raise TransportError(f"already connected to {self._where}; call close() first")
        try:
            self._connect_once(client_id, will)
        except (ConfigError, TransportError) as exc:
            login = isinstance(exc, ConfigError) and self._refused in BAD_LOGIN and self._username
            reset = not isinstance(exc, (ConfigError, BrokerUnreachable))  # e.g. TLS reset
            handshake = reset and self._tls is not None
            if not (login or handshake):
                raise
            log.info("%s: %s; retrying in %g s", self._where, exc, LOGIN_RETRY_S)
            time.sleep(LOGIN_RETRY_S)
            self._connect_once(client_id, will)

    def _connect_once(self, client_id: str, will: Message | None) -> None:
        self._protocol = probe_protocol(self.host, self.port, self.connect_timeout_s, self._tls)
        v5 = self._protocol == "MQTTv5"
        client = new_client(  # reconnect delays replaced before each wait (_schedule_reconnect)
            client_id,
            v5=v5,
            tls=self._tls,
            username=self._username,
            password=self._password,
            connect_timeout_s=self.connect_timeout_s,
            reconnect_min_s=self.reconnect_min_s,
            reconnect_max_s=self.reconnect_max_s,
            will=will,
        )
        self._client_id = client_id
        self._fatal = self._refused = None
        self._pubacks.take_denial()  # a denial on the last connection is not this one's
        self.backoff.reset()
        client.suppress_exceptions = True  # paho's own net; ours below also counts and logs
        client.on_connect = self._contained(self._on_connect)
        client.on_connect_fail = self._contained(self._on_connect_fail)
        client.on_disconnect = self._contained(self._on_disconnect)
        client.on_message = self._contained(self._on_message)
        client.on_publish = self._contained(self._on_publish)
        client.on_subscribe = self._contained(self._on_subscribe)
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
            except (TransportError, ConfigError):
                self._shutdown(client)
                raise
            return
        error = self._first_error or BrokerUnreachable(
            f"MQTT broker at {self._where} did not accept the connection within "
            f"{self.connect_timeout_s:g} s; check that it runs and the --broker URL"
            " (mqtts:// for a TLS listener)"
        )
        self._shutdown(client)
        raise error

    def _await_initial_subacks(self, timeout_s: float) -> None:
        """Wait for the SUBACKs of the subscriptions made before :meth:`connect`.

        So that, as after :meth:`subscribe`, a message published once ``connect`` returns
        is delivered to us. An ACL denial (0x87) raises ConfigError, another refusal
        TransportError; a broker that does not answer in time is logged and the
        subscriptions stay pending.
        """
        pending = dict(self._initial_subscriptions)
        results = self._subacks.wait(list(pending), max(timeout_s, 0.1))
        for mid, failed in results.items():
            self._raise_suback(pending[mid], failed)
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
            Not connected yet, an invalid topic, a payload over :meth:`payload_limit`
            (sent, the broker would disconnect us and paho re-send it forever), or paho
            refused the message.

        """
        client = self._require_client(f"publish to {topic}")
        self._raise_refusals()
        limit = self.payload_limit(topic)
        if limit is not None and len(payload) > limit:
            raise TransportError(
                f"cannot publish {len(payload)} bytes to {topic}: the broker at {self._where}"
                f" accepts packets of at most {self.limits.max_packet_bytes} bytes ({limit} of"
                " payload on this topic); chunk it (max_payload_bytes)"
            )
        try:
            info = client.publish(topic, payload, qos=qos, retain=retain)
        except ValueError as exc:
            raise TransportError(f"cannot publish to {topic}: {exc}") from exc
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise TransportError(f"cannot publish to {topic}: {_error_text(info.rc)}")
        self._bytes_sent += len(payload)
        self._pubacks.sent(info.mid, topic, qos, self._client_id)

    def _raise_refusals(self) -> None:
        """Raise a refused reconnect (for good) or a PUBACK 0x87 seen since the last call (once)."""
        if self._fatal is not None:
            raise self._fatal
        denied = self._pubacks.take_denial()
        if denied is not None:
            raise denied

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
        acked = self._subacks.wait([mid], self.connect_timeout_s)
        failed = acked.get(mid, [])
        if not acked and self._connected:
            raise TransportError(
                f"the broker at {self._where} did not acknowledge the subscription to"
                f" {topic_filter} within {self.connect_timeout_s:g} s"
            )
        self._raise_suback(topic_filter, failed)

    def _raise_suback(self, topic_filter: str, failed: list[Any]) -> None:
        """Raise for a refused subscription: ConfigError for an ACL denial, else TransportError."""
        error = suback_error(topic_filter, failed, self._where, self._client_id)
        if error is not None:
            self._subscriptions.pop(topic_filter, None)  # not re-sent after a reconnect
            raise error

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until every QoS ≥ 1 publish got its PUBACK.

        Raises
        ------
        ConfigError
            The broker denied a publish (PUBACK 0x87: its ACL), or refused our login.

        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._pubacks.settled or self._fatal is not None:
                self._raise_refusals()
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _require_client(self, what: str) -> paho.Client:
        if self._client is None:
            raise TransportError(f"cannot {what}: not connected to {self._where}; call connect()")
        return self._client

    # -- paho callbacks (network thread) ------------------------------------------------------

    def _schedule_reconnect(self, client: paho.Client) -> float:
        """Set paho's next reconnect wait to one jittered delay from :attr:`backoff`."""
        delay = self.backoff.next_delay()
        client.reconnect_delay_set(delay, delay)  # type: ignore[arg-type]  # floats work
        return delay

    def _on_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        delay = self._schedule_reconnect(client)
        log.debug("cannot reach %s; next try in %.2f s", self._where, delay)

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        no_delay(client)
        if reason.is_failure:
            self._refused = code_of(reason)
            error = connack_error(reason, self._where, self._client_id, bool(self._username))
            log.warning("%s", error)
            if isinstance(error, ConfigError):
                self._fatal = error
                client.disconnect()  # retrying cannot fix a refused login: stop reconnecting
            if not self._ever_connected:
                self._first_error = error
                self._first_result.set()
            return
        self.backoff.reset()
        v5 = self._protocol == "MQTTv5"
        self.limits = BrokerLimits.from_properties(properties if v5 else None)
        set_inflight(client, inflight_cap(MAX_INFLIGHT, self.limits))
        resumed = bool(flags.session_present)
        if self._ever_connected:
            self._reconnects += 1
        announced = self.limits.as_dict()
        log.info(
            "%s to %s (%s, session resumed: %s; broker limits: %s; in-flight window %d)",
            "reconnected" if self._ever_connected else "connected",
            self._where,
            self._protocol,
            resumed,
            ", ".join(f"{name}={value}" for name, value in announced.items()) or "none",
            client.max_inflight_messages,
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
        elif v5:
            # A session restored from a broker's last autosave (Mosquitto after SIGKILL)
            # lacks the subscriptions made after it: subscribe again; retained messages
            # come only for a subscription that was missing (Retain Handling 1).
            for topic_filter, qos in list(self._subscriptions.items()):
                client.subscribe(topic_filter, options=resubscribe_options(qos))
        self._connected = True
        self._ever_connected = True
        self._first_result.set()

    def _on_disconnect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        was_connected, self._connected = self._connected, False
        if self._closing:
            return
        if code_of(reason) == Reason.SESSION_TAKEN_OVER:  # another process connected as us
            self._fatal = taken_over_error(self._where, self._client_id)
            log.error("%s", self._fatal)
            client.disconnect()  # reconnecting would take it back: the two would fight
            return
        delay = self._schedule_reconnect(client)
        if was_connected:
            log.warning(
                "lost connection to %s (%s); reconnecting in %.2f s", self._where, reason, delay
            )

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        self._deliver(message.topic, bytes(message.payload))

    def _on_subscribe(
        self, client: paho.Client, userdata: Any, mid: int, reasons: Any, properties: Any
    ) -> None:
        self._subacks.received(mid, reasons)

    def _on_publish(
        self, client: paho.Client, userdata: Any, mid: int, reason: Any, properties: Any
    ) -> None:
        self._pubacks.acked(mid, code_of(reason) or 0, self._client_id)

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

    @property
    def broker_limits(self) -> dict[str, int]:
        """The CONNACK limits by MQTT property name (``MaximumPacketSize``, ...); {} on 3.1.1."""
        return self.limits.as_dict()

    @property
    def max_inflight(self) -> int:
        """QoS 1 publishes sent before waiting for PUBACKs: ``min(20, Receive Maximum)``."""
        client = self._client
        if client is None:
            return inflight_cap(MAX_INFLIGHT, self.limits)
        return int(client.max_inflight_messages)

    def payload_limit(self, topic: str) -> int | None:
        """Largest payload in bytes the broker accepts on ``topic`` (None: no limit announced)."""
        return payload_limit(self.limits, topic)
