"""The broker's limits from an MQTT 5 CONNACK, and what they mean for our PUBLISHes.

An MQTT 5 broker may announce (MQTT 5.0 §3.2.2.3):

- **Maximum Packet Size** (bytes): a larger PUBLISH is a protocol error; Mosquitto
  disconnects the client (reason 0x95). paho-mqtt 2.x does not check it, and re-sends the
  unacknowledged message after every reconnect — a loop that never ends. So the agent
  chunks under :func:`payload_limit` and the transport refuses anything larger up front.
- **Receive Maximum**: how many QoS 1/2 PUBLISHes the broker accepts unacknowledged from
  this client (default 65535). paho does not honour it either; the transport caps paho's
  in-flight window at :func:`inflight_cap`.

A 3.1.1 broker announces nothing: :class:`BrokerLimits` is then all None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PUBLISH_OVERHEAD", "BrokerLimits", "inflight_cap", "payload_limit"]

PUBLISH_OVERHEAD = 1 + 4 + 2 + 2 + 1
"""Bytes of a QoS 1 MQTT 5 PUBLISH besides the topic and payload, at most: the fixed header
byte, a remaining-length varint of up to 4 bytes, the topic's 2-byte length, the packet id
and a 1-byte (empty) property length."""


@dataclass(frozen=True)
class BrokerLimits:
    """Limits a broker announced in CONNACK; None means it announced none.

    Attributes
    ----------
    max_packet_bytes : int or None
        Maximum Packet Size, bytes (whole MQTT packet, headers included).
    receive_maximum : int or None
        Receive Maximum: QoS ≥ 1 PUBLISHes it accepts in flight from us.
    topic_alias_maximum : int or None
        Topic Alias Maximum (recorded only; meshfl sends no topic aliases).

    """

    max_packet_bytes: int | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None

    @classmethod
    def from_properties(cls, properties: Any) -> BrokerLimits:
        """Read the limits from paho's CONNACK ``Properties`` (None or absent: no limit)."""

        def read(name: str) -> int | None:
            value = getattr(properties, name, None) if properties is not None else None
            return None if value is None else int(value)

        return cls(
            max_packet_bytes=read("MaximumPacketSize"),
            receive_maximum=read("ReceiveMaximum"),
            topic_alias_maximum=read("TopicAliasMaximum"),
        )

    def as_dict(self) -> dict[str, int]:
        """The announced limits under their MQTT property names (``MaximumPacketSize``, ...)."""
        names = {
            "MaximumPacketSize": self.max_packet_bytes,
            "ReceiveMaximum": self.receive_maximum,
            "TopicAliasMaximum": self.topic_alias_maximum,
        }
        return {name: value for name, value in names.items() if value is not None}


def payload_limit(limits: BrokerLimits, topic: str) -> int | None:
    """Largest payload in bytes that fits the broker's Maximum Packet Size on ``topic``.

    Returns None when the broker announced no maximum. The result may be 0 or negative for
    an absurdly small maximum; callers refuse it.
    """
    if limits.max_packet_bytes is None:
        return None
    return limits.max_packet_bytes - PUBLISH_OVERHEAD - len(topic.encode("utf-8"))


def inflight_cap(ours: int, limits: BrokerLimits) -> int:
    """Return the QoS 1 in-flight window: ``min(ours, Receive Maximum)`` (at least 1)."""
    if limits.receive_maximum is None:
        return ours
    return max(1, min(ours, limits.receive_maximum))
