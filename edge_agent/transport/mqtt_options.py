"""How :class:`~edge_agent.transport.mqtt.MqttTransport` sets up its paho client.

The connection options (protocol, TLS, login, timeouts, the in-flight window, the Last
Will) and the socket and window adjustments made on each CONNACK. Part of the MQTT
transport: with :mod:`edge_agent.transport.mqtt` the only code that touches paho's client.
"""

from __future__ import annotations

import contextlib
import socket
import ssl

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.transport.base import Message

__all__ = ["MAX_INFLIGHT", "new_client", "no_delay", "resubscribe_options", "set_inflight"]

MAX_INFLIGHT = 20  # QoS 1 messages awaiting PUBACK; more are queued in paho, unbounded


def new_client(
    client_id: str,
    *,
    v5: bool,
    tls: ssl.SSLContext | None,
    username: str | None,
    password: str | None,
    connect_timeout_s: float,
    reconnect_min_s: float,
    reconnect_max_s: float,
    will: Message | None,
) -> paho.Client:
    """A paho client (callback API v2) with the transport's connection options.

    MQTT 5 (its session is kept by ``clean_start=False`` at connect) or 3.1.1 with
    ``clean_session=False``; TLS with ``tls`` when given; the broker login when
    ``username`` is given; at most :data:`MAX_INFLIGHT` QoS 1 messages in flight and no
    cap on paho's queue; reconnect delays from ``reconnect_min_s`` to ``reconnect_max_s``
    seconds (the transport replaces them before each wait); ``will`` published retained.
    No callback is set.
    """
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        clean_session=None if v5 else False,
    )
    if tls is not None:
        client.tls_set_context(tls)
    if username:
        client.username_pw_set(username, password)
    client.connect_timeout = connect_timeout_s
    client.max_inflight_messages_set(MAX_INFLIGHT)
    client.max_queued_messages_set(0)
    client.reconnect_delay_set(
        reconnect_min_s,  # type: ignore[arg-type]  # floats work
        reconnect_max_s,  # type: ignore[arg-type]
    )
    if will is not None:
        client.will_set(will.topic, will.payload, will.qos, retain=True)
    return client


def no_delay(client: paho.Client) -> None:
    """Turn Nagle's algorithm off on the client's socket.

    Small QoS 1 messages otherwise wait ~40 ms each for the peer's delayed ACK (measured
    on loopback: RTT 44 ms with Nagle, 0.1-0.3 ms without).
    """
    sock = client.socket()
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_inflight(client: paho.Client, cap: int) -> None:
    """Set paho's QoS 1 in-flight window to ``cap`` (> 0) from ``on_connect``.

    paho's public setter refuses any change once the socket is open, and the broker's
    Receive Maximum is only known from its CONNACK, so this writes the attribute the setter
    guards. It is safe there: paho re-sends unacknowledged messages only after
    ``on_connect`` returns, and its own worry (a change between 0, "unlimited", and a
    positive window) cannot arise since ``cap`` is always positive.
    """
    client._max_inflight_messages = max(1, cap)


def resubscribe_options(qos: int) -> SubscribeOptions:
    """MQTT 5 options of a subscription renewed in a resumed session (no retained repeat)."""
    return SubscribeOptions(qos=qos, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
