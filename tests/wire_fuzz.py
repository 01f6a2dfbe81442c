"""Fuzz targets and oracles for the wire decoder and the agent's receive path.

Shared by ``tests/unit/test_wire_fuzz.py`` (hypothesis, a few seconds in CI) and
``benchmarks/fuzz_decoder.py`` (atheris or hypothesis, >= 10⁶ inputs). Each ``check_*``
feeds hostile bytes to one decoder and raises ``AssertionError`` on a finding; any
exception other than :class:`~meshfl.errors.WireError` escaping a decoder (or anything at
all escaping :meth:`Inbox._handle`) is a crash. The oracles:

- an envelope or chunk is accepted only if its CRC-32 trailer matches, and it re-encodes
  to exactly the bytes it was decoded from (the layout is canonical);
- reassembly stays within its bounds (``max_messages``, ``max_bytes``) and accepts only
  chunks whose CRC matches;
- the agent's inbox never raises, and applies a message only if both CRCs match;
- every JSON decoder of :mod:`meshfl.wire` raises :class:`~meshfl.errors.PayloadError`
  and nothing else, and the inbox counts and drops a status, control message or repair
  request that does not decode (targets 8 and 9).

:func:`run_selected` interprets one byte string (first byte: target, rest: input) for
fuzzers that only produce bytes; :func:`seed_inputs` gives them valid starting points.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from edge_agent.inbox import Inbox
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.errors import PayloadError, WireError
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    Reassembler,
    TensorEntry,
    control_topic,
    delta_topic,
    inbox_topic,
    split_message,
    status_topic,
)
from meshfl.wire.control import ControlMessage, decode_control, encode_control
from meshfl.wire.repair import decode_repair_request, encode_repair_request
from meshfl.wire.secagg import (
    decode_body,
    decode_declaration,
    decode_mask_set,
    encode_declaration,
    encode_mask_set,
    encode_request,
    encode_sealed,
)
from meshfl.wire.serde import (
    CHUNK_HEADER,
    DecodedEnvelope,
    decode_chunk,
    decode_envelope_signed,
    encode_chunk,
    encode_envelope,
)
from meshfl.wire.shares import Reveal, SharesMessage, decode_sealed, encode_reveal, encode_shares
from meshfl.wire.status import decode_status, encode_status

__all__ = [
    "CHUNK_FIELDS",
    "HOSTILE_ID",
    "JSON_DECODERS",
    "TARGETS",
    "TOPIC",
    "check_chunk",
    "check_envelope",
    "check_inbox",
    "check_inbox_json",
    "check_json",
    "check_reassembly",
    "crc_ok",
    "delta_messages",
    "envelope_fields",
    "fresh_inbox",
    "json_seeds",
    "run_selected",
    "seed_inputs",
    "with_crc",
]

FLEET, JOB, SELF, PEER = "fuzz", "job-1", "dev-0", "dev-1"
TOPIC = delta_topic(FLEET, PEER)
KEYFRAME_ID, HOSTILE_ID = b"k" * 16, b"h" * 16  # chunk message ids (reassembly keys)
CHUNK_FIELDS = ((5, 1), (22, 4), (26, 4), (30, 4))
"""(offset, width) of a chunk's flags, index, count and total."""
CODEC_SPECS = (
    "identity",
    "topk:0.3",
    "fp16",
    "bf16",
    "int8",
    "qsgd:4",
    "randk:0.3",
    "sign",
    "powersgd:1",
    "topk:0.3+zstd",
)
REASSEMBLY_LIMITS = {"max_messages": 4, "max_bytes": 4096}


def with_crc(body: bytes) -> bytes:
    """``body`` followed by its CRC-32 (what a hostile but well-framed sender sends)."""
    return bytes(body) + struct.pack("!I", zlib.crc32(body))


def crc_ok(frame: bytes) -> bool:
    """Whether the last 4 bytes of ``frame`` are the CRC-32 of the bytes before them."""
    return len(frame) >= 4 and struct.pack("!I", zlib.crc32(frame[:-4])) == frame[-4:]


def envelope_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every numeric field of a valid encoded envelope (docs/wire.md)."""
    fields = [(5, 1), (6, 2), (8, 4), (12, 8)]  # kind, flags, round, sequence
    pos = 36
    for _ in range(3):  # fleet, job, sender lengths
        fields.append((pos, 1))
        pos += 1 + data[pos]
    count = int.from_bytes(data[pos : pos + 2], "big")
    fields.append((pos, 2))
    pos += 2
    for _ in range(count):
        fields.append((pos, 1))  # name length
        pos += 1 + data[pos]
        ndim = data[pos + 1]
        fields += [(pos, 1), (pos + 1, 1)]  # dtype, ndim
        pos += 2
        fields += [(pos + 4 * d, 4) for d in range(ndim)]
        pos += 4 * ndim
        fields += [(pos, 1), (pos + 1, 4)]  # codec, payload length
        pos += 5
    return fields


def check_envelope(data: bytes) -> DecodedEnvelope | None:
    """Decode ``data`` as an envelope; ``None`` if refused with a WireError."""
    try:
        decoded = decode_envelope_signed(data)
    except WireError:
        return None
    assert crc_ok(data), "accepted an envelope whose CRC-32 does not match"
    signature = decoded.signature
    sign = None if signature is None else (lambda _body: signature)
    again = encode_envelope(decoded.envelope, sign)
    assert again == bytes(data), "an accepted envelope does not re-encode to its own bytes"
    return decoded


def check_chunk(data: bytes) -> None:
    """Decode ``data`` as a chunk: refused with a WireError, or canonical with a good CRC."""
    try:
        c = decode_chunk(data)
    except WireError:
        return
    assert crc_ok(data), "accepted a chunk whose CRC-32 does not match"
    again = encode_chunk(c.message_id, c.index, c.count, c.total, c.body)
    assert again == bytes(data), "an accepted chunk does not re-encode to its own bytes"


def check_reassembly(frames: Sequence[bytes]) -> list[bytes]:
    """Feed ``frames`` to a small Reassembler; return the completed messages.

    Completed messages are decoded as envelopes (:func:`check_envelope`).
    """
    r = Reassembler(**REASSEMBLY_LIMITS, clock=lambda: 0.0)
    done = []
    for frame in frames:
        try:
            message = r.feed(frame)
        except WireError:
            message, accepted = None, False
        else:
            accepted = True
        stats = r.stats
        assert stats.pending_messages <= REASSEMBLY_LIMITS["max_messages"], stats
        assert stats.pending_bytes <= REASSEMBLY_LIMITS["max_bytes"], stats
        assert not accepted or crc_ok(frame), "reassembly took a chunk with a bad CRC-32"
        if message is not None:
            assert len(message) <= REASSEMBLY_LIMITS["max_bytes"]
            done.append(message)
            check_envelope(message)
    return done


# --- the agent's receive path ----------------------------------------------------------


def _model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(6, 5)).astype(np.float32),
        "b": rng.normal(size=(5,)).astype(np.float32),
    }


def _choco(codec: str = "identity") -> ChocoGossip:
    return ChocoGossip(_model(0), {PEER: 0.5}, 0.5, consensus_step=0.5, codec=parse_codec(codec))


def _envelope(kind: MessageKind, sequence: int, tensors: tuple[TensorEntry, ...]) -> Envelope:
    mid = sequence.to_bytes(16, "big")
    return Envelope(kind, FLEET, JOB, 0, PEER, mid, sequence, tensors)


@functools.cache
def _peer_messages() -> tuple[bytes, tuple[bytes, ...]]:
    """The peer's keyframe (sequence 1) and one round-0 delta per codec (sequence 2)."""
    x = _model(1)
    sender = _choco()
    keyframe = encode_envelope(_envelope(MessageKind.KEYFRAME, 1, sender.keyframe(x)))
    moved = {k: v + np.float32(0.25) for k, v in x.items()}
    deltas = []
    for spec in CODEC_SPECS:
        algo = _choco()
        algo.keyframe(x)
        tensors = algo.outgoing(moved, parse_codec(spec, seed=0))
        deltas.append(encode_envelope(_envelope(MessageKind.DELTA, 2, tensors)))
    return keyframe, tuple(deltas)


def delta_messages() -> tuple[bytes, ...]:
    """Valid encoded deltas from the peer, one per codec in :data:`CODEC_SPECS`."""
    return _peer_messages()[1]


def fresh_inbox() -> Inbox:
    """An inbox of :data:`SELF` that has applied :data:`PEER`'s keyframe (``applied == 1``)."""
    inbox = Inbox(
        fleet=FLEET,
        job_id=JOB,
        device_id=SELF,
        peers=[PEER],
        algorithm=_choco(),
        deadline_s=1.0,
        clock=lambda: 0.0,
    )
    for chunk in split_message(_peer_messages()[0], KEYFRAME_ID, 1024):
        inbox._handle(TOPIC, chunk)
    assert inbox.stats.applied == 1, inbox.stats
    return inbox


def check_inbox(payloads: Sequence[bytes], message: bytes, topic: str = TOPIC) -> Inbox:
    """Hand ``payloads`` to a fresh inbox as the transport would; it must never raise.

    ``message`` is the envelope the payloads carry: it may be applied only if its CRC
    matches. Returns the inbox for further assertions.
    """
    inbox = fresh_inbox()
    for payload in payloads:
        inbox._handle(topic, payload)
    if inbox.stats.applied > 1:
        assert crc_ok(message), "applied a message with a bad CRC"
    return inbox


# --- one byte string, many targets (atheris, raw hypothesis) ---------------------------


def _frames(data: bytes) -> list[bytes]:
    """Split ``data`` into u16-length-prefixed frames, each given a valid CRC."""
    frames, pos = [], 0
    while pos + 2 <= len(data):
        size = int.from_bytes(data[pos : pos + 2], "big")
        frames.append(with_crc(data[pos + 2 : pos + 2 + size]))
        pos += 2 + size
    return frames


def _raw_payload(data: bytes) -> None:
    # One payload completes at most a one-chunk message: the chunk's body.
    inbox = check_inbox([data], data[CHUNK_HEADER:-4])
    assert inbox.stats.applied == 1 or crc_ok(data), "applied a chunk with a bad CRC"


def _hostile_sender(body: bytes) -> None:
    message = with_crc(body)
    check_inbox(split_message(message, HOSTILE_ID, 256), message)


def _topic(data: bytes) -> None:
    message = delta_messages()[0]
    check_inbox(
        split_message(message, HOSTILE_ID, 1024), message, topic=data.decode(errors="replace")
    )


# --- the JSON payloads (meshfl.wire status, control, repair, secagg, shares) -----------

JSON_DECODERS: tuple[Callable[[bytes], object], ...] = (
    decode_status,
    decode_control,
    decode_repair_request,
    decode_declaration,
    decode_body,
    decode_mask_set,
    decode_sealed,
)
"""Every JSON decoder of :mod:`meshfl.wire`: each may raise PayloadError and nothing else."""


def check_json(data: bytes) -> None:
    """Feed ``data`` to every JSON decoder; any exception but PayloadError is a finding."""
    for decode in JSON_DECODERS:
        with contextlib.suppress(PayloadError):
            decode(data)


@functools.cache
def _json_inbox() -> Inbox:
    return fresh_inbox()


def check_inbox_json(data: bytes) -> None:
    """``data`` as a neighbour's status, a control message and a repair request: an
    inbox's handler must count and drop what does not decode, never raise."""
    inbox = _json_inbox()
    inbox._handle(status_topic(FLEET, PEER), data)
    inbox._handle(control_topic(FLEET), data)
    inbox._handle(inbox_topic(FLEET, SELF, PEER), b"{" + data)
    inbox.control.clear()


def json_seeds() -> list[bytes]:
    """Valid JSON payloads of every kind (a corpus for :func:`check_json`)."""
    declaration = {"job": JOB, "round": 3, "aggregator": PEER, "survivors": [SELF],
                   "dropped": [], "aborted": False}  # fmt: skip
    share = (1, bytes(32))
    return [
        encode_status("online", JOB, 3, need=[SELF], done=True),
        encode_control(ControlMessage(JOB, 2, 5, "ring", (SELF, PEER), ((0, 1),), "running")),
        encode_repair_request(JOB, 41),
        encode_declaration(declaration),
        encode_request(declaration, "A" * 86 + "=="),
        encode_sealed(bytes(48)),
        encode_mask_set([SELF, PEER]),
        encode_shares(SharesMessage(PEER, 3, {SELF: (share, share)})),
        encode_reveal(Reveal(3, SELF, {PEER: share}, {}, ())),
    ]


TARGETS: tuple[Callable[[bytes], object], ...] = (
    check_envelope,  # 0: raw bytes as an envelope
    lambda d: check_envelope(with_crc(d)),  # 1: envelope body behind a valid CRC
    check_chunk,  # 2: raw bytes as a chunk
    lambda d: check_chunk(with_crc(d)),  # 3: chunk body behind a valid CRC
    lambda d: check_reassembly(_frames(d)),  # 4: a sequence of well-framed chunks
    _raw_payload,  # 5: raw bytes on a neighbour's delta topic
    _hostile_sender,  # 6: a well-framed envelope body, chunked, on that topic
    _topic,  # 7: a valid delta on an arbitrary topic
    check_json,  # 8: raw bytes to every JSON decoder of meshfl.wire
    check_inbox_json,  # 9: raw bytes as a status, a control message, a repair request
)


def run_selected(data: bytes, targets: Sequence[int] = range(len(TARGETS))) -> None:
    """Run target ``targets[data[0] % len(targets)]`` on ``data[1:]`` (nothing if empty)."""
    if data:
        TARGETS[targets[data[0] % len(targets)]](data[1:])


def seed_inputs(targets: Sequence[int] = range(len(TARGETS))) -> list[bytes]:
    """Valid inputs for ``targets``, each prefixed with its selector byte (a corpus).

    The selector byte is the target's position in ``targets`` (see :func:`run_selected`).
    """
    signed = _envelope(MessageKind.MODEL, 3, (TensorEntry("b", (5,), DType.FLOAT32, 1, b""),))
    envelopes = [
        *delta_messages(),
        _peer_messages()[0],
        encode_envelope(signed, lambda _body: bytes(range(64))),
    ]
    chunks = [c for e in envelopes for c in split_message(e, bytes(16), 200)[:2]]
    frames = [
        b"".join(len(c[:-4]).to_bytes(2, "big") + c[:-4] for c in split_message(e, bytes(16), 96))
        for e in envelopes[:3]
    ]
    per_target = [
        envelopes,
        [e[:-4] for e in envelopes],
        chunks,
        [c[:-4] for c in chunks],
        frames,
        chunks,
        [e[:-4] for e in envelopes],
        [TOPIC.encode()],
        json_seeds(),
        json_seeds(),
    ]
    return [bytes([i]) + s for i, t in enumerate(targets) for s in per_target[t]]
