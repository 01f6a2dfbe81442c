# Wire v1 chunking and reassembly.
#
# A chunk is: magic "MFLC" | version u8 | flags u8 | message id 16s | index u32 | count u32
# | total u32 | body | CRC-32 u32 over header and body — 34 header bytes + 4 CRC bytes.
from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.errors import ChecksumError, ConfigError, VersionError, WireError
from meshfl.wire import (
    DType,
    Envelope,
    MessageKind,
    Reassembler,
    ReassemblyStats,
    TensorEntry,
    decode_envelope,
    pack_message,
    split_message,
)
from meshfl.wire.chunking import MIN_MAX_PAYLOAD, REMEMBERED_COMPLETED
from meshfl.wire.serde import CHUNK_HEADER, CHUNK_OVERHEAD, decode_chunk, encode_chunk

MID = bytes(range(16))


def mid(n: int) -> bytes:
    return n.to_bytes(16, "big")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_chunk_golden_bytes() -> None:
    chunk = encode_chunk(MID, 1, 3, 5, b"ab")
    body = b"MFLC\x01\x00" + MID + struct.pack("!III", 1, 3, 5) + b"ab"
    assert chunk == body + struct.pack("!I", zlib.crc32(body))
    assert (CHUNK_HEADER, CHUNK_OVERHEAD, MIN_MAX_PAYLOAD) == (34, 38, 39)
    c = decode_chunk(chunk)
    assert (c.message_id, c.index, c.count, c.total, c.body) == (MID, 1, 3, 5, b"ab")


def test_split_sizes_and_count() -> None:
    message = bytes(range(256)) * 4  # 1024 bytes
    chunks = split_message(message, MID, max_payload=100)
    step = 100 - CHUNK_OVERHEAD
    assert len(chunks) == -(-len(message) // step)
    assert all(len(c) <= 100 for c in chunks)
    assert b"".join(decode_chunk(c).body for c in chunks) == message


def test_single_and_empty_messages_are_one_chunk() -> None:
    assert len(split_message(b"x" * 10, MID)) == 1
    (chunk,) = split_message(b"", MID, max_payload=MIN_MAX_PAYLOAD)
    assert Reassembler().feed(chunk) == b""


def test_max_payload_too_small_names_the_minimum() -> None:
    with pytest.raises(ConfigError, match="at least 39 bytes"):
        split_message(b"abc", MID, max_payload=38)
    with pytest.raises(ConfigError):
        split_message(b"abc", MID, max_payload=True)
    assert len(split_message(b"abc", MID, max_payload=39)) == 3


def test_split_rejects_a_bad_message_id() -> None:
    with pytest.raises(WireError, match="16 bytes"):
        split_message(b"abc", b"short")


def test_pack_message_round_trip() -> None:
    env = Envelope(
        MessageKind.KEYFRAME, "lab", "job-1", 3, "pi-02", MID, 9,
        (TensorEntry("w", (300,), DType.FLOAT32, 0, bytes(1200)),),
    )  # fmt: skip
    chunks = pack_message(env, max_payload=256)
    assert len(chunks) > 1 and all(len(c) <= 256 for c in chunks)
    r = Reassembler()
    results = [r.feed(c) for c in chunks]
    assert results[:-1] == [None] * (len(chunks) - 1)
    assert results[-1] is not None and decode_envelope(results[-1]) == env


@settings(deadline=None)
@given(
    message=st.binary(max_size=2000),
    max_payload=st.integers(MIN_MAX_PAYLOAD, 400),
    data=st.data(),
)
def test_reassembly_in_any_order_with_duplicates(
    message: bytes, max_payload: int, data: st.DataObject
) -> None:
    chunks = split_message(message, MID, max_payload)
    dups = data.draw(st.lists(st.sampled_from(chunks), max_size=10))
    order = data.draw(st.permutations(chunks + dups))
    r = Reassembler()
    results = [r.feed(c) for c in order]
    done = [i for i, out in enumerate(results) if out is not None]
    assert len(done) == 1 and results[done[0]] == message
    assert done[0] == max(order.index(c) for c in chunks)  # at the last missing chunk
    assert r.stats == ReassemblyStats(completed=1, duplicates=len(dups))


@settings(deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=2, max_size=5), st.randoms())
def test_interleaved_messages_reassemble_independently(
    msgs: list[bytes], rnd: random.Random
) -> None:
    chunks = [c for i, m in enumerate(msgs) for c in split_message(m, mid(i), 50)]
    rnd.shuffle(chunks)
    r = Reassembler()
    outs = [out for c in chunks if (out := r.feed(c)) is not None]
    assert sorted(outs) == sorted(msgs)


# --- fuzz: only WireError --------------------------------------------------------------


@given(st.binary(max_size=200))
def test_random_chunk_bytes_raise_only_wire_error(data: bytes) -> None:
    r = Reassembler()
    try:
        out = r.feed(data)
    except WireError:
        assert r.stats.rejected == 1
    else:
        assert out is None or isinstance(out, bytes)


@given(st.binary(max_size=120), st.data())
def test_corrupted_or_truncated_chunks_raise_wire_error(body: bytes, data: st.DataObject) -> None:
    chunk = bytearray(split_message(body, MID, 200)[0])
    cut = data.draw(st.integers(0, len(chunk) - 1))
    with pytest.raises(WireError):
        decode_chunk(bytes(chunk[:cut]))
    pos = data.draw(st.integers(0, len(chunk) - 1))
    chunk[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        decode_chunk(bytes(chunk))


@given(st.binary(min_size=CHUNK_HEADER - 5, max_size=CHUNK_HEADER + 40))
def test_random_chunk_with_valid_frame_raises_only_wire_error(tail: bytes) -> None:
    frame = b"MFLC\x01" + tail
    try:
        chunk = decode_chunk(frame + struct.pack("!I", zlib.crc32(frame)))
    except WireError:
        return
    assert chunk.index < chunk.count and len(chunk.body) <= chunk.total


def test_chunk_frame_errors() -> None:
    chunk = encode_chunk(MID, 0, 1, 2, b"ab")
    with pytest.raises(ChecksumError):
        decode_chunk(chunk[:-1] + bytes([chunk[-1] ^ 1]))
    with pytest.raises(VersionError):
        decode_chunk(chunk[:4] + b"\x07" + chunk[5:])
    for index, count, total, body in [(1, 1, 2, b"ab"), (0, 0, 2, b"ab"), (0, 3, 2, b"ab"),
                                      (0, 1, 1, b"ab"), (0, 2, 2, b"")]:  # fmt: skip
        with pytest.raises(WireError, match="chunk"):
            decode_chunk(encode_chunk(MID, index, count, total, body))


# --- consistency, bounds, expiry, replay ----------------------------------------------


def test_inconsistent_chunks_raise_and_keep_the_partial() -> None:
    r = Reassembler()
    a, b = split_message(b"0123456789", MID, CHUNK_OVERHEAD + 5)
    assert r.feed(a) is None
    with pytest.raises(WireError, match="contradicts"):
        r.feed(encode_chunk(MID, 1, 3, 10, b"56789"))
    assert r.stats.rejected == 1 and r.stats.pending_messages == 1
    assert r.feed(b) == b"0123456789"


def test_chunk_sizes_that_do_not_add_up_drop_the_message() -> None:
    r = Reassembler()
    assert r.feed(encode_chunk(MID, 0, 2, 10, b"0123")) is None
    with pytest.raises(WireError, match="add up"):
        r.feed(encode_chunk(MID, 1, 2, 10, b"45"))
    assert r.stats.pending_messages == 0 and r.stats.pending_bytes == 0


def test_eviction_over_max_messages_drops_the_oldest() -> None:
    r = Reassembler(max_messages=2)
    firsts = [split_message(b"abcdef", mid(i), CHUNK_OVERHEAD + 3) for i in range(3)]
    for chunks in firsts:
        assert r.feed(chunks[0]) is None
    assert r.stats.evicted == 1 and r.stats.pending_messages == 2
    assert r.feed(firsts[0][1]) is None  # message 0 was evicted: starts over, evicts 1
    assert r.stats.evicted == 2
    assert r.feed(firsts[2][1]) == b"abcdef"


def test_eviction_over_max_bytes_keeps_memory_bounded() -> None:
    r = Reassembler(max_bytes=10)
    a = split_message(b"x" * 10, mid(1), CHUNK_OVERHEAD + 6)
    b = split_message(b"y" * 8, mid(2), CHUNK_OVERHEAD + 6)
    assert r.feed(a[0]) is None and r.stats.pending_bytes == 6
    assert r.feed(b[0]) is None  # 6 + 6 > 10: message 1 evicted
    assert r.stats == ReassemblyStats(evicted=1, pending_messages=1, pending_bytes=6)
    assert r.feed(b[1]) == b"y" * 8
    with pytest.raises(WireError, match="max_bytes"):
        r.feed(split_message(b"z" * 11, mid(3))[0])


def test_partial_messages_expire_after_timeout() -> None:
    clock = FakeClock()
    r = Reassembler(timeout_s=30.0, clock=clock)
    a = split_message(b"abcd", mid(1), CHUNK_OVERHEAD + 2)
    b = split_message(b"efgh", mid(2), CHUNK_OVERHEAD + 2)
    r.feed(a[0])
    clock.now = 20.0
    r.feed(b[0])
    clock.now = 30.0
    assert r.expire() == 0  # exactly timeout_s idle is kept
    clock.now = 30.5
    assert r.expire() == 1 and r.stats.pending_messages == 1
    assert r.feed(a[1]) is None  # message 1 is gone; this starts a new partial
    clock.now = 60.0
    assert r.feed(b[1]) is None  # feed expired message 2 (idle 40 s) before taking this
    assert r.stats.expired == 2 and r.stats.pending_messages == 2


def test_completed_messages_are_not_replayed() -> None:
    r = Reassembler()
    chunks = split_message(b"hello world", MID, CHUNK_OVERHEAD + 4)
    outs = [r.feed(c) for c in chunks]
    assert outs[-1] == b"hello world"
    assert [r.feed(c) for c in chunks] == [None] * len(chunks)
    assert r.stats == ReassemblyStats(completed=1, duplicates=len(chunks))


def test_completed_id_memory_is_bounded() -> None:
    r = Reassembler()
    first = split_message(b"m", mid(0))[0]
    assert r.feed(first) == b"m"
    for i in range(1, REMEMBERED_COMPLETED + 1):
        r.feed(split_message(b"m", mid(i))[0])
    assert r.feed(first) == b"m"  # forgotten after 4096 newer completions
    assert r.stats.completed == REMEMBERED_COMPLETED + 2


def test_reassembler_rejects_nonsense_bounds() -> None:
    with pytest.raises(ConfigError):
        Reassembler(max_messages=0)
    with pytest.raises(ConfigError):
        Reassembler(timeout_s=0)
