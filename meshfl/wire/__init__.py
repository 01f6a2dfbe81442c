"""Wire format v1: envelopes, their byte layout, chunking, reassembly and MQTT topics.

- :mod:`meshfl.wire.envelope` — :class:`Envelope`, :class:`TensorEntry`, :class:`DType`,
  :class:`MessageKind`: what a gossip message carries.
- :mod:`meshfl.wire.serde` — the only module that knows the bytes
  (:func:`encode_envelope` / :func:`decode_envelope`, chunk frames).
- :mod:`meshfl.wire.chunking` — :func:`split_message`, :func:`pack_message` and the
  bounded :class:`Reassembler`.
- :mod:`meshfl.wire.topics` — the ``meshfl/v1/...`` topic scheme and :func:`validate_id`.
- the JSON payloads, one encoder and one bounded decoder each (raising only
  :class:`~meshfl.errors.PayloadError`): :mod:`~meshfl.wire.status`,
  :mod:`~meshfl.wire.control`, :mod:`~meshfl.wire.repair`, :mod:`~meshfl.wire.secagg`
  (the signed declaration, protocol bodies, mask sets), :mod:`~meshfl.wire.shares`
  (SHARES/REVEAL), all through :mod:`~meshfl.wire.jsonbody`.

Sending: ``for chunk in pack_message(env, max_payload, sign): publish(delta_topic(...), chunk)``
(the gossip sender and the secure engine both do exactly this).
Receiving: ``msg = reassembler.feed(payload, sender, topic)``; if not ``None``,
``decode_envelope(msg)``.
Malformed input raises :class:`~meshfl.errors.WireError` and nothing else. See docs/wire.md.
"""

from meshfl.wire.chunking import (
    DEFAULT_MAX_PAYLOAD,
    Reassembler,
    ReassemblyStats,
    pack_message,
    split_message,
)
from meshfl.wire.envelope import DType, Envelope, MessageKind, TensorEntry, new_message_id
from meshfl.wire.serde import WIRE_VERSION, decode_envelope, encode_envelope
from meshfl.wire.topics import (
    TopicInfo,
    control_topic,
    delta_topic,
    inbox_filter,
    inbox_topic,
    parse_topic,
    probe_topic,
    status_filter,
    status_topic,
    validate_id,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "WIRE_VERSION",
    "DType",
    "Envelope",
    "MessageKind",
    "Reassembler",
    "ReassemblyStats",
    "TensorEntry",
    "TopicInfo",
    "control_topic",
    "decode_envelope",
    "delta_topic",
    "encode_envelope",
    "inbox_filter",
    "inbox_topic",
    "new_message_id",
    "pack_message",
    "parse_topic",
    "probe_topic",
    "split_message",
    "status_filter",
    "status_topic",
    "validate_id",
]
