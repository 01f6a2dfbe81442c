"""MQTT control packets in a TCP byte stream, for the chaos proxy (``meshfl local --chaos``).

Only what a fault-injecting relay needs, for MQTT 3.1.1 and 5.0 alike: split a stream
into whole control packets by the fixed header's Remaining Length (a variable byte
integer of 1–4 bytes, MQTT 5 §1.5.5 / 3.1.1 §2.2.3), read a PUBLISH's flags, topic,
packet identifier and where its application payload starts (after the MQTT 5
properties), read the protocol level of a CONNECT, and build a PUBACK. Nothing else
of the protocol is interpreted: every other packet is relayed as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from meshfl.errors import WireError

__all__ = [
    "MAX_REMAINING_LENGTH",
    "PacketSplitter",
    "PacketType",
    "Publish",
    "connect_level",
    "packet_id",
    "packet_type",
    "parse_publish",
    "puback",
]

MAX_REMAINING_LENGTH = 268_435_455
"""The largest Remaining Length a 4-byte variable byte integer encodes (bytes)."""


class PacketType(IntEnum):
    """MQTT control packet types (the fixed header's high nibble)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


def _varint(data: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """Decode a variable byte integer at ``pos``: ``(value, bytes used)``; None if cut short.

    Raises WireError for a fifth continuation byte (malformed, MQTT 5 §1.5.5).
    """
    value = 0
    for k in range(4):
        if pos + k >= len(data):
            return None
        byte = data[pos + k]
        value |= (byte & 0x7F) << (7 * k)
        if not byte & 0x80:
            return value, k + 1
    raise WireError("malformed MQTT packet: a variable byte integer longer than 4 bytes")


class PacketSplitter:
    r"""Cut a TCP byte stream into whole MQTT control packets.

    Examples
    --------
    >>> splitter = PacketSplitter()
    >>> splitter.feed(b"\xc0\x00\xd0")  # PINGREQ, then half of a PINGRESP
    [b'\xc0\x00']
    >>> splitter.feed(b"\x00")
    [b'\xd0\x00']

    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held back: the start of a packet not yet complete."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next bytes of the stream; return the packets they complete, in order.

        Raises
        ------
        WireError
            A malformed Remaining Length: the stream cannot be framed any further.

        """
        buffer = self._buffer
        buffer += data
        packets: list[bytes] = []
        pos = 0
        while pos < len(buffer):
            length = _varint(buffer, pos + 1)
            if length is None:
                break
            end = pos + 1 + length[1] + length[0]
            if end > len(buffer):
                break
            packets.append(bytes(buffer[pos:end]))
            pos = end
        del buffer[:pos]
        return packets


def packet_type(packet: bytes) -> int:
    """The control packet type of a whole packet (see :class:`PacketType`)."""
    return packet[0] >> 4


def _body_start(packet: bytes) -> int:
    """Offset of the variable header (after the fixed header)."""
    length = _varint(packet, 1)
    if length is None:
        raise WireError("truncated MQTT fixed header")
    return 1 + length[1]


def connect_level(packet: bytes) -> int:
    """The protocol level of a CONNECT packet: 3 (3.1), 4 (3.1.1) or 5 (5.0).

    Raises WireError for a packet too short to hold one.
    """
    start = _body_start(packet)
    if len(packet) < start + 2:
        raise WireError("truncated MQTT CONNECT")
    name_length = int.from_bytes(packet[start : start + 2], "big")
    level = start + 2 + name_length
    if len(packet) <= level:
        raise WireError("truncated MQTT CONNECT")
    return packet[level]


def packet_id(packet: bytes) -> int:
    """The packet identifier of a PUBACK, PUBREC, PUBREL or PUBCOMP (first two body bytes)."""
    start = _body_start(packet)
    if len(packet) < start + 2:
        raise WireError("truncated MQTT acknowledgement")
    return int.from_bytes(packet[start : start + 2], "big")


@dataclass(frozen=True)
class Publish:
    """What the chaos proxy reads of a PUBLISH packet.

    Attributes
    ----------
    qos : int
        0, 1 or 2.
    packet_id : int or None
        The packet identifier (QoS 1 and 2 only).
    topic : str
        The topic name (empty when an MQTT 5 topic alias stands for it).
    payload_start : int
        Offset of the application payload in the packet (bytes); the payload runs to
        the end of the packet and may be empty.

    """

    qos: int
    packet_id: int | None
    topic: str
    payload_start: int


def parse_publish(packet: bytes, v5: bool) -> Publish:
    """Read a PUBLISH packet's QoS, packet identifier, topic and payload offset.

    Parameters
    ----------
    packet : bytes
        One whole PUBLISH packet, fixed header included.
    v5 : bool
        The connection speaks MQTT 5 (a property block follows the packet identifier).

    Raises
    ------
    WireError
        Not a PUBLISH, or a variable header that runs past the packet's end.

    """
    if packet_type(packet) != PacketType.PUBLISH:
        raise WireError("not an MQTT PUBLISH")
    qos = (packet[0] >> 1) & 0x03
    pos = _body_start(packet)
    if len(packet) < pos + 2:
        raise WireError("truncated MQTT PUBLISH")
    topic_length = int.from_bytes(packet[pos : pos + 2], "big")
    topic = packet[pos + 2 : pos + 2 + topic_length].decode("utf-8", "replace")
    pos += 2 + topic_length
    ident = None
    if qos:
        ident = int.from_bytes(packet[pos : pos + 2], "big")
        pos += 2
    if v5:
        properties = _varint(packet, pos)
        if properties is None:
            raise WireError("truncated MQTT 5 PUBLISH properties")
        pos += properties[1] + properties[0]
    if pos > len(packet):
        raise WireError("MQTT PUBLISH variable header runs past the packet")
    return Publish(qos, ident, topic, pos)


def puback(ident: int) -> bytes:
    """A PUBACK for packet identifier ``ident``: success, valid in MQTT 3.1.1 and 5."""
    return bytes((PacketType.PUBACK << 4, 2)) + ident.to_bytes(2, "big")
