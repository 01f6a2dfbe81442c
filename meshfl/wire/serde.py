"""The byte layout of wire v1 — the only module that packs or parses wire bytes.

Two paired layouts, both big-endian (network byte order) and CRC-32 (:func:`zlib.crc32`)
terminated; docs/wire.md draws them as tables.

Envelope::

    magic "MFLW" | version u8 | kind u8 | flags u16 | round u32 | sequence u64
    | message_id 16s | fleet, job, sender: (len u8, UTF-8) | tensor count u16
    | per tensor: name (len u8, UTF-8), dtype u8, ndim u8, shape ndim×u32, codec u8,
      payload length u32
    | payloads, in manifest order
    | [signature 64s, only with flag SIGNED] | crc32 u32 over everything before it

Flags: bit 0 ``SIGNED`` (:data:`FLAG_SIGNED`); every other bit is reserved and must be 0.
A signed envelope carries a 64-byte Ed25519 signature (RFC 8032) over every byte before
it — the header with the flag set included, so kind, round, sequence, message id, fleet,
job and sender are all covered. The kernel never sees a key: the signer and the verifier
are the caller's (``edge_agent.signing``).

Chunk::

    magic "MFLC" | version u8 | flags u8 (=0) | message_id 16s | index u32 | count u32
    | total u32 (message length, bytes) | body | crc32 u32 over header and body

Decoding bounds-checks every length against the remaining buffer and raises only
:class:`~meshfl.errors.WireError` (:class:`~meshfl.errors.ChecksumError` for a CRC
mismatch, :class:`~meshfl.errors.VersionError` for an unknown version).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from meshfl.errors import ChecksumError, VersionError, WireError
from meshfl.wire.envelope import (
    MAX_NDIM,
    MAX_TENSORS,
    MESSAGE_ID_BYTES,
    DType,
    Envelope,
    MessageKind,
    TensorEntry,
)

_E = TypeVar("_E", DType, MessageKind)

__all__ = [
    "CHUNK_HEADER",
    "CHUNK_OVERHEAD",
    "ENVELOPE_OVERHEAD",
    "FLAG_SIGNED",
    "SIGNATURE_BYTES",
    "TENSOR_OVERHEAD",
    "WIRE_VERSION",
    "Chunk",
    "DecodedEnvelope",
    "Sign",
    "decode_chunk",
    "decode_envelope",
    "decode_envelope_signed",
    "encode_chunk",
    "encode_envelope",
]

WIRE_VERSION = 1
"""The wire format version this build speaks (u8 after the magic)."""

_ENV_MAGIC = b"MFLW"
_CHUNK_MAGIC = b"MFLC"
_ENV_HEAD = struct.Struct("!4sBBHIQ16s")  # magic, version, kind, flags, round, sequence, id
_CHUNK_HEAD = struct.Struct("!4sBB16sIII")  # magic, version, flags, id, index, count, total
_TENSOR_HEAD = struct.Struct("!BB")  # dtype, ndim
_TENSOR_TAIL = struct.Struct("!BI")  # codec, payload length
_U8 = struct.Struct("!B")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")

ENVELOPE_OVERHEAD = _ENV_HEAD.size + 3 * _U8.size + _U16.size + _U32.size
"""Fixed envelope bytes besides strings and tensors (45)."""
TENSOR_OVERHEAD = _U8.size + _TENSOR_HEAD.size + _TENSOR_TAIL.size
"""Per-tensor manifest bytes besides the name, 4 bytes per dimension and the payload (8)."""
CHUNK_HEADER = _CHUNK_HEAD.size
"""Chunk header bytes before the body (34)."""
CHUNK_OVERHEAD = CHUNK_HEADER + _U32.size
"""Chunk bytes besides the body: header plus CRC-32 trailer (38)."""
FLAG_SIGNED = 0x0001
"""Envelope flag bit 0: a 64-byte Ed25519 signature precedes the CRC-32 trailer."""
SIGNATURE_BYTES = 64
"""Length of an envelope signature (Ed25519), bytes."""
_KNOWN_FLAGS = FLAG_SIGNED

Sign = Callable[[bytes], bytes]
"""``sign(data) -> signature``: a 64-byte Ed25519 signature of ``data`` (the signer's key)."""


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk: body bytes ``index`` of ``count`` of a ``total``-byte message."""

    message_id: bytes
    index: int
    count: int
    total: int
    body: bytes


@dataclass(frozen=True)
class DecodedEnvelope:
    """An envelope with what a receiver needs to verify it (:func:`decode_envelope_signed`).

    ``signature`` is the 64-byte signature, ``None`` for an unsigned envelope;
    ``signed_bytes`` the bytes it covers (every byte before it; empty when unsigned).
    """

    envelope: Envelope
    signature: bytes | None
    signed_bytes: bytes


def _enum(cls: type[_E], tag: int, what: str) -> _E:
    try:
        return cls(tag)
    except ValueError as exc:
        raise WireError(f"unknown {what} {tag}") from exc


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U8.pack(len(raw)) + raw


def encode_envelope(env: Envelope, sign: Sign | None = None) -> bytes:
    """Serialize an envelope to wire v1 bytes (layout in the module docstring).

    Parameters
    ----------
    env : Envelope
        The envelope; it validated its fields on construction.
    sign : callable, optional
        ``sign(data) -> 64 bytes``: sets flag ``SIGNED`` and appends its signature of
        every byte before it. ``None`` (default): an unsigned envelope, flags 0.

    Raises
    ------
    WireError
        If ``sign`` returns anything but 64 bytes.

    """
    flags = FLAG_SIGNED if sign is not None else 0
    parts = [
        _ENV_HEAD.pack(
            _ENV_MAGIC, WIRE_VERSION, env.kind, flags, env.round, env.sequence, env.message_id
        ),
        _text(env.fleet),
        _text(env.job),
        _text(env.sender),
        _U16.pack(len(env.tensors)),
    ]
    for t in env.tensors:
        parts += [
            _text(t.name),
            _TENSOR_HEAD.pack(t.dtype, len(t.shape)),
            struct.pack(f"!{len(t.shape)}I", *t.shape),
            _TENSOR_TAIL.pack(t.codec, len(t.payload)),
        ]
    parts += [t.payload for t in env.tensors]
    body = b"".join(parts)
    if sign is not None:
        signature = sign(body)
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
            raise WireError(
                f"a signature must be {SIGNATURE_BYTES} bytes, the signer returned"
                f" {len(signature) if isinstance(signature, bytes) else signature!r}"
            )
        body += signature
    return body + _U32.pack(zlib.crc32(body))


class _Reader:
    """Bounds-checked cursor over a buffer; every read past ``end`` raises WireError."""

    def __init__(self, data: memoryview, end: int) -> None:
        self.data, self.pos, self.end = data, 0, end

    def take(self, n: int, what: str) -> memoryview:
        if n > self.end - self.pos:
            raise WireError(f"truncated {what}: need {n} bytes, {self.end - self.pos} left")
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        return tuple(int(v) for v in fmt.unpack(self.take(fmt.size, what)))

    def text(self, what: str) -> str:
        (size,) = self.unpack(_U8, what)
        try:
            return str(self.take(size, what), "utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"{what} is not valid UTF-8") from exc


def _view(data: object, what: str) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"{what} must be bytes, not {type(data).__name__}")
    try:
        return memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise WireError(f"{what} is not a contiguous byte buffer") from exc


def _check_frame(view: memoryview, magic: bytes, minimum: int, what: str) -> None:
    """Check length, magic, version and CRC trailer of a frame (in that order)."""
    if len(view) < minimum:
        raise WireError(f"truncated {what}: {len(view)} bytes, at least {minimum} needed")
    if view[:4] != magic:
        hint = " (a chunk: feed it to a Reassembler)" if view[:4] == _CHUNK_MAGIC else ""
        raise WireError(f"bad {what} magic {bytes(view[:4])!r}{hint}")
    if view[4] != WIRE_VERSION:
        raise VersionError(f"{what} is wire version {view[4]}; this build speaks {WIRE_VERSION}")
    (crc,) = _U32.unpack(view[-4:])
    if zlib.crc32(view[:-4]) != crc:
        raise ChecksumError(f"{what} CRC-32 mismatch")


def decode_envelope(data: bytes) -> Envelope:
    """Parse wire v1 bytes into an :class:`Envelope`, signed or not (the signature unchecked).

    Receivers that check signatures use :func:`decode_envelope_signed`.

    Raises
    ------
    VersionError, ChecksumError, WireError
        As :func:`decode_envelope_signed`.

    """
    return decode_envelope_signed(data).envelope


def decode_envelope_signed(data: bytes) -> DecodedEnvelope:
    """Parse wire v1 bytes into the envelope, its signature and the bytes it covers.

    The signature is returned, not verified: the caller holds the keys.

    Raises
    ------
    VersionError
        If the version byte is not :data:`WIRE_VERSION`.
    ChecksumError
        If the CRC-32 trailer does not match.
    WireError
        For anything else malformed: truncated, trailing bytes, bad magic, unknown
        flag bits, unknown kind or dtype, too many dims or tensors, bad UTF-8.

    """
    view = _view(data, "envelope")
    _check_frame(view, _ENV_MAGIC, ENVELOPE_OVERHEAD, "envelope")
    r = _Reader(view, len(view) - _U32.size)
    _, _, kind_tag, flags, rnd, seq, message_id = _ENV_HEAD.unpack(r.take(_ENV_HEAD.size, "header"))
    if flags & ~_KNOWN_FLAGS:
        raise WireError(f"envelope flags {flags:#06x} set reserved bits (only bit 0, SIGNED)")
    signed = bool(flags & FLAG_SIGNED)
    if signed:
        if r.end - r.pos < SIGNATURE_BYTES:
            raise WireError("truncated signed envelope: no room for its 64-byte signature")
        r.end -= SIGNATURE_BYTES
    kind = _enum(MessageKind, kind_tag, "message kind")
    fleet, job, sender = r.text("fleet"), r.text("job"), r.text("sender")
    (count,) = r.unpack(_U16, "tensor count")
    if count > MAX_TENSORS:
        raise WireError(f"{count} tensors; at most {MAX_TENSORS}")
    manifest = []
    for i in range(count):
        name = r.text(f"tensor {i} name")
        dtype_tag, ndim = r.unpack(_TENSOR_HEAD, f"tensor {i} manifest")
        dtype = _enum(DType, dtype_tag, f"tensor {name!r} dtype")
        if ndim > MAX_NDIM:
            raise WireError(f"tensor {name!r} has {ndim} dims; at most {MAX_NDIM}")
        shape = struct.unpack(f"!{ndim}I", r.take(4 * ndim, f"tensor {name!r} shape"))
        codec, size = r.unpack(_TENSOR_TAIL, f"tensor {name!r} manifest")
        manifest.append((name, shape, dtype, codec, size))
    tensors = tuple(
        TensorEntry(name, shape, dtype, codec, bytes(r.take(size, f"tensor {name!r} payload")))
        for name, shape, dtype, codec, size in manifest
    )
    if r.pos != r.end:
        raise WireError(f"{r.end - r.pos} trailing bytes after the last payload")
    env = Envelope(kind, fleet, job, rnd, sender, message_id, seq, tensors)
    if not signed:
        return DecodedEnvelope(env, None, b"")
    signature = bytes(view[r.end : r.end + SIGNATURE_BYTES])
    return DecodedEnvelope(env, signature, bytes(view[: r.end]))


def encode_chunk(message_id: bytes, index: int, count: int, total: int, body: bytes) -> bytes:
    """Serialize one chunk (layout in the module docstring); fields are not re-validated.

    Raises
    ------
    WireError
        If a field does not fit its wire width (id not 16 bytes, counters past u32).

    """
    if not isinstance(message_id, bytes) or len(message_id) != MESSAGE_ID_BYTES:
        raise WireError(f"message id must be {MESSAGE_ID_BYTES} bytes, got {message_id!r}")
    try:
        head = _CHUNK_HEAD.pack(_CHUNK_MAGIC, WIRE_VERSION, 0, message_id, index, count, total)
    except struct.error as exc:
        raise WireError(f"chunk field out of range: {exc}") from exc
    frame = head + body
    return frame + _U32.pack(zlib.crc32(frame))


def decode_chunk(data: bytes) -> Chunk:
    """Parse one chunk and check its CRC and index/count/total consistency.

    Raises
    ------
    VersionError, ChecksumError, WireError
        As :func:`decode_envelope`; also for ``index >= count``, ``count == 0``, more
        chunks than message bytes, or a body longer than the message.

    """
    view = _view(data, "chunk")
    _check_frame(view, _CHUNK_MAGIC, CHUNK_OVERHEAD, "chunk")
    _, _, flags, message_id, index, count, total = _CHUNK_HEAD.unpack(view[:CHUNK_HEADER])
    body = bytes(view[CHUNK_HEADER:-4])
    if flags:
        raise WireError(f"chunk flags {flags:#04x} are reserved and must be 0")
    if not index < count <= max(total, 1):
        raise WireError(f"inconsistent chunk {index}/{count} of a {total}-byte message")
    if len(body) > total or (not body and total):
        raise WireError(f"chunk body of {len(body)} bytes in a {total}-byte message")
    return Chunk(message_id, index, count, total, body)
