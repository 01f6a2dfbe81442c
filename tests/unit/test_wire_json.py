"""Every JSON payload on MQTT: golden bytes of each encoder, round trips, and decoders that
raise nothing but :class:`~meshfl.errors.PayloadError` on any input (hypothesis)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfl.errors import PayloadError
from meshfl.wire.control import ControlMessage, decode_control, encode_control
from meshfl.wire.jsonbody import load_object, nesting_depth
from meshfl.wire.repair import decode_repair_request
from meshfl.wire.secagg import (
    Sealed,
    SignedRequest,
    decode_body,
    decode_declaration,
    decode_mask_set,
    encode_declaration,
    encode_mask_set,
    encode_request,
    encode_sealed,
)
from meshfl.wire.shares import (
    Reveal,
    SharesMessage,
    decode_reveal,
    decode_sealed,
    decode_shares,
    encode_reveal,
    encode_shares,
)
from meshfl.wire.status import DeviceStatus, decode_status, encode_status

DECODERS: dict[str, Callable[[bytes], object]] = {
    "status": decode_status,
    "control": decode_control,
    "repair": decode_repair_request,
    "declaration": decode_declaration,
    "body": decode_body,
    "mask set": decode_mask_set,
    "shares": decode_shares,
    "reveal": decode_reveal,
    "sealed": decode_sealed,
}
DECLARATION = {"job": "job-1", "round": 3, "aggregator": "dev-i", "survivors": ["dev-a"],
               "dropped": ["dev-b"], "aborted": False}  # fmt: skip
SIG = "A" * 86 + "=="  # 64 zero bytes in base64
SHARE = (2, bytes(range(32)))
B64_SHARE = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


# -- golden bytes ------------------------------------------------------------------------


def test_status_bytes_are_the_agents_of_before() -> None:
    assert encode_status("online", "job-1", 3) == b'{"state": "online", "job": "job-1", "round": 3}'
    assert encode_status("online", "job-1", 3, need={"b", "a"}, done=True) == (
        b'{"state": "online", "job": "job-1", "round": 3, "need": ["a", "b"], "done": true}'
    )
    assert encode_status("offline") == b'{"state": "offline", "job": null, "round": null}'


def test_control_bytes() -> None:
    message = ControlMessage("job-1", 3, 9, "ring", ("a", "b", "c"), ((0, 1), (1, 2)), "running")
    assert encode_control(message) == (
        b'{"job":"job-1","version":3,"from_round":9,"kind":"ring","devices":["a","b","c"],'
        b'"edges":[[0,1],[1,2]],"status":"running"}'
    )
    paused = ControlMessage("j", 1, 1, "ring", ("a", "b"), ((0, 1),), "paused", pause_round=4)
    assert encode_control(paused).endswith(b',"status":"paused","pause_round":4}')


def test_declaration_bytes_are_what_the_coordinator_signs() -> None:
    assert encode_declaration(DECLARATION) == (
        b'{"aborted":false,"aggregator":"dev-i","dropped":["dev-b"],"job":"job-1","round":3,'
        b'"survivors":["dev-a"]}'
    )


def test_protocol_body_and_mask_set_bytes() -> None:
    assert encode_sealed(b"\x00\x01") == b'{"sealed":"AAE="}'
    assert encode_request(DECLARATION, SIG).startswith(
        b'{"type":"request","signed":{"declaration":{"job":"job-1",'
    )
    assert encode_mask_set(["a", "b"]) == b'["a", "b"]'


def test_shares_and_reveal_bytes() -> None:
    shares = SharesMessage("dev-a", 3, {"dev-i": (SHARE, SHARE)})
    assert encode_shares(shares) == (
        b'{"v":1,"type":"shares","owner":"dev-a","round":3,"shares":{"dev-i":{"b":[2,"'
        + B64_SHARE.encode()
        + b'"],"s":[2,"'
        + B64_SHARE.encode()
        + b'"]}}}'
    )
    reveal = Reveal(3, "dev-i", {"dev-a": SHARE}, {}, ("dev-c",))
    assert encode_reveal(reveal) == (
        b'{"v":1,"type":"reveal","round":3,"aggregator":"dev-i","b":{"dev-a":[2,"'
        + B64_SHARE.encode()
        + b'"]},"s":{},"refused":["dev-c"]}'
    )


# -- round trips ---------------------------------------------------------------------------


def test_every_encoder_round_trips_through_its_decoder() -> None:
    assert decode_status(encode_status("online", "job-1", 3, ["b"], True)) == DeviceStatus(
        "online", "job-1", 3, ("b",), True
    )
    assert decode_status(b"") is None  # a deleted retained status
    message = ControlMessage("job-1", 3, 9, None, ("a", "b"), ((0, 1),), "paused", 4)
    assert decode_control(encode_control(message)) == message
    assert decode_declaration(encode_declaration(DECLARATION)) == DECLARATION
    request = decode_body(encode_request(DECLARATION, SIG))
    assert request == SignedRequest(DECLARATION, bytes(64))  # type: ignore[arg-type]
    assert decode_body(encode_sealed(b"ct")) == Sealed(b"ct")
    assert decode_mask_set(encode_mask_set(["a", "b"])) == ("a", "b")
    shares = SharesMessage("dev-a", 3, {"dev-i": (SHARE, SHARE)})
    assert decode_shares(encode_shares(shares)) == shares == decode_sealed(encode_shares(shares))
    reveal = Reveal(3, "dev-i", {"dev-a": SHARE}, {"dev-b": SHARE}, ("dev-c",))
    assert decode_reveal(encode_reveal(reveal)) == reveal == decode_sealed(encode_reveal(reveal))


# -- hostile input -------------------------------------------------------------------------

HOSTILE = {
    "deep arrays": b"[" * 100_000,
    "deep objects": b'{"a":' * 50_000,
    "deep inside a valid field": b'{"state": "online", "need": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "brackets in strings do not count": None,  # see the nesting test
    "NaN": b'{"state": "online", "round": NaN}',
    "huge int": b'{"job": "j", "after": ' + b"9" * 5000 + b"}",
    "duplicate key": b'{"job": "j", "after": 1, "after": 2}',
    "utf-16": '{"state": "online"}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"state": "online"}',
    "lone surrogate": b'{"state": "\\ud800"}',
    "not an object or a list": b'"x"',
    "empty": b"{}",
}


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("payload", [p for p in HOSTILE.values() if p is not None])
def test_hostile_payloads_raise_only_a_payload_error(name: str, payload: bytes) -> None:
    with pytest.raises(PayloadError):
        DECODERS[name](payload)


def test_nesting_is_counted_outside_strings_only() -> None:
    assert nesting_depth('{"a": "[[[[[[[[[[[[[[[[", "b": [[1]]}', 8) == 3
    assert nesting_depth('["\\"[[[[[[[[[[[["]', 8) == 1
    assert nesting_depth("[" * 1_000_000, 8) == 9  # stops counting past the limit
    body = load_object(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', "test", max_bytes=100, max_depth=1)
    assert body == {"a": "[" * 28}


def test_the_nesting_scan_is_linear_on_unterminated_strings() -> None:
    # '"' then 16,000 '\\"': a scan that retried at every quote took 31 s (quadratic).
    text = '"' + '\\"' * 16_000
    started = time.process_time()
    assert nesting_depth(text, 8) == 0 and nesting_depth(text + "\\", 8) == 0
    assert time.process_time() - started < 2.0
    with pytest.raises(PayloadError):
        decode_status(text.encode())


def test_non_bytes_input_is_a_payload_error() -> None:
    for decoder in DECODERS.values():
        with pytest.raises(PayloadError):
            decoder("{}")  # type: ignore[arg-type]


_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_FIELDS = st.sampled_from(
    [
        "state",
        "job",
        "round",
        "need",
        "done",
        "version",
        "from_round",
        "kind",
        "devices",
        "edges",
        "status",
        "pause_round",
        "after",
        "type",
        "signed",
        "sealed",
        "declaration",
        "signature",
        "v",
        "owner",
        "shares",
        "aggregator",
        "b",
        "s",
        "refused",
        "survivors",
        "dropped",
        "aborted",
    ]
)
_OBJECTS = st.dictionaries(_FIELDS, _JSON, max_size=8).map(lambda d: json.dumps(d).encode())


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=60, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), _OBJECTS))
def test_decoders_raise_nothing_but_a_payload_error(name: str, data: bytes) -> None:
    with contextlib.suppress(PayloadError):
        DECODERS[name](data)
