# Wire v1 envelope serde: golden bytes, round trips, and malformed input.
#
# The golden envelope below (kind DELTA, fleet "lab", job "mnist", round 7, sender
# "pi-01", message id 00..0f, sequence 42, two tensors) encodes to exactly 100 bytes:
#
#   4d464c57                  magic "MFLW"
#   01                        version 1
#   01                        kind 1 = DELTA
#   0000                      flags (reserved, 0)
#   00000007                  round 7 (u32)
#   000000000000002a          sequence 42 (u64)
#   000102...0e0f             message id (16 bytes)
#   03 6c6162                 fleet: len 3, "lab"
#   05 6d6e697374             job: len 5, "mnist"
#   05 70692d3031             sender: len 5, "pi-01"
#   0002                      tensor count 2 (u16)
#   04 66632e77               tensor 0 name: len 4, "fc.w"
#   01 02 00000002 00000003   dtype 1 = FLOAT32, ndim 2, shape (2, 3) as u32s
#   01 00000004               codec tag 1, payload length 4
#   04 66632e62               tensor 1 name: len 4, "fc.b"
#   02 01 00000003            dtype 2 = FLOAT16, ndim 1, shape (3,)
#   02 00000002               codec tag 2, payload length 2
#   deadbeef                  tensor 0 payload
#   0102                      tensor 1 payload
#   101c62ba                  CRC-32 (zlib.crc32) of the 96 bytes before it
#
# 100 = 45 fixed (ENVELOPE_OVERHEAD) + 13 string bytes + 2 × 8 (TENSOR_OVERHEAD)
#       + 8 name bytes + 3 × 4 shape bytes + 6 payload bytes.
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshfl.wire
from meshfl.errors import ChecksumError, CodecError, VersionError, WireError
from meshfl.wire import (
    WIRE_VERSION,
    DType,
    Envelope,
    MessageKind,
    TensorEntry,
    decode_envelope,
    encode_envelope,
    new_message_id,
)
from meshfl.wire.serde import (
    ENVELOPE_OVERHEAD,
    FLAG_SIGNED,
    SIGNATURE_BYTES,
    TENSOR_OVERHEAD,
    decode_envelope_signed,
)

GOLDEN_HEX = "".join(
    [
        "4d464c57",  # magic
        "01",  # version
        "01",  # kind DELTA
        "0000",  # flags
        "00000007",  # round
        "000000000000002a",  # sequence
        "000102030405060708090a0b0c0d0e0f",  # message id
        "03" + "6c6162",  # fleet
        "05" + "6d6e697374",  # job
        "05" + "70692d3031",  # sender
        "0002",  # tensor count
        "04" + "66632e77" + "01" + "02" + "00000002" + "00000003" + "01" + "00000004",
        "04" + "66632e62" + "02" + "01" + "00000003" + "02" + "00000002",
        "deadbeef",
        "0102",
        "101c62ba",  # CRC-32
    ]
)

GOLDEN = Envelope(
    kind=MessageKind.DELTA,
    fleet="lab",
    job="mnist",
    round=7,
    sender="pi-01",
    message_id=bytes(range(16)),
    sequence=42,
    tensors=(
        TensorEntry("fc.w", (2, 3), DType.FLOAT32, 1, bytes.fromhex("deadbeef")),
        TensorEntry("fc.b", (3,), DType.FLOAT16, 2, bytes.fromhex("0102")),
    ),
)


def with_crc(body: bytes) -> bytes:
    return body + struct.pack("!I", zlib.crc32(body))


def test_public_names_are_exactly_all() -> None:
    expected = {
        "WIRE_VERSION", "DEFAULT_MAX_PAYLOAD", "DType", "MessageKind", "TensorEntry",
        "Envelope", "new_message_id", "encode_envelope", "decode_envelope", "split_message",
        "pack_message", "Reassembler", "ReassemblyStats", "delta_topic", "status_topic",
        "inbox_topic", "inbox_filter", "control_topic", "parse_topic", "TopicInfo",
        "validate_id", "probe_topic", "status_filter",
    }  # fmt: skip
    public = {n for n in dir(meshfl.wire) if not n.startswith("_")}
    assert set(meshfl.wire.__all__) == expected
    assert expected <= public
    assert WIRE_VERSION == 1 and meshfl.wire.DEFAULT_MAX_PAYLOAD == 131072


def test_golden_bytes_encode_exactly() -> None:
    data = encode_envelope(GOLDEN)
    assert data.hex() == GOLDEN_HEX
    strings = len("lab") + len("mnist") + len("pi-01")
    names_shapes_payloads = 8 + 4 * 3 + 6
    assert len(data) == ENVELOPE_OVERHEAD + strings + 2 * TENSOR_OVERHEAD + names_shapes_payloads
    assert (ENVELOPE_OVERHEAD, TENSOR_OVERHEAD) == (45, 8)


def test_golden_bytes_decode_back() -> None:
    env = decode_envelope(bytes.fromhex(GOLDEN_HEX))
    assert env == GOLDEN
    assert isinstance(env.kind, MessageKind) and isinstance(env.tensors[0].dtype, DType)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = bytes.fromhex(GOLDEN_HEX)
    assert decode_envelope(bytearray(data)) == GOLDEN  # type: ignore[arg-type]
    assert decode_envelope(memoryview(data)) == GOLDEN  # type: ignore[arg-type]


# --- strategies ------------------------------------------------------------------------

texts = st.text(max_size=40).filter(lambda s: len(s.encode("utf-8", "surrogatepass")) <= 255)
utf8_texts = texts.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
tensor_entries = st.builds(
    TensorEntry,
    name=utf8_texts.filter(lambda s: len(s) > 0),
    shape=st.lists(st.integers(0, 2**32 - 1), max_size=8).map(tuple),
    dtype=st.sampled_from(DType),
    codec=st.integers(0, 255),
    payload=st.binary(max_size=64),
)
envelopes = st.builds(
    Envelope,
    kind=st.sampled_from(MessageKind),
    fleet=utf8_texts,
    job=utf8_texts,
    round=st.integers(0, 2**32 - 1),
    sender=utf8_texts,
    message_id=st.binary(min_size=16, max_size=16),
    sequence=st.integers(0, 2**64 - 1),
    tensors=st.lists(tensor_entries, max_size=6, unique_by=lambda t: t.name).map(tuple),
)


@settings(deadline=None)
@given(envelopes)
def test_envelope_round_trip(env: Envelope) -> None:
    data = encode_envelope(env)
    assert decode_envelope(data) == env
    manifest = sum(
        TENSOR_OVERHEAD + len(t.name.encode()) + 4 * len(t.shape) + len(t.payload)
        for t in env.tensors
    )
    strings = sum(len(s.encode()) for s in (env.fleet, env.job, env.sender))
    assert len(data) == ENVELOPE_OVERHEAD + strings + manifest


# --- signed envelopes (flag bit 0) ---------------------------------------------------------


def fake_sign(data: bytes) -> bytes:
    """A stand-in signer: any 64 bytes that depend on the data (the kernel never checks)."""
    return (zlib.crc32(data).to_bytes(4, "big") * 16)[:SIGNATURE_BYTES]


def test_signed_golden_layout() -> None:
    # The golden envelope signed: flags 0001, then the 64-byte signature of the 96 bytes
    # before it (header with the flag set included), then the CRC of all 160 bytes.
    data = encode_envelope(GOLDEN, sign=fake_sign)
    unsigned = bytes.fromhex(GOLDEN_HEX)
    signed_part = unsigned[:6] + b"\x00\x01" + unsigned[8:-4]
    assert FLAG_SIGNED == 1 and len(data) == len(unsigned) + SIGNATURE_BYTES
    assert data[:-68] == signed_part
    assert data[-68:-4] == fake_sign(signed_part)
    assert data[-4:] == struct.pack("!I", zlib.crc32(data[:-4]))
    decoded = decode_envelope_signed(data)
    assert decoded.envelope == GOLDEN
    assert decoded.signature == fake_sign(signed_part)
    assert decoded.signed_bytes == signed_part
    assert decode_envelope(data) == GOLDEN  # callers that do not care


def test_unsigned_envelope_decodes_without_signature() -> None:
    decoded = decode_envelope_signed(bytes.fromhex(GOLDEN_HEX))
    assert decoded.envelope == GOLDEN and decoded.signature is None
    assert decoded.signed_bytes == b""


@pytest.mark.parametrize("flags", [0x0002, 0x0003, 0x8000, 0x0100])
def test_unknown_flag_bits_are_wire_errors(flags: int) -> None:
    body = bytearray(encode_envelope(GOLDEN, sign=fake_sign)[:-4])
    body[6:8] = flags.to_bytes(2, "big")
    with pytest.raises(WireError, match="reserved bits"):
        decode_envelope(with_crc(bytes(body)))


def test_signer_must_return_64_bytes() -> None:
    with pytest.raises(WireError, match="64 bytes"):
        encode_envelope(GOLDEN, sign=lambda data: b"short")


def test_signed_flag_without_room_for_a_signature_is_a_wire_error() -> None:
    body = golden_body()
    body[6:8] = b"\x00\x01"  # claims a signature, carries none
    with pytest.raises(WireError):
        decode_envelope(with_crc(bytes(body)))


@settings(deadline=None)
@given(envelopes)
def test_signed_envelope_round_trip(env: Envelope) -> None:
    data = encode_envelope(env, sign=fake_sign)
    decoded = decode_envelope_signed(data)
    assert decoded.envelope == env
    assert decoded.signed_bytes == data[: -4 - SIGNATURE_BYTES]
    assert decoded.signature == fake_sign(decoded.signed_bytes)
    assert len(data) == len(encode_envelope(env)) + SIGNATURE_BYTES


@settings(deadline=None)
@given(envelopes, st.data())
def test_signature_covers_every_byte_before_it(env: Envelope, data: st.DataObject) -> None:
    # A change anywhere in header, manifest or payloads (CRC recomputed, as an attacker
    # would) changes the signed bytes, so the original signature no longer matches them.
    encoded = encode_envelope(env, sign=fake_sign)
    body = bytearray(encoded[:-4])
    pos = data.draw(st.integers(8, len(body) - SIGNATURE_BYTES - 1))  # past magic/flags
    body[pos] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_envelope_signed(with_crc(bytes(body)))
    except WireError:
        return
    assert decoded.signed_bytes != encoded[: -4 - SIGNATURE_BYTES]
    assert decoded.signature == fake_sign(encoded[: -4 - SIGNATURE_BYTES])


# --- fuzz: only WireError ----------------------------------------------------------------


def decode_or_wire_error(data: bytes) -> None:
    try:
        env = decode_envelope(data)
    except WireError:
        return
    assert isinstance(env, Envelope)


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_wire_error(data: bytes) -> None:
    decode_or_wire_error(data)


@given(st.binary(max_size=300))
def test_random_body_with_valid_frame_raises_only_wire_error(tail: bytes) -> None:
    # Magic, version and CRC are right, so the structural parser sees the garbage.
    decode_or_wire_error(with_crc(b"MFLW\x01" + tail))


@settings(deadline=None)
@given(envelopes, st.data())
def test_single_byte_corruption_is_always_detected(env: Envelope, data: st.DataObject) -> None:
    encoded = bytearray(encode_envelope(env))
    pos = data.draw(st.integers(0, len(encoded) - 1))
    encoded[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        decode_envelope(bytes(encoded))


@settings(deadline=None)
@given(envelopes, st.data())
def test_corruption_behind_a_fixed_crc_raises_only_wire_error(
    env: Envelope, data: st.DataObject
) -> None:
    body = bytearray(encode_envelope(env)[:-4])
    pos = data.draw(st.integers(5, len(body) - 1))
    body[pos] = data.draw(st.integers(0, 255))
    decode_or_wire_error(with_crc(bytes(body)))


@settings(deadline=None)
@given(envelopes, st.data())
def test_truncation_and_trailing_bytes_raise_wire_error(env: Envelope, data: st.DataObject) -> None:
    encoded = encode_envelope(env)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(WireError):
        decode_envelope(encoded[:cut])
    with pytest.raises(WireError):
        decode_envelope(encoded + b"\x00")
    with pytest.raises(WireError, match="trailing"):
        decode_envelope(with_crc(encoded[:-4] + b"\x00"))


# --- specific malformations ----------------------------------------------------------------


def golden_body() -> bytearray:
    return bytearray(bytes.fromhex(GOLDEN_HEX)[:-4])


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [
        (5, 9, "unknown message kind 9"),
        (6, 1, "flags"),
        (59, 0, "unknown tensor 'fc.w' dtype 0"),  # offsets from the layout comment above
        (60, 9, "9 dims"),
        (52, 0xFF, "65282 tensors"),
        (37, 0xFF, "fleet is not valid UTF-8"),
        (40, 200, "truncated job"),
        (73, 0xFF, "truncated tensor 'fc.w' payload"),
        (74, 0xFF, "truncated tensor 1 name"),
    ],
)
def test_structural_errors_are_wire_errors(offset: int, value: int, match: str) -> None:
    body = golden_body()
    body[offset] = value
    with pytest.raises(WireError, match=match) as info:
        decode_envelope(with_crc(bytes(body)))
    assert type(info.value) is WireError


def test_bad_magic_version_and_crc_have_their_own_errors() -> None:
    data = bytes.fromhex(GOLDEN_HEX)
    with pytest.raises(WireError, match="magic"):
        decode_envelope(b"XXXX" + data[4:])
    with pytest.raises(WireError, match="a chunk"):
        decode_envelope(b"MFLC" + data[4:])
    with pytest.raises(VersionError, match="version 2"):
        decode_envelope(data[:4] + b"\x02" + data[5:])
    with pytest.raises(ChecksumError):
        decode_envelope(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(WireError, match="must be bytes"):
        decode_envelope("not bytes")  # type: ignore[arg-type]


def test_duplicate_tensor_names_on_the_wire_are_rejected() -> None:
    body = golden_body()
    at = body.index(b"fc.b")
    body[at : at + 4] = b"fc.w"
    with pytest.raises(WireError, match="unique"):
        decode_envelope(with_crc(bytes(body)))


# --- construction invariants ----------------------------------------------------------------


def entry(**changes: object) -> TensorEntry:
    fields: dict[str, object] = {
        "name": "w", "shape": (2,), "dtype": DType.FLOAT32, "codec": 1, "payload": b"",
    }  # fmt: skip
    fields.update(changes)
    return TensorEntry(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"name": ""},
        {"name": "x" * 256},
        {"name": "\ud800"},
        {"shape": (1,) * 9},
        {"shape": (-1,)},
        {"shape": (2**32,)},
        {"shape": (1.5,)},
        {"dtype": 99},
        {"codec": 256},
        {"codec": -1},
        {"payload": "text"},
    ],
)
def test_tensor_entry_rejects_what_the_wire_cannot_carry(changes: dict[str, object]) -> None:
    with pytest.raises(WireError):
        entry(**changes)


def test_tensor_entry_normalizes_numpy_shapes_and_buffers() -> None:
    arr = np.zeros((2, 3), dtype=np.float32)
    t = entry(shape=np.array(arr.shape), dtype=1, payload=bytearray(arr.tobytes()))
    assert t.shape == (2, 3) and all(type(d) is int for d in t.shape)
    assert t.dtype is DType.FLOAT32 and t.payload == arr.tobytes()


@pytest.mark.parametrize(
    "changes",
    [
        {"message_id": b"short"},
        {"round": -1},
        {"round": 2**32},
        {"sequence": 2**64},
        {"sequence": True},
        {"fleet": "é" * 128},
        {"kind": 7},
        {"tensors": (entry(), entry())},
        {"tensors": ("not an entry",)},
    ],
)
def test_envelope_rejects_what_the_wire_cannot_carry(changes: dict[str, object]) -> None:
    fields = {**GOLDEN.__dict__, **changes}
    with pytest.raises(WireError):
        Envelope(**fields)


def test_envelope_accepts_a_list_of_tensors() -> None:
    env = Envelope(**{**GOLDEN.__dict__, "tensors": list(GOLDEN.tensors)})
    assert env == GOLDEN


def test_new_message_id_is_16_random_bytes() -> None:
    ids = {new_message_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 16 for i in ids)


# --- dtypes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("np_dtype", "wire"),
    [
        (np.float32, DType.FLOAT32),
        (np.float16, DType.FLOAT16),
        (np.int8, DType.INT8),
        (np.uint8, DType.UINT8),
        (np.int32, DType.INT32),
        (np.int64, DType.INT64),
        (np.float64, DType.FLOAT64),
    ],
)
def test_dtype_maps_numpy_both_ways(np_dtype: type[np.generic], wire: DType) -> None:
    assert DType.from_numpy(np.dtype(np_dtype)) is wire
    assert DType.from_numpy(np.dtype(np_dtype).newbyteorder(">")) is wire
    assert wire.to_numpy() == np.dtype(np_dtype)
    assert wire.itemsize == np.dtype(np_dtype).itemsize


def test_dtype_values_are_frozen() -> None:
    assert [(d.name, d.value) for d in DType] == [
        ("FLOAT32", 1), ("FLOAT16", 2), ("BFLOAT16", 3), ("INT8", 4),
        ("UINT8", 5), ("INT32", 6), ("INT64", 7), ("FLOAT64", 8),
    ]  # fmt: skip
    assert [(k.name, k.value) for k in MessageKind] == [
        ("DELTA", 1), ("MODEL", 2), ("KEYFRAME", 3), ("SECURE_INPUT", 4), ("SECAGG", 5),
    ]  # fmt: skip


def test_bfloat16_and_unsupported_dtypes_raise_codec_error() -> None:
    with pytest.raises(CodecError, match="bfloat16"):
        DType.BFLOAT16.to_numpy()
    assert DType.BFLOAT16.itemsize == 2
    for bad in (np.bool_, np.complex64, np.uint16):
        with pytest.raises(CodecError):
            DType.from_numpy(np.dtype(bad))
    with pytest.raises(CodecError):
        DType.from_numpy("no such dtype")
