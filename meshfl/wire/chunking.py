"""Chunking of wire messages under a broker's payload limit, and bounded reassembly.

Every message travels as one or more chunks (see :mod:`meshfl.wire.serde` for the
layout), each at most ``max_payload`` bytes including its header and CRC-32, so managed
brokers with small packet limits work. :class:`Reassembler` puts them back together in
any order, ignores duplicates and replays, and is bounded in memory and time.

A partial message is keyed by ``(sender, topic, message id)``: a message id copied from
an honest message by anyone else (another sender, another topic) is a different
message and cannot disturb it. Each sender has its own quota of partial messages and
held bytes; a chunk past it is refused (:class:`~meshfl.errors.QuotaError`), so one
flooding sender cannot evict everyone else's messages.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from meshfl.errors import ConfigError, QuotaError, WireError
from meshfl.wire.envelope import Envelope
from meshfl.wire.serde import CHUNK_OVERHEAD, Sign, decode_chunk, encode_chunk, encode_envelope

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "MIN_MAX_PAYLOAD",
    "REMEMBERED_COMPLETED",
    "Reassembler",
    "ReassemblyStats",
    "pack_message",
    "split_message",
]

DEFAULT_MAX_PAYLOAD = 131072
"""Default largest chunk, bytes (128 KiB: fits managed brokers with small limits)."""
MIN_MAX_PAYLOAD = CHUNK_OVERHEAD + 1
"""Smallest usable ``max_payload``, bytes: the chunk header and CRC plus one body byte."""
REMEMBERED_COMPLETED = 4096
"""How many recently completed message ids a :class:`Reassembler` remembers."""
_MAX_MESSAGE = 2**32 - 1


def split_message(
    message: bytes, message_id: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[bytes]:
    """Split ``message`` into chunks of at most ``max_payload`` bytes each.

    Parameters
    ----------
    message : bytes
        The message, usually :func:`~meshfl.wire.serde.encode_envelope` output; at most
        2**32-1 bytes. An empty message is one chunk with an empty body.
    message_id : bytes
        16 bytes shared by all chunks; the receiver reassembles by it.
    max_payload : int, default 131072
        Largest chunk in bytes, header and CRC included; at least :data:`MIN_MAX_PAYLOAD`.

    Returns
    -------
    list of bytes
        ``count = max(1, ceil(len(message) / (max_payload - 38)))`` chunks in index order.

    Raises
    ------
    ConfigError
        If ``max_payload`` is below :data:`MIN_MAX_PAYLOAD`.
    WireError
        If ``message_id`` is not 16 bytes or the message is longer than 2**32-1 bytes.

    """
    if isinstance(max_payload, bool) or not isinstance(max_payload, int):
        raise ConfigError(f"max_payload must be an int of bytes, got {max_payload!r}")
    if max_payload < MIN_MAX_PAYLOAD:
        raise ConfigError(
            f"max_payload {max_payload} is too small: a chunk needs at least {MIN_MAX_PAYLOAD} "
            f"bytes ({CHUNK_OVERHEAD} of header and CRC plus 1 of body)"
        )
    if len(message) > _MAX_MESSAGE:
        raise WireError(f"message of {len(message)} bytes exceeds the {_MAX_MESSAGE}-byte limit")
    step = max_payload - CHUNK_OVERHEAD
    total = len(message)
    count = max(1, -(-total // step))
    view = memoryview(message)
    return [
        encode_chunk(message_id, i, count, total, bytes(view[i * step : (i + 1) * step]))
        for i in range(count)
    ]


def pack_message(
    env: Envelope, max_payload: int = DEFAULT_MAX_PAYLOAD, sign: Sign | None = None
) -> list[bytes]:
    """Encode ``env`` (signed by ``sign`` if given) and split it into chunks keyed by its id.

    The one way a sender turns an envelope into what it publishes: the chunks of
    :func:`~meshfl.wire.serde.encode_envelope` ``(env, sign)`` of at most ``max_payload``
    bytes each (see :func:`split_message` for the bounds and errors).
    """
    return split_message(encode_envelope(env, sign), env.message_id, max_payload)


@dataclass(frozen=True)
class ReassemblyStats:
    """Counters of a :class:`Reassembler` (a snapshot; counts are since construction).

    ``completed`` messages returned; ``duplicates`` chunks ignored (already held, or of a
    recently completed message); ``expired`` and ``evicted`` partial messages dropped for
    age or for memory; ``rejected`` chunks that raised :class:`~meshfl.errors.WireError`
    (``refused`` of them a :class:`~meshfl.errors.QuotaError`: over the sender's quota);
    ``pending_messages`` partial messages held, ``pending_bytes`` body bytes they hold.
    """

    completed: int = 0
    duplicates: int = 0
    expired: int = 0
    evicted: int = 0
    rejected: int = 0
    refused: int = 0
    pending_messages: int = 0
    pending_bytes: int = 0


_Key = tuple[str, str, bytes]  # (sender, topic, message id)


@dataclass
class _Partial:
    sender: str
    count: int
    total: int
    last_seen: float
    size: int = 0
    bodies: dict[int, bytes] = field(default_factory=dict)


class Reassembler:
    """Reassemble chunked messages, bounded in memory and time.

    Parameters
    ----------
    max_messages : int, default 256
        Most partial messages held at once.
    max_bytes : int, default 256 MiB
        Most body bytes held over all partial messages; a chunk announcing a longer
        message is rejected.
    timeout_s : float, default 30.0
        A partial message that received no new chunk for longer than this many seconds
        is dropped (on every :meth:`feed` and by :meth:`expire`).
    clock : callable, default time.monotonic
        Returns the current time in seconds; inject a fake one in tests.
    sender_messages : int, default 64
        Most partial messages held for one sender (see :meth:`feed`).
    sender_bytes : int, default 128 MiB
        Most body bytes held for one sender; a chunk announcing a longer message is
        refused too.

    Notes
    -----
    When holding a new chunk would exceed ``max_messages`` or ``max_bytes``, the oldest
    partial message (the one least recently fed a new chunk) is evicted first. A chunk
    that would take its sender past ``sender_messages`` or ``sender_bytes`` is refused
    instead (:class:`~meshfl.errors.QuotaError`): a sender's flood costs only itself.
    Keys of the last 4096 completed messages are remembered so late duplicates are
    ignored.

    """

    def __init__(
        self,
        max_messages: int = 256,
        max_bytes: int = 256 * 2**20,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sender_messages: int = 64,
        sender_bytes: int = 128 * 2**20,
    ) -> None:
        if min(max_messages, max_bytes, sender_messages, sender_bytes) < 1 or not timeout_s > 0:
            raise ConfigError("the message, byte and time bounds must all be positive")
        self._max_messages, self._max_bytes, self._timeout = max_messages, max_bytes, timeout_s
        self._sender_messages, self._sender_bytes = sender_messages, sender_bytes
        self._clock = clock
        self._partials: OrderedDict[_Key, _Partial] = OrderedDict()  # least recent first
        self._completed: OrderedDict[_Key, None] = OrderedDict()
        self._bytes = 0
        self._held: dict[str, list[int]] = {}  # sender → [partial messages, body bytes]
        self._counts = dict.fromkeys(
            ("completed", "duplicates", "expired", "evicted", "rejected", "refused"), 0
        )

    @property
    def stats(self) -> ReassemblyStats:
        """A snapshot of the counters and current memory use."""
        return ReassemblyStats(
            **self._counts, pending_messages=len(self._partials), pending_bytes=self._bytes
        )

    def expire(self) -> int:
        """Drop partial messages idle for longer than ``timeout_s``; return how many."""
        now, dropped = self._clock(), 0
        while self._partials:
            mid, oldest = next(iter(self._partials.items()))
            if now - oldest.last_seen <= self._timeout:
                break
            self._drop(mid)
            dropped += 1
        self._counts["expired"] += dropped
        return dropped

    def feed(self, chunk: bytes, sender: str = "", topic: str = "") -> bytes | None:
        """Take one chunk; return the whole message when its last missing chunk arrives.

        Parameters
        ----------
        chunk : bytes
            One chunk frame.
        sender, topic : str, default ""
            Who sent it (the device id its topic names) and on which topic: a message is
            reassembled from the chunks of one ``(sender, topic, message id)``, and
            ``sender`` is charged the quota.

        Returns ``None`` while the message is incomplete and for ignored chunks
        (duplicates, chunks of a recently completed message).

        Raises
        ------
        QuotaError
            For a chunk that would take ``sender`` past ``sender_messages`` partial
            messages or ``sender_bytes`` held bytes.
        WireError
            For a chunk that does not decode (bad CRC, truncated, garbage), that
            contradicts earlier chunks of its message (count, total or sizes), or that
            announces a message longer than ``max_bytes``. The caller counts and drops it.

        """
        self.expire()
        try:
            return self._feed(chunk, sender, topic)
        except WireError as exc:
            self._counts["rejected"] += 1
            if isinstance(exc, QuotaError):
                self._counts["refused"] += 1
            raise

    def _feed(self, data: bytes, sender: str, topic: str) -> bytes | None:
        c = decode_chunk(data)
        key = (sender, topic, c.message_id)
        if key in self._completed:
            self._counts["duplicates"] += 1
            return None
        if c.total > self._max_bytes:
            raise WireError(f"message of {c.total} bytes exceeds max_bytes={self._max_bytes}")
        if c.total > self._sender_bytes:
            raise QuotaError(
                f"message of {c.total} bytes exceeds {sender!r}'s quota of {self._sender_bytes}"
            )
        part = self._partials.get(key)
        if part is not None and (part.count, part.total) != (c.count, c.total):
            raise WireError(
                f"chunk {c.index}/{c.count} of {c.total} bytes contradicts earlier chunks "
                f"({part.count} chunks, {part.total} bytes) of message {c.message_id.hex()}"
            )
        if part is not None and c.index in part.bodies:
            self._counts["duplicates"] += 1
            return None
        held = self._held.get(sender, [0, 0])
        if (part is None and held[0] >= self._sender_messages) or (
            held[1] + len(c.body) > self._sender_bytes
        ):
            raise QuotaError(
                f"{sender!r} holds {held[0]} partial messages of {held[1]} bytes: over its quota"
                f" ({self._sender_messages} messages, {self._sender_bytes} bytes)"
            )
        self._make_room(key, len(c.body), new=part is None)
        if part is None:
            part = self._partials[key] = _Partial(sender, c.count, c.total, self._clock())
            held = self._held.setdefault(sender, [0, 0])
            held[0] += 1
        part.bodies[c.index] = c.body
        part.size += len(c.body)
        part.last_seen = self._clock()
        self._bytes += len(c.body)
        held[1] += len(c.body)
        self._partials.move_to_end(key)
        if part.size > part.total or (len(part.bodies) == part.count and part.size != part.total):
            self._drop(key)
            raise WireError(f"chunk sizes of message {c.message_id.hex()} do not add up")
        if len(part.bodies) < part.count:
            return None
        self._drop(key)
        self._completed[key] = None
        if len(self._completed) > REMEMBERED_COMPLETED:
            self._completed.popitem(last=False)
        self._counts["completed"] += 1
        return b"".join(part.bodies[i] for i in range(part.count))

    def _make_room(self, key: _Key, size: int, *, new: bool) -> None:
        """Evict the oldest other partial messages until ``size`` more bytes fit."""
        while True:
            over_count = new and len(self._partials) >= self._max_messages
            if not over_count and self._bytes + size <= self._max_bytes:
                return
            victim = next((k for k in self._partials if k != key), None)
            if victim is None:
                return
            self._drop(victim)
            self._counts["evicted"] += 1

    def _drop(self, key: _Key) -> None:
        part = self._partials.pop(key)
        self._bytes -= part.size
        held = self._held[part.sender]
        held[0] -= 1
        held[1] -= part.size
        if held[0] == 0:
            del self._held[part.sender]
