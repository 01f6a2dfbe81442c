"""MQTT helpers outside the transport's connection: topic matching, ``$SYS`` counters.

Both are built on paho, so they live behind the transport seam.

paho stays behind :mod:`edge_agent.transport`: the coordinator's MQTT subscriber
(``meshfl coordinator serve``) and the bridged-brokers report of ``meshfl local`` use
these instead of importing paho themselves.
"""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.transport.address import parse_broker_address

__all__ = ["sys_bytes", "topic_matches"]


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` matches the MQTT ``topic_filter`` (``+`` and ``#`` wildcards).

    MQTT 3.1.1 section 4.7 (paho's ``topic_matches_sub``).
    """
    return bool(mqtt.topic_matches_sub(topic_filter, topic))


def sys_bytes(url: str, timeout_s: float = 3.0) -> dict[str, int] | None:
    """Return a Mosquitto's ``$SYS/broker/bytes/received`` and ``.../sent`` (bytes), fresh.

    Waits for the next periodic update (not the retained, possibly stale, one), so it
    takes up to the broker's ``sys_interval``; the reading client's own few hundred bytes
    are included. ``None`` when the broker does not answer within ``timeout_s`` seconds
    (``$SYS`` off, or the broker is down).
    """
    address = parse_broker_address(url)
    fresh: dict[str, int] = {}
    done = threading.Event()

    def on_message(_c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        if not message.retain:  # a live update, not the value retained since the last one
            fresh[message.topic.rsplit("/", 1)[1]] = int(message.payload)
            if len(fresh) == 2:
                done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.on_message = on_message
    try:
        client.connect(address.host, address.port)
    except OSError:
        return None
    client.subscribe("$SYS/broker/bytes/+")
    client.loop_start()
    try:
        return dict(fresh) if done.wait(timeout_s) else None
    finally:
        client.disconnect()
        client.loop_stop()
