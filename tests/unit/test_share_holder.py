"""ShareHolder: what a member reveals to an aggregator, its never-both rule, its messages."""

from __future__ import annotations

import base64
import json

import pytest

from edge_agent.secagg.holder import ShareHolder
from edge_agent.secagg.shamir import combine_shares, split_secret
from meshfl.errors import SecurityError, WireError
from meshfl.wire.shares import (
    Reveal,
    SharesMessage,
    decode_reveal,
    decode_shares,
    encode_reveal,
    encode_shares,
)


def _share(index: int, fill: int) -> tuple[int, bytes]:
    return index, bytes([fill]) * 32


def _holder() -> ShareHolder:
    holder = ShareHolder("k")
    for owner, fill in (("a", 1), ("b", 2), ("c", 3)):
        for aggregator in ("i", "h"):
            holder.store(owner, 5, aggregator, _share(2, fill), _share(2, 100 + fill))
    return holder


def test_reveals_b_shares_of_survivors_and_s_shares_of_dropped() -> None:
    holder = _holder()
    reveal = holder.reveal(5, "i", survivors=["a", "b"], dropped=["c"])
    assert reveal.round == 5 and reveal.aggregator == "i"
    assert dict(reveal.b_shares) == {"a": _share(2, 1), "b": _share(2, 2)}
    assert dict(reveal.s_shares) == {"c": _share(2, 103)}
    assert reveal.refused == () and holder.refusals == 0
    # A retransmitted request gets the same answer, and another aggregator the same kinds.
    assert holder.reveal(5, "i", ["a", "b"], ["c"]) == reveal
    assert holder.reveal(5, "h", ["a", "b"], ["c"]).refused == ()


def test_refuses_both_shares_of_one_peer_in_one_instance() -> None:
    holder = _holder()
    holder.reveal(5, "i", survivors=["a", "b"], dropped=["c"])
    # A second request for the same instance now claims a dropped and c survived: a's
    # s-share and c's b-share would complete the pair; both are refused, b is answered.
    reveal = holder.reveal(5, "i", survivors=["b", "c"], dropped=["a"])
    assert reveal.refused == ("a", "c")
    assert dict(reveal.b_shares) == {"b": _share(2, 2)}
    assert dict(reveal.s_shares) == {}
    assert holder.refusals == 2


def test_another_aggregators_instance_has_its_own_masking_key() -> None:
    holder = _holder()
    holder.reveal(5, "i", survivors=["a", "b"], dropped=["c"])
    # a's input was lost at h only: h's instance used a's key of slot h, which i never
    # sees, so revealing it to h cannot unmask a's input at i.
    reveal = holder.reveal(5, "h", survivors=["b", "c"], dropped=["a"])
    assert reveal.refused == () and holder.refusals == 0
    assert set(reveal.b_shares) == {"b", "c"} and set(reveal.s_shares) == {"a"}


def test_refuses_an_owner_declared_both_survivor_and_dropped() -> None:
    holder = _holder()
    reveal = holder.reveal(5, "i", survivors=["a", "b"], dropped=["a"])
    assert reveal.refused == ("a",) and set(reveal.b_shares) == {"b"}
    assert holder.refusals == 1


def test_missing_and_forget_before() -> None:
    holder = _holder()
    holder.store("a", 7, "i", _share(1, 9), _share(1, 10))
    assert holder.missing(5, "i", ["a", "b", "z"]) == ["z"]
    assert holder.missing(5, "i", ["a"], ["y", "c"]) == ["y"]
    assert holder.missing(7, "i", ["a", "b"]) == ["b"]
    reveal = holder.reveal(5, "i", ["a", "z"], [])
    assert set(reveal.b_shares) == {"a"} and reveal.refused == ()  # z: nothing to reveal
    holder.forget_before(6)
    assert len(holder) == 1
    assert holder.missing(5, "i", ["a"]) == ["a"]


def test_store_keeps_first_shares_and_refuses_different_ones() -> None:
    holder = ShareHolder("k")
    holder.store("a", 1, "i", _share(1, 1), _share(1, 2))
    holder.store("a", 1, "i", _share(1, 1), _share(1, 2))  # retransmission
    with pytest.raises(SecurityError):
        holder.store("a", 1, "i", _share(1, 7), _share(1, 2))
    assert holder.reveal(1, "i", ["a"], []).b_shares["a"] == _share(1, 1)


def test_shares_from_messages_reconstruct_the_secret() -> None:
    b_secret, s_secret = bytes(range(32)), bytes(range(32, 64))
    b_split, s_split = split_secret(b_secret, 2, 3), split_secret(s_secret, 2, 3)
    holders = [ShareHolder(name) for name in ("h1", "h2", "h3")]
    for n, holder in enumerate(holders):
        wire = encode_shares(SharesMessage("a", 4, {"i": (b_split[n], s_split[n])}))
        holder.store_message(decode_shares(wire))
    reveals = [decode_reveal(encode_reveal(h.reveal(4, "i", ["a"], []))) for h in holders[:2]]
    assert combine_shares([r.b_shares["a"] for r in reveals]) == b_secret


def test_messages_round_trip() -> None:
    message = SharesMessage(
        "a", 3, {"i": (_share(1, 1), _share(1, 2)), "h": (_share(3, 4), _share(2, 5))}
    )
    assert decode_shares(encode_shares(message)) == message
    reveal = Reveal(3, "i", {"a": _share(2, 1)}, {"c": _share(2, 3)}, ("d",))
    assert decode_reveal(encode_reveal(reveal)) == reveal


def _good_shares() -> dict[str, object]:
    return json.loads(encode_shares(SharesMessage("a", 3, {"i": (_share(1, 1), _share(1, 2))})))


def _good_reveal() -> dict[str, object]:
    return json.loads(encode_reveal(Reveal(3, "i", {"a": _share(2, 1)}, {}, ())))


B64 = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"v": True},
        {"type": "reveal"},
        {"owner": "a/b"},
        {"owner": 7},
        {"round": 0},
        {"round": "3"},
        {"round": True},
        {"shares": []},
        {"shares": {"i": {"b": [1, B64]}}},
        {"shares": {"i": {"b": [0, B64], "s": [1, B64]}}},
        {"shares": {"i": {"b": [1, B64[:-4]], "s": [1, B64]}}},
        {"shares": {"i": {"b": [1, "!!!"], "s": [1, B64]}}},
        {"shares": {"i": {"b": [70000, B64], "s": [1, B64]}}},
        {"shares": {"bad id": {"b": [1, B64], "s": [1, B64]}}},
        {"extra": 1},
    ],
)
def test_malformed_shares_message_is_a_wire_error(change: dict[str, object]) -> None:
    body = {**_good_shares(), **change}
    with pytest.raises(WireError):
        decode_shares(json.dumps(body).encode())


@pytest.mark.parametrize(
    "change",
    [
        {"holder": "k"},  # unknown field
        {"round": -1},
        {"aggregator": None},
        {"b": {"a": [1]}},
        {"b": {"a": "x"}},
        {"s": {"a": [1, B64]}},  # a in b and s
        {"refused": ["a"]},  # a in b and refused
        {"refused": "a"},
        {"type": "shares"},
    ],
)
def test_malformed_reveal_message_is_a_wire_error(change: dict[str, object]) -> None:
    body = {**_good_reveal(), **change}
    with pytest.raises(WireError):
        decode_reveal(json.dumps(body).encode())


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xfe", b"[1,2]", b"null", b'{"v":1,"v":1}', b"x" * (5 * 1024 * 1024)],
)
def test_garbage_bytes_are_a_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_shares(data)
    with pytest.raises(WireError):
        decode_reveal(data)
